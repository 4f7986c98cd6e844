"""Multi-turn rollouts: sample a turn, answer it, append the answer, sample the next turn, until the answer ends
the trajectory, `max_turns` turns were sampled or `max_dec_len` tokens of trajectory are used. Turns are
answered by the run's tools (ToolReplies: a turn's tool calls, run; a turn without a call ends the trajectory)
or by an environment (EnvironmentReplies: agents/environments.py, which also rewards each turn).

Token in, token out: a trajectory is the prompt's ids, then each turn's ids exactly as sampled, with the ids
of the observations between them (chat_turns.py); nothing is decoded and encoded again. The trainer sees
`response_mask` 1 on the sampled tokens and 0 on the observations (no loss, gradient, KL, entropy, ratio or
length counts them), `attention_mask` 1 on both, and the log-probs each sampled token was drawn with.

Each turn is one batched decode of the trajectories still running. Where the decode loop carries the KV cache
(rollout/decode.py sample_turn: the native CPU forward) a turn prefills only what follows the previous turn's
cache: its last sampled token and the observation; elsewhere it prefills the whole trajectory again. Either
way the log-probs are those of a fresh forward over the trajectory (tested). Every trajectory counts, in
`turn_stats` (TURN_STATS): its turns, tool calls, failed calls (an unreadable call, an unknown tool, wrong
arguments, a tool that raised), timeouts, observations cut to `max_tool_response_tokens`, whether the token
budget cut it, its observation tokens, whether decoding and encoding its ids again gives other ids (where a
re-tokenising toolkit would have trained on tokens nobody sampled), and failed environment calls.
"""

import dataclasses
from concurrent.futures import ThreadPoolExecutor

import paddle

from paddlenlp.utils.log import logger

from paddle_alignment.agents.chat_turns import observation_ids
from paddle_alignment.agents.environments import EnvironmentStep
from paddle_alignment.agents.tools import ToolCallError, ToolResult, parse_tool_calls
from paddle_alignment.experience import Experience
from paddle_alignment.tokens import decode_responses, end_ids, left_pad, through_first_end

TURN_STATS = (
    "turns", "tool_calls", "tool_errors", "tool_timeouts", "observations_cut", "truncated", "observation_tokens",
    "rerender_differs", "env_errors",
)
MAX_LOGGED_ENV_ERRORS = 4  # of one batch


def turn_metrics(turn_stats):
    """`multi_turn/<stat>`: each TURN_STATS counter's mean over the trajectories of `turn_stats` [B, K]."""
    means = turn_stats.mean(axis=0).numpy().tolist()
    return {f"multi_turn/{name}": value for name, value in zip(TURN_STATS, means)}


def called_tools(turn_stats):
    """Whether each trajectory of `turn_stats` [B, K] called a tool: a NumPy bool array [B]."""
    return turn_stats.numpy()[:, TURN_STATS.index("tool_calls")] > 0


@dataclasses.dataclass(frozen=True)
class TurnSettings:
    """The multi-turn keys of the config (config/arguments.py MultiTurnArguments)."""

    max_turns: int
    max_tool_response_tokens: int
    tool_call_style: str
    tool_workers: int = 1
    turn_reward_discount: float = 1.0

    @classmethod
    def from_args(cls, args):
        return cls(args.max_turns, args.max_tool_response_tokens, args.tool_call_style, args.tool_workers, args.turn_reward_discount)


class Trajectory:
    """One row's response side: sampled and observation ids, which of them were sampled, their log-probs, and
    the rewards of its turns (from an environment)."""

    def __init__(self, prompt_ids):
        self.prompt_ids = list(prompt_ids)
        self.ids, self.sampled, self.turn_ids, self.logprobs, self.turn_rewards = [], [], [], [], []
        self.last_turn, self.finished, self.done = [], False, False
        self.environment = None  # (path, pickled state) of its episode
        self.cache = None  # the KV cache of its first tokens (RowCache), where the decode loop carries it
        self.stats = dict.fromkeys(TURN_STATS, 0)

    def add_turn(self, ids, logprobs):
        self.stats["turns"] += 1
        self.ids += ids
        self.sampled += [1.0] * len(ids)
        self.turn_ids += [self.stats["turns"]] * len(ids)
        self.logprobs += logprobs
        self.last_turn = ids

    def add_observation(self, ids):
        self.ids += ids
        self.sampled += [0.0] * len(ids)
        self.turn_ids += [0] * len(ids)
        self.logprobs += [0.0] * len(ids)
        self.stats["observation_tokens"] += len(ids)

    def stop(self, truncated=False):
        self.done = True
        self.stats["truncated"] = int(truncated)

    def env_return(self, discount):
        """The discounted sum of its turns' rewards."""
        return sum(reward * discount**turn for turn, reward in enumerate(self.turn_rewards))


def turn_seed(seed, turn):
    """Each turn's sampling seed: apart from the next micro-batch's seed + 1."""
    return (seed * 1_000_003 + turn) % (2**31 - 1)


