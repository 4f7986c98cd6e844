"""The trainer's `response_logits`, whose LM head projects only the response positions (a pre-hook on the
head), against the full logits sliced afterwards: values and gradients, for paddlenlp's Qwen2 (tied and untied
head) and Llama, a LoRA-wrapped actor, and a model without a separate head. And `response_token_stats`, the
log-probs and entropies taken a chunk of tokens at a time from the hidden states, against those of the whole
logits, at the tiny vocabulary and at Qwen2.5's 151,936 entries."""

import contextlib
import functools
import logging
from types import SimpleNamespace

import numpy as np
import paddle
import pytest
from paddlenlp.peft import LoRAConfig, LoRAModel
from paddlenlp.transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen2Model
from paddlenlp.transformers.qwen2.modeling import scaled_dot_product_attention as qwen2_scaled_dot_product_attention

from paddle_alignment.algos.token_stats import entropy_from_logits, gather_logprobs, position_ids_from_mask, tempered_logits
from paddle_alignment.models import head_logprobs, shared_prompts
from paddle_alignment.models.fused_kernels import FusedAttention, use_fused_kernels
from paddle_alignment.models.head_logprobs import head_token_stats
from paddle_alignment.models.ppo_model_utils import chunkable_lm_head, lm_head_layer, response_logits, response_token_stats
from paddle_alignment.models.shared_prompts import AttentionAfterCache, prompt_groups

PROMPT_LEN, RESPONSE_LEN, VOCAB = 5, 4, 67


def tiny_causal_lm(model_class, config_class, tie_word_embeddings, **config):
    paddle.seed(0)
    return model_class(config_class(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=tie_word_embeddings, dtype="float32",
        **config,
    ))


def with_lora(model):
    config = LoRAConfig(target_modules=[".*q_proj.*", ".*v_proj.*"], r=4, lora_alpha=8, dtype="float32")
    lora = LoRAModel(model, config)
    for name, parameter in lora.named_parameters():
        if "lora_B" in name:  # away from zero, so the adapters change the logits
            parameter.set_value(paddle.randn(parameter.shape) * 0.1)
    return lora


class NoSeparateHead(paddle.nn.Layer):
    """A causal LM whose logits come out of its forward with no `lm_head` sublayer."""

    def __init__(self):
        super().__init__()
        self.embed = paddle.nn.Embedding(VOCAB, VOCAB)

    def forward(self, input_ids, attention_mask, position_ids, return_dict):
        return SimpleNamespace(logits=self.embed(input_ids))


def experience(rows=3):
    rng = np.random.default_rng(0)
    mask = np.ones((rows, PROMPT_LEN + RESPONSE_LEN), "int64")
    mask[1, :2] = 0  # left-padded prompt
    mask[2, -1] = 0  # response ended early
    return SimpleNamespace(
        input_ids=paddle.to_tensor(rng.integers(0, VOCAB, size=mask.shape)), attention_mask=paddle.to_tensor(mask),
        prompt_len=PROMPT_LEN,
    )


def full_logits_sliced(model, exp):
    """response_logits as it was: every position through the head, then the response ones."""
    logits = model(input_ids=exp.input_ids, attention_mask=exp.attention_mask,
                   position_ids=position_ids_from_mask(exp.attention_mask), return_dict=True).logits
    return logits[:, exp.prompt_len - 1 : -1]


def logits_and_grads(function, model, exp, weights):
    model.clear_gradients()
    logits = function(model, exp)
    (logits * weights).sum().backward()
    return logits.numpy(), {n: p.grad.numpy() for n, p in model.named_parameters() if p.grad is not None}


MODELS = {
    "qwen2-tied": lambda: tiny_causal_lm(Qwen2ForCausalLM, Qwen2Config, True),
    "qwen2": lambda: tiny_causal_lm(Qwen2ForCausalLM, Qwen2Config, False),
    "llama": lambda: tiny_causal_lm(LlamaForCausalLM, LlamaConfig, False),
    "lora-qwen2": lambda: with_lora(tiny_causal_lm(Qwen2ForCausalLM, Qwen2Config, False)),
    "no-separate-head": NoSeparateHead,
}


