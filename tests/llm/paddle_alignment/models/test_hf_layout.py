import json
import os
import shutil
import subprocess

import numpy as np
import paddle
import pytest
from paddlenlp.transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM
from safetensors import safe_open
from safetensors.numpy import save_file

from helpers import transformers_python
from paddle_alignment.models.hf_layout import SAFE_INDEX, hf_config, safetensors_files, save_hf_weights, weight_files
from paddle_alignment.models.split_loading import load_hf_folder
from paddle_alignment.models.loading import load_score_model, pretrained_causal_lm
from paddle_alignment.models.rope import use_rope_tables
from paddle_alignment.models.score_model import AutoModelForScore

INPUT_IDS = [[1, 5, 9, 20, 7, 250]]
SMALL = dict(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=128)


def tiny_model(model_class=Qwen2ForCausalLM, config_class=Qwen2Config, **changes):
    """A random model with the RoPE tables every loader gives (transformers' numbers, where paddlenlp's own
    tables differ in the last bit), so that a loaded copy's logits equal it exactly."""
    paddle.seed(0)
    model = model_class(config_class(architectures=[model_class.__name__], **{**SMALL, **changes}))
    model.eval()
    return use_rope_tables(model)


def logits(model, ids=INPUT_IDS):
    output = model(paddle.to_tensor(ids))
    return (output[0] if isinstance(output, tuple) else output.logits).numpy()


def hf_folder(model, folder, **options):
    save_hf_weights(model, str(folder), **options)
    return str(folder)


@pytest.mark.parametrize(
    "model_class, config_class, tie",
    [(Qwen2ForCausalLM, Qwen2Config, True), (Qwen2ForCausalLM, Qwen2Config, False), (LlamaForCausalLM, LlamaConfig, False)],
)
def test_a_hugging_face_folder_loads_with_the_same_logits(tmp_path, model_class, config_class, tie):
    model = tiny_model(model_class, config_class, tie_word_embeddings=tie)
    folder = hf_folder(model, tmp_path / "hf")
    loaded = pretrained_causal_lm(folder)
    assert type(loaded) is model_class
    np.testing.assert_array_equal(logits(loaded), logits(model))
    # PyTorch's names and layout: Linear weights [out, in], the backbone under `model.`, a tied head not saved.
    with safe_open(os.path.join(folder, "model.safetensors"), framework="np") as f:
        assert f.metadata() == {"format": "pt"}
        assert f.get_slice("model.layers.0.mlp.up_proj.weight").get_shape() == [128, 64]
        assert f.get_slice("model.embed_tokens.weight").get_shape() == [300, 64]
        assert ("lm_head.weight" in f.keys()) is not tie
    config = json.load(open(os.path.join(folder, "config.json")))
    assert config["architectures"] == [model_class.__name__] and config["tie_word_embeddings"] is tie
    # As readable as config.json (safetensors itself creates files owner-only).
    assert os.stat(os.path.join(folder, "model.safetensors")).st_mode & 0o777 == os.stat(os.path.join(folder, "config.json")).st_mode & 0o777


def test_loaded_parameters_own_their_memory_not_the_files_mapping(tmp_path):
    """A parameter left on safetensors' memory map of its file (one in the file's dtype and layout, as the embedding
    and the norms are) would keep the mapping, and every page read from the file, in the process's memory."""
    folder = hf_folder(tiny_model(), tmp_path / "hf")
    loaded = pretrained_causal_lm(folder)
    weights = os.path.join(folder, "model.safetensors")
    assert not [line for line in open("/proc/self/maps") if line.rstrip().endswith(weights)]
    np.testing.assert_array_equal(logits(loaded), logits(tiny_model()))


def test_a_sharded_folder_loads_through_its_index(tmp_path):
    model = tiny_model(tie_word_embeddings=False)
    folder = hf_folder(model, tmp_path / "hf", shard_bytes=100_000)
    index = json.load(open(os.path.join(folder, SAFE_INDEX)))
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 2 and shards[0] == f"model-00001-of-{len(shards):05d}.safetensors"
    assert not os.path.exists(os.path.join(folder, "model.safetensors"))
    assert index["metadata"]["total_size"] == sum(p.numel().item() * 4 for p in model.parameters())
    np.testing.assert_array_equal(logits(pretrained_causal_lm(folder)), logits(model))


