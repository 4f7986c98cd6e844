"""Parameters of the reward: its source (rule, server, reward model or LLM judge) and its shaping."""

import os
import re
from dataclasses import dataclass, field
from typing import Optional

from paddlenlp.utils.log import logger

from paddle_alignment.config.checks import check_non_negative
from paddle_alignment.rewards import REWARD_TASKS


@dataclass
class RewardArguments:
    """Parameters that control the reward: its source (rule, server or reward model) and its shaping."""

    use_rule_reward: bool = field(default=False, metadata={"help": "Score responses in-process with the rule reward of reward_task."})
    reward_task: Optional[str] = field(
        default=None,
        metadata={"help": "Rule reward task: " + ", ".join(sorted(REWARD_TASKS)) + " (docs/rewards.md says what each pays for). Default for use_rule_reward: math, the GSM8K and MATH answer grader, where PaddleNLP's rule reward is a GSM8K rule; for use_rm_server: the server's /health task. Reference answers (tgt) are checked against it when the data loads."},
    )
    use_rm_server: bool = field(default=False, metadata={"help": "Score responses with the reward server. Exactly one of use_rm_server, use_rule_reward and reward_model_name_or_path."})
    reward_server: str = field(default="http://127.0.0.1:8731", metadata={"help": "URL of the reward server."})
    reward_server_timeout: float = field(default=60.0, metadata={"help": "Seconds to wait for one reward request; at least this project's reward server's --grading_budget (20 s) plus 10, checked at start against its /health."})
    reward_server_max_retries: int = field(
        default=3, metadata={"help": "Retries of a reward request that met an outage (no answer, timeout, 5xx without a protocol error), with exponential backoff, before the run stops."}
    )
    normalize_reward: bool = field(
        default=False, metadata={"help": "Normalise rewards by running mean and std over all ranks, kept in checkpoints (off for grpo, as in PaddleNLP)."}
    )
    clip_range_score: float = field(default=10.0, metadata={"help": "Rewards are clipped to [-this, this]."})
    missing_eos_penalty: float = field(default=0.0, metadata={"help": "Subtracted from the reward of responses that never emit EOS."})
    enable_overlong_reward_buffer: bool = field(default=False, metadata={"help": "DAPO's overlong penalty (overlong_reward_buffer)."})
    overlong_reward_buffer: int = field(
        default=256, metadata={"help": "With enable_overlong_reward_buffer: responses longer than max_dec_len - this are penalised."}
    )
    overlong_penalty_factor: float = field(default=1.0, metadata={"help": "Penalty of a response of max_dec_len tokens."})

    def validate_reward(self):
        if self.reward_server_timeout <= 0:
            raise ValueError(f"reward_server_timeout must be positive, got {self.reward_server_timeout}")
        if self.reward_task is None and self.use_rule_reward:
            logger.info("use_rule_reward without reward_task scores with the math rule (GSM8K and MATH answers; docs/rewards.md)")
            self.reward_task = "math"
        if self.reward_task is not None and self.reward_task not in REWARD_TASKS:
            raise ValueError(f"reward_task={self.reward_task!r} is not registered; choose from {sorted(REWARD_TASKS)}")
        check_non_negative(self, ["clip_range_score", "overlong_penalty_factor", "reward_server_max_retries", "missing_eos_penalty"])
        if self.enable_overlong_reward_buffer and not 0 <= self.overlong_reward_buffer <= self.max_dec_len:
            raise ValueError(
                f"overlong_reward_buffer={self.overlong_reward_buffer} must lie in [0, max_dec_len={self.max_dec_len}]"
            )


@dataclass
class JudgeArguments:
    """Parameters of the LLM judge, a generative reward (docs/rewards.md): set judge_model_name_or_path or
    judge_server to score with it."""

    judge_model_name_or_path: str = field(default="", metadata={"help": "A local causal LM (Paddle's or Hugging Face's layout) that judges each response, greedily, from judge_prompt_template."})
    judge_server: str = field(default="", metadata={"help": "URL of a judge that speaks the reward-server protocol: it gets the filled judge_prompt_template as src, the reference as tgt, the response, and answers the score (row errors: no verdict)."})
    judge_prompt_template: str = field(default="", metadata={"help": "The judge's prompt, or a file holding it, with {prompt}, {response} and {reference} replaced by each rollout's (default: grade against the reference, reply [[1]] or [[0]])."})
    judge_verdict_pattern: str = field(default=r"\[\[(-?\d+(?:\.\d+)?)\]\]", metadata={"help": "A regular expression whose first group, read as a number, is a local judge's score; a reply without it has no verdict: its row leaves the batch (judge/excluded_frac), never scored 0."})
    judge_max_new_tokens: int = field(default=64, metadata={"help": "Tokens a local judge may write per verdict."})
    judge_max_score: Optional[float] = field(default=None, metadata={"help": "The judge's score of a correct response, for the accuracy metric (unset: none)."})

    @property
    def uses_judge(self):
        return bool(self.judge_model_name_or_path or self.judge_server)

    def validate_judge(self):
        if self.judge_model_name_or_path and self.judge_server:
            raise ValueError("judge_model_name_or_path and judge_server: one judge, a local model or a server")
        try:
            pattern = re.compile(self.judge_verdict_pattern)
        except re.error as error:
            raise ValueError(f"judge_verdict_pattern={self.judge_verdict_pattern!r} is not a regular expression: {error}") from None
        if pattern.groups < 1:
            raise ValueError(f"judge_verdict_pattern={self.judge_verdict_pattern!r} has no group: its first group is the score")
        if self.judge_max_new_tokens < 1:
            raise ValueError(f"judge_max_new_tokens must be >= 1, got {self.judge_max_new_tokens}")
        if self.judge_model_name_or_path and not os.path.isdir(self.judge_model_name_or_path):
            raise FileNotFoundError(f"judge_model_name_or_path={self.judge_model_name_or_path!r} is not a folder")