@pytest.mark.parametrize("name", MODELS)
def test_response_logits_match_the_full_logits_sliced(name):
    model = MODELS[name]()
    assert (lm_head_layer(model) is None) == (name == "no-separate-head")
    exp = experience()
    weights = paddle.randn([3, RESPONSE_LEN, VOCAB])
    logits, grads = logits_and_grads(response_logits, model, exp, weights)
    expected_logits, expected_grads = logits_and_grads(full_logits_sliced, model, exp, weights)
    assert logits.shape == (3, RESPONSE_LEN, VOCAB)
    np.testing.assert_allclose(logits, expected_logits, rtol=1e-5, atol=1e-5)
    assert grads.keys() == expected_grads.keys()
    for key, grad in grads.items():
        np.testing.assert_allclose(grad, expected_grads[key], rtol=1e-5, atol=1e-5 * max(1.0, np.abs(grad).max()), err_msg=key)
    # The hook is gone afterwards: a plain call gives every position's logits.
    plain = model(input_ids=exp.input_ids, attention_mask=exp.attention_mask,
                  position_ids=position_ids_from_mask(exp.attention_mask), return_dict=True).logits
    assert plain.shape[1] == PROMPT_LEN + RESPONSE_LEN


def whole_logits_stats(model, exp, temperature):
    """Log-probs and entropies of the response tokens from the full logits, with Paddle's own ops."""
    tempered = tempered_logits(full_logits_sliced(model, exp), temperature)
    labels = exp.input_ids[:, exp.prompt_len :]
    return gather_logprobs(tempered, labels), entropy_from_logits(tempered)


def stats_and_grads(function, model, exp, weights):
    model.clear_gradients()
    logprobs, entropy = function(model, exp)
    ((logprobs * weights[0]).sum() + (entropy * weights[1]).sum()).backward()
    grads = {n: p.grad.astype("float32").numpy() for n, p in model.named_parameters() if p.grad is not None}
    return [logprobs.numpy(), entropy.numpy()], grads  # float32 values of bfloat16 gradients too


def assert_same_stats_and_grads(model, exp, chunk_tokens, temperature=0.7, reference=whole_logits_stats, function=None,
                                reference_model=None):
    """`function` on `model` equals `reference` (on `reference_model`, a twin, where given) in log-probs,
    entropies and every parameter's gradient; `function` runs first."""
    rows, length = exp.input_ids.shape[0], exp.input_ids.shape[1] - exp.prompt_len
    weights = [paddle.randn([rows, length]), paddle.randn([rows, length])]
    function = function or (lambda m, e: response_token_stats(m, e, temperature, chunk_tokens))
    chunked = stats_and_grads(function, model, exp, weights)
    whole = stats_and_grads(lambda m, e: reference(m, e, temperature), reference_model or model, exp, weights)
    for got, expected in zip(chunked[0], whole[0]):
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    assert chunked[1].keys() == whole[1].keys()
    for key, grad in chunked[1].items():
        np.testing.assert_allclose(grad, whole[1][key], rtol=1e-5, atol=1e-5 * max(1.0, np.abs(grad).max()), err_msg=key)


@pytest.mark.parametrize("name", MODELS)
def test_chunked_logprobs_and_entropies_match_the_whole_logits(name):
    # 3 x 4 response tokens, 5 at a time: chunks that cut rows (the LoRA actor's adapters are on q and v; a
    # model without a separate head takes the whole logits).
    model = MODELS[name]()
    assert (chunkable_lm_head(model) is None) == (name == "no-separate-head")
    exp = experience()
    assert_same_stats_and_grads(model, exp, chunk_tokens=5)
    # The head is itself again afterwards.
    assert full_logits_sliced(model, exp).shape[-1] == VOCAB



