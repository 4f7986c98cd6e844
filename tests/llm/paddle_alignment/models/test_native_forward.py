"""The native no-gradient forward (csrc/decoder_ops.cc, models/native_forward.py) against paddlenlp's own
Qwen2/Llama forward, in the log-prob pass and in the static-cache decode loop, and its fallbacks."""

import copy
import logging
import os
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import paddle
import pytest
from paddlenlp.peft import LoRAConfig, LoRAModel
from paddlenlp.transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from helpers import REPO_ROOT, built_paddlenlp_ops
from paddle_alignment.algos.token_stats import gather_logprobs, position_ids_from_mask, tempered_logits
from paddle_alignment.cpu_runtime import cpu_vendor_and_flags, mkl_local_threads, mklml, read_cpuinfo
from paddle_alignment.experience import Experience
from paddle_alignment.models import native_forward, ppo_model_utils
from paddle_alignment.models.fused_kernels import ATTENTION_OPS, FUSED_OPS
from paddle_alignment.models.fused_kernels import SWITCH as FUSED_SWITCH
from paddle_alignment.models.head_logprobs import head_logits, head_token_stats
from paddle_alignment.models.native_forward import NATIVE_OPS, NativeDecoder
from paddle_alignment.models.native_forward import SWITCH as NATIVE_SWITCH
from paddle_alignment.models.shared_prompts import shared_prompt_groups
from paddle_alignment.models.static_cache_decoder import StaticCacheDecoder
from paddle_alignment.rollout import worker as worker_module
from paddle_alignment.rollout.worker import RolloutWorker

TOLERANCE = dict(rtol=1e-5, atol=1e-5)
VOCAB = 97


@pytest.fixture(scope="module")
def ops():
    return built_paddlenlp_ops(FUSED_OPS + ATTENTION_OPS + NATIVE_OPS)


def tiny_model(architecture, tie_word_embeddings=False, max_positions=64, **overrides):
    """A random tiny model with GQA (4 heads, 2 kv heads) and non-default rope_theta and rms_norm_eps."""
    config_class, model_class = {"qwen2": (Qwen2Config, Qwen2ForCausalLM), "llama": (LlamaConfig, LlamaForCausalLM)}[architecture]
    config = config_class(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=max_positions, rope_theta=5000.0, rms_norm_eps=1e-5,
        tie_word_embeddings=tie_word_embeddings, **overrides,
    )
    paddle.seed(0)
    model = model_class(config)
    model.eval()
    return model


def padded_batch(prompt_lengths, prompt_len, response_lengths, response_len):
    """Left-padded prompts and right-padded responses: input_ids and attention_mask [B, P + R]."""
    rows = len(prompt_lengths)
    mask = np.zeros([rows, prompt_len + response_len], "int64")
    for row, (p, r) in enumerate(zip(prompt_lengths, response_lengths)):
        mask[row, prompt_len - p : prompt_len + r] = 1
    ids = np.random.default_rng(1).integers(0, VOCAB, mask.shape)
    return paddle.to_tensor(ids), paddle.to_tensor(mask)


MODELS = [("qwen2", False), ("qwen2", True), ("llama", False), ("llama", True)]


@pytest.mark.parametrize("architecture, tied, overrides", [*((*m, {}) for m in MODELS), ("qwen2", False, {"fuse_attention_ffn": True})],
                         ids=[*(f"{a}-{t}" for a, t in MODELS), "qwen2-fused-ffn"])
