"""Where rewards come from during training: a rule function in-process, or the reward server."""

from llm.alignment.ppo.rewards import get_reward_task


class RuleRewardScorer:
    """Scores with a registered rule reward in this process (`use_rule_reward`)."""

    def __init__(self, task_name):
        self.task = get_reward_task(task_name)
        self.max_score = self.task.max_score

    def score(self, prompts, labels, responses):
        return [float(self.task.score(p, l, r)) for p, l, r in zip(prompts, labels, responses)]


class ServerRewardScorer:
    """Scores through the reward server (`use_rm_server`); its /health tells the task's max score."""

    def __init__(self, client):
        self.client = client
        self.max_score = float(client.health()["max_score"])

    def score(self, prompts, labels, responses):
        return self.client.score(prompts, labels, responses)


def build_reward_scorer(args):
    if args.use_rule_reward:
        return RuleRewardScorer(args.reward_task)
    from llm.alignment.ppo.reward_client import RewardServerClient

    client = RewardServerClient(args.reward_server, timeout=args.reward_server_timeout, max_retries=args.reward_server_max_retries)
    return ServerRewardScorer(client)
