"""Offload: in-place moves keep values, identities and training results; scopes, level parsing, the CPU no-op.

On CPU both places are CPUPlace: each move still allocates a fresh copy, which the data pointers show.
"""

import logging

import paddle
import pytest

from paddle_alignment.offload import (
    OFFLOAD_GROUPS,
    OffloadPlan,
    model_tensors,
    move_tensors_,
    optimizer_tensors,
    parse_offload_level,
)

CPU = paddle.CPUPlace()


class TinyNet(paddle.nn.Layer):
    """Parameters, a persistable and a non-persistable buffer."""

    def __init__(self):
        super().__init__()
        self.proj = paddle.nn.Linear(6, 4)
        self.norm = paddle.nn.LayerNorm(4)
        self.register_buffer("offset", paddle.arange(4, dtype="float32"))
        self.register_buffer("scale", paddle.to_tensor([0.5], dtype="float32"), persistable=False)

    def forward(self, x):
        return self.norm(self.proj(x)) * self.scale + self.offset


def make_model_and_optimizer(seed=7):
    paddle.seed(seed)
    model = TinyNet()
    optimizer = paddle.optimizer.AdamW(learning_rate=1e-2, parameters=model.parameters(), weight_decay=0.1)
    return model, optimizer


def batches(count):
    paddle.seed(123)
    return [paddle.randn([5, 6]) for _ in range(count)]


def train_step(model, optimizer, batch):
    (model(batch) ** 2).mean().backward()
    optimizer.step()
    optimizer.clear_grad()


def contents(tensors):
    return [tensor.numpy().tobytes() for tensor in tensors]


def pointers(tensors):
    return [tensor.data_ptr() for tensor in tensors]


def all_moved(before, after):
    return all(old != new for old, new in zip(before, after, strict=True))


def test_model_round_trip_keeps_objects_values_and_gradients():
    model, _ = make_model_and_optimizer()
    model.norm.weight.stop_gradient = True
    batch = batches(1)[0]
    model(batch).sum().backward()
    expected_output = model(batch).numpy().tobytes()
    tensors = model_tensors(model)
    assert len(tensors) == 6  # 4 parameters and both buffers
    names, flags = [t.name for t in tensors], [t.stop_gradient for t in tensors]
    values, grads = contents(tensors), contents([t.grad for t in tensors if t.grad is not None])
    assert len(grads) == 3

    start = pointers(tensors)
    assert move_tensors_(tensors, CPU, CPU) == 6
    offloaded = pointers(tensors)
    assert all_moved(start, offloaded)
    assert contents(tensors) == values
    assert move_tensors_(tensors, CPU, CPU) == 6
    assert all_moved(offloaded, pointers(tensors))

    assert all(a is b for a, b in zip(model_tensors(model), tensors, strict=True))
    assert [t.name for t in tensors] == names and [t.stop_gradient for t in tensors] == flags
    assert contents(tensors) == values
    assert contents([t.grad for t in tensors if t.grad is not None]) == grads
    assert model(batch).numpy().tobytes() == expected_output


def test_uninitialized_tensors_are_left_alone():
    tensor = paddle.to_tensor([1.0])
    tensor._clear_data()
    assert move_tensors_([tensor], CPU, CPU) == 0


def test_adamw_states_round_trip_and_next_step_matches_no_offload():
    offloaded_model, offloaded_opt = make_model_and_optimizer()
    plain_model, plain_opt = make_model_and_optimizer()
    first, second, third = batches(3)
    assert optimizer_tensors(offloaded_opt) == []  # states appear on the first step
    assert move_tensors_(optimizer_tensors(offloaded_opt), CPU, CPU) == 0
    for batch in (first, second):
        train_step(offloaded_model, offloaded_opt, batch)
        train_step(plain_model, plain_opt, batch)

    states = optimizer_tensors(offloaded_opt)
    assert len(states) == 4 * 4  # moment1, moment2, beta1 pow, beta2 pow for each of 4 parameters
    assert contents(states) == contents(optimizer_tensors(plain_opt))
    values, start = contents(states), pointers(states)
    move_tensors_(states, CPU, CPU)
    assert all_moved(start, pointers(states))
    move_tensors_(states, CPU, CPU)
    assert contents(states) == values
    assert all(a is b for a, b in zip(optimizer_tensors(offloaded_opt), states, strict=True))

    train_step(offloaded_model, offloaded_opt, third)
    train_step(plain_model, plain_opt, third)
    assert contents(offloaded_model.parameters()) == contents(plain_model.parameters())
    assert contents(optimizer_tensors(offloaded_opt)) == contents(optimizer_tensors(plain_opt))