def test_response_hidden_states_and_logprobs_match_paddlenlp(ops, architecture, tied, overrides):
    model = tiny_model(architecture, tied, **overrides)
    prompt_len = 5
    input_ids, mask = padded_batch([5, 2, 3, 1], prompt_len, [6, 3, 1, 6], 6)
    with paddle.no_grad():
        eager = model(input_ids=input_ids, attention_mask=mask, position_ids=position_ids_from_mask(mask), return_dict=True)
        expected = eager.logits[:, prompt_len - 1 : -1]
        native = NativeDecoder.for_model(model)
        assert native is not None and native.has_qkv_bias == (architecture == "qwen2")
        assert native.transpose_lm_head == tied
        hidden = native.response_hidden(input_ids, mask, prompt_len)
        logits = head_logits(hidden, native.lm_head.weight, native.lm_head.transpose)
        labels, temperature = input_ids[:, prompt_len:], 0.7
        # 24 response positions, 5 at a time through the head
        logprobs, _ = head_token_stats(hidden, native.lm_head.weight, native.lm_head.transpose, labels, temperature, 5)
    np.testing.assert_allclose(logits.numpy(), expected.numpy(), **TOLERANCE)
    np.testing.assert_allclose(logprobs.numpy(), gather_logprobs(tempered_logits(expected, temperature), labels).numpy(), **TOLERANCE)


def test_long_sequences_match_paddlenlp_across_attention_blocks(ops):
    """Sequences of 340 positions: the op's attention runs queries in blocks of 128 (a partial last one), and
    left padding of 163 positions hides keys from whole blocks of one row."""
    model = tiny_model("qwen2", max_positions=512)
    prompt_len = 300
    input_ids, mask = padded_batch([300, 137], prompt_len, [40, 12], 40)
    with paddle.no_grad():
        eager = model(input_ids=input_ids, attention_mask=mask, position_ids=position_ids_from_mask(mask), return_dict=True)
        native = NativeDecoder.for_model(model)
        hidden = native.response_hidden(input_ids, mask, prompt_len)
        logits = head_logits(hidden, native.lm_head.weight, native.lm_head.transpose)
    real = mask[:, prompt_len:].numpy().astype(bool)
    np.testing.assert_allclose(logits.numpy()[real], eager.logits[:, prompt_len - 1 : -1].numpy()[real], **TOLERANCE)


def decode(model, prompt_ids, prompt_mask, steps):
    """Greedy decoding through the static-cache decoder: (tokens [B, steps], logits [steps + 1, B, V], its native
    session or None)."""
    decoder = StaticCacheDecoder(model, prompt_ids.shape[0], prompt_ids.shape[1] + steps, prompt_mask)
    logits, tokens = [decoder.prefill(prompt_ids)], []
    for _ in range(steps):
        tokens.append(paddle.argmax(logits[-1], axis=-1))
        logits.append(decoder.step(tokens[-1]))
    return np.stack([t.numpy() for t in tokens], 1), np.stack([l.numpy() for l in logits]), decoder.native


@pytest.mark.parametrize("architecture, tied", MODELS[::3])
def test_decode_loop_matches_the_eager_decoder(ops, architecture, tied, monkeypatch):
    model = tiny_model(architecture, tied)
    prompt_ids, prompt_mask = padded_batch([6, 2, 4], 6, [0, 0, 0], 0)
    with paddle.no_grad():
        tokens, logits, native = decode(model, prompt_ids, prompt_mask, steps=10)
        monkeypatch.setenv(NATIVE_SWITCH, "off")
        eager_tokens, eager_logits, eager_native = decode(model, prompt_ids, prompt_mask, steps=10)
    assert native and not eager_native
    np.testing.assert_array_equal(tokens, eager_tokens)
    np.testing.assert_allclose(logits, eager_logits, **TOLERANCE)


@pytest.mark.parametrize("overrides", [{}, {"fuse_attention_ffn": True}], ids=["separate-ffn", "fused-ffn"])
def test_few_row_products_cut_across_mkl_threads_equal_whole_ones(ops, overrides):
    """The decode step's products of few rows run as column slices, one per MKL thread (csrc/common/mkl_gemm.h,
    uneven slices of the untied head's 97 columns included): on two threads they give what one thread's whole
    products give."""
    model = tiny_model("qwen2", **overrides)
    prompt_ids, prompt_mask = padded_batch([6, 2, 4], 6, [0, 0, 0], 0)
    with paddle.no_grad(), mkl_local_threads(2):
        assert mklml().MKL_Get_Max_Threads() == 2
        tokens, logits, native = decode(model, prompt_ids, prompt_mask, steps=6)
        with mkl_local_threads(1):
            whole_tokens, whole_logits, _ = decode(model, prompt_ids, prompt_mask, steps=6)
    assert native
    np.testing.assert_array_equal(tokens, whole_tokens)
    np.testing.assert_allclose(logits, whole_logits, **TOLERANCE)


