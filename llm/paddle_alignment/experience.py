"""The batch that crosses stage boundaries of one RL step: rollout -> reward -> log-probs -> advantages -> update."""

from dataclasses import dataclass, fields
from typing import List, Optional

import numpy as np
import paddle


@dataclass
class Experience:
    """Tensors of B = prompts * rollout_n responses, with P prompt and R response positions.

    input_ids        [B, P+R] int64  prompt left-padded, response right-padded
    attention_mask   [B, P+R] int64  1 on real prompt tokens and on response tokens up to EOS
    response_mask    [B, R] float32  1 on response tokens up to and including EOS
    group_index      [B] int64       which prompt a response answers (GRPO groups)
    finished         [B] bool        the response ended with EOS (not cut at max_dec_len)
    scores           [B] float32     raw score of the reward source (rule, server or reward model)
    score_parts      [B, K] float32  the score's parts (a rule with parts: the columns of the scorer's `parts`)
    unscored         [B] bool        the reward source could not score the row: it got the rule's min score, and
                                     leaves advantages, group statistics and the loss (trained_mask)
    rewards          [B] float32     the score after penalties, normalisation and clipping
    rollout_logprobs [B, R] float32  the sampler's log-probs of the tokens it drew, as it drew them (the fast
                                     decode loop's; None from generate() or greedy decoding)
    old_logprobs     [B, R] float32  the trainer's forward's log-probs of the sampling policy (None: on-policy,
                                     use the detached current ones)
    ref_logprobs     [B, R] float32  reference-model log-probs (None without a KL term)
    teacher_logprobs [B, R] float32  a distillation teacher's log-probs of the sampled tokens (None without one)
    teacher_topk_ids [B, R, K] int64 a distribution-matching teacher's (distill_loss gkd) K most likely tokens
                                     at each response position, and their log-probs teacher_topk_logprobs
                                     [B, R, K] float32 (None otherwise)
    advantages       [B, R] float32
    values           [B, R] float32  critic values at rollout time (PPO)
    returns          [B, R] float32  the critic's targets (PPO)
    turn_stats       [B, K] float32  a multi-turn trajectory's counters (agents/trajectories.py TURN_STATS; None
                                     single-turn). Multi-turn, the response axis holds the sampled turns and
                                     the observations between them: attention_mask is 1 on both,
                                     response_mask on the sampled tokens only
    turn_ids         [B, R] int64    multi-turn: the turn (1, 2, ...) of each sampled token, 0 on observations and
                                     padding (None single-turn)
    env_returns      [B] float32     a trajectory's environment return: its turns' rewards, discounted
                                     (agents/environments.py; None without an environment), part of scores
    prompts, labels, responses: the texts, for rewards and sample tables (multi-turn: the last turn's).
    """

    input_ids: paddle.Tensor
    attention_mask: paddle.Tensor
    response_mask: paddle.Tensor
    group_index: paddle.Tensor
    finished: paddle.Tensor
    prompts: List[str]
    labels: List[str]
    responses: List[str]
    scores: Optional[paddle.Tensor] = None
    score_parts: Optional[paddle.Tensor] = None
    unscored: Optional[paddle.Tensor] = None
    rewards: Optional[paddle.Tensor] = None
    rollout_logprobs: Optional[paddle.Tensor] = None
    old_logprobs: Optional[paddle.Tensor] = None
    ref_logprobs: Optional[paddle.Tensor] = None
    teacher_logprobs: Optional[paddle.Tensor] = None
    teacher_topk_ids: Optional[paddle.Tensor] = None
    teacher_topk_logprobs: Optional[paddle.Tensor] = None
    advantages: Optional[paddle.Tensor] = None
    values: Optional[paddle.Tensor] = None
    returns: Optional[paddle.Tensor] = None
    turn_stats: Optional[paddle.Tensor] = None
    turn_ids: Optional[paddle.Tensor] = None
    env_returns: Optional[paddle.Tensor] = None

    @property
    def prompt_len(self):
        return self.input_ids.shape[1] - self.response_mask.shape[1]

    def __len__(self):
        return self.input_ids.shape[0]

    @property
    def scored(self):
        """[B] bool: the rows the reward source scored (None when it scored every row, or before scoring)."""
        if self.unscored is None or not bool(self.unscored.any()):
            return None
        return ~self.unscored

    @property
    def trained_mask(self):
        """response_mask without the rows the reward source could not score: the tokens advantages, the loss
        and its token counts are taken over. An unscored row is no evidence of a wrong answer."""
        scored = self.scored
        if scored is None:
            return self.response_mask
        return self.response_mask * scored.astype(self.response_mask.dtype).unsqueeze(-1)

    # The fields with a response axis [B, R] (the rest are per row, or [B, P+R]).
    RESPONSE_FIELDS = ("response_mask", "rollout_logprobs", "old_logprobs", "ref_logprobs", "teacher_logprobs", "teacher_topk_ids",
                       "teacher_topk_logprobs", "advantages", "values", "returns", "turn_ids")

    def real_lengths(self):
        """(prompt lengths, response lengths) of each row [B], as numpy int arrays: the attended tokens of each
        side (a multi-turn response's observation tokens count: they take columns and compute)."""
        mask = self.attention_mask.astype("int64")
        return mask[:, : self.prompt_len].sum(axis=1).numpy(), mask[:, self.prompt_len :].sum(axis=1).numpy()

    def trimmed(self):
        """These rows without the padding columns none of them uses: prompt columns left of the longest prompt
        and response columns right of the longest response (micro_batches.py)."""
        prompt_len = self.prompt_len
        prompt, response = self.real_lengths()
        prompt_width, response_width = int(prompt.max()), max(1, int(response.max()))
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        for name in ("input_ids", "attention_mask"):
            values[name] = values[name][:, prompt_len - prompt_width : prompt_len + response_width]
        for name in self.RESPONSE_FIELDS:
            if values[name] is not None:
                values[name] = values[name][:, :response_width]
        return Experience(**values)

    def select(self, start, end):
        """Rows [start, end) as a new Experience (a micro-batch)."""
        return self.take(list(range(start, min(end, len(self)))))

    def take(self, rows):
        """The given rows (a list of indices) as a new Experience."""
        index = paddle.to_tensor(rows, dtype="int64")
        values = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, list):
                values[f.name] = [value[i] for i in rows]
            else:
                values[f.name] = None if value is None else paddle.gather(value, index)
        return Experience(**values)

    @staticmethod
    def concat(batches, pad_token_id):
        """One Experience of the rows of `batches` (rollouts of the same step, before or after scoring,
        before their rewards are turned into advantages): prompts re-padded on the left and responses on the right to common
        widths, group indices kept apart."""
        prompt_len = max(b.prompt_len for b in batches)
        response_len = max(b.response_mask.shape[1] for b in batches)
        groups, offset = [], 0
        for b in batches:
            groups.append(b.group_index + offset)
            offset += int(b.group_index.max()) + 1

        def widen(b, name, value, with_prompt):
            left = prompt_len - b.prompt_len if with_prompt else 0
            return padded_on_axis_1(getattr(b, name), left, response_len - b.response_mask.shape[1], value)

        merged = {
            "input_ids": paddle.concat([widen(b, "input_ids", pad_token_id, True) for b in batches]),
            "attention_mask": paddle.concat([widen(b, "attention_mask", 0, True) for b in batches]),
            "response_mask": paddle.concat([widen(b, "response_mask", 0, False) for b in batches]),
            "group_index": paddle.concat(groups),
            "finished": paddle.concat([b.finished for b in batches]),
        }
        for name in ("scores", "score_parts", "unscored", "rewards", "turn_stats", "env_returns"):  # present once scored (or multi-turn)
            if all(getattr(b, name) is not None for b in batches):
                merged[name] = paddle.concat([getattr(b, name) for b in batches])
        for name in ("rollout_logprobs", "old_logprobs", "ref_logprobs", "teacher_logprobs", "teacher_topk_ids",
                     "teacher_topk_logprobs", "turn_ids"):  # present when recorded at sampling time
            if all(getattr(b, name) is not None for b in batches):
                merged[name] = paddle.concat([widen(b, name, 0.0, False) for b in batches])
        for name in ("prompts", "labels", "responses"):
            merged[name] = [text for b in batches for text in getattr(b, name)]
        return Experience(**merged)

    def to_numpy(self):
        """The fields as numpy arrays and lists (None where unset): what crosses a process boundary."""
        values = {}
        for f in fields(self):
            value = getattr(self, f.name)
            values[f.name] = value.numpy() if isinstance(value, paddle.Tensor) else value
        return values

    @staticmethod
    def from_numpy(values):
        return Experience(**{name: paddle.to_tensor(v) if isinstance(v, np.ndarray) else v for name, v in values.items()})


def padded_on_axis_1(tensor, left, right, value=0):
    """`tensor` ([B, L] or [B, L, K]) with `left` and `right` columns of `value` added on its second axis."""
    pad = [0, 0] * tensor.ndim
    pad[2:4] = [left, right]
    return paddle.nn.functional.pad(tensor, pad, value=value, mode="constant")