def test_bfloat16_weights_load_into_the_dtype_asked_for(tmp_path):
    model = tiny_model()
    state = {name: tensor.astype("bfloat16") for name, tensor in model.state_dict().items()}
    folder = hf_folder(model, tmp_path / "hf", state=state)
    assert json.load(open(os.path.join(folder, "config.json")))["torch_dtype"] == "bfloat16"
    as_float32 = pretrained_causal_lm(folder, dtype="float32")
    assert as_float32.lm_head.weight.dtype == paddle.float32
    expected = model.qwen2.embed_tokens.weight.astype("bfloat16").astype("float32").numpy()
    np.testing.assert_array_equal(as_float32.qwen2.embed_tokens.weight.numpy(), expected)
    # Without a dtype the model takes config.json's, as paddlenlp's from_pretrained does.
    assert pretrained_causal_lm(folder).lm_head.weight.dtype == paddle.bfloat16


def test_paddle_layout_folders_are_left_to_paddlenlp(tmp_path):
    model = tiny_model()
    model.save_pretrained(str(tmp_path / "pdparams"))
    model.save_pretrained(str(tmp_path / "np_safetensors"), safe_serialization=True)
    for folder in ("pdparams", "np_safetensors"):
        assert weight_files(str(tmp_path / folder)) is None
        np.testing.assert_array_equal(logits(pretrained_causal_lm(str(tmp_path / folder))), logits(model))
    # Tensor-parallel ranks read slices of either layout's safetensors (split_loading.py); pickles have none.
    assert safetensors_files(str(tmp_path / "pdparams")) is None
    assert safetensors_files(str(tmp_path / "np_safetensors")) == ([str(tmp_path / "np_safetensors" / "model.safetensors")], False)
    assert safetensors_files(hf_folder(model, tmp_path / "hf")) == ([str(tmp_path / "hf" / "model.safetensors")], True)


def test_a_folder_of_safetensors_without_metadata_is_told_by_its_names(tmp_path):
    model = tiny_model()
    folder = hf_folder(model, tmp_path / "hf")
    with safe_open(os.path.join(folder, "model.safetensors"), framework="np") as f:
        tensors = {key: f.get_tensor(key) for key in f.keys()}
    save_file(tensors, os.path.join(folder, "model.safetensors"))  # no metadata, as some tools write
    assert weight_files(folder) == [os.path.join(folder, "model.safetensors")]
    np.testing.assert_array_equal(logits(pretrained_causal_lm(folder)), logits(model))


def test_a_tied_head_saved_anyway_is_the_embedding(tmp_path):
    # transformers leaves a tied lm_head.weight out, but some tools write it: it is not the [in, out] Linear weight.
    model = tiny_model(tie_word_embeddings=True)
    folder = hf_folder(model, tmp_path / "hf")
    path = os.path.join(folder, "model.safetensors")
    with safe_open(path, framework="np") as f:
        tensors = {key: f.get_tensor(key) for key in f.keys()}
    save_file({**tensors, "lm_head.weight": tensors["model.embed_tokens.weight"]}, path, metadata={"format": "pt"})
    np.testing.assert_array_equal(logits(pretrained_causal_lm(folder)), logits(model))


def test_a_score_model_starts_from_a_causal_lm_folder_with_a_fresh_head(tmp_path, monkeypatch):
    model = tiny_model(initializer_range=0.5)
    folder = hf_folder(model, tmp_path / "hf")
    critic = load_hf_folder(folder, AutoModelForScore.class_for, score_type="critic")
    np.testing.assert_array_equal(critic.qwen2.embed_tokens.weight.numpy(), model.qwen2.embed_tokens.weight.numpy())
    # paddlenlp's initialisation of the head (normal, std initializer_range), not Paddle's default or zeros.
    assert 0.3 < critic.score_head.weight.numpy().std() < 0.7
    assert critic.config.score_type == "critic"