@pytest.mark.parametrize("architecture, tied, overrides", [*((*m, {}) for m in MODELS[:3]), ("qwen2", False, {"fuse_attention_ffn": True})],
                         ids=[*(f"{a}-{t}" for a, t in MODELS[:3]), "qwen2-fused-ffn"])
def test_sessions_of_few_rows_and_many_steps_run_on_packed_weights(ops, monkeypatch, architecture, tied, overrides):
    """A decode session of at most PACKED_MAX_ROWS rows and at least PACKED_MIN_STEPS new tokens, on a model of at least
    PACKED_MIN_PARAMETERS parameters, passes MKL's packed form of its large products' weights after the model's
    (native_packed_products): its logits equal the eager decoder's."""
    monkeypatch.setattr(native_forward, "PACKED_MIN_STEPS", 6)
    model = tiny_model(architecture, tied, **overrides)
    native = NativeDecoder.for_model(model)
    assert native.for_session(1, 100) is native  # a model under PACKED_MIN_PARAMETERS
    monkeypatch.setattr(native_forward, "PACKED_MIN_PARAMETERS", native.parameters)
    assert native.for_session(native_forward.PACKED_MAX_ROWS + 1, 100) is native
    assert native.for_session(native_forward.PACKED_MAX_ROWS, 5) is native
    packed = native.for_session(1, 6).weights
    assert len(packed) == len(native.weights) + 1 and all(p is w for p, w in zip(packed, native.weights))
    assert packed[-1].ndim == 1 and packed[-1].dtype == paddle.float32
    prompt_ids, prompt_mask = padded_batch([6, 2, 4], 6, [0, 0, 0], 0)
    with paddle.no_grad():
        tokens, logits, session = decode(model, prompt_ids, prompt_mask, steps=6)
        monkeypatch.setenv(NATIVE_SWITCH, "off")
        eager_tokens, eager_logits, _ = decode(model, prompt_ids, prompt_mask, steps=6)
    assert len(session.decoder.weights) == len(native.weights) + 1
    np.testing.assert_array_equal(tokens, eager_tokens)
    np.testing.assert_allclose(logits, eager_logits, **TOLERANCE)


@pytest.mark.parametrize("rows", [1, 16, 17, 40])
@pytest.mark.parametrize("form", ["on", "off"])
def test_a_packed_decode_step_equals_the_plain_one_in_either_form(ops, monkeypatch, rows, form):
    """A session's packed weights record their form: panels on a CPU with AVX-512 unless
    PADDLE_ALIGNMENT_PANEL_PRODUCTS=off, else MKL's packed form. Either way a decode step on them equals the step on the
    plain weights, at row counts of one row block of the panel products (16 rows), part of one, and several (the
    tiny model's widths, 64, 96 and a vocabulary of 97, leave partial and single panels too)."""
    monkeypatch.setattr(native_forward, "PACKED_MIN_PARAMETERS", 0)
    monkeypatch.setenv("PADDLE_ALIGNMENT_PANEL_PRODUCTS", form)
    native = NativeDecoder.for_model(tiny_model("qwen2", tie_word_embeddings=rows % 2 == 0))
    packed = native.for_session(rows, native_forward.PACKED_MIN_STEPS)
    avx512 = "avx512f" in cpu_vendor_and_flags(read_cpuinfo())[1]
    assert packed.weights[-1][0].item() == (2.0 if avx512 and form == "on" else 1.0)
    rng = np.random.default_rng(rows)
    length = 9
    cache = paddle.to_tensor(rng.normal(size=native.cache_shape[:2] + [rows] + native.cache_shape[3:4] + [length]
                                        + native.cache_shape[5:]).astype("float32"))
    inputs = (paddle.to_tensor(rng.integers(0, VOCAB, size=(rows, 1))), paddle.full([rows, 1], length - 1, dtype="int64"),
              paddle.to_tensor(rng.integers(0, 2, size=(rows, length)) | np.eye(1, length, length - 1, dtype="int64")))
    with paddle.no_grad():
        steps = [decoder(*inputs, cache.clone(), native.rope_tables(length), length - 1, 0, 1).numpy()
                 for decoder in (packed, native)]
    np.testing.assert_allclose(*steps, **TOLERANCE)


