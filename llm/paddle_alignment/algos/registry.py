"""Name -> function registries, so a config key selects an algorithm and adding one touches one file."""

import dataclasses
import inspect
from types import SimpleNamespace


class Registry:
    """Functions by name, each with its traits: what the rest of the run must provide or derive for it
    (e.g. an advantage estimator that needs a critic). `default_traits` names every trait of this kind."""

    def __init__(self, kind, **default_traits):
        self.kind = kind
        self.default_traits = default_traits
        self._functions = {}
        self._traits = {}

    def register(self, name, **traits):
        unknown = sorted(set(traits) - set(self.default_traits))
        if unknown:
            raise ValueError(f"{self.kind} {name!r}: unknown traits {unknown}; known: {sorted(self.default_traits)}")

        def wrap(fn):
            if name in self._functions:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            self._functions[name] = fn
            self._traits[name] = SimpleNamespace(**{**self.default_traits, **traits})
            return fn

        return wrap

    def get(self, name):
        if name not in self._functions:
            raise ValueError(f"unknown {self.kind} {name!r}; choose from {self.names()}")
        return self._functions[name]

    def traits(self, name):
        self.get(name)
        return self._traits[name]

    def names(self):
        return sorted(self._functions)


def from_config(cls, config):
    """The dataclass `cls` with each field the run's `config` key of its name: how an algorithm's options reach it."""
    return cls(**{field.name: getattr(config, field.name) for field in dataclasses.fields(cls)})


def call_with_options(fn, *args, **options):
    """Call `fn(*args)` plus those `options` its signature names, so algorithms of one registry can take
    different settings (GRPO's std normalisation, say) from one pool of config values."""
    accepted = inspect.signature(fn).parameters
    return fn(*args, **{key: value for key, value in options.items() if key in accepted})


# critic: trains a value model; kl_in_reward: takes kl_coeff x KL into the token rewards; group_baseline:
# compares the samples of one prompt (needs rollout_n >= 2).
ADVANTAGE_ESTIMATORS = Registry("advantage estimator (rl_algorithm)", critic=False, kl_in_reward=False, group_baseline=False)
# loss_agg_mode: the aggregation the loss is defined with, whatever the config's loss_agg_mode (None: any).
POLICY_LOSSES = Registry("policy loss (policy_loss)", loss_agg_mode=None)
KL_ESTIMATORS = Registry("KL estimator (kl_estimator)")
LOSS_AGGREGATIONS = Registry("loss aggregation (loss_agg_mode)")
LR_SCHEDULES = Registry("learning-rate schedule (lr_scheduler_type)")
PAIRWISE_LOSSES = Registry("pairwise reward-model loss (loss_type)")
# reference: compares the policy with a reference model (else reference-free by definition); length_normalized:
# takes each response's mean token log-prob rather than its sum.
PREFERENCE_LOSSES = Registry("preference loss (loss_type)", reference=True, length_normalized=False)
UNPAIRED_PREFERENCE_LOSSES = Registry("unpaired preference loss (loss_type)", kl_baseline=True)
# level: what one weight covers: "token", or "sequence" (the same weight on each of its tokens).
ROLLOUT_CORRECTIONS = Registry("rollout correction (rollout_correction)", level="token")
# signal: how the teacher's signal trains the student: "advantage" (a per-token value added to the advantages,
# which the policy loss optimises) or "loss" (a divergence of distributions added to the objective).
DISTILL_LOSSES = Registry("distillation loss (distill_loss)", signal="advantage")
