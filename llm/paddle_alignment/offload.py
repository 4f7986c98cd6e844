"""Offload the RL trainer's models and optimizer states to host memory between the stages that use them.

`offload_level` (PaddleNLP's names, any of `freeze_model`, `optimizer`, `train_model`) picks the groups:
reference and reward models, optimizer states (moments, beta pows, master weights), actor and critic.
A group lives in CUDA pinned host memory except inside `plan.on_device(group)`. Tensors are moved in
place: the Parameter objects, their names, gradients and stop_gradient flags stay, so models and
optimizers hold valid references throughout. Without CUDA the plan moves nothing and says so once.
"""

import contextlib

import paddle
from paddlenlp.utils.log import logger

from paddle_alignment.group_sharded import stepping_optimizer

OFFLOAD_GROUPS = ("freeze_model", "optimizer", "train_model")


def parse_offload_level(value):
    """The group names in `value` ("freeze_model optimizer", "optimizer,train_model", "" or None) as a frozenset."""
    if value is None:
        return frozenset()
    names = value.replace(",", " ").split() if isinstance(value, str) else list(value)
    unknown = sorted(set(names) - set(OFFLOAD_GROUPS))
    if unknown:
        raise ValueError(
            f"offload_level: unknown name(s) {', '.join(map(repr, unknown))} in {value!r}; "
            f"valid names are {', '.join(OFFLOAD_GROUPS)}, separated by spaces or commas"
        )
    return frozenset(names)


def model_tensors(model):
    """Parameters and buffers of a paddle.nn.Layer."""
    return list(model.parameters()) + list(model.buffers())


def optimizer_tensors(optimizer):
    """The state tensors an optimizer holds now; they appear lazily, on its first step (or set_state_dict).

    Fleet's optimizer wrappers forward these attributes to the inner optimizer; sharding stage 2's does not
    (group_sharded.stepping_optimizer).
    """
    optimizer = stepping_optimizer(optimizer)
    accumulators = [tensor for per_param in optimizer._accumulators.values() for tensor in per_param.values()]
    master_weights = list(optimizer._master_weights.values())
    # A resumed state waits here until the first step copies it into fresh accumulators.
    pending = [value for value in optimizer._accumulators_holder.values() if isinstance(value, paddle.Tensor)]
    return accumulators + master_weights + pending


def move_tensors_(tensors, from_place, to_place):
    """Move each initialized tensor that lives on `from_place` to `to_place`, in place; return how many moved.

    Places are paddle.CPUPlace, CUDAPlace or CUDAPinnedPlace objects. Tensors elsewhere stay: AdamW keeps
    its beta pows on CPU even when training on GPU. If a copy fails (out of memory), no tensor has moved.
    """
    movable = [tensor for tensor in tensors if tensor._is_initialized() and tensor.place._equals(from_place)]
    if not movable:
        return 0
    with paddle.no_grad():
        copies = [tensor._copy_to(to_place, False) for tensor in movable]
        # The sources stay referenced until the asynchronous copies have landed.
        for place in (from_place, to_place):
            if isinstance(place, paddle.CUDAPlace):
                paddle.device.synchronize(place)
        for tensor, copy in zip(movable, copies):
            copy._share_buffer_to(tensor)
    return len(movable)


def _tensors_of(owner):
    if isinstance(owner, paddle.nn.Layer):
        return model_tensors(owner)
    return optimizer_tensors(owner)


def _cuda_device_id(device):
    """The CUDA card that `device` ("gpu", "gpu:1", "cpu") names, or None where there is no CUDA."""
    kind, _, index = device.partition(":")
    if kind != "gpu" or not paddle.is_compiled_with_cuda():
        return None
    # A bare "gpu" means the card paddle (or paddle.distributed.launch) selected for this process.
    return int(index or paddle.get_device().partition(":")[2] or 0)


class OffloadPlan:
    """Which models and optimizers live in host memory, and scopes that bring them onto the device.

    `groups` maps group names (OFFLOAD_GROUPS) to the paddle.nn.Layer and optimizer objects they hold;
    `notice`, if given, is logged once, on first use (the CPU plan explains why it moves nothing).
    """

    def __init__(self, groups, host_place, device_place, notice=None):
        _check_group_names(groups)
        self._groups = {name: [owner for owner in owners if owner is not None] for name, owners in groups.items()}
        self._host_place = host_place
        self._device_place = device_place
        self._users = dict.fromkeys(self._groups, 0)
        self._pending_notice = notice

    @classmethod
    def from_level(cls, level, device=None, frozen=(), trained=(), optimizers=()):
        """The plan for the trainer's `offload_level` on `device` ("gpu", "gpu:1", "cpu"; None: paddle's current).

        None entries (e.g. no critic in GRPO) are skipped.
        """
        names = parse_offload_level(level)
        if not names:
            return cls({}, None, None)
        device = device or paddle.get_device()
        device_id = _cuda_device_id(device)
        if device_id is None:
            notice = (
                f"offload_level {' '.join(sorted(names))!r} has no effect on device {device!r}: offload needs "
                "CUDA pinned host memory, so models and optimizer states stay where they are"
            )
            return cls({}, None, None, notice=notice)
        owners = {"freeze_model": frozen, "optimizer": optimizers, "train_model": trained}
        return cls({name: owners[name] for name in names}, paddle.CUDAPinnedPlace(), paddle.CUDAPlace(device_id))

    @property
    def groups(self):
        """The names of the groups this plan moves."""
        return frozenset(self._groups)

    def offload(self, name):
        """Move group `name`'s tensors to host memory; returns how many moved."""
        return move_tensors_(self._group_tensors(name), self._device_place, self._host_place)

    def reload(self, name):
        """Move group `name`'s tensors back to the device; returns how many moved."""
        return move_tensors_(self._group_tensors(name), self._host_place, self._device_place)

    def offload_all(self):
        """Offload every group not in use inside an `on_device` scope (the trainer calls it once set up)."""
        self._log_pending_notice()
        for name, users in self._users.items():
            if users == 0:
                self.offload(name)

    @contextlib.contextmanager
    def on_device(self, *names):
        """Reload the named groups for the block and offload them after it, also when it raises.

        Scopes nest: a group leaves the device when its outermost scope ends. Groups outside the plan are
        accepted and stay put, so the trainer writes its scopes once for every offload_level.
        """
        _check_group_names(names)
        self._log_pending_notice()
        with contextlib.ExitStack() as scopes:
            for name in names:
                if name in self._groups:
                    scopes.enter_context(self._group_on_device(name))
            yield

    @contextlib.contextmanager
    def _group_on_device(self, name):
        if self._users[name] == 0:
            self.reload(name)
        self._users[name] += 1
        try:
            yield
        finally:
            self._users[name] -= 1
            if self._users[name] == 0:
                self.offload(name)

    def _group_tensors(self, name):
        # Collected at each move, so optimizer states created since the last move are included.
        return [tensor for owner in self._groups[name] for tensor in _tensors_of(owner)]

    def _log_pending_notice(self):
        if self._pending_notice:
            logger.warning(self._pending_notice)
            self._pending_notice = None


def _check_group_names(names):
    unknown = set(names) - set(OFFLOAD_GROUPS)
    if unknown:
        raise ValueError(f"unknown offload groups {sorted(unknown)}; valid names are {', '.join(OFFLOAD_GROUPS)}")
