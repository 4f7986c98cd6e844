"""Score models (backbone + score head) and their normalizers, on tiny random Qwen2 / Llama configs."""

import numpy as np
import paddle
import pytest
from paddlenlp.transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from paddle_alignment.algos.token_stats import end_positions
from paddle_alignment.models.rope import use_rope_tables
from paddle_alignment.models.score_model import (
    SCORE_CONFIG_DEFAULTS,
    AutoModelForScore,
    LlamaForScore,
    Qwen2ForScore,
)
from paddle_alignment.models.score_model_utils import (
    ExponentialMovingAverage,
    IdentityNormalizer,
    RunningMeanStd,
    build_normalizer,
    combine_moments,
)

TINY = dict(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
    pad_token_id=0,
    dtype="float32",
)
CONFIGS = {"qwen2": lambda: Qwen2Config(**TINY), "llama": lambda: LlamaConfig(**TINY)}
CAUSAL_LMS = {"qwen2": Qwen2ForCausalLM, "llama": LlamaForCausalLM}


def tiny_score_model(backbone="qwen2", seed=0, **overrides):
    """A random score model with the RoPE tables every loader gives (transformers' numbers, where paddlenlp's own
    differ in the last bit), so that a loaded copy's scores equal it to rounding."""
    paddle.seed(seed)
    model = AutoModelForScore.from_config(CONFIGS[backbone](), **overrides)
    model.eval()
    return use_rope_tables(model)


def tensor(x, dtype="float32"):
    return paddle.to_tensor(np.asarray(x), dtype=dtype)


# ---- normalizers ----


def test_running_mean_std_matches_numpy_on_concatenation():
    rng = np.random.default_rng(0)
    batches = [rng.normal(3.0, 2.0, size=(n, 2)) for n in (5, 1, 3, 7)]
    norm = RunningMeanStd(2)
    for batch in batches:
        norm.update(tensor(batch))
    allv = np.concatenate(batches)
    np.testing.assert_allclose(norm.mean.numpy(), allv.mean(axis=0), rtol=1e-5)
    np.testing.assert_allclose(norm.var.numpy(), allv.var(axis=0), rtol=1e-5)
    assert norm.count.numpy().item() == len(allv)


def test_exponential_moving_average_by_hand():
    norm = ExponentialMovingAverage(1, momentum=0.9)
    norm.update(tensor([[1.0], [3.0]]))  # first batch initialises: mean 2, var 1
    np.testing.assert_allclose(norm.mean.numpy(), [2.0], rtol=1e-6)
    np.testing.assert_allclose(norm.var.numpy(), [1.0], rtol=1e-6)
    norm.update(tensor([[10.0], [14.0], [12.0]]))  # batch mean 12, population var 8/3
    np.testing.assert_allclose(norm.mean.numpy(), [0.9 * 2 + 0.1 * 12], rtol=1e-6)
    np.testing.assert_allclose(norm.var.numpy(), [0.9 * 1 + 0.1 * 8 / 3], rtol=1e-6)
    assert norm.count.numpy().item() == 5


def test_identity_normalizer_leaves_values_and_counts():
    norm = build_normalizer(None, 1)
    assert isinstance(norm, IdentityNormalizer) and isinstance(build_normalizer("identity", 1), IdentityNormalizer)
    values = tensor([[1.5], [-2.0]])
    norm.update(values)
    np.testing.assert_array_equal(norm.normalize(values).numpy(), values.numpy())
    assert norm.count.numpy().item() == 2


def test_normalize_formula():
    norm = build_normalizer("RunningMeanStd", 1)
    norm.update(tensor([[1.0], [3.0]]))  # mean 2, var 1
    out = norm.normalize(tensor([[4.0], [0.0]]), epsilon=1e-5)
    np.testing.assert_allclose(out.numpy(), [[2 / np.sqrt(1 + 1e-5)], [-2 / np.sqrt(1 + 1e-5)]], rtol=1e-6)


def test_unknown_normalizer_type():
    with pytest.raises(ValueError, match="normalizer_type.*RunningMeanStd"):
        build_normalizer("zscore", 1)


def test_combine_moments_of_unequal_parts_is_exact():
    # the merge used across data-parallel ranks: unequal sizes, one rank with no values
    rng = np.random.default_rng(1)
    parts = [rng.normal(size=(n, 3)) for n in (4, 9, 1)]
    counts = [len(p) for p in parts] + [0]
    means = [p.mean(0) for p in parts] + [np.zeros(3)]
    variances = [p.var(0) for p in parts] + [np.zeros(3)]
    total, mean, var = combine_moments(*(tensor(x, "float64") for x in (counts, means, variances)))
    allv = np.concatenate(parts)
    assert total.numpy().item() == len(allv)
    np.testing.assert_allclose(mean.numpy(), allv.mean(0), rtol=1e-12)
    np.testing.assert_allclose(var.numpy(), allv.var(0), rtol=1e-12)


def test_end_positions_left_and_right_padded():
    mask = tensor([[0, 0, 1, 1, 0], [1, 1, 1, 1, 1], [0, 1, 1, 0, 0], [1, 0, 0, 0, 0]], "int64")
    ends = end_positions(mask)
    assert ends.dtype == paddle.int64
    assert ends.numpy().tolist() == [3, 4, 2, 0]


# ---- score models ----


def test_end_score_is_score_at_last_valid_position():
    model = tiny_score_model()
    paddle.seed(1)
    ids = paddle.randint(1, 64, [3, 6])
    mask = tensor([[0, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 0]], "int64")
    out = model(ids, attention_mask=mask)
    assert out.scores.shape == [3, 6, 1] and out.end_scores.shape == [3, 1]
    scores = out.scores.numpy()
    np.testing.assert_array_equal(out.end_scores.numpy(), scores[[0, 1, 2], [3, 5, 4]])
    no_mask = model(ids)  # without a mask the end is the last position
    np.testing.assert_array_equal(no_mask.end_scores.numpy(), no_mask.scores.numpy()[:, -1])


