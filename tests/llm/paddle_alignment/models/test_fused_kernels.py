"""The fused model ops of paddlenlp_ops (csrc/fused_ops.cc) against Paddle's unfused ops, values and
gradients, and paddlenlp's Qwen2/Llama with the ops put in (models/fused_kernels.py) against the same models
without them."""

import copy
from types import SimpleNamespace

import numpy as np
import paddle
import paddle.nn.functional as F
import pytest
from paddlenlp.transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM
from paddlenlp.transformers.llama import modeling as llama_modeling
from paddlenlp.transformers.qwen2 import modeling as qwen2_modeling

from helpers import built_paddlenlp_ops
from paddle_alignment.algos.token_stats import (
    entropy_from_logits,
    gather_logprobs,
    position_ids_from_mask,
    tempered_logits,
)
from paddle_alignment.models import fused_kernels
from paddle_alignment.models.fused_kernels import (
    ATTENTION_OPS,
    FUSED_OPS,
    rms_norm_reference,
    rotary_reference,
    token_logprobs_and_entropy,
    use_fused_kernels,
    use_unfused_kernels,
)

# float32 kernels against float32 Paddle ops: 1e-5 relative, plus 1e-5 absolute for values near 0.
TOLERANCE = dict(rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def ops():
    return built_paddlenlp_ops(FUSED_OPS + ATTENTION_OPS)


def tensor(array, grad=True):
    t = paddle.to_tensor(np.asarray(array))
    t.stop_gradient = not grad
    return t


def assert_close(actual, expected, **tolerance):
    np.testing.assert_allclose(np.asarray(actual), np.asarray(expected), **(tolerance or TOLERANCE))


def assert_close_summed(actual, expected, err_msg=""):
    """For gradients that sum over many rows (a norm's weight, a model's parameters): float32 summation order
    alone moves an element whose terms cancel by more than 1e-5 of its own value, so the tolerance is 1e-5
    of the tensor's largest element."""
    expected = np.asarray(expected)
    scale = float(np.abs(expected).max()) if expected.size else 0.0
    np.testing.assert_allclose(np.asarray(actual), expected, rtol=1e-5, atol=1e-5 * max(scale, 1.0), err_msg=err_msg)


def rms_norm_weight_grad64(x, inv_rms, g):
    """d(sum(out * g))/d weight in float64: sum over rows of g * x * inv_rms."""
    x64, g64 = np.asarray(x, "float64"), np.asarray(g, "float64")
    rows = x64.reshape(-1, x64.shape[-1]) * np.asarray(inv_rms, "float64").reshape(-1, 1)
    return (rows * g64.reshape(rows.shape)).sum(axis=0)


def grads(outputs, inputs, output_grads):
    """d(sum of output * output_grad)/d inputs (zeros for an input the sum does not reach); an output whose
    output_grad is None is left out of the sum."""
    pairs = [(o, g) for o, g in zip(outputs, output_grads) if g is not None]
    result = paddle.grad([o for o, _ in pairs], inputs, [g for _, g in pairs], allow_unused=True)
    return [np.zeros(x.shape, "float32") if g is None else g.numpy() for g, x in zip(result, inputs)]


RNG = np.random.default_rng(0)


def randn(*shape, scale=1.0):
    return (RNG.standard_normal(shape) * scale).astype("float32")


# ---- RMSNorm ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [[3, 5, 7], [64, 14, 128], [1, 130], [2, 1, 33]])
def test_rms_norm_matches_unfused(ops, shape):
    x, weight = tensor(randn(*shape, scale=3.0)), tensor(randn(shape[-1]) + 1.0)
    out, inv_rms = ops.fused_rms_norm(x, weight, 1e-6)
    reference = rms_norm_reference(x, weight, 1e-6)
    assert out.shape == reference.shape and inv_rms.shape == shape[:-1]
    assert_close(out, reference)
    g = tensor(randn(*shape), grad=False)
    (grad_x, grad_weight), (ref_grad_x, ref_grad_weight) = grads([out], [x, weight], [g]), grads([reference], [x, weight], [g])
    assert_close(grad_x, ref_grad_x)
    assert_close_summed(grad_weight, ref_grad_weight)
    x64 = x.numpy().astype("float64")
    inv64 = 1.0 / np.sqrt((x64**2).mean(-1) + 1e-6)
    assert_close(grad_weight, rms_norm_weight_grad64(x64, inv64, g.numpy()))


@pytest.mark.parametrize("shape", [[3, 5, 7], [64, 14, 128]])
def test_add_rms_norm_matches_unfused(ops, shape):
    x, residual, weight = tensor(randn(*shape)), tensor(randn(*shape)), tensor(randn(shape[-1]) + 1.0)
    out, total, _ = ops.fused_add_rms_norm(x, residual, weight, 1e-5)
    ref_total = x + residual
    ref_out = rms_norm_reference(ref_total, weight, 1e-5)
    assert_close(total, ref_total, rtol=0, atol=0)
    assert_close(out, ref_out)
    g_out, g_total = tensor(randn(*shape), grad=False), tensor(randn(*shape), grad=False)
    # Both outputs differentiated, then each alone (the other's gradient never arrives).
    for output_grads in ([g_out, g_total], [g_out, None], [None, g_total]):
        actual = grads([out, total], [x, residual, weight], output_grads)
        expected = grads([ref_out, ref_total], [x, residual, weight], output_grads)
        assert_close(actual[0], expected[0])
        assert_close(actual[1], expected[1])
        assert_close_summed(actual[2], expected[2])


# ---- SwiGLU ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [[5], [3, 7, 11], [64, 14, 512]])
def test_swiglu_matches_unfused(ops, shape):
    gate, up = tensor(randn(*shape, scale=4.0)), tensor(randn(*shape))
    out = ops.fused_swiglu(gate, up)
    reference = F.silu(gate) * up
    assert_close(out, reference)
    g = tensor(randn(*shape), grad=False)
    for actual, expected in zip(grads([out], [gate, up], [g]), grads([reference], [gate, up], [g])):
        assert_close(actual, expected)


def test_swiglu_extreme_gates(ops):
    """Large and tiny gates (exp's clamped range, silu's tails) against float64 NumPy: Paddle's own silu
    gradient overflows to inf/nan below about -88, where the fused one stays at its limit, 0."""
    values = np.array([-1e4, -200, -88.5, -87.4, -30, -1e-20, 0, 1e-20, 1e-3, 30, 88.5, 200, 1e4], "float32")
    ups = np.linspace(-2, 2, values.size).astype("float32")
    gate, up = tensor(values), tensor(ups)
    out = ops.fused_swiglu(gate, up)
    g64, u64 = values.astype("float64"), ups.astype("float64")
    s = 0.5 * (1.0 + np.tanh(0.5 * g64))  # sigmoid without overflow
    assert_close(out, g64 * s * u64)
    grad_gate, grad_up = grads([out], [gate, up], [tensor(np.ones(values.size, "float32"), grad=False)])
    assert_close(grad_gate, u64 * s * (1.0 + g64 * (1.0 - s)))
    assert_close(grad_up, g64 * s)


def test_fused_exp_over_float_range(ops):
    """The kernels' exp against NumPy's over the range softmax and sigmoid use (through swiglu with up = 1:
    silu(g) = g / (1 + exp(-g)))."""
    gate = np.linspace(-87, 87, 100003).astype("float32")
    out = ops.fused_swiglu(tensor(gate, grad=False), tensor(np.ones_like(gate), grad=False)).numpy()
    expected = gate.astype("float64") / (1.0 + np.exp(-gate.astype("float64")))
    np.testing.assert_allclose(out, expected, rtol=2e-7, atol=1e-30)


# ---- rotary embedding ------------------------------------------------------------------------------


def rope_tables(length, dim, base=10000.0):
    """Qwen2RotaryEmbedding's cos/sin tables, [1, L, 1, D]."""
    rope = qwen2_modeling.Qwen2RotaryEmbedding(dim, max_position_embeddings=length, base=base)
    return rope(paddle.zeros([1], "float32"), seq_len=length)


@pytest.mark.parametrize("batch,seq,q_heads,k_heads,dim", [(2, 5, 3, 1, 6), (64, 14, 4, 2, 32), (1, 1, 2, 2, 2)])
def test_rotary_matches_paddlenlp(ops, batch, seq, q_heads, k_heads, dim):
    length = seq + 7
    cos, sin = rope_tables(length, dim)
    q, k = tensor(randn(batch, seq, q_heads, dim)), tensor(randn(batch, seq, k_heads, dim))
    # Positions as the trainer makes them: counted over real tokens of left-padded rows.
    mask = (np.arange(seq)[None, :] >= RNG.integers(0, seq, size=(batch, 1))).astype("int64")
    position_ids = position_ids_from_mask(paddle.to_tensor(mask)) + paddle.to_tensor(RNG.integers(0, 7, (batch, 1)))
    q_out, k_out = ops.fused_rotary(q, k, cos, sin, position_ids)
    original = fused_kernels.UNFUSED_ROTARY.get(qwen2_modeling, qwen2_modeling.apply_rotary_pos_emb)
    q_ref, k_ref = original(q, k, cos, sin, position_ids)
    assert_close(q_out, q_ref)
    assert_close(k_out, k_ref)
    q_alt, k_alt = rotary_reference(q, k, cos, sin, position_ids)
    assert_close(q_alt, q_ref, rtol=0, atol=0)
    g_q, g_k = tensor(randn(*q.shape), grad=False), tensor(randn(*k.shape), grad=False)
    for output_grads in ([g_q, g_k], [g_q, None], [None, g_k]):
        actual = grads([q_out, k_out], [q, k], output_grads)
        expected = grads([q_ref, k_ref], [q, k], output_grads)
        for a, e in zip(actual, expected):
            assert_close(a, e)


def test_rotary_refuses_positions_outside_the_table(ops):
    cos, sin = rope_tables(4, 2)
    q = tensor(randn(1, 2, 1, 2))
    with pytest.raises(Exception, match="outside the cos/sin table"):
        ops.fused_rotary(q, q, cos, sin, paddle.to_tensor([[0, 4]], dtype="int64"))


# ---- core attention --------------------------------------------------------------------------------


def decoder_mask(padding, queries, keys):
    """paddlenlp's additive attention mask for left-padded rows (`padding` [B] pad tokens each) whose last
    `queries` of `keys` positions are queried: [B, 1, queries, keys], 0 or float32's lowest value."""
    attention_mask = paddle.to_tensor((np.arange(keys)[None, :] >= np.asarray(padding)[:, None]).astype("int64"))
    return qwen2_modeling.Qwen2Model._prepare_decoder_attention_mask(
        attention_mask, (len(padding), queries), keys - queries, paddle.float32
    )


def unfused_attention(modeling, q, k, v, mask):
    """paddlenlp's own path: k and v heads repeated, then scaled_dot_product_attention (no dropout)."""
    repeat_kv = fused_kernels.UNFUSED_REPEAT_KV.get(modeling, modeling.repeat_kv)
    groups = q.shape[2] // k.shape[2]
    config = SimpleNamespace(use_flash_attention=False, attention_dropout=0.0, context_parallel_degree=1)
    return modeling.scaled_dot_product_attention(q, config, repeat_kv(k, groups), repeat_kv(v, groups), mask, False)


# (batch, queries, keys, q_heads, kv_heads, head_dim): grouped heads, one kv head, plain multi-head, the
# demo's shape, one query over a cache (decoding), and 300 queries (the op's blocks of 128, a partial one).
ATTENTION_SHAPES = [(3, 9, 9, 4, 2, 8), (2, 5, 5, 3, 1, 6), (2, 7, 7, 2, 2, 4), (64, 14, 14, 4, 2, 32), (3, 1, 6, 4, 2, 8),
                    (2, 300, 300, 4, 2, 16)]


@pytest.mark.parametrize("modeling", [qwen2_modeling, llama_modeling], ids=["qwen2", "llama"])
@pytest.mark.parametrize("batch,queries,keys,q_heads,kv_heads,dim", ATTENTION_SHAPES)
def test_attention_matches_paddlenlp(ops, modeling, batch, queries, keys, q_heads, kv_heads, dim):
    # Left padding of up to keys - 1 tokens: pad queries attend to no key at all (paddlenlp's softmax then
    # spreads them evenly), which the fused op must reproduce, gradients included.
    padding = RNG.integers(0, keys, size=batch)
    padding[0] = 0
    mask = decoder_mask(padding, queries, keys)
    q = tensor(randn(batch, queries, q_heads, dim, scale=2.0))
    k, v = tensor(randn(batch, keys, kv_heads, dim, scale=2.0)), tensor(randn(batch, keys, kv_heads, dim))
    out, softmax_stats = ops.fused_attention(q, k, v, mask, 1.0 / np.sqrt(dim))
    reference = unfused_attention(modeling, q, k, v, mask)
    # What the backward keeps grows with the queries, not queries x keys: each row's top score and 1 / its sum.
    assert out.shape == reference.shape == [batch, queries, q_heads * dim] and softmax_stats.shape == [batch, q_heads, queries, 2]
    assert_close(out, reference)
    g = tensor(randn(*reference.shape), grad=False)
    for actual, expected in zip(grads([out], [q, k, v], [g]), grads([reference], [q, k, v], [g])):
        assert_close_summed(actual, expected)  # sums over up to 300 queries, in another order


def test_attention_refuses_mismatched_heads(ops):
    q, k = tensor(randn(1, 2, 3, 4)), tensor(randn(1, 2, 2, 4))
    with pytest.raises(Exception, match="must divide"):
        ops.fused_attention(q, k, k, decoder_mask([0], 2, 2), 0.5)


# ---- token log-probs and entropy -------------------------------------------------------------------


def reference_token_stats(logits, labels, temperature):
    tempered = tempered_logits(logits, temperature)
    return gather_logprobs(tempered, labels), entropy_from_logits(tempered)


@pytest.mark.parametrize("shape,vocab", [([7], 5), ([3, 4], 259), ([2, 3], 1031), ([64, 8], 259)])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_token_logprobs_match_unfused(ops, shape, vocab, temperature):
    logits = tensor(randn(*shape, vocab, scale=3.0))
    labels = paddle.to_tensor(RNG.integers(0, vocab, size=shape).astype("int64"))
    logprobs, entropy, _ = ops.fused_token_logprobs(logits, labels, temperature)
    ref_logprobs, ref_entropy = reference_token_stats(logits, labels, temperature)
    assert_close(logprobs, ref_logprobs)
    assert_close(entropy, ref_entropy)
    g_lp, g_h = tensor(randn(*shape), grad=False), tensor(randn(*shape), grad=False)
    # Both differentiated (an entropy bonus), and each alone (log-probs only: entropy_coeff 0).
    for output_grads in ([g_lp, g_h], [g_lp, None], [None, g_h]):
        actual = grads([logprobs, entropy], [logits], output_grads)
        expected = grads([ref_logprobs, ref_entropy], [logits], output_grads)
        assert_close(actual[0], expected[0])


def test_token_logprobs_ignore_index_and_range(ops):
    logits = tensor(randn(3, 6))
    labels = paddle.to_tensor([2, -100, 5], dtype="int64")
    logprobs, entropy, _ = ops.fused_token_logprobs(logits, labels, 1.0)
    ref_logprobs, ref_entropy = reference_token_stats(logits, labels, 1.0)  # cross_entropy's ignore_index
    assert_close(logprobs, ref_logprobs)
    assert float(logprobs[1]) == 0.0
    (grad,) = paddle.grad([logprobs.sum()], [logits])
    (ref_grad,) = paddle.grad([ref_logprobs.sum()], [logits])
    assert_close(grad, ref_grad)
    with pytest.raises(Exception, match="outside"):
        ops.fused_token_logprobs(logits, paddle.to_tensor([0, 6, 1], dtype="int64"), 1.0)


def test_token_logprobs_and_entropy_function(ops):
    """The trainer-facing function: same as the reference composition, and its fallback (no ops) too."""
    logits = tensor(randn(4, 5, 37))
    labels = paddle.to_tensor(RNG.integers(0, 37, size=(4, 5)).astype("int64"))
    expected = reference_token_stats(logits, labels, 0.6)
    for actual in (token_logprobs_and_entropy(logits, labels, 0.6),):
        for a, e in zip(actual, expected):
            assert_close(a, e)


def test_functions_fall_back_without_the_ops(monkeypatch):
    """Without paddlenlp_ops (or for tensors the kernels do not take) the functions are Paddle's ops."""
    monkeypatch.setattr(fused_kernels, "fused_ops", lambda *args: None)
    logits = tensor(randn(2, 3, 11))
    labels = paddle.to_tensor(RNG.integers(0, 11, size=(2, 3)).astype("int64"))
    for a, e in zip(token_logprobs_and_entropy(logits, labels, 0.9), reference_token_stats(logits, labels, 0.9)):
        assert_close(a, e, rtol=0, atol=0)
    x, weight = tensor(randn(2, 8)), tensor(randn(8))
    assert_close(fused_kernels.rms_norm(x, weight, 1e-6), rms_norm_reference(x, weight, 1e-6), rtol=0, atol=0)
    assert use_fused_kernels(tiny_causal_lm(Qwen2ForCausalLM, Qwen2Config)) == 0


def test_functions_fall_back_for_other_dtypes(ops):
    x, weight = tensor(randn(2, 8).astype("float64")), tensor(randn(8).astype("float64"))
    assert_close(fused_kernels.rms_norm(x, weight, 1e-6), rms_norm_reference(x, weight, 1e-6), rtol=0, atol=0)
    gate, up = tensor(randn(4).astype("float64")), tensor(randn(4).astype("float64"))
    assert_close(fused_kernels.swiglu(gate, up), F.silu(gate) * up, rtol=0, atol=0)


# ---- the patched models ----------------------------------------------------------------------------


def tiny_causal_lm(model_class, config_class, seed=0, **overrides):
    settings = dict(
        vocab_size=61, hidden_size=32, intermediate_size=88, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-6, tie_word_embeddings=True,
        dtype="float32",
    )
    settings.update(overrides)
    paddle.seed(seed)
    model = model_class(config_class(**settings))
    # Norm weights away from their initial ones, so the weight's gradient path is exercised.
    for name, parameter in model.named_parameters():
        if "norm" in name:
            parameter.set_value(paddle.rand(parameter.shape) + 0.5)
    return model


def batch(vocab=61, rows=3, length=9):
    input_ids = paddle.to_tensor(RNG.integers(0, vocab, size=(rows, length)).astype("int64"))
    mask = np.ones((rows, length), "int64")
    mask[1, :3] = 0  # left padding, as prompts are padded
    mask[2, :1] = 0
    attention_mask = paddle.to_tensor(mask)
    return input_ids, attention_mask, position_ids_from_mask(attention_mask)


def logits_and_grads(model, input_ids, attention_mask, position_ids):
    model.clear_gradients()
    logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids)[0]
    logprobs, entropy = token_logprobs_and_entropy(logits[:, :-1], input_ids[:, 1:], 0.8)
    (logprobs.sum() + 0.1 * entropy.sum()).backward()
    return logits.numpy(), {name: p.grad.numpy() for name, p in model.named_parameters() if p.grad is not None}


