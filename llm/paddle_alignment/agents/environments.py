"""Environments of multi-turn rollouts: a task that answers each sampled turn with an observation, a reward for
the turn and whether the episode is over (verl's interactions, TRL's environments).

    class GuessTheNumber(Environment):
        '''Guess the row's number: each wrong guess is answered "higher" or "lower".'''

        def reset(self, row):
            self.secret = int(row["label"])

        def step(self, action):
            numbers = re.findall(r"-?\\d+", action)
            if numbers and int(numbers[-1]) == self.secret:
                return "correct", 1.0, True
            return "higher" if not numbers or int(numbers[-1]) < self.secret else "lower", 0.0, False

`reset(row)` starts an episode for a dataset row ({"prompt", "label"}: its prompt text and reference answer);
`step(action)` takes the text of a sampled turn (special tokens removed) and returns (observation, reward,
done). The observation becomes a user turn of the chat template, appended token in, token out; the rewards
of a trajectory's turns add up (discounted by `turn_reward_discount`) to its environment return, which is
added to the reward source's score of the last turn (or is the whole score when no reward source is set).

Like tools, an environment runs in worker processes with a deadline per call (deadline_workers.py), so one
that hangs cannot hang the run: its instance is pickled between calls (keep its attributes plain data), and
any worker takes the next step. A step that raises, returns something else than (str, number, bool) or runs
past `tool_timeout` ends its trajectory, counted in `multi_turn/env_errors` and logged.
"""

import base64
import inspect
import pickle
from dataclasses import dataclass

from paddle_alignment.agents.tools import load_path
from paddle_alignment.deadline_workers import CallFailed, DeadlineExceeded


class Environment:
    """Subclass it with `reset(row)` and `step(action) -> (observation, reward, done)`; see the module's text."""

    def reset(self, row):
        raise NotImplementedError

    def step(self, action):
        raise NotImplementedError


@dataclass(frozen=True)
class EnvironmentStep:
    """What a step gave: `observation` (None: the episode is over), the turn's `reward`, and `error` (a step
    that failed; the episode is over)."""

    observation: object
    reward: float = 0.0
    error: str = ""


def environment_class(path):
    """The Environment subclass at "module:Class" (the config's `environment`)."""
    target = load_path(path, "environment")
    if not (inspect.isclass(target) and issubclass(target, Environment)):
        raise TypeError(f"environment {path}: a subclass of paddle_alignment.agents.environments.Environment")
    for method in ("reset", "step"):
        if getattr(target, method) is getattr(Environment, method):
            raise TypeError(f"environment {path}: define its {method} method")
    return target


def pickled(environment):
    return base64.b64encode(pickle.dumps(environment)).decode("ascii")


def unpickled(state):
    return pickle.loads(base64.b64decode(state))


def checked_step(result, name):
    """A step's (observation, reward, done) as JSON values; TypeError naming `name` when it is something else."""
    if not (isinstance(result, tuple) and len(result) == 3):
        raise TypeError(f"{name}.step returned {type(result).__name__}, not (observation, reward, done)")
    observation, reward, done = result
    if not isinstance(observation, str) or isinstance(reward, bool) or not isinstance(reward, (int, float)) or not isinstance(done, bool):
        raise TypeError(f"{name}.step returned ({type(observation).__name__}, {type(reward).__name__}, {type(done).__name__}), not (str, number, bool)")
    return {"observation": observation, "reward": float(reward), "done": done}


def environment_path(paths, name, where):
    """The path among `paths` ("module:Class") of the environment a row names by its class name (empty: the only
    one configured); ValueError naming the row (`where`) otherwise."""
    by_name = {path.partition(":")[2]: path for path in paths}
    if not name and len(by_name) == 1:
        return paths[0]
    if not name:
        raise ValueError(f"{where}: name its environment in the column 'environment' ({', '.join(by_name)})")
    if name not in by_name:
        raise ValueError(f"{where}: environment {name!r} is not configured (environment: {', '.join(by_name)})")
    return by_name[name]


class Environments:
    """The run's environment classes, run in the tool workers (`pool`, a WorkerPool of agents/tool_worker.py):
    `reset` starts each trajectory's episode and `step` answers its turn. Instances travel as pickled states."""

    def __init__(self, paths, pool):
        if len({path.partition(":")[2] for path in paths}) != len(paths):
            raise ValueError(f"two environments share a class name: {paths}")
        for path in paths:
            environment_class(path)
        self.pool = pool
        for path in paths:  # a class the workers cannot import is the config's error, not the model's
            try:
                self.pool.call({"environment": path, "op": "check"})
            except (CallFailed, RuntimeError, DeadlineExceeded) as error:
                raise RuntimeError(
                    f"environment {path} does not load in a worker process: {error or 'no answer'}; its module must "
                    "be importable there (on PYTHONPATH)"
                ) from None

    def reset(self, path, row):
        """The pickled state of a new episode of `path` for `row`, or an EnvironmentStep with the error."""
        try:
            return self.pool.call({"environment": path, "op": "reset", "row": row})["state"]
        except (CallFailed, DeadlineExceeded, RuntimeError) as error:
            return EnvironmentStep(None, error=failure(error, path, "reset", self.pool.deadline))

    def step(self, path, state, action):
        """(the new state, the EnvironmentStep) of one turn."""
        try:
            answer = self.pool.call({"environment": path, "op": "step", "state": state, "action": action})
        except (CallFailed, DeadlineExceeded, RuntimeError) as error:
            return state, EnvironmentStep(None, error=failure(error, path, "step", self.pool.deadline))
        observation = None if answer["done"] else answer["observation"]
        return answer["state"], EnvironmentStep(observation, answer["reward"])


def failure(error, path, op, deadline):
    if isinstance(error, DeadlineExceeded):
        return f"{path}.{op} did not answer within {deadline:g} s"
    return f"{path}.{op}: {error.error if isinstance(error, CallFailed) else error}"