def test_resumed_optimizer_state_and_master_weights_are_moved():
    model, optimizer = make_model_and_optimizer()
    train_step(model, optimizer, batches(1)[0])
    saved = {k: v.clone() for k, v in optimizer.state_dict().items()}
    saved["master_weights"] = {p.name: p.clone() for p in model.parameters()}
    _, resumed_opt = make_model_and_optimizer()
    resumed_opt.set_state_dict(saved)

    pending = optimizer_tensors(resumed_opt)  # no step yet: held until the first step, plus the master weights
    assert len(pending) == 4 * 4 + 4
    values, start = contents(pending), pointers(pending)
    move_tensors_(pending, CPU, CPU)
    assert all_moved(start, pointers(pending))
    move_tensors_(pending, CPU, CPU)
    assert contents(pending) == values


def test_plan_scopes_train_like_no_offload_and_pick_up_lazy_states():
    actor, actor_opt = make_model_and_optimizer()
    plain_actor, plain_opt = make_model_and_optimizer()
    plan = OffloadPlan({"train_model": [actor], "optimizer": [actor_opt, None]}, CPU, CPU)
    assert plan.groups == {"train_model", "optimizer"}
    plan.offload_all()
    for batch in batches(3):
        with plan.on_device("train_model", "optimizer"):
            train_step(actor, actor_opt, batch)
            in_scope = pointers(optimizer_tensors(actor_opt))
        assert all_moved(in_scope, pointers(optimizer_tensors(actor_opt)))
        train_step(plain_actor, plain_opt, batch)
    assert contents(actor.parameters()) == contents(plain_actor.parameters())


def test_on_device_reloads_then_offloads_also_on_error_and_nests():
    reference, _ = make_model_and_optimizer()
    actor, actor_opt = make_model_and_optimizer()
    train_step(actor, actor_opt, batches(1)[0])
    plan = OffloadPlan({"freeze_model": [reference], "train_model": [actor]}, CPU, CPU)
    frozen, trained, states = model_tensors(reference), model_tensors(actor), optimizer_tensors(actor_opt)
    values = contents(frozen)
    plan.offload_all()

    offloaded = pointers(frozen)
    actor_place, states_place = pointers(trained), pointers(states)
    with plan.on_device("freeze_model", "optimizer"):  # "optimizer" is not in this plan: it stays put
        on_device = pointers(frozen)
        assert all_moved(offloaded, on_device)
        assert pointers(trained) == actor_place and pointers(states) == states_place
    assert all_moved(on_device, pointers(frozen))

    with pytest.raises(RuntimeError, match="scoring failed"):
        with plan.on_device("freeze_model"):
            on_device = pointers(frozen)
            raise RuntimeError("scoring failed")
    assert all_moved(on_device, pointers(frozen))
    assert contents(frozen) == values

    with plan.on_device("train_model"):
        outer, frozen_outside = pointers(trained), pointers(frozen)
        plan.offload_all()  # leaves the group in use alone
        assert pointers(trained) == outer and all_moved(frozen_outside, pointers(frozen))
        with plan.on_device("train_model", "freeze_model"):
            assert pointers(trained) == outer
        assert pointers(trained) == outer
    assert all_moved(outer, pointers(trained))


