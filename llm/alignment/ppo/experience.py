"""The batch that crosses stage boundaries of one RL step: rollout -> reward -> log-probs -> advantages -> update."""

from dataclasses import dataclass, fields
from typing import List, Optional

import paddle


@dataclass
class Experience:
    """Tensors of B = prompts * rollout_n responses, with P prompt and R response positions.

    input_ids        [B, P+R] int64  prompt left-padded, response right-padded
    attention_mask   [B, P+R] int64  1 on real prompt tokens and on response tokens up to EOS
    response_mask    [B, R] float32  1 on response tokens up to and including EOS
    group_index      [B] int64       which prompt a response answers (GRPO groups)
    finished         [B] bool        the response ended with EOS (not cut at max_dec_len)
    rewards          [B] float32     clipped scalar reward per response
    old_logprobs     [B, R] float32  actor log-probs at rollout time (None: on-policy, use detached current ones)
    ref_logprobs     [B, R] float32  reference-model log-probs (None without a KL term)
    advantages       [B, R] float32
    prompts, labels, responses: the texts, for rewards and sample tables.
    """

    input_ids: paddle.Tensor
    attention_mask: paddle.Tensor
    response_mask: paddle.Tensor
    group_index: paddle.Tensor
    finished: paddle.Tensor
    prompts: List[str]
    labels: List[str]
    responses: List[str]
    rewards: Optional[paddle.Tensor] = None
    old_logprobs: Optional[paddle.Tensor] = None
    ref_logprobs: Optional[paddle.Tensor] = None
    advantages: Optional[paddle.Tensor] = None

    @property
    def prompt_len(self):
        return self.input_ids.shape[1] - self.response_mask.shape[1]

    def __len__(self):
        return self.input_ids.shape[0]

    def select(self, start, end):
        """Rows [start, end) as a new Experience (a micro-batch)."""
        values = {}
        for f in fields(self):
            value = getattr(self, f.name)
            values[f.name] = None if value is None else value[start:end]
        return Experience(**values)