class CountingOps:
    """paddlenlp_ops, counting the calls of each op."""

    def __init__(self, ops):
        self.ops, self.calls = ops, {}

    def __getattr__(self, name):
        op = getattr(self.ops, name)

        def counted(*args):
            self.calls[name] = self.calls.get(name, 0) + 1
            return op(*args)

        return counted


MODELS = [(Qwen2ForCausalLM, Qwen2Config, {}), (LlamaForCausalLM, LlamaConfig, {}),
          (Qwen2ForCausalLM, Qwen2Config, {"fuse_attention_ffn": True})]


@pytest.mark.parametrize("model_class,config_class,overrides", MODELS, ids=["qwen2", "llama", "qwen2-fused-ffn"])
def test_patched_model_matches_unpatched(ops, model_class, config_class, overrides, monkeypatch):
    model = tiny_causal_lm(model_class, config_class, **overrides)
    inputs = batch()
    expected_logits, expected_grads = logits_and_grads(model, *inputs)
    layers = model.config.num_hidden_layers
    # Per layer: two norms, the MLP and the attention; plus the final norm.
    assert use_fused_kernels(model) == 4 * layers + 1
    assert use_fused_kernels(model) == 0  # patching twice changes nothing
    counting = CountingOps(ops)
    monkeypatch.setattr(fused_kernels, "fused_ops", lambda *args: counting)
    logits, param_grads = logits_and_grads(model, *inputs)
    assert counting.calls == {
        "fused_rms_norm": 2 * layers + 1, "fused_swiglu": layers, "fused_rotary": layers, "fused_attention": layers,
        "fused_token_logprobs": 1,
    }
    assert_close(logits, expected_logits)
    assert param_grads.keys() == expected_grads.keys()
    for name, grad in param_grads.items():
        assert_close_summed(grad, expected_grads[name], err_msg=name)
    assert use_unfused_kernels(model) == 4 * layers + 1
    logits, _ = logits_and_grads(model, *inputs)
    assert_close(logits, expected_logits, rtol=0, atol=0)