def test_a_session_packs_once_its_decode_rows_are_few(ops, monkeypatch):
    """A session decides at each decode step, on the rows that step runs: prompts repeated past PACKED_MAX_ROWS run on
    the plain weights, packed once finished rows leave few enough with PACKED_MIN_STEPS to go, and kept packed to
    the end; the logits equal the eager decoder's throughout."""
    for name, value in (("PACKED_MIN_PARAMETERS", 0), ("PACKED_MAX_ROWS", 2), ("PACKED_MIN_STEPS", 4)):
        monkeypatch.setattr(native_forward, name, value)
    model = tiny_model("qwen2")
    prompt_ids, prompt_mask = padded_batch([6, 2], 6, [0, 0], 0)

    def run():
        decoder = StaticCacheDecoder(model, 2, 6 + 6, prompt_mask)
        logits = [paddle.repeat_interleave(decoder.prefill(prompt_ids), 2, axis=0)]
        decoder.repeat_rows(2)  # 4 rows
        packed = []
        for kept in (None, [0, 3], [1], None, None):  # 4 rows with 6 steps to go, 2 with 5, 1 with 4, 3, 2
            tokens = paddle.argmax(logits[-1], axis=-1)
            if kept is not None:
                decoder.keep_rows(paddle.to_tensor(kept, dtype="int64"))
                tokens = paddle.index_select(tokens, paddle.to_tensor(kept, dtype="int64"))
            logits.append(decoder.step(tokens))
            packed.append(decoder.native and decoder.native.decoder.packed)
        return [l.numpy() for l in logits], packed

    with paddle.no_grad():
        logits, packed = run()
        monkeypatch.setenv(NATIVE_SWITCH, "off")
        eager_logits, _ = run()
    assert packed == [False, True, True, True, True]
    for mine, eager in zip(logits, eager_logits):
        np.testing.assert_allclose(mine, eager, **TOLERANCE)


def test_packed_products_read_the_weights_as_they_were_packed(ops, monkeypatch):
    """The session's products of few rows read the packed weights, not the model's tensors: changed after packing,
    the q and down weights change the plain forward's logits and not the packed one's."""
    monkeypatch.setattr(native_forward, "PACKED_MIN_PARAMETERS", 0)
    model = tiny_model("qwen2")
    native = NativeDecoder.for_model(model)
    packed = native.for_session(3, native_forward.PACKED_MIN_STEPS)
    input_ids, mask = padded_batch([6, 2, 4], 6, [0, 0, 0], 0)

    def logits(decoder):
        return decoder(input_ids, paddle.tile(paddle.arange(6)[None], [3, 1]), mask, decoder.new_cache(3, 6),
                       decoder.rope_tables(6), 0, 0, 6).numpy()

    with paddle.no_grad():
        before = logits(native)
        for layer in model.qwen2.layers:
            for weight in (layer.self_attn.q_proj.weight, layer.mlp.down_proj.weight):
                weight.set_value(weight * 2)
        np.testing.assert_allclose(logits(packed), before, **TOLERANCE)
        assert np.abs(logits(native) - before).max() > 1e-2