def test_a_head_sliced_by_sharding_stage_3_takes_its_logits_in_its_forward():
    """Sharding stage 3 keeps a slice of each weight (`fw_storage`) and gathers the whole one only within its
    layer's forward and backward, so the chunks, which read the head's weight outside them, are not taken:
    the head projects the response positions in its own forward, with the same results."""
    model = MODELS["qwen2"]()
    exp = experience()
    expected = response_token_stats(model, exp, 0.7)[0].numpy()
    model.lm_head.weight.fw_storage = paddle.zeros([1])  # as paddle's group_sharded stage 3 marks a weight
    assert chunkable_lm_head(model) is None
    np.testing.assert_allclose(response_token_stats(model, exp, 0.7)[0].numpy(), expected, rtol=1e-5, atol=1e-6)


def test_the_chunks_backward_computes_under_the_forwards_autocast(monkeypatch):
    """A PyLayer's backward runs outside the caller's autocast (Paddle's recompute enters it again too), so under
    O1 the chunks' recompute would take the head's product in float32 where the forward took it in bfloat16:
    it enters the forward's autocast. CPU Paddle has no bfloat16 autocast, so the forward's state is given and
    the autocast each chunk's recompute enters is recorded."""
    assert not head_logprobs.autocast_state()["enable"]
    forward = {"enable": True, "custom_white_list": {"matmul_v2"}, "custom_black_list": set(), "level": "O1", "dtype": "bfloat16"}
    monkeypatch.setattr(head_logprobs, "autocast_state", lambda: forward)
    entered = []

    @contextlib.contextmanager
    def recorded_auto_cast(**kwargs):
        entered.append(kwargs)
        yield

    monkeypatch.setattr(paddle.amp, "auto_cast", recorded_auto_cast)
    hidden = paddle.randn([1, 10, 16])
    hidden.stop_gradient = False
    logprobs, _ = head_token_stats(hidden, paddle.randn([VOCAB, 16]), True, paddle.randint(0, VOCAB, [1, 10]), 1.0, 4)
    assert not entered
    logprobs.sum().backward()
    assert entered == [forward] * 3  # 10 tokens, 4 at a time

def test_chunked_logprobs_at_the_real_vocabulary():
    """Qwen2.5's 151,936-entry vocabulary (a narrow 2-layer model), 2 x 40 response tokens 16 at a time against
    one pass over the whole logits with the same kernels, at temperature 0.7 and 1.0, tied and untied head.
    (Paddle's unfused ops sum a near-uniform entropy over 151,936 terms to only 2e-5 relative, and take
    minutes over these logits on the CPU.)"""
    rng = np.random.default_rng(3)
    for tied, temperature in ((True, 0.7), (False, 1.0)):
        paddle.seed(0)
        model = Qwen2ForCausalLM(Qwen2Config(
            vocab_size=151936, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
            num_key_value_heads=1, max_position_embeddings=64, tie_word_embeddings=tied, dtype="float32",
        ))
        ids = paddle.to_tensor(rng.integers(0, 151936, size=(2, 46)))
        exp = SimpleNamespace(input_ids=ids, attention_mask=paddle.ones([2, 46], dtype="int64"), prompt_len=6)
        unchunked = lambda m, e, t: response_token_stats(m, e, t, chunk_tokens=0)  # noqa: E731
        assert_same_stats_and_grads(model, exp, chunk_tokens=16, temperature=temperature, reference=unchunked)