@pytest.mark.parametrize("backbone", ["qwen2", "llama"])
def test_padding_does_not_change_end_score(backbone):
    model = tiny_score_model(backbone)
    seq = [5, 9, 17, 33, 2]
    plain = model(tensor([seq], "int64"), attention_mask=tensor([[1] * 5], "int64")).end_scores.numpy()
    right = model(tensor([seq + [0, 0, 0]], "int64"), attention_mask=tensor([[1] * 5 + [0] * 3], "int64"))
    left = model(tensor([[0, 0] + seq + [0]], "int64"), attention_mask=tensor([[0, 0] + [1] * 5 + [0]], "int64"))
    np.testing.assert_allclose(right.end_scores.numpy(), plain, atol=1e-6)
    np.testing.assert_allclose(left.end_scores.numpy(), plain, atol=1e-5)


@pytest.mark.parametrize("backbone", ["qwen2", "llama"])
def test_save_load_round_trip(backbone, tmp_path):
    settings = dict(score_dim=2, score_bias=False, score_type="critic", do_normalize=True,
                    normalizer_type="ExponentialMovingAverage", normalizer_momentum=0.8)  # fmt: skip
    model = tiny_score_model(backbone, **settings)
    paddle.seed(2)
    ids = paddle.randint(1, 64, [4, 7])
    mask = tensor([[0, 0, 1, 1, 1, 1, 0]] * 2 + [[1] * 7] * 2, "int64")
    model.train()
    for _ in range(2):  # training-mode forwards update the normalizer
        model(ids, attention_mask=mask)
    model.eval()
    assert model.normalizer.count.numpy().item() == 8
    before = model(ids, attention_mask=mask)
    model.save_pretrained(str(tmp_path))

    loaded = AutoModelForScore.from_pretrained(str(tmp_path))
    loaded.eval()
    assert type(loaded) is {"qwen2": Qwen2ForScore, "llama": LlamaForScore}[backbone]
    assert {k: getattr(loaded.config, k) for k in settings} == settings
    assert model.score_head.bias is None and loaded.score_head.bias is None
    for name in ("mean", "var", "count"):
        np.testing.assert_array_equal(getattr(loaded.normalizer, name).numpy(), getattr(model.normalizer, name).numpy())
    after = loaded(ids, attention_mask=mask)
    np.testing.assert_allclose(after.scores.numpy(), before.scores.numpy(), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(after.end_scores.numpy(), before.end_scores.numpy(), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("backbone", ["qwen2", "llama"])
def test_from_causal_lm_checkpoint(backbone, tmp_path):
    paddle.seed(3)
    causal = CAUSAL_LMS[backbone](CONFIGS[backbone]())
    causal.save_pretrained(str(tmp_path))
    model = AutoModelForScore.from_pretrained(str(tmp_path), score_type="critic", normalizer_type="RunningMeanStd")
    assert model.config.score_type == "critic" and model.config.normalizer_type == "RunningMeanStd"
    assert model.config.score_dim == SCORE_CONFIG_DEFAULTS["score_dim"]
    assert isinstance(model.normalizer, RunningMeanStd)
    causal_backbone = getattr(causal, backbone).state_dict()
    score_backbone = model.backbone.state_dict()
    assert causal_backbone.keys() == score_backbone.keys()
    for key, value in causal_backbone.items():
        np.testing.assert_array_equal(score_backbone[key].numpy(), value.numpy(), err_msg=key)
    assert model.score_head.weight.shape == [TINY["hidden_size"], 1]


def test_do_normalize_uses_normalizer_state():
    model = tiny_score_model(do_normalize=True, normalizer_type="RunningMeanStd")
    paddle.seed(4)
    ids = paddle.randint(1, 64, [5, 6])
    mask = tensor([[1] * 6, [0, 1, 1, 1, 1, 0], [1, 1, 1, 0, 0, 0], [0, 0, 0, 1, 1, 1], [1] * 6], "int64")
    model.train()
    normalized = model(ids, attention_mask=mask)  # updates with this batch, then normalizes
    model.eval()
    model.config.do_normalize = False
    raw = model(ids, attention_mask=mask)
    raw_end = raw.end_scores.numpy()
    np.testing.assert_allclose(model.normalizer.mean.numpy(), raw_end.mean(0), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(model.normalizer.var.numpy(), raw_end.var(0), rtol=1e-4)
    mean, std = model.normalizer.mean.numpy(), np.sqrt(model.normalizer.var.numpy() + 1e-5)
    np.testing.assert_allclose(normalized.end_scores.numpy(), (raw_end - mean) / std, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(normalized.scores.numpy(), (raw.scores.numpy() - mean) / std, rtol=1e-4, atol=1e-5)


def test_eval_mode_and_identity_do_not_update():
    model = tiny_score_model(normalizer_type="RunningMeanStd")
    ids = paddle.randint(1, 64, [2, 4])
    model(ids)  # eval mode
    assert model.normalizer.count.numpy().item() == 0
    scores, end_scores = model(ids, return_dict=False)
    assert scores.shape == [2, 4, 1] and end_scores.shape == [2, 1]


def test_bad_settings():
    with pytest.raises(ValueError, match="score_type"):
        tiny_score_model(score_type="value")
    with pytest.raises(ValueError, match="normalizer_type"):
        tiny_score_model(normalizer_type="minmax")
    config = Qwen2Config(**TINY)
    config.model_type = "gpt2"
    with pytest.raises(ValueError, match="gpt2"):
        AutoModelForScore.from_config(config)