def test_unknown_group_names_are_rejected():
    plan = OffloadPlan({}, CPU, CPU)
    with pytest.raises(ValueError, match="reward_model"):
        with plan.on_device("reward_model"):
            pass
    with pytest.raises(ValueError, match="critic"):
        OffloadPlan({"critic": []}, CPU, CPU)


@pytest.mark.parametrize(
    "value, expected",
    [
        ("freeze_model", {"freeze_model"}),
        ("freeze_model optimizer", {"freeze_model", "optimizer"}),
        ("optimizer,train_model", {"optimizer", "train_model"}),
        (" freeze_model, optimizer  train_model ", set(OFFLOAD_GROUPS)),
        (["optimizer"], {"optimizer"}),
        ("", set()),
        (None, set()),
    ],
)
def test_parse_offload_level(value, expected):
    assert parse_offload_level(value) == frozenset(expected)


@pytest.mark.parametrize(
    "value, bad", [("optimizer,gpu_cache", "gpu_cache"), ("Optimizer", "Optimizer"), ("optimiser", "optimiser")]
)
def test_parse_offload_level_names_key_bad_value_and_valid_names(value, bad):
    with pytest.raises(ValueError) as error:
        parse_offload_level(value)
    message = str(error.value)
    assert "offload_level" in message and repr(bad) in message
    assert all(name in message for name in OFFLOAD_GROUPS)


@pytest.fixture
def paddlenlp_log(caplog):
    """caplog, also capturing paddlenlp's logger (which does not propagate to the root logger)."""
    paddlenlp_logger = logging.getLogger("PaddleNLP")
    paddlenlp_logger.addHandler(caplog.handler)
    yield caplog
    paddlenlp_logger.removeHandler(caplog.handler)


@pytest.mark.skipif(paddle.is_compiled_with_cuda(), reason="the CPU no-op needs a paddle without CUDA")
@pytest.mark.parametrize("device", ["cpu", "gpu"])
def test_cpu_plan_moves_nothing_and_says_so_once(device, paddlenlp_log):
    reference, _ = make_model_and_optimizer()
    actor, actor_opt = make_model_and_optimizer()
    train_step(actor, actor_opt, batches(1)[0])
    everything = model_tensors(reference) + model_tensors(actor) + optimizer_tensors(actor_opt)
    start = pointers(everything)
    plan = OffloadPlan.from_level(
        "freeze_model optimizer,train_model", device, frozen=[reference, None], trained=[actor], optimizers=[actor_opt]
    )
    assert plan.groups == frozenset() and not paddlenlp_log.records

    plan.offload_all()
    with plan.on_device(*OFFLOAD_GROUPS):
        assert pointers(everything) == start
    plan.offload_all()
    assert pointers(everything) == start
    notices = [r.getMessage() for r in paddlenlp_log.records if "offload_level" in r.getMessage()]
    assert len(notices) == 1 and "no effect" in notices[0] and repr(device) in notices[0]


def test_empty_level_is_silent(paddlenlp_log):
    plan = OffloadPlan.from_level("", "cpu", frozen=[TinyNet()])
    plan.offload_all()
    with plan.on_device("freeze_model"):
        pass
    assert plan.groups == frozenset() and not paddlenlp_log.records


@pytest.mark.skipif(not paddle.is_compiled_with_cuda(), reason="needs CUDA pinned memory")
def test_gpu_plan_keeps_frozen_model_in_pinned_memory():
    paddle.set_device("gpu:0")
    reference = TinyNet()
    values = contents(model_tensors(reference))
    plan = OffloadPlan.from_level("freeze_model", "gpu:0", frozen=[reference])
    plan.offload_all()
    assert all(t.place.is_cuda_pinned_place() for t in model_tensors(reference))
    with plan.on_device("freeze_model"):
        assert all(t.place.is_gpu_place() for t in model_tensors(reference))
    assert all(t.place.is_cuda_pinned_place() for t in model_tensors(reference))
    assert contents(model_tensors(reference)) == values