@pytest.mark.parametrize("transpose", [True, False])
def test_chunked_head_stats_with_ignored_labels_at_the_real_vocabulary(transpose):
    """head_token_stats itself: 3 x 50 positions 16 at a time against one whole pass, labels -100 included
    (log-prob 0, as F.cross_entropy's ignore index), gradients of the hidden states and the head."""
    rng = np.random.default_rng(4)
    hidden = rng.normal(size=(3, 50, 24)).astype("float32")
    weight = (rng.normal(size=(151936, 24) if transpose else (24, 151936)) * 0.3).astype("float32")
    labels = rng.integers(0, 151936, size=(3, 50))
    labels[0, 7] = labels[2, 49] = -100
    seeds = [paddle.to_tensor(rng.normal(size=(3, 50)).astype("float32")) for _ in range(2)]
    results = []
    for chunk_tokens in (16, 0):
        h, w = paddle.to_tensor(hidden, stop_gradient=False), paddle.to_tensor(weight, stop_gradient=False)
        logprobs, entropy = head_token_stats(h, w, transpose, paddle.to_tensor(labels), 0.8, chunk_tokens)
        ((logprobs * seeds[0]).sum() + (entropy * seeds[1]).sum()).backward()
        results.append([logprobs.numpy(), entropy.numpy(), h.grad.numpy(), w.grad.numpy()])
    assert results[0][0][0, 7] == 0 and results[0][0][2, 49] == 0
    for got, expected in zip(*results):
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5 * max(1.0, np.abs(expected).max()))


def grouped_experience(samples=(3, 1, 2), response_len=RESPONSE_LEN):
    """Rows of prompts repeated `samples` times each (a GRPO batch): prompts left-padded to different lengths,
    responses right-padded to different ones."""
    rng = np.random.default_rng(5)
    rows, width = sum(samples), PROMPT_LEN + response_len
    ids, mask = np.zeros((rows, width), "int64"), np.ones((rows, width), "int64")
    row = 0
    for group, count in enumerate(samples):
        prompt = rng.integers(0, VOCAB, size=PROMPT_LEN)
        for _ in range(count):
            ids[row, :PROMPT_LEN] = prompt
            mask[row, :group] = 0  # prompt g left-padded by g tokens
            ids[row, PROMPT_LEN:] = rng.integers(0, VOCAB, size=response_len)
            mask[row, width - row % response_len :] = 0  # responses ended early, by different amounts
            row += 1
    ids[mask == 0] = 0  # padding holds the pad id
    return SimpleNamespace(input_ids=paddle.to_tensor(ids), attention_mask=paddle.to_tensor(mask), prompt_len=PROMPT_LEN)


# The whole rows' stats, and the shared prompts' at temperature 0.7, five tokens a chunk.
WHOLE_ROWS = lambda m, e, t: response_token_stats(m, e, t, chunk_tokens=5)  # noqa: E731
WHOLE_ROWS_AT_0_7 = lambda m, e: WHOLE_ROWS(m, e, 0.7)  # noqa: E731
SHARED_PROMPTS = lambda m, e: response_token_stats(m, e, 0.7, chunk_tokens=5, share_prompts=True)  # noqa: E731


@pytest.mark.parametrize("name", ["qwen2-tied", "llama", "lora-qwen2"])
@pytest.mark.parametrize("response_len", [RESPONSE_LEN, 1])
def test_shared_prompts_give_the_log_probs_entropies_and_gradients_of_whole_rows(name, response_len):
    """share_prompts: each distinct prompt runs once and its rows' responses run on its keys and values; log-probs,
    entropies and every gradient equal the whole rows' (prompts of 3, 1 and 2 samples, left-padded apart;
    responses right-padded apart; one response token, where no response runs after the prompt)."""
    model = MODELS[name]()
    exp = grouped_experience(response_len=response_len)
    first, row_prompt = prompt_groups(exp)
    assert first.numpy().tolist() == [0, 3, 4] and row_prompt.numpy().tolist() == [0, 0, 0, 1, 2, 2]
    assert_same_stats_and_grads(model, exp, chunk_tokens=5, reference=WHOLE_ROWS, function=SHARED_PROMPTS)