def first_turn_ids(row, ends, budget):
    """A row's sampled ids up to and including its first end id (of `ends`), at most `budget`: (ids, their count)."""
    ids = row.tolist()
    end = min(through_first_end(ids, ends), budget)
    return ids[:end], end


def cut_observation(tokenizer, text, limit):
    """`text`, cut to its first `limit` tokens (and whether it was)."""
    ids = tokenizer.encode(text, add_special_tokens=False)["input_ids"]
    if len(ids) <= limit:
        return text, False
    return tokenizer.decode(ids[:limit]) + " ...(cut)", True


def turn_calls(text, style):
    """The tool calls of a sampled turn's `text` ([] when it calls none), or the error result of a call that
    cannot be read."""
    try:
        return parse_tool_calls(text, style)
    except ToolCallError as error:
        return [ToolResult(f"error: {error}", "error")]


def count_results(trajectory, results):
    trajectory.stats["tool_calls"] += len(results)
    trajectory.stats["tool_errors"] += sum(result.status == "error" for result in results)
    trajectory.stats["tool_timeouts"] += sum(result.status == "timeout" for result in results)


def run_calls(calls_by_trajectory, toolbox, pool):
    """The results of every call of a turn, all trajectories' at once on the pool (an unreadable call's result
    is already there): a list per trajectory."""
    pending = [call for calls in calls_by_trajectory for call in calls if not isinstance(call, ToolResult)]
    answered = iter(pool.map(toolbox.run, pending))
    return [[call if isinstance(call, ToolResult) else next(answered) for call in calls] for calls in calls_by_trajectory]


class ToolReplies:
    """Turns answered by the run's tools: the results of a turn's calls, each a `tool` turn of the chat template;
    a turn that calls none ends its trajectory."""

    role = "tool"

    def __init__(self, toolbox, style):
        self.toolbox, self.style = toolbox, style

    def start(self, trajectories, items, n, pool):
        pass

    def reply(self, turns, pool, answerable=True):
        """The observation texts answering each (trajectory, text) of `turns` (None: the trajectory ends). When
        no turn is left to read the answers (`answerable` false) the calls are not run, nor counted: a call's
        answer is all it gives."""
        if not answerable:
            return [None] * len(turns)
        results = run_calls([turn_calls(text, self.style) for _, text in turns], self.toolbox, pool)
        for (trajectory, _), answers in zip(turns, results):
            count_results(trajectory, answers)
        return [[answer.text for answer in answers] or None for answers in results]


class EnvironmentReplies:
    """Turns answered by each row's environment (agents/environments.py): its observation, a `user` turn; its
    reward is the turn's. A reset or step that fails ends the trajectory, counted and logged."""

    role = "user"

    def __init__(self, environments):
        self.environments = environments

    def start(self, trajectories, items, n, pool):
        rows = [item for item in items for _ in range(n)]
        resets = pool.map(lambda item: self.environments.reset(item["environment"], {"prompt": item["prompt"], "label": item["label"]}), rows)
        for trajectory, item, state in zip(trajectories, rows, resets):
            trajectory.environment = (item["environment"], state)

    def reply(self, turns, pool, answerable=True):
        """Each turn's step: its reward counts whether or not a turn is left to read its observation."""

        def step(turn):
            trajectory, text = turn
            path, state = trajectory.environment
            if isinstance(state, EnvironmentStep):  # its reset failed: the episode ends at its first turn
                return None, state
            return self.environments.step(path, state, text)

        steps = list(pool.map(step, turns))
        errors = []
        for (trajectory, _), (state, outcome) in zip(turns, steps):
            trajectory.environment = (trajectory.environment[0], state)
            trajectory.turn_rewards.append(outcome.reward)
            if outcome.error:
                trajectory.stats["env_errors"] += 1
                errors.append(outcome.error)
        if errors:
            shown = "\n".join(f"  {error}" for error in errors[:MAX_LOGGED_ENV_ERRORS])
            logger.warning(f"{len(errors)} environment calls failed; their trajectories end there (multi_turn/env_errors):\n{shown}")
        return [None if outcome.observation is None else [outcome.observation] for _, outcome in steps]


