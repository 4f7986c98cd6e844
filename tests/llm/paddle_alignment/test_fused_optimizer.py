"""The fused optimizer ops (csrc/optimizer_ops.cc) against a NumPy transcription of Paddle's AdamW, and
FusedAdamW / FusedClipGradByGlobalNorm (fused_optimizer.py) against Paddle's AdamW and clip: the same
parameters, accumulators and state dict, step after step."""

import numpy as np
import paddle
import pytest

from helpers import built_paddlenlp_ops
from paddle_alignment import fused_optimizer
from paddle_alignment.fused_optimizer import (
    OPTIMIZER_OPS,
    FusedAdamW,
    FusedClipGradByGlobalNorm,
    build_adamw_classes,
    gradient_norm,
)
from paddle_alignment.models.fused_kernels import SWITCH

# Float32 updates against Paddle's float32 kernel: a few units in the last place after several steps.
TOLERANCE = dict(rtol=2e-6, atol=1e-7)


@pytest.fixture(scope="module")
def ops():
    return built_paddlenlp_ops(OPTIMIZER_OPS)


def numpy_adamw(p, g, m, v, b1p, b2p, lr, coeff, beta1=0.9, beta2=0.999, eps=1e-8):
    """Paddle's AdamW step (phi's adamw kernel) in float64: the new p, m, v."""
    lr_t = lr * np.sqrt(1 - b2p) / (1 - b1p)
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    p = p - lr * coeff * p
    return p - lr_t * m / (np.sqrt(v) + eps * np.sqrt(1 - b2p)), m, v


