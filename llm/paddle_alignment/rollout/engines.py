"""Where a step's experience comes from: two implementations of one interface, the trainer's one rollout
handle. Each owns a rollout worker (rollout/worker.py) over the trainer's models.

- `ColocatedRollout`: the worker generates and scores a batch when the trainer takes it, so every batch is
  sampled by the policy being trained (on-policy; the default).
- `DecoupledRollout` (rollout/decoupled.py): sampler processes (rollout/sampler.py), each with a rollout
  worker of its own on its own device, generate, score and compute the behaviour and reference log-probs of
  batches requested ahead of time, while the trainer updates the policy on earlier ones.

The trainer requests prompt batches in order (each with a sampling seed and the policy version that must
sample it: the RL steps done when it was requested) and takes them in the same order; `lookahead` is how
many it keeps requested beyond the one it is about to take. Taken batches carry the version that sampled
them, so the trainer knows their staleness. Once it has chosen the rows it trains on (dynamic sampling and a
judge drop some), `complete` adds what the run needs and the batch lacks (log-probs, values): computed once,
on the kept rows, in the trainer's process or already by a sampler. For checkpoints, `drain` makes every
requested batch ready and returns them, and `restore` puts them back, so a resumed run trains on exactly the
batches the first would have.
"""

from collections import deque
from dataclasses import dataclass

from paddle_alignment.experience import Experience


@dataclass
class RolloutBatch:
    """A requested batch, sampled: its scored rollouts, the policy version that sampled them, the seconds the
    generation took, and how long its sampler waited for work or weights before it (decoupled)."""

    exp: Experience
    version: int
    generation_seconds: float
    sampler_idle_seconds: float = 0.0

    def to_numpy(self):
        return {"exp": self.exp.to_numpy(), "version": self.version, "generation_seconds": self.generation_seconds,
                "sampler_idle_seconds": self.sampler_idle_seconds}

    @staticmethod
    def from_numpy(values):
        return RolloutBatch(**(values | {"exp": Experience.from_numpy(values["exp"])}))


class Rollout:
    """The interface, the worker over the trainer's models, and the queue of batches that are sampled but not
    yet taken."""

    lookahead = 0

    def __init__(self, worker):
        self.worker = worker
        self.ready = deque()

    def start(self, version, offload):
        """Begin serving the trainer whose policy is at `version`; the worker's passes follow its OffloadPlan."""
        self.worker.offload = offload

    def request(self, items, seed, version):
        raise NotImplementedError

    def requested(self):
        """Batches requested (or restored) and not yet taken."""
        return len(self.ready)

    def take(self):
        """The oldest requested batch, sampled and scored: a RolloutBatch (waits for it)."""
        raise NotImplementedError

    def complete(self, exp):
        """`exp`, rows of taken batches, with the log-probs and values the run needs (RolloutWorker.complete)."""
        return self.worker.complete(exp)

    def greedy_rollouts(self, items):
        """One greedy, scored rollout of each prompt item by the trainer's policy (evaluation)."""
        return self.worker.greedy_rollouts(items)

    def drain(self):
        """Every requested batch, sampled and kept in order for `take`: the list of them."""
        return list(self.ready)

    def restore(self, batches):
        """Requested batches of a checkpoint (from `drain`), to be taken before any new request."""
        self.ready.extend(batches)

    def policy_updated(self, version):
        """The trainer's policy (the worker's) is now at `version`."""

    def close(self):
        """Stop whatever serves the requests (idempotent)."""


class ColocatedRollout(Rollout):
    """Each batch is sampled in the trainer's process by the worker, over the trainer's own models, when the
    trainer takes it."""

    def __init__(self, worker):
        super().__init__(worker)
        self.pending = deque()

    def request(self, items, seed, version):
        self.pending.append((items, seed, version))

    def requested(self):
        return len(self.ready) + len(self.pending)

    def take(self):
        if not self.ready:
            self.sample_next()
        return self.ready.popleft()

    def sample_next(self):
        items, seed, version = self.pending.popleft()
        exp, seconds = self.worker.generate_sequences(items, seed)
        self.ready.append(RolloutBatch(exp, version, seconds))

    def drain(self):
        while self.pending:
            self.sample_next()
        return super().drain()


class RolloutTiming:
    """What the batches of one RL step cost: the seconds their generation took, the trainer's wait for them,
    their samplers' wait for work or weights, and their staleness (RL steps between the policy that sampled
    a batch and the one it trains)."""

    def __init__(self):
        self.generation_seconds = self.waited = self.sampler_idle_seconds = 0.0
        self.staleness = []

    def add(self, batch, waited, staleness):
        self.generation_seconds += batch.generation_seconds
        self.sampler_idle_seconds += batch.sampler_idle_seconds
        self.waited += waited
        self.staleness.append(staleness)

    def metrics(self):
        return {
            "rollout_seconds": self.generation_seconds,
            "rollout_wait_s": self.waited,
            "train_wait_s": self.sampler_idle_seconds,
            "staleness": sum(self.staleness) / len(self.staleness),
        }
