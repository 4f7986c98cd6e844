"""Model folders in Hugging Face's layout, read and written without a converted copy.

A folder as transformers writes it (and as the Hugging Face hub ships Qwen2.5 and Llama 3) holds
config.json, `model.safetensors` — or shards listed in `model.safetensors.index.json` — with PyTorch's
names and layout, and the tokenizer files. paddlenlp's own loader refuses it unless `convert_from_torch`
is set, and that flag writes a whole converted copy (`model_state.pdparams`) into the user's folder.
Here the model is built from config.json and each parameter is created from its tensor in the safetensors
(models/split_loading.py, which reads only a tensor-parallel rank's slices): renamed (`model.` is the backbone's prefix, `qwen2.` or `llama.`; a sequence classifier's
`score.` is the score head), transposed where Paddle's Linear stores [in, out] against PyTorch's
[out, in], and cast to the model's dtype (bfloat16 files included).

The way back (`save_hf_folder`) writes the same layout: shards of at most 5 GB with an index, the
safetensors marked `{"format": "pt"}`, config.json with transformers' keys, generation_config.json, and
the tokenizer files.
"""

import json
import os

import paddle
from paddlenlp.transformers.model_utils import no_init_weights
from paddlenlp.utils.log import logger
from safetensors import safe_open
from safetensors.paddle import save_file

from paddle_alignment.models.checkpoint_config import SCORE_HEAD, fresh_parts, read_config
from paddle_alignment.models.rope import use_rope_tables
from paddle_alignment.tokens import end_ids

SAFE_WEIGHTS = "model.safetensors"
SAFE_INDEX = "model.safetensors.index.json"
PADDLE_WEIGHTS = ("model_state.pdparams", "model_state.pdparams.index.json")
TORCH_PICKLES = ("pytorch_model.bin", "pytorch_model.bin.index.json")
SHARD_BYTES = 5 * 10**9  # transformers' default max_shard_size
HF_BACKBONE, HF_SCORE = "model", "score"
# Tensors a folder may hold that no Paddle model has (older transformers saved the rotary inverse frequencies).
IGNORED_SUFFIXES = (".rotary_emb.inv_freq",)
# Keys of transformers' configs of the families (models/families.py), written on export when the Paddle config has them.
HF_CONFIG_KEYS = (
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "hidden_act", "max_position_embeddings", "initializer_range",
    "rms_norm_eps", "tie_word_embeddings", "rope_theta", "rope_scaling", "attention_dropout",
    "attention_bias", "mlp_bias", "use_sliding_window", "sliding_window", "max_window_layers",
    "bos_token_id", "eos_token_id", "use_bias", "num_experts", "num_experts_per_tok", "moe_intermediate_size",
    "shared_expert_intermediate_size", "decoder_sparse_step", "mlp_only_layers", "norm_topk_prob", "router_aux_loss_coef",
)
HF_ARCHITECTURES = {
    "qwen2": "Qwen2ForCausalLM", "llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM", "ernie4_5": "Ernie4_5ForCausalLM",
    "qwen2_moe": "Qwen2MoeForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM",
}
# Their fused projections have no one-to-one tensor in the folder.
FUSED_LAYOUT_FLAGS = ("fuse_attention_qkv", "fuse_attention_ffn")


def weight_files(folder):
    """The safetensors files of `folder` when it holds a model in Hugging Face's layout, else None (a
    Paddle-layout folder, or not a local folder)."""
    found = safetensors_files(folder)
    return found[0] if found and found[1] else None


def safetensors_files(folder):
    """(paths, in Hugging Face's layout) of `folder`'s safetensors, or None when it holds none (or Paddle's
    pickles, which paddlenlp's loader reads first). paddlenlp writes safetensors marked "np" with its own
    names; transformers marks them "pt", and files some tools write without metadata have `model.` names."""
    if not os.path.isdir(folder) or any(os.path.exists(os.path.join(folder, name)) for name in PADDLE_WEIGHTS):
        return None
    index = os.path.join(folder, SAFE_INDEX)
    if os.path.exists(index):
        with open(index, encoding="utf-8") as f:
            names = sorted(set(json.load(f)["weight_map"].values()))
    elif os.path.exists(os.path.join(folder, SAFE_WEIGHTS)):
        names = [SAFE_WEIGHTS]
    else:
        pickles = [name for name in TORCH_PICKLES if os.path.exists(os.path.join(folder, name))]
        if pickles:
            raise ValueError(
                f"{folder} holds PyTorch pickle weights ({pickles[0]}) and no safetensors: save them as safetensors "
                "first (transformers: model.save_pretrained(folder, safe_serialization=True))"
            )
        return None
    paths = [os.path.join(folder, name) for name in names]
    with safe_open(paths[0], framework="np") as f:
        metadata, keys = f.metadata() or {}, list(f.keys())
    return paths, metadata.get("format") == "pt" or (not metadata and any(k.startswith(f"{HF_BACKBONE}.") for k in keys))