def run_turns(sample, tokenizer, trajectories, sampling, replies, settings, seed, pool):
    """Sample turns of `trajectories` until each is done, answered by `replies` (ToolReplies or
    EnvironmentReplies) on the thread `pool`; whether every turn recorded its log-probs.
    `sample(histories, caches, sampling, seed)` decodes one turn of the token lists `histories` from their
    carried caches (None each on the first turn): (response ids [A, R], their log-probs [A, R] or None, each
    row's cache after the turn or None)."""
    eos, ends, budget = tokenizer.eos_token_id, end_ids(tokenizer), sampling.max_dec_len
    recorded = True
    for turn in range(settings.max_turns):
        running = [t for t in trajectories if not t.done]
        if not running:
            break
        room = [budget - len(t.ids) for t in running]
        turn_sampling = dataclasses.replace(sampling, max_dec_len=max(room), min_dec_len=min(sampling.min_dec_len, max(room)))
        histories = [t.prompt_ids + t.ids for t in running]
        response_ids, logprobs, caches = sample(histories, [t.cache for t in running], turn_sampling, turn_seed(seed, turn))
        recorded = recorded and logprobs is not None
        response_ids, logprobs = response_ids.numpy(), logprobs.numpy() if logprobs is not None else None
        answered = []
        for row, (trajectory, left) in enumerate(zip(running, room)):
            trajectory.cache = caches[row] if caches else None
            ids, count = first_turn_ids(response_ids[row], ends, left)
            trajectory.add_turn(ids, logprobs[row, :count].tolist() if logprobs is not None else [0.0] * count)
            if not ids or ids[-1] not in ends:  # the token budget ended the turn
                trajectory.stop(truncated=True)
                continue
            trajectory.finished = True
            if ids[-1] != eos:  # another end id (Qwen's <|endoftext|>) ends the conversation, not the turn
                trajectory.stop()
                continue
            answered.append((trajectory, decode_responses(tokenizer, [ids])[0]))
        last = turn == settings.max_turns - 1
        for (trajectory, _), observations in zip(answered, replies.reply(answered, pool, answerable=not last)):
            if observations is None or last:
                trajectory.stop()
                continue
            cut = [cut_observation(tokenizer, text, settings.max_tool_response_tokens) for text in observations]
            trajectory.stats["observations_cut"] += sum(was_cut for _, was_cut in cut)
            observation = observation_ids(tokenizer, [text for text, _ in cut], replies.role)
            if len(trajectory.ids) + len(observation) >= budget:  # no room left for the answer to it
                trajectory.stop(truncated=True)
                continue
            trajectory.add_observation(observation)
            trajectory.finished = False
    return recorded


def rerender_differs(tokenizer, trajectory):
    """Whether decoding the trajectory's ids and encoding the text again gives other ids."""
    ids = trajectory.prompt_ids + trajectory.ids
    text = tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    return int(tokenizer.encode(text, add_special_tokens=False)["input_ids"] != ids)


def trajectories_experience(tokenizer, items, n, trajectories, recorded, discount, environments):
    """The Experience of the trajectories (`n` per item, a prompt's adjacent); rollout_logprobs when `recorded`,
    and with `environments` their returns (turn rewards discounted by `discount`)."""
    pad = tokenizer.pad_token_id
    prompt_ids, prompt_mask = left_pad([t.prompt_ids for t in trajectories], pad)
    width = max(1, max(len(t.ids) for t in trajectories))

    def padded(rows, value, dtype):
        return paddle.to_tensor([row + [value] * (width - len(row)) for row in rows], dtype=dtype)

    for trajectory in trajectories:
        trajectory.stats["rerender_differs"] = rerender_differs(tokenizer, trajectory)
    response_mask = padded([t.sampled for t in trajectories], 0.0, "float32")
    exp = Experience(
        input_ids=paddle.concat([prompt_ids, padded([t.ids for t in trajectories], pad, "int64")], axis=1),
        attention_mask=paddle.concat([prompt_mask, padded([[1] * len(t.ids) for t in trajectories], 0, "int64")], axis=1),
        response_mask=response_mask,
        group_index=paddle.arange(len(items), dtype="int64").repeat_interleave(n),
        finished=paddle.to_tensor([t.finished for t in trajectories], dtype="bool"),
        prompts=[item["prompt"] for item in items for _ in range(n)],
        labels=[item["label"] for item in items for _ in range(n)],
        responses=decode_responses(tokenizer, [t.last_turn for t in trajectories]),
        turn_stats=paddle.to_tensor([[float(t.stats[name]) for name in TURN_STATS] for t in trajectories], dtype="float32"),
        turn_ids=padded([t.turn_ids for t in trajectories], 0, "int64"),
    )
    if recorded:
        exp.rollout_logprobs = padded([t.logprobs for t in trajectories], 0.0, "float32") * response_mask
    if environments:
        exp.env_returns = paddle.to_tensor([t.env_return(discount) for t in trajectories], dtype="float32")
    return exp


def multi_turn_rollouts(sample, tokenizer, items, n, sampling, replies, settings, seed):
    """`n` trajectories of each prompt item ({"prompt", "label", "input_ids"}, and "environment" with
    EnvironmentReplies) as an Experience (see above); `sample` as run_turns takes it."""
    trajectories = [Trajectory(item["input_ids"]) for item in items for _ in range(n)]
    with ThreadPoolExecutor(max_workers=settings.tool_workers) as pool:
        replies.start(trajectories, items, n, pool)
        recorded = run_turns(sample, tokenizer, trajectories, sampling, replies, settings, seed, pool)
    environments = isinstance(replies, EnvironmentReplies)
    return trajectories_experience(tokenizer, items, n, trajectories, recorded, settings.turn_reward_discount, environments)
