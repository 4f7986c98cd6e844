"""Rollout: the rollout worker that generates, scores and computes the behaviour and reference log-probs
(worker.py) on the decode loop (decode.py); the engines through which the trainer asks for batches
(engines.py: colocated; decoupled.py: sampler processes, each serving a worker, sampler.py); weight
publishing to the samplers (weights.py)."""

from paddle_alignment.rollout.engines import ColocatedRollout, Rollout, RolloutBatch, RolloutTiming

__all__ = ["ColocatedRollout", "Rollout", "RolloutBatch", "RolloutTiming"]