def recomputed(model_class, config_class, granularity="full", **config):
    """A tiny model that recomputes its layers (`granularity`, paddlenlp's) in the backward, as the trainer's do."""
    model = tiny_causal_lm(model_class, config_class, False, recompute=True, recompute_granularity=granularity, **config)
    model.recompute_enable()
    model.train()
    return model


ARCHITECTURES = {"qwen2": (Qwen2ForCausalLM, Qwen2Config), "llama": (LlamaForCausalLM, LlamaConfig)}


@pytest.mark.parametrize("granularity", ["full", "full_attn", "core_attn"])
@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_shared_prompts_under_reentrant_recompute_keep_the_prompts_gradient(architecture, granularity, caplog):
    """Paddle's reentrant recompute (PaddleNLP's GRPO configs set recompute_use_reentrant) passes no gradient to
    the prompt's keys and values, which reach the layers in a tuple: from its first shared forward on, the
    model recomputes without reentrancy, and says so."""
    model = recomputed(*ARCHITECTURES[architecture], granularity, recompute_use_reentrant=True)
    with caplog.at_level(logging.INFO, logger=shared_prompts.logger.name):
        assert_same_stats_and_grads(model, grouped_experience(), 5, reference=WHOLE_ROWS, function=SHARED_PROMPTS)
    assert not model.config.recompute_use_reentrant
    assert "recomputes without reentrancy" in caplog.text


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_shared_prompts_run_the_unfused_rotary_embedding(architecture):
    """paddlenlp's fused rotary embedding (use_fused_rope, set by PaddleNLP's GRPO config) asserts there are no
    cached keys: from its first shared forward on, the model rotates with the unfused one, which rotates alike,
    in its recompute in the backward too (on CPU the fused one would not run at all)."""
    model = recomputed(*ARCHITECTURES[architecture])
    attentions = [layer for layer in model.sublayers() if hasattr(layer, "use_fused_rope")]
    for layer in attentions:
        layer.use_fused_rope = True
    assert_same_stats_and_grads(model, grouped_experience(), 5, reference=WHOLE_ROWS, function=SHARED_PROMPTS)
    assert attentions and not any(layer.use_fused_rope for layer in attentions)



def test_preparing_for_shared_prompts_keeps_the_cpu_fused_attention():
    """Off the flash-attention branch the layers' attention stays as it was: the CPU's fused op, which reads
    grouped k and v heads in place (its layers see it there and leave them unrepeated)."""
    model = MODELS["qwen2-tied"]()
    if use_fused_kernels(model) == 0:
        pytest.skip("paddlenlp_ops lacks the fused CPU ops")
    response_token_stats(model, grouped_experience(), 0.7, chunk_tokens=5, share_prompts=True)
    attentions = [layer for layer in model.sublayers() if hasattr(layer, "attn_func")]
    assert attentions and all(isinstance(layer.attn_func, FusedAttention) for layer in attentions)

def on_the_flash_attention_branch(model):
    """`model` with paddlenlp's flash-attention branch configured (on CPU its scaled_dot_product_attention runs
    the math backend, which puts a causal triangle aligned to the first key in place of any mask it is given)."""
    for layer in model.sublayers(include_self=True):
        if hasattr(layer, "config"):
            layer.config.use_flash_attention = True
    return model


FLASH_BRANCH_MODELS = {
    **{name: MODELS[name] for name in ("qwen2-tied", "llama", "lora-qwen2")},
    # Llama hands its attention function the alibi argument by position under core_attn recompute.
    **{f"{name}-core-attn-recompute": functools.partial(recomputed, *classes, "core_attn") for name, classes in ARCHITECTURES.items()},
    **{f"{name}-recompute": functools.partial(recomputed, *classes) for name, classes in ARCHITECTURES.items()},
}