@pytest.mark.parametrize("buffer, error", [
    (np.zeros(16), "packed products do not start with the form native_packed_products records"),
    (np.ones(32), "packed products has the wrong shape"),  # MKL's form recorded (1), but no room for the products
])
def test_a_packed_buffer_that_does_not_fit_the_model_is_refused(ops, buffer, error):
    native = copy.copy(NativeDecoder.for_model(tiny_model("qwen2")))
    native.weights = native.weights + [paddle.to_tensor(buffer, dtype="float32")]
    input_ids, mask = padded_batch([3], 3, [0], 0)
    with paddle.no_grad(), pytest.raises(Exception, match=error):
        native(input_ids, paddle.arange(3)[None], mask, native.new_cache(1, 3), native.rope_tables(3), 0, 0, 3)


def test_decode_after_long_prompts_matches_the_eager_decoder(ops, monkeypatch):
    model = tiny_model("llama", max_positions=512)
    prompt_ids, prompt_mask = padded_batch([300, 137], 300, [0, 0], 0)
    with paddle.no_grad():
        tokens, logits, native = decode(model, prompt_ids, prompt_mask, steps=4)
        monkeypatch.setenv(NATIVE_SWITCH, "off")
        eager_tokens, eager_logits, _ = decode(model, prompt_ids, prompt_mask, steps=4)
    assert native
    np.testing.assert_array_equal(tokens, eager_tokens)
    np.testing.assert_allclose(logits, eager_logits, **TOLERANCE)


@pytest.mark.parametrize("switch", [FUSED_SWITCH, NATIVE_SWITCH])
def test_switched_off_runs_the_models_own_forward(ops, monkeypatch, switch):
    assert NativeDecoder.for_model(tiny_model("qwen2")) is not None
    monkeypatch.setenv(switch, "off")
    assert NativeDecoder.for_model(tiny_model("qwen2")) is None


def test_unsupported_models_fall_back_with_one_warning(ops, caplog):
    model = tiny_model("qwen2")
    lora = LoRAModel(model, LoRAConfig(target_modules=[".*q_proj.*"], r=2, lora_alpha=4))
    half = tiny_model("llama")
    assert NativeDecoder.for_model(half) is not None
    half.to(dtype="bfloat16")  # after a first pass: its structure is kept, its weights are checked at every pass
    native_forward.warn_unsupported.cache_clear()
    with caplog.at_level(logging.WARNING, logger=native_forward.logger.name):
        assert NativeDecoder.for_model(lora) is None and NativeDecoder.for_model(lora) is None
        assert NativeDecoder.for_model(half) is None
    # Only this module's records: pytest 9's caplog also holds other loggers' (paddlenlp's).
    warnings = [r.getMessage() for r in caplog.records if r.name == native_forward.logger.name]
    assert len(warnings) == 2, warnings
    assert "LoRA" in warnings[0] and "float32" in warnings[1]