@pytest.mark.parametrize("granularity", ["full", "full_attn", "core_attn"])
def test_patched_model_under_recompute(ops, granularity, monkeypatch):
    model = tiny_causal_lm(Qwen2ForCausalLM, Qwen2Config, recompute=True, recompute_granularity=granularity)
    model.train()
    inputs = batch()
    expected_logits, expected_grads = logits_and_grads(model, *inputs)
    model.recompute_enable()
    use_fused_kernels(model)
    counting = CountingOps(ops)
    monkeypatch.setattr(fused_kernels, "fused_ops", lambda *args: counting)
    logits, param_grads = logits_and_grads(model, *inputs)
    # The recomputed part runs its ops twice: forward, then again before its backward.
    assert counting.calls["fused_attention"] == 2 * model.config.num_hidden_layers
    assert_close(logits, expected_logits)
    for name, grad in param_grads.items():
        assert_close_summed(grad, expected_grads[name], err_msg=name)


@pytest.mark.parametrize("model_class,config_class", [(Qwen2ForCausalLM, Qwen2Config), (LlamaForCausalLM, LlamaConfig)])
def test_patched_attention_falls_back_where_the_op_does_not_apply(ops, model_class, config_class, monkeypatch):
    """Attention probabilities asked for: paddlenlp's own attention runs, on k and v heads the fallback repeats
    (the patched layer's repeat_kv left them grouped), and the model's results are the unpatched ones."""
    model = tiny_causal_lm(model_class, config_class)
    model.eval()
    input_ids, attention_mask, position_ids = batch()

    def run():
        return model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                     output_attentions=True, return_dict=True)

    expected = run()
    attention = next(layer for layer in model.sublayers() if isinstance(layer, fused_kernels.ATTENTIONS))
    original_attn_func = attention.attn_func
    use_fused_kernels(model)
    counting = CountingOps(ops)
    monkeypatch.setattr(fused_kernels, "fused_ops", lambda *args: counting)
    actual = run()
    assert "fused_attention" not in counting.calls and counting.calls["fused_rotary"] == model.config.num_hidden_layers
    assert_close(actual.logits, expected.logits)
    for a, e in zip(actual.attentions, expected.attentions):
        assert_close(a, e)
    use_unfused_kernels(model)
    assert attention.attn_func is original_attn_func


