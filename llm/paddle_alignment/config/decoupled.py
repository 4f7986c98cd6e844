"""Parameters of decoupled rollout: sampler processes on their own devices (docs/decoupled_rollout.md)."""

import os
from dataclasses import dataclass, field
from typing import Optional

from paddle_alignment.config.layout import runs_on_accelerator, slices_weights

ROLLOUT_MODES = ("colocated", "decoupled")


@dataclass
class DecoupledRolloutArguments:
    """Parameters that control decoupled rollout: sampler processes on their own devices."""

    rollout_mode: str = field(
        default="colocated",
        metadata={"help": "colocated: the trainer samples each batch itself; decoupled: sampler processes on rollout_devices sample the next batches while the trainer learns."},
    )
    max_staleness: int = field(
        default=1, metadata={"help": "Decoupled rollout: a batch is sampled by the policy of at most this many RL steps before the one that trains on it."}
    )
    rollout_devices: str = field(
        default="", metadata={"help": "Decoupled rollout: one sampler per entry, comma separated GPU ids not used for training (e.g. 6,7) or cpu (default on CPU: cpu)."}
    )
    rollout_dir: str = field(
        default="", metadata={"help": "Decoupled rollout: folder of the published policy weights and the samplers' logs (default output_dir/rollout; a tmpfs such as /dev/shm is fastest)."}
    )
    rollout_timeout: Optional[float] = field(
        default=None,
        metadata={"help": "Decoupled rollout: seconds the trainer waits for a sampler's batch, or a sampler for weights, before the run stops (default: derived from the steps so far, 10 x the slowest and at least 60 s; 1800 s before the first step)."},
    )
    rollout_sync_check: bool = field(
        default=True,
        metadata={"help": "Decoupled rollout: after loading each policy version a sampler compares its log-probs of a fixed probe batch with the trainer's for that version, and stops the run beyond rollout_sync_tolerance (docs/decoupled_rollout.md)."},
    )
    rollout_sync_tolerance: float = field(
        default=1e-3, metadata={"help": "Decoupled rollout: the largest |log-prob difference| on the probe batch that the weight-sync check lets pass."}
    )

    @property
    def sampler_devices(self):
        """Decoupled rollout: the device of each sampler process ("cpu" or a GPU id)."""
        return [device.strip() for device in self.rollout_devices.split(",") if device.strip()]

    def validate_rollout_mode(self):
        if self.rollout_mode not in ROLLOUT_MODES:
            raise ValueError(f"rollout_mode={self.rollout_mode!r}: choose from {ROLLOUT_MODES}")
        if self.max_staleness < 0:
            raise ValueError(f"max_staleness must be >= 0, got {self.max_staleness}")
        if self.rollout_timeout is not None and self.rollout_timeout <= 0:
            raise ValueError(f"rollout_timeout must be positive (or unset: derived from the steps), got {self.rollout_timeout}")
        if self.rollout_sync_tolerance < 0:
            raise ValueError(f"rollout_sync_tolerance must be >= 0, got {self.rollout_sync_tolerance}")
        if self.rollout_mode != "decoupled":
            return
        if self.pipeline_parallel_degree > 1:
            raise ValueError(
                f"rollout_mode=decoupled: pipeline_parallel_degree={self.pipeline_parallel_degree} is not supported "
                "with it (split the trainer with tensor_parallel_degree, data parallel or sharding stage1)"
            )
        if slices_weights(self):
            raise ValueError(
                "rollout_mode=decoupled with sharding stage3: the trainer publishes the policy's whole weights to its "
                "samplers, and stage 3 holds each only in slices; use sharding stage1 or stage2"
            )
        if not self.rollout_devices:
            if runs_on_accelerator(self):
                raise ValueError(
                    "rollout_mode=decoupled needs rollout_devices: the GPU ids its samplers use, apart from the "
                    "training devices (e.g. --devices 0,1,2,3,4,5 for training and rollout_devices 6,7)"
                )
            self.rollout_devices = "cpu"
        for device in self.sampler_devices:
            if device != "cpu" and not device.isdigit():
                raise ValueError(f"rollout_devices={self.rollout_devices!r}: each entry is a GPU id or cpu, got {device!r}")
        self.rollout_dir = self.rollout_dir or os.path.join(self.output_dir, "rollout")