def test_fused_adamw_is_paddles_formula_per_tensor(ops):
    rng = np.random.default_rng(0)
    shapes, rates, coeffs = [(3, 5), (7,), (2, 2, 4)], [1e-2, 3e-3, 1e-2], [0.1, 0.0, 0.01]
    p, g, m, v = ([rng.normal(size=s).astype("float32") for s in shapes] for _ in range(4))
    v = [np.abs(x) for x in v]
    b1p, b2p = [0.9, 0.9**3, 0.9**7], [0.999, 0.999**3, 0.999**7]
    tensors = [[paddle.to_tensor(x) for x in xs] for xs in (p, g, m, v)]
    pows = [[paddle.to_tensor([x], dtype="float32") for x in xs] for xs in (b1p, b2p)]
    ops.fused_adamw(*tensors, *pows, rates, coeffs, 0.9, 0.999, 1e-8)
    for i in range(len(shapes)):
        want = numpy_adamw(*(x[i].astype("float64") for x in (p, g, m, v)), b1p[i], b2p[i], rates[i], coeffs[i])
        for got, expected in zip((tensors[0][i], tensors[2][i], tensors[3][i]), want):
            np.testing.assert_allclose(got.numpy(), expected, rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(pows[0][i].numpy(), [b1p[i] * 0.9], rtol=1e-6)
        np.testing.assert_allclose(pows[1][i].numpy(), [b2p[i] * 0.999], rtol=1e-6)


def test_fused_square_sum_and_scale(ops):
    rng = np.random.default_rng(1)
    arrays = [rng.normal(size=s).astype("float32") for s in [(1000, 300), (5,), (1,)]]
    tensors = [paddle.to_tensor(a) for a in arrays]
    total = ops.fused_square_sum(tensors)
    assert total.dtype == paddle.float64 and total.shape == [1]
    # float32 sums within blocks of 1024, added in float64
    np.testing.assert_allclose(float(total), sum((a.astype("float64") ** 2).sum() for a in arrays), rtol=1e-7)
    ops.fused_scale(tensors, 0.25)
    for t, a in zip(tensors, arrays):
        np.testing.assert_array_equal(t.numpy(), a * np.float32(0.25))


def test_fused_adamw_names_a_mismatched_input(ops):
    params = [paddle.zeros([4]), paddle.zeros([3])]
    with pytest.raises(Exception, match="moment1"):
        ops.fused_adamw(params, params, [paddle.zeros([4])], params, [paddle.ones([1])] * 2, [paddle.ones([1])] * 2,
                        [1e-3] * 2, [0.0] * 2, 0.9, 0.999, 1e-8)
    with pytest.raises(Exception, match="float32"):
        ops.fused_square_sum([paddle.zeros([4], dtype="float64")])


class Net(paddle.nn.Layer):
    """Weights that decay and biases and a norm that do not (paddlenlp's rule); with `slow_down`, the last
    layer's weight has its own learning-rate factor of 0.5 (ParamAttr)."""

    def __init__(self, slow_down=False):
        super().__init__()
        attr = paddle.ParamAttr(learning_rate=0.5) if slow_down else None
        self.up, self.norm, self.down = paddle.nn.Linear(6, 16), paddle.nn.LayerNorm(16), paddle.nn.Linear(16, 3, weight_attr=attr)

    def forward(self, x):
        return self.down(self.norm(self.up(x)))


def make_optimizer(net, optimizer_cls, clip_cls, **options):
    decays = {p.name for n, p in net.named_parameters() if not any(word in n for word in ["bias", "norm"])}
    return optimizer_cls(
        learning_rate=paddle.optimizer.lr.CosineAnnealingDecay(5e-2, 8), parameters=net.parameters(),
        weight_decay=0.1, apply_decay_param_fun=lambda name: name in decays, grad_clip=clip_cls(0.5), **options,
    )


def train(net, optimizer, steps, done=0):
    """Steps `done + 1 .. steps` on fixed random batches; returns their pre-clip gradient norms."""
    rng, norms = np.random.default_rng(0), []
    for step in range(steps):
        x = paddle.to_tensor(rng.normal(size=(8, 6)).astype("float32"))
        if step < done:
            continue
        (net(x) ** 2).mean().backward()
        norms.append(gradient_norm(net.parameters()))
        optimizer.step()
        optimizer.clear_grad()
        optimizer._learning_rate.step()
    return norms


def fresh_run(optimizer_cls, clip_cls, steps, weights=None, state=None, done=0, slow_down=False, **options):
    """Steps `done + 1 .. steps` of a run (a seeded net, or one with `weights`, and its optimizer, with
    `state`), named as in a new process (so that state dicts of separate runs have the same keys); returns
    the net, the optimizer and the pre-clip gradient norms."""
    with paddle.utils.unique_name.guard():
        paddle.seed(3)
        net = Net(slow_down)
        if weights is not None:
            net.set_state_dict(weights)
        optimizer = make_optimizer(net, optimizer_cls, clip_cls, **options)
        if state is not None:
            optimizer.set_state_dict(state)
        return net, optimizer, train(net, optimizer, steps, done)


def as_numpy(state):
    return {k: v.numpy() if isinstance(v, paddle.Tensor) else v for k, v in state.items()}


def assert_states_close(want, got, compare):
    assert sorted(want) == sorted(got)
    for key, value in want.items():
        if isinstance(value, np.ndarray):
            compare(got[key], value)
        else:
            assert got[key] == value, key


def close(a, b):
    np.testing.assert_allclose(a, b, **TOLERANCE)


@pytest.mark.parametrize("variant", [{}, {"slow_down": True}, {"amsgrad": True}], ids=["plain", "lr-factor", "amsgrad"])
def test_fused_adamw_steps_as_paddles_adamw(ops, variant, monkeypatch):
    """amsgrad is not fused: Paddle's op steps every parameter; otherwise it steps none."""
    paddle_net, reference, paddle_norms = fresh_run(paddle.optimizer.AdamW, paddle.nn.ClipGradByGlobalNorm, 6, **variant)
    if "amsgrad" not in variant:
        monkeypatch.setattr(paddle._C_ops, "adamw_", lambda *args: pytest.fail("Paddle's adamw_ stepped a fusable parameter"))
    fused_net, fused, fused_norms = fresh_run(FusedAdamW, FusedClipGradByGlobalNorm, 6, **variant)
    np.testing.assert_allclose(fused_norms, paddle_norms, rtol=1e-5)
    assert max(paddle_norms) > 0.5, "the clip must act in this test"
    assert_states_close(as_numpy(paddle_net.state_dict()), as_numpy(fused_net.state_dict()), close)
    assert_states_close(as_numpy(reference.state_dict()), as_numpy(fused.state_dict()), close)


def test_a_fused_checkpoint_resumes_exactly_and_loads_into_paddles_adamw(ops):
    """Saved after 3 steps and loaded into a new FusedAdamW, a run continues bit for bit as one that never
    stopped; loaded into Paddle's AdamW, it continues to a float32 rounding."""
    straight, straight_optimizer, _ = fresh_run(FusedAdamW, FusedClipGradByGlobalNorm, 5)
    first, first_optimizer, _ = fresh_run(FusedAdamW, FusedClipGradByGlobalNorm, 3)
    weights, state = as_numpy(first.state_dict()), as_numpy(first_optimizer.state_dict())
    tensors = lambda values: {k: paddle.to_tensor(v) if isinstance(v, np.ndarray) else v for k, v in values.items()}
    for optimizer_cls, clip_cls, compare in [
        (FusedAdamW, FusedClipGradByGlobalNorm, np.testing.assert_array_equal),
        (paddle.optimizer.AdamW, paddle.nn.ClipGradByGlobalNorm, close),
    ]:
        net, optimizer, _ = fresh_run(optimizer_cls, clip_cls, 5, weights=tensors(weights), state=tensors(state), done=3)
        assert_states_close(as_numpy(straight.state_dict()), as_numpy(net.state_dict()), compare)
        assert_states_close(as_numpy(straight_optimizer.state_dict()), as_numpy(optimizer.state_dict()), compare)


@pytest.mark.parametrize("auto_skip_clip", [False, True])
def test_fused_clip_is_paddles_clip(ops, auto_skip_clip, monkeypatch):
    rng = np.random.default_rng(4)
    params = [paddle.create_parameter(s, "float32") for s in [(4, 5), (5,), (3,)]]
    params[2].need_clip = False  # left as it is, and out of the norm
    for clip_norm in (0.1, 100.0):
        grads = [rng.normal(size=p.shape).astype("float32") for p in params]
        pairs = [[(p, paddle.to_tensor(g)) for p, g in zip(params, grads)] for _ in range(2)]
        want = paddle.nn.ClipGradByGlobalNorm(clip_norm, auto_skip_clip=auto_skip_clip)(pairs[0])
        with monkeypatch.context() as patch:
            patch.setattr(paddle.nn.ClipGradByGlobalNorm, "_dygraph_clip", lambda *args: pytest.fail("Paddle's clip ran"))
            got = FusedClipGradByGlobalNorm(clip_norm, auto_skip_clip=auto_skip_clip)(pairs[1])
        for (_, a), (_, b) in zip(want, got):
            np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=1e-6)
        np.testing.assert_array_equal(got[2][1].numpy(), grads[2])
        norm = np.sqrt(sum((g.astype("float64") ** 2).sum() for g in grads[:2]))
        factor = clip_norm / max(norm, clip_norm)
        np.testing.assert_allclose(got[0][1].numpy(), grads[0] * factor, rtol=1e-6)