@pytest.mark.parametrize("name", FLASH_BRANCH_MODELS)
def test_shared_prompts_on_the_flash_attention_branch_give_the_whole_rows(name):
    """With flash attention configured, the responses after a shared prompt's keys still see exactly the prompt
    and their own past, in the forward and in its recompute in the backward: paddlenlp would ask for a causal
    mask aligned to the first key (0.05-0.09 off here before). Against a twin off that branch; unpadded rows,
    whose mask paddlenlp drops as causal, since on CPU the math backend would also drop a padded prompt's mask
    in the prompt's own forward: padding is tested on the attention alone below."""
    exp = grouped_experience()
    exp.attention_mask = paddle.ones_like(exp.attention_mask)
    model, twin = on_the_flash_attention_branch(FLASH_BRANCH_MODELS[name]()), FLASH_BRANCH_MODELS[name]()
    assert_same_stats_and_grads(model, exp, 5, reference=WHOLE_ROWS, function=SHARED_PROMPTS, reference_model=twin)


@pytest.mark.parametrize("padded", [True, False])
def test_attention_after_cache_takes_the_mask_whole(padded):
    """AttentionAfterCache on paddlenlp's flash branch (grouped k and v heads, as that branch has them) equals
    paddlenlp's other branch on repeated heads, with the additive mask paddlenlp makes for queries after cached
    keys: left-padded keys, or no mask at all (dropped as causal), values and gradients."""
    rng = np.random.default_rng(3)
    batch, queries, keys, heads, kv_heads, head_dim = 3, 4, 9, 4, 2, 8
    q, k, v = (paddle.to_tensor(rng.normal(size=[batch, n, h, head_dim]).astype("float32"), stop_gradient=False)
               for n, h in ((queries, heads), (keys, kv_heads), (keys, kv_heads)))
    valid = np.ones([batch, keys], "int64")
    valid[1, :2] = valid[2, :1] = 0
    mask = Qwen2Model._prepare_decoder_attention_mask(
        paddle.to_tensor(valid if padded else np.ones_like(valid)), (batch, queries), keys - queries, "float32")
    flash, plain = (SimpleNamespace(use_flash_attention=on, attention_dropout=0.0) for on in (True, False))
    got = AttentionAfterCache(qwen2_scaled_dot_product_attention)(q, flash, k, v, mask if padded else None, False)
    repeat = lambda t: paddle.repeat_interleave(t, heads // kv_heads, axis=2)  # noqa: E731
    expected = qwen2_scaled_dot_product_attention(q, plain, repeat(k), repeat(v), mask, False, training=False)
    weights = paddle.to_tensor(rng.normal(size=got.shape).astype("float32"))
    grads = [paddle.grad((out * weights).sum(), [q, k, v]) for out in (got, expected)]
    np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=1e-5, atol=1e-6)
    for mine, theirs in zip(*grads):
        np.testing.assert_allclose(mine.numpy(), theirs.numpy(), rtol=1e-5, atol=1e-6)



# ---- On a GPU (a Paddle GPU build): what the CPU tests above prove on CPU, in bfloat16 with paddlenlp's GPU
# settings. Skipped elsewhere; the first run on a GPU is what lets share_prompt_forward be on by default.

ON_A_GPU = pytest.mark.skipif(not paddle.is_compiled_with_cuda() or paddle.device.cuda.device_count() == 0,
                              reason="needs a Paddle GPU build and a GPU")


@contextlib.contextmanager
def on_gpu():
    device = paddle.get_device()
    paddle.set_device("gpu")
    try:
        yield
    finally:
        paddle.set_device(device)


def relative_errors(got, reference):
    """Each gradient's distance from the reference's, over the reference's norm (the worst of them)."""
    return max(float(np.linalg.norm(got[name] - ref) / (np.linalg.norm(ref) + 1e-12)) for name, ref in reference.items())