def paddle_name(hf_name, prefix):
    """The Paddle parameter name of a tensor of a Hugging Face folder (`prefix`: the backbone's name)."""
    head, _, rest = hf_name.partition(".")
    return {HF_BACKBONE: f"{prefix}.{rest}", HF_SCORE: f"{SCORE_HEAD}.{rest}"}.get(head, hf_name)


def hf_name(name, prefix):
    """The Hugging Face name of a Paddle parameter: paddle_name's inverse."""
    head, _, rest = name.partition(".")
    return {prefix: f"{HF_BACKBONE}.{rest}", SCORE_HEAD: f"{HF_SCORE}.{rest}"}.get(head, name)


def is_transposed(name, shape):
    """Whether Paddle stores the tensor `name` of `shape` as the transpose of PyTorch's: every matrix but the
    embedding (Linear layers and an untied LM head keep [in, out]; a tied LM head is the embedding itself)."""
    return len(shape) == 2 and not name.endswith("embed_tokens.weight")


def model_class_config(folder, options):
    """read_config's (config, model keyword arguments), for a folder that stores every projection apart."""
    config, model_kwargs = read_config(folder, options)
    fused = [flag for flag in FUSED_LAYOUT_FLAGS if getattr(config, flag, False)]
    if fused:
        raise ValueError(f"{fused} fuse projections that {folder} (Hugging Face layout) stores apart: load it without them")
    return config, model_kwargs


def build_model(folder, class_for_config, options):
    """The model class `class_for_config(config)` built from `folder`'s config.json with `options`, its
    parameters not yet created (Paddle's LazyGuard): each is created from the folder's tensor, without the
    random initialisation that was most of a load's time."""
    config, model_kwargs = model_class_config(folder, options)
    with paddle.LazyGuard(), no_init_weights():
        model = class_for_config(config)._from_config(config, dtype=config.dtype, **model_kwargs)
    return use_rope_tables(model)


def tensor_index(folder, paths, model, hf_layout):
    """{name in `model.state_dict()`: (file, key)} of the safetensors `paths` of `folder` (`hf_layout`: named
    as transformers names them, else as paddlenlp does). A parameter the files lack is an error naming it,
    but for a score model's fresh head; tensors with no place in the model are logged, not loaded."""
    targets = model.state_dict()
    index, unused = {}, []
    for path in paths:
        with safe_open(path, framework="np") as f:
            keys = list(f.keys())
        for key in keys:
            name = paddle_name(key, model.base_model_prefix) if hf_layout else key
            if model.config.tie_word_embeddings and name == "lm_head.weight":
                continue  # some tools save a tied head anyway; the model's is the embedding, loaded as such
            if name in targets:
                index[name] = (path, key)
            elif not key.endswith(IGNORED_SUFFIXES):
                unused.append(key)
    missing = [name for name in unloaded(targets, index) if not name.startswith(fresh_parts(model))]
    if missing:
        raise ValueError(f"{folder} has no tensor for {missing[:8]}{' ...' if len(missing) > 8 else ''} ({len(missing)} missing)")
    if unused:
        logger.warning(f"{len(unused)} tensors of {folder} have no place in {type(model).__name__} and are not loaded: {unused[:8]}")
    return index


def unloaded(targets, index):
    """Names of `targets` (a state dict) whose tensor no `index` entry fills (a tied LM head is its embedding)."""
    loaded = {targets[name].name for name in index}
    return [name for name, tensor in targets.items() if tensor.name not in loaded]


def initialize_fresh_parts(model, index):
    """Create the parameters `index` does not fill (a score model's head and normalizer) of a model built by
    build_model, and give a score head paddlenlp's initialisation, which no_init_weights skipped."""
    targets = model.state_dict()
    fresh = unloaded(targets, index)
    for name in fresh:
        if not targets[name]._is_initialized():
            targets[name].initialize()
    if any(name.startswith(f"{SCORE_HEAD}.") for name in fresh):
        model._init_weights(model.score_head)


