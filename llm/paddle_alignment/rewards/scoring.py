"""Where rewards come from during training: a rule function in-process, the reward server, a reward model, or an
LLM judge (rewards/judge.py).

Every scorer maps an Experience (texts, and the finished flags) to a ScoredBatch: one float per response,
the score's parts when the rule has parts, and the rows that could not be scored. `max_score` is the score
of a fully correct response (None for a reward model, whose scale is learnt), which the trainer uses to
report accuracy; `parts` the (min, max) of each part, for the accuracy of each.
"""

import paddle
from paddlenlp.utils.log import logger

from paddle_alignment.data.datasets import encode_completion, pad_right
from paddle_alignment.models.tensor_parallel import whole
from paddle_alignment.rewards import BUDGET_MARGIN_SECONDS, REWARD_TASKS, ScoredBatch, get_reward_task
from paddle_alignment.rewards.client import server_client


class RuleRewardScorer:
    """Scores with a registered rule reward in this process (`use_rule_reward`)."""

    def __init__(self, task_name):
        self.task = get_reward_task(task_name)
        self.task_name = task_name
        self.max_score = self.task.max_score
        self.parts = self.task.parts

    def score(self, exp):
        return self.task.score_batch(exp.prompts, exp.labels, exp.responses)


class ServerRewardScorer:
    """Scores through a reward server (`use_rm_server`) of task `task_name` (`reward_task`, may be unset).

    The max score comes from the server's /health, whose task must be `task_name` when that is set; a
    server without /health (PaddleNLP's) is taken to score `task_name`, whose registered rule gives the
    max score (with neither, there is no accuracy metric).
    """

    def __init__(self, client, task_name):
        self.client = client
        self.task_name, self.max_score, self.parts = server_task(client, task_name)

    def score(self, exp):
        return self.client.score(exp.prompts, exp.labels, exp.responses)


def server_task(client, task_name):
    """The server's task name (None when unknown), its max score, and its parts' (min, max)."""
    health = client.health()
    if health is None:
        if task_name is None:
            logger.info(
                f"reward server at {client.url} has no GET /health (as PaddleNLP's) and reward_task is unset: "
                "no accuracy metric (set reward_task to the server's task to count full-score responses)"
            )
            return None, None, {}
        task = get_reward_task(task_name)
        logger.info(
            f"reward server at {client.url} has no GET /health (as PaddleNLP's); "
            f"accuracy counts scores >= {task.max_score:g}, the max score of reward_task={task_name!r}"
        )
        return task_name, task.max_score, task.parts
    if task_name is not None and health.get("task") != task_name:
        raise ValueError(
            f"reward server at {client.url} scores task {health.get('task')!r}, but reward_task={task_name!r}; "
            f"start the server with --task {task_name} or set reward_task to its task"
        )
    check_timeout_covers_budget(client, health.get("grading_budget"))
    parts = {name: (float(low), float(high)) for name, (low, high) in (health.get("parts") or {}).items()}
    return health.get("task"), float(health["max_score"]), parts


def check_timeout_covers_budget(client, grading_budget):
    """Refuse a client that would give up on a request the server is still allowed to grade: a batch of slow
    answers would then time out, be retried, and stop the run."""
    if grading_budget is None:
        return
    needed = float(grading_budget) + BUDGET_MARGIN_SECONDS
    if client.timeout < needed:
        raise ValueError(
            f"reward_server_timeout={client.timeout:g} s is shorter than the reward server's grading budget "
            f"({float(grading_budget):g} s, its --grading_budget) plus {BUDGET_MARGIN_SECONDS:g} s: raise "
            f"reward_server_timeout to at least {needed:g} or start the server with a smaller --grading_budget "
            f"({client.url})"
        )


class RewardModelScorer:
    """Scores with a reward model (`reward_model_name_or_path`): its end score of prompt + response, with
    EOS when the response emitted one, tokenized by the reward model's own tokenizer as in its training."""

    task_name = None
    max_score = None
    parts = {}

    def __init__(self, model, tokenizer, batch_size):
        self.model, self.tokenizer, self.batch_size = model, tokenizer, batch_size

    @paddle.no_grad()
    def score(self, exp):
        finished = exp.finished.numpy().tolist()
        sequences = [
            encode_completion(self.tokenizer, p, r, add_eos=f) for p, r, f in zip(exp.prompts, exp.responses, finished)
        ]
        scores = []
        for start in range(0, len(sequences), self.batch_size):
            input_ids, attention_mask = pad_right(sequences[start : start + self.batch_size], self.tokenizer.pad_token_id)
            end_scores = self.model(input_ids=input_ids, attention_mask=attention_mask).end_scores
            scores.extend(whole(end_scores[:, 0]).astype("float32").numpy().tolist())
        return ScoredBatch(scores)


class EnvironmentReturnsOnly:
    """No reward source: with an environment (agents/environments.py), a trajectory's score is its environment
    return alone, which the rollout worker adds to every score; this scorer adds nothing to it. In pure on-policy
    distillation (rl_algorithm on_policy_distill) the teacher is the signal and every score is 0."""

    task_name = None
    max_score = None
    parts = {}

    def score(self, exp):
        return ScoredBatch([0.0] * len(exp))


def reference_checker(scorer):
    """The check of reference answers (tgt) of the scorer's rule, to run when the data loads; None for a
    reward model, or a server whose task is not one of this project's rules."""
    if scorer.task_name is None:
        return None
    if scorer.task_name not in REWARD_TASKS:
        logger.info(f"reward task {scorer.task_name!r} is not registered here: reference answers are not checked at load")
        return None
    return REWARD_TASKS[scorer.task_name].target_refusal


def build_reward_scorer(args, reward_model=None, reward_tokenizer=None, judge_decode=None):
    """The scorer of the config's reward source; `judge_decode`: the decode loop a local LLM judge answers with
    (rollout/decode.py greedy_responses)."""
    if reward_model is not None:
        return RewardModelScorer(reward_model, reward_tokenizer, args.per_device_reward_batch_size)
    if args.use_rule_reward:
        return RuleRewardScorer(args.reward_task)
    if args.uses_judge:
        from paddle_alignment.rewards.judge import build_judge_scorer

        return build_judge_scorer(args, judge_decode)
    if not args.use_rm_server:
        return EnvironmentReturnsOnly()
    return ServerRewardScorer(server_client(args, args.reward_server), args.reward_task)

