"""Rollout engines: where the trainer's batches of scored rollouts come from (engines.py), and decoupled
rollout's sampler processes (decoupled.py, sampler.py) and weight publishing (weights.py)."""

from paddle_alignment.rollout.engines import ColocatedRollout, Rollout, RolloutBatch, RolloutTiming

__all__ = ["ColocatedRollout", "Rollout", "RolloutBatch", "RolloutTiming"]