def bfloat16_errors(exp):
    """How far a tiny Qwen2 in bfloat16 with PaddleNLP's GRPO settings (flash attention, the fused rotary
    embedding, reentrant recompute) is from its float32 twin on paddlenlp's math attention, whole rows then
    shared prompts: (the worst log-prob difference at a real response token, the worst relative gradient
    difference) of each. Its weights are drawn wider than a fresh model's, so that attention is far from
    uniform and a wrong mask moves the log-probs."""
    real = exp.attention_mask.numpy()[:, PROMPT_LEN:] > 0
    weights = [paddle.randn(real.shape), paddle.randn(real.shape)]

    def model(gpu_settings):
        model = recomputed(Qwen2ForCausalLM, Qwen2Config, initializer_range=0.2, recompute_use_reentrant=gpu_settings)
        if gpu_settings:
            model.to(dtype="bfloat16")
            for layer in on_the_flash_attention_branch(model).sublayers():
                if hasattr(layer, "use_fused_rope"):
                    layer.use_fused_rope = True
        return model

    reference = stats_and_grads(WHOLE_ROWS_AT_0_7, model(False), exp, weights)
    runs = [stats_and_grads(function, model(True), exp, weights) for function in (WHOLE_ROWS_AT_0_7, SHARED_PROMPTS)]
    return [(float(np.abs(run[0][0] - reference[0][0])[real].max()), relative_errors(run[1], reference[1])) for run in runs]


@ON_A_GPU
def test_on_a_gpu_shared_prompts_in_bfloat16_with_paddlenlps_gpu_settings():
    """In bfloat16 with PaddleNLP's GRPO settings, shared prompts are as close to float32 as bfloat16 allows:
    its error is measured on unpadded rows of whole prompts, which paddlenlp runs as plain causal flash
    attention (no mask), and neither padded rows, whole or shared, nor unpadded shared ones may be much further
    (a wrong mask, or the prompt's gradient lost, is)."""
    with on_gpu():
        padded = grouped_experience()
        unpadded = grouped_experience()
        unpadded.attention_mask = paddle.ones_like(unpadded.attention_mask)
        (noise, noise_grads), unpadded_shared = bfloat16_errors(unpadded)
        errors = [unpadded_shared, *bfloat16_errors(padded)]
    for name, (error, grads) in zip(["unpadded shared", "padded whole", "padded shared"], errors):
        assert error <= 3 * noise + 5e-3, f"{name}: log-probs {error} off float32, against bfloat16's {noise}"
        assert grads <= 3 * noise_grads + 5e-3, f"{name}: gradients {grads} off float32, against bfloat16's {noise_grads}"


@ON_A_GPU
def test_on_a_gpu_the_chunks_backward_runs_in_the_forwards_bfloat16(monkeypatch):
    """Under O1 autocast the head's product runs in bfloat16, in the chunks' recompute in the backward too, and
    the chunked log-probs and gradients are the whole logits' (bfloat16's precision)."""
    products, product = [], head_logprobs.head_logits

    def recorded(*args):
        logits = product(*args)
        products.append(logits.dtype)
        return logits

    monkeypatch.setattr(head_logprobs, "head_logits", recorded)
    with on_gpu():
        exp = experience()
        weights = [paddle.randn([3, RESPONSE_LEN]), paddle.randn([3, RESPONSE_LEN])]
        model = MODELS["qwen2"]()

        def under_autocast(chunk_tokens):
            def stats(m, e):
                with paddle.amp.auto_cast(level="O1", dtype="bfloat16"):
                    return response_token_stats(m, e, 0.7, chunk_tokens)
            return stats

        chunked = stats_and_grads(under_autocast(5), model, exp, weights)
        assert products == [paddle.bfloat16] * 6  # 12 tokens, 5 at a time: 3 chunks forward, 3 in the backward
        whole = stats_and_grads(under_autocast(0), model, exp, weights)
    np.testing.assert_allclose(chunked[0][0], whole[0][0], atol=2e-2)
    assert relative_errors(chunked[1], whole[1]) < 2e-2