def test_a_sequence_classifier_folder_gives_its_score_head(tmp_path):
    # A Hugging Face reward model (Qwen2ForSequenceClassification): the backbone plus `score.weight` [1, hidden].
    model = tiny_model()
    folder = hf_folder(model, tmp_path / "hf")
    head = np.random.RandomState(0).randn(1, 64).astype("float32")
    with safe_open(os.path.join(folder, "model.safetensors"), framework="np") as f:
        tensors = {key: f.get_tensor(key) for key in f.keys()}
    save_file({**tensors, "score.weight": head}, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
    reward = load_hf_folder(folder, AutoModelForScore.class_for, score_bias=False)
    np.testing.assert_array_equal(reward.score_head.weight.numpy(), head.T)


def test_a_missing_or_misshapen_tensor_is_an_error_naming_it(tmp_path):
    model = tiny_model()
    folder = hf_folder(model, tmp_path / "hf")
    path = os.path.join(folder, "model.safetensors")
    with safe_open(path, framework="np") as f:
        tensors = {key: f.get_tensor(key) for key in f.keys()}
    save_file({k: v for k, v in tensors.items() if k != "model.norm.weight"}, path, metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"has no tensor for \['qwen2.norm.weight'\]"):
        pretrained_causal_lm(folder)
    tensors["model.layers.1.mlp.down_proj.weight"] = tensors["model.layers.1.mlp.down_proj.weight"][:, :64]
    save_file(tensors, path, metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"model.layers.1.mlp.down_proj.weight of .* has shape \[64, 64\]; qwen2.layers.1.mlp.down_proj.weight needs \[128, 64\]"):
        pretrained_causal_lm(folder)


def test_pickle_weights_and_fused_projections_are_refused_with_the_reason(tmp_path):
    folder = tmp_path / "torch_bin"
    folder.mkdir()
    (folder / "pytorch_model.bin").write_bytes(b"")
    shutil.copy(hf_folder(tiny_model(), tmp_path / "hf") + "/config.json", folder)
    with pytest.raises(ValueError, match="PyTorch pickle weights .* save them as safetensors"):
        weight_files(str(folder))
    with pytest.raises(ValueError, match="fuse_attention_qkv.* load it without them"):
        pretrained_causal_lm(str(tmp_path / "hf"), fuse_attention_qkv=True)


def test_the_exported_config_has_transformers_keys_only():
    config = hf_config(tiny_model(LlamaForCausalLM, LlamaConfig).config, "float32")
    assert config["model_type"] == "llama" and config["architectures"] == ["LlamaForCausalLM"]
    assert not {"dtype", "tensor_parallel_degree", "pad_token_id", "fuse_attention_qkv"} & set(config)


LLAMA3_ROPE = {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0, "original_max_position_embeddings": 8192, "rope_type": "llama3"}


@pytest.mark.skipif(transformers_python() is None, reason="transformers is not installed (set TRANSFORMERS_PYTHON to a Python that has it)")
@pytest.mark.parametrize(
    "model_class, config_class, changes",
    [
        (Qwen2ForCausalLM, Qwen2Config, {"tie_word_embeddings": False, "rope_theta": 1e6, "max_position_embeddings": 32768}),
        # Llama 3's scaled rotary frequencies, at positions past its original context of 8,192.
        (LlamaForCausalLM, LlamaConfig, {"rope_theta": 5e5, "rope_scaling": LLAMA3_ROPE, "max_position_embeddings": 131072}),
    ],
)
def test_transformers_reads_the_folder_with_the_same_logits(tmp_path, model_class, config_class, changes):
    model = tiny_model(model_class, config_class, **changes)
    folder = hf_folder(model, tmp_path / "hf")
    positions = [list(range(30000, 30000 + len(INPUT_IDS[0])))]
    script = (
        "import sys, numpy, torch, transformers\n"
        "m = transformers.AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32).eval()\n"
        "with torch.no_grad(): numpy.save(sys.argv[2], m(torch.tensor(%r), position_ids=torch.tensor(%r)).logits.numpy())\n"
        % (INPUT_IDS, positions)
    )
    subprocess.run([transformers_python(), "-c", script, folder, str(tmp_path / "hf.npy")], check=True)
    ours = pretrained_causal_lm(folder)(paddle.to_tensor(INPUT_IDS), position_ids=paddle.to_tensor(positions))[0].numpy()
    np.testing.assert_allclose(np.load(tmp_path / "hf.npy"), ours, atol=1e-5)


def test_load_score_model_reads_either_layout(tmp_path):
    # The loader every stage uses: run_reward, the reward model and critic of run_ppo.
    model = tiny_model()
    folder = hf_folder(model, tmp_path / "hf")
    args = type("Args", (), {"fp16_opt_level": "O1", "bf16": False, "fp16": False, "tensor_parallel_degree": -1, "pipeline_parallel_degree": -1, "device": "cpu"})()
    score = load_score_model(folder, args)
    np.testing.assert_array_equal(score.qwen2.norm.weight.numpy(), model.qwen2.norm.weight.numpy())
    assert score.qwen2.norm.weight.dtype == paddle.float32