def by_file(index):
    """`index`'s (name, key) pairs grouped by file, in file order."""
    files = {}
    for name, (path, key) in index.items():
        files.setdefault(path, []).append((name, key))
    return sorted(files.items())


def hf_tensors(state, prefix, tied_embeddings):
    """A Paddle state dict under Hugging Face's names and layout (a tied LM head is the embedding, not saved)."""
    tensors = {}
    for name, tensor in state.items():
        if tied_embeddings and name == "lm_head.weight":
            continue
        tensors[hf_name(name, prefix)] = (tensor.T if is_transposed(name, tensor.shape) else tensor).contiguous()
    return tensors


def write_safetensors(tensors, folder, shard_bytes=SHARD_BYTES):
    """`tensors` as `model.safetensors`, or as numbered shards of at most `shard_bytes` with their index."""
    shards, size, total = [{}], 0, 0
    for key, tensor in tensors.items():
        nbytes = tensor.numel().item() * tensor.element_size()
        if shards[-1] and size + nbytes > shard_bytes:
            shards.append({})
            size = 0
        shards[-1][key] = tensor
        size += nbytes
        total += nbytes
    if len(shards) == 1:
        write_shard(shards[0], os.path.join(folder, SAFE_WEIGHTS))
        return
    weight_map = {}
    for i, shard in enumerate(shards, start=1):
        name = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        write_shard(shard, os.path.join(folder, name))
        weight_map.update(dict.fromkeys(shard, name))
    write_json({"metadata": {"total_size": total}, "weight_map": weight_map}, os.path.join(folder, SAFE_INDEX))


def write_shard(tensors, path):
    save_file(tensors, path, metadata={"format": "pt"})
    # safetensors creates the file owner-only; readable like the JSON files beside it (vLLM may serve as another user).
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)


def hf_config(config, dtype):
    """config.json as transformers writes it for this causal LM."""
    if config.model_type not in HF_ARCHITECTURES:
        raise ValueError(f"no Hugging Face layout known for model_type {config.model_type!r}; known: {sorted(HF_ARCHITECTURES)}")
    keys = {key: getattr(config, key) for key in HF_CONFIG_KEYS if hasattr(config, key)}
    return {"architectures": [HF_ARCHITECTURES[config.model_type]], "model_type": config.model_type, **keys, "use_cache": True, "torch_dtype": dtype}


def generation_config(tokenizer, config):
    """generation_config.json: the ids a response ends at (tokens.end_ids: the EOS and those of the folder the model
    came from; the pad token too where it differs, as Qwen2.5 lists <|im_end|> and <|endoftext|>) and pads with."""
    ends = list(dict.fromkeys([*end_ids(tokenizer), *([tokenizer.pad_token_id] if tokenizer.pad_token_id is not None else [])]))
    return {"bos_token_id": config.bos_token_id, "eos_token_id": ends, "pad_token_id": tokenizer.pad_token_id}


def save_hf_folder(model, folder, tokenizer, state=None, shard_bytes=SHARD_BYTES):
    """`model` (a causal LM of a family the loaders take; `state`: its whole weights when they are not `model.state_dict()`,
    such as LoRA-merged or gathered from tensor-parallel ranks) written to `folder` in Hugging Face's
    layout with `tokenizer`, for transformers, vLLM and this project's loader."""
    save_hf_weights(model, folder, state, shard_bytes)
    write_json(generation_config(tokenizer, model.config), os.path.join(folder, "generation_config.json"))
    tokenizer.save_pretrained(folder)


def save_hf_weights(model, folder, state=None, shard_bytes=SHARD_BYTES):
    """The safetensors and config.json of `save_hf_folder`."""
    os.makedirs(folder, exist_ok=True)
    state = model.state_dict() if state is None else state
    tensors = hf_tensors(state, model.base_model_prefix, model.config.tie_word_embeddings)
    dtypes = {str(t.dtype).replace("paddle.", "") for t in tensors.values()}
    write_safetensors(tensors, folder, shard_bytes)
    write_json(hf_config(model.config, dtypes.pop() if len(dtypes) == 1 else "float32"), os.path.join(folder, "config.json"))


def write_json(value, path):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(value, f, indent=2, ensure_ascii=False)
        f.write("\n")

