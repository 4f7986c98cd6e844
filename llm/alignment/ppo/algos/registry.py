"""Name -> function registries, so a config key selects an algorithm and adding one touches one file."""


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


ADVANTAGE_ESTIMATORS = Registry("advantage estimator (rl_algorithm)")
POLICY_LOSSES = Registry("policy loss")
KL_ESTIMATORS = Registry("KL estimator (kl_estimator)")
LOSS_AGGREGATIONS = Registry("loss aggregation (loss_agg_mode)")
LR_SCHEDULES = Registry("learning-rate schedule (lr_scheduler_type)")
