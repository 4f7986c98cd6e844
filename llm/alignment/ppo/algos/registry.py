"""Name -> function registries, so a config key selects an algorithm and adding one touches one file."""

import inspect


class Registry:
    def __init__(self, kind):
        self.kind = kind
        self._functions = {}

    def register(self, name):
        def wrap(fn):
            if name in self._functions:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            self._functions[name] = fn
            return fn

        return wrap

    def get(self, name):
        if name not in self._functions:
            raise ValueError(f"unknown {self.kind} {name!r}; choose from {self.names()}")
        return self._functions[name]

    def names(self):
        return sorted(self._functions)


def call_with_options(fn, *args, **options):
    """Call `fn(*args)` plus those `options` its signature names, so algorithms of one registry can take
    different settings (GRPO's std normalisation, say) from one pool of config values."""
    accepted = inspect.signature(fn).parameters
    return fn(*args, **{key: value for key, value in options.items() if key in accepted})


ADVANTAGE_ESTIMATORS = Registry("advantage estimator (rl_algorithm)")
POLICY_LOSSES = Registry("policy loss")
KL_ESTIMATORS = Registry("KL estimator (kl_estimator)")
LOSS_AGGREGATIONS = Registry("loss aggregation (loss_agg_mode)")
LR_SCHEDULES = Registry("learning-rate schedule (lr_scheduler_type)")
PAIRWISE_LOSSES = Registry("pairwise reward-model loss (loss_type)")