def test_shared_prompt_logprobs_match_the_whole_rows(ops, monkeypatch):
    """share_prompt_forward in the log-prob passes: the native op and Paddle's forward, each running a prompt once
    for the rows that share it (rows 0 and 1, 2 and 3; left-padded apart, responses right-padded apart), give the
    log-probs of the whole rows."""
    model = tiny_model("qwen2")
    input_ids, mask = padded_batch([5, 5, 3, 3], 5, [4, 2, 1, 3], 4)
    ids = input_ids.numpy()
    ids[1, :5], ids[3, :5] = ids[0, :5], ids[2, :5]
    input_ids = paddle.to_tensor(ids)
    exp = Experience(input_ids, mask, mask[:, 5:].astype("float32"), paddle.arange(4), paddle.ones([4], "bool"),
                     [""] * 4, [""] * 4, [""] * 4)
    args = SimpleNamespace(per_device_logprob_batch_size=4, max_dec_len=4, min_dec_len=0, temperature=0.7, top_p=1.0,
                           repetition_penalty=1.0, top_k=0, logprob_chunk_tokens=3, use_dynamic_batch_size=True,
                           max_token_len_per_device=-1, tool_paths=[], environment_paths=[], share_prompt_forward=False)
    worker = RolloutWorker(args, model, tokenizer=None, reward_scorer=None)
    whole = worker.compute_logprobs(model, exp).numpy()
    args.share_prompt_forward = True
    shared_groups, shared_hidden = [], []
    monkeypatch.setattr(worker_module, "shared_prompt_groups", lambda e: shared_groups.append(shared_prompt_groups(e)) or shared_groups[-1])
    original = ppo_model_utils.shared_prompt_hidden
    monkeypatch.setattr(ppo_model_utils, "shared_prompt_hidden", lambda *a: shared_hidden.append(1) or original(*a))
    native = worker.compute_logprobs(model, exp).numpy()
    monkeypatch.setenv(NATIVE_SWITCH, "off")
    eager = worker.compute_logprobs(model, exp).numpy()
    # one micro-batch (its rows in order of length), two prompts of two rows each, in each pass
    assert [np.bincount(g[1].numpy()).tolist() for g in shared_groups] == [[2, 2]] and shared_hidden == [1]
    np.testing.assert_allclose(native, whole, **TOLERANCE)
    np.testing.assert_allclose(eager, whole, **TOLERANCE)


def test_the_op_reads_parameters_replaced_after_its_first_pass(ops):
    model = tiny_model("qwen2")
    q_proj = model.qwen2.layers[1].self_attn.q_proj
    first = NativeDecoder.for_model(model).weights  # where each tensor lives is found once per model
    index = next(i for i, w in enumerate(first) if w is q_proj.weight)
    q_proj.weight = paddle.create_parameter(q_proj.weight.shape, "float32")
    model.lm_head.weight = paddle.create_parameter(model.lm_head.weight.shape, "float32")
    weights = NativeDecoder.for_model(model).weights
    assert weights[index] is q_proj.weight and first[index] is not q_proj.weight
    assert weights[-1] is model.lm_head.weight and first[-1] is not model.lm_head.weight


def test_trainer_logprobs_match_the_eager_pass(ops, monkeypatch):
    model = tiny_model("qwen2")
    input_ids, mask = padded_batch([5, 2, 3], 5, [4, 2, 1], 4)
    response_mask = mask[:, 5:].astype("float32")
    exp = Experience(input_ids, mask, response_mask, paddle.arange(3), paddle.ones([3], "bool"), [""] * 3, [""] * 3, [""] * 3)
    # Two micro-batches of 2 and 1 rows, at temperature 0.7, the head applied to 3 positions at a time.
    args = SimpleNamespace(per_device_logprob_batch_size=2, max_dec_len=4, min_dec_len=0, temperature=0.7, top_p=1.0,
                           repetition_penalty=1.0, top_k=0, logprob_chunk_tokens=3,
                           use_dynamic_batch_size=True, max_token_len_per_device=-1, tool_paths=[], environment_paths=[],
                           share_prompt_forward=False)
    worker = RolloutWorker(args, model, tokenizer=None, reward_scorer=None)
    assert NativeDecoder.for_model(model) is not None
    native = worker.compute_logprobs(model, exp)
    monkeypatch.setenv(NATIVE_SWITCH, "off")
    eager = worker.compute_logprobs(model, exp)
    np.testing.assert_allclose(native.numpy(), eager.numpy(), **TOLERANCE)


def test_bench_native_forward_prints_its_figure(ops):
    script = os.path.join(REPO_ROOT, "benchmarks", "bench_native_forward.py")
    result = subprocess.run([sys.executable, script, "--repeats", "1"], capture_output=True, text=True, timeout=300,
                            env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert result.returncode == 0, result.stderr[-3000:]
    last = result.stdout.strip().splitlines()[-1]
    assert last.startswith("reference_speedup=") and float(last.split("=")[1]) > 0