def test_gradient_norm_of_mixed_gradients():
    """float32 gradients go through the fused op; a float64 one sends the whole list to Paddle's ops."""
    rng = np.random.default_rng(5)
    for dtype in ("float32", "float64"):
        params = [paddle.create_parameter([6], "float32"), paddle.create_parameter([2, 3], dtype)]
        grads = [rng.normal(size=p.shape) for p in params]
        for p, g in zip(params, grads):
            p.grad = paddle.to_tensor(g, dtype=p.dtype)
        want = np.sqrt(sum((p.grad.numpy().astype("float64") ** 2).sum() for p in params))
        np.testing.assert_allclose(gradient_norm(params), want, rtol=1e-6)


def test_the_switch_and_the_device_pick_paddles_classes(ops, monkeypatch):
    assert build_adamw_classes("cpu") == (FusedAdamW, FusedClipGradByGlobalNorm)
    assert build_adamw_classes("gpu") == (paddle.optimizer.AdamW, paddle.nn.ClipGradByGlobalNorm)
    monkeypatch.setenv(SWITCH, "off")
    assert build_adamw_classes("cpu") == (paddle.optimizer.AdamW, paddle.nn.ClipGradByGlobalNorm)
    assert fused_optimizer.optimizer_ops() is None


def test_the_trainers_build_the_fused_optimizer_on_cpu(ops, tmp_path):
    from paddlenlp.trainer import Trainer, TrainingArguments

    from paddle_alignment.fused_optimizer import FusedOptimizerMixin
    from llm.alignment.ppo.ppo_trainer import PPOTrainer
    from llm.alignment.rm.reward_trainer import RewardTrainer
    from llm.run_finetune import FinetuneTrainer

    assert all(issubclass(cls, FusedOptimizerMixin) for cls in (PPOTrainer, RewardTrainer, FinetuneTrainer))

    class MixedIn(FusedOptimizerMixin, Trainer):
        pass

    args = TrainingArguments(output_dir=str(tmp_path), device="cpu", weight_decay=0.1, max_grad_norm=1.0, learning_rate=1e-3)
    net = Net()
    trainer = MixedIn(model=net, args=args)
    trainer.create_optimizer_and_scheduler(num_training_steps=10)
    optimizer = trainer.optimizer
    assert isinstance(optimizer, FusedAdamW) and isinstance(optimizer._grad_clip, FusedClipGradByGlobalNorm)
    assert optimizer._grad_clip.clip_norm == 1.0 and optimizer._weight_decay == 0.1
    decayed = {n for n, p in net.named_parameters() if optimizer._apply_decay_param_fun(p.name)}
    assert decayed == {"up.weight", "down.weight"}