def test_qwen2_attention_dropout_in_training_runs_paddlenlp_attention(ops, monkeypatch):
    model = tiny_causal_lm(Qwen2ForCausalLM, Qwen2Config, attention_dropout=0.5)
    use_fused_kernels(model)
    counting = CountingOps(ops)
    monkeypatch.setattr(fused_kernels, "fused_ops", lambda *args: counting)
    inputs = batch()
    model.train()
    logits_and_grads(model, *inputs)
    assert "fused_attention" not in counting.calls
    model.eval()  # no dropout: the fused op
    logits_and_grads(model, *inputs)
    assert counting.calls["fused_attention"] == model.config.num_hidden_layers


def test_patch_is_per_model(ops):
    """An unpatched model (a frozen reference, say) keeps Paddle's ops; a deep copy of a patched model runs
    the fused ops on its own weights."""
    patched, plain = tiny_causal_lm(Qwen2ForCausalLM, Qwen2Config), tiny_causal_lm(Qwen2ForCausalLM, Qwen2Config)
    use_fused_kernels(patched)
    assert not hasattr(plain.qwen2.layers[0].input_layernorm, fused_kernels.PATCHED)
    copied = copy.deepcopy(patched)
    norm = copied.qwen2.layers[0].input_layernorm
    assert norm.forward.__self__ is norm
    with paddle.no_grad():
        for p in copied.parameters():
            p.set_value(p * 0.5)
    inputs = batch()
    assert not np.allclose(logits_and_grads(copied, *inputs)[0], logits_and_grads(patched, *inputs)[0])


def test_the_environment_switch_turns_the_kernels_off(monkeypatch, ops):
    monkeypatch.setenv("PADDLE_ALIGNMENT_FUSED_KERNELS", "off")
    assert fused_kernels.fused_ops() is None
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1))
    assert use_fused_kernels(model) == 0
    monkeypatch.setenv("PADDLE_ALIGNMENT_FUSED_KERNELS", "on")
    assert fused_kernels.fused_ops() is ops and use_fused_kernels(model) > 0
    use_unfused_kernels(model)
