"""Pieces shared by the Qwen2 and Llama pipeline-parallel models (model_pp.py): the RL batch packed for
fleet's `PipelineParallel.train_batch`, the loss layers of the last stage (and reward-model training's), and
the score head of the critic and the reward model.

One optimizer step per group of micro-batches, with `model = fleet.distributed_model(pipe)` and the
optimizer from `fleet.distributed_optimizer` (fleet's pipeline_configs: accumulate_steps =
gradient_accumulation_steps, micro_batch_size = per_device_train_batch_size, as paddlenlp's
TrainingArguments set them); the critic likewise with `value_micro_batch`:

    for group in micro_batch_groups(len(exp), per_device_train_batch_size, gradient_accumulation_steps,
                                    dataloader_drop_last):
        micro_batches = pad_micro_batches([policy_micro_batch(exp.select(*rows)) for rows in group], pad_id)
        loss = model.train_batch(pipe._prepare_pipeline_inputs_func(micro_batches), optimizer, lr_scheduler, scaler)
        stats = pipe.pipeline_loss.pop_stats()  # on the last pipeline stage; {} elsewhere

Packing. A micro-batch is a dict of the experience's tensors (`policy_micro_batch`, `value_micro_batch`):

    input_ids [b, P+R] int64, attention_mask [b, P+R] (prompt left-padded, response right-padded),
    response_mask [b, R]; policy: rollout_logprobs, old_logprobs, ref_logprobs, advantages [b, R];
    value: old_values, returns [b, R]; both: loss_scale [b, 4] (`loss_scale_entry`: the optimizer step's
    LossScale, so that each micro-batch's loss is its share of the step's as in the trainer's update, times
    the accumulation steps that fleet divides each micro-batch's loss by; None: each micro-batch its own
    step, its losses averaged)

`split_pipeline_inputs` (the pipes' `_prepare_pipeline_inputs_func`) turns one micro-batch dict, which
fleet then cuts into micro-batches along the batch axis, or a list of them (one per accumulation step, the
form paddlenlp's Trainer uses), into `[first_stage_inputs, labels]`:

    first stage: (input_ids, attention_mask as bool, None, position_ids)
    labels, policy: (response labels, old_logprobs, ref_logprobs, advantages, response_mask, rollout_logprobs,
                     loss_scale)
    labels, value:  (old_values, returns, response_mask, loss_scale)
    labels, reward-model training: (input_ids, attention_mask) of the collated pairs (`pair_labels`)

with a list of micro-batches each entry becomes a list with one tensor per micro-batch. The first-stage
tuple follows paddlenlp's pipe layers, (input_ids, attention_mask, attn_mask_startend_row_indices,
position_ids); the mask is bool because on GPU paddlenlp's Llama pipe reads an int64 [B, L] tensor in the
mask slot as position ids. The response labels are the last R input ids, so the loss layers take the
logits predicting them as `logits[:, -R-1:-1]`, the trainer's `logits[:, P-1:-1]`.

Absent tensors. `old_logprobs` None (on-policy), `ref_logprobs` None (no KL term), `rollout_logprobs` None
(not recorded: generate() decoding) or `loss_scale` None travel as zero-width
float32 tensors [b, 0], so the labels are always the same tuple of tensors: what a trainer broadcasts to
the other ranks of a stage goes through Paddle collectives, which move tensors only, and a [b, 0] tensor is
cut along the batch axis like the others while carrying no data. The loss layers read width 0 as None.

Shapes. Every micro-batch of one `train_batch` call must have the same shape (stages exchange activations
whose shape is sent once and then checked): `pad_micro_batches` pads them to common widths, or to fixed ones
so that the shape also holds across calls. With shapes that vary between calls, set
`pipeline_parallel_config: "disable_p2p_cache_shape"`.
"""

import paddle
import paddle.nn.functional as F
from paddle import nn
from paddlenlp.utils.log import logger

from paddle_alignment.algos.losses import LossScale
from paddle_alignment.algos.token_stats import end_positions, position_ids_from_mask
from paddle_alignment.models.score_model_utils import IdentityNormalizer

SEQUENCE_KEYS = ("input_ids", "attention_mask")  # [b, P+R]; every other key of a micro-batch is [b, R]


def policy_micro_batch(exp):
    """The policy's micro-batch dict from an Experience (or any object with its fields)."""
    return {
        "input_ids": exp.input_ids,
        "attention_mask": exp.attention_mask,
        "response_mask": exp.trained_mask,  # the loss's tokens: unscored rows leave it
        "old_logprobs": exp.old_logprobs,
        "ref_logprobs": exp.ref_logprobs,
        "advantages": exp.advantages,
        "rollout_logprobs": exp.rollout_logprobs,
        "loss_scale": None,
    }


def value_micro_batch(exp):
    """The value model's micro-batch dict: the rollout-time values are the clipping anchor `old_values`."""
    return {
        "input_ids": exp.input_ids,
        "attention_mask": exp.attention_mask,
        "response_mask": exp.trained_mask,
        "old_values": exp.values,
        "returns": exp.returns,
        "loss_scale": None,
    }


def loss_scale_entry(scale, rows, accumulate_steps):
    """A step's LossScale as the [rows, 4] float32 `loss_scale` of its micro-batches: (tokens, sequences,
    ranks, accumulate_steps)."""
    row = [float(scale.tokens), float(scale.sequences), float(scale.ranks), float(accumulate_steps)]
    return paddle.to_tensor([row] * rows, dtype="float32")


def step_share(entry, response_budget):
    """(LossScale, accumulate_steps) of a `loss_scale` entry; (None, 1) for a zero-width one (the micro-batch
    is its own step, and its loss is left as fleet averages it)."""
    if entry.shape[-1] == 0:
        return None, 1
    tokens, sequences, ranks, accumulate_steps = entry[0].numpy().tolist()
    return LossScale(tokens, sequences, int(ranks), response_budget), accumulate_steps


def micro_batch_groups(num_rows, micro_batch_size, accumulate_steps, drop_last):
    """Row ranges [(start, end), ...] of the micro-batches of `num_rows` rows, one group of `accumulate_steps`
    micro-batches of `micro_batch_size` rows per `train_batch` call (one optimizer step).

    Rows that do not fill a whole group are dropped with a logged count when `drop_last`
    (`dataloader_drop_last`), else they raise ValueError; so does a batch too small for a single group.
    """
    rows_per_step = micro_batch_size * accumulate_steps
    steps, remainder = divmod(num_rows, rows_per_step)
    sizes = (
        f"per_device_train_batch_size={micro_batch_size} x gradient_accumulation_steps={accumulate_steps} "
        f"= {rows_per_step} rows per pipeline step"
    )
    if steps == 0:
        raise ValueError(f"a batch of {num_rows} rows is smaller than {sizes}")
    if remainder:
        if not drop_last:
            raise ValueError(
                f"a batch of {num_rows} rows does not split into {sizes}: choose sizes that divide it, or set "
                f"dataloader_drop_last to drop the last {remainder} rows"
            )
        logger.warning(f"dataloader_drop_last: dropping {remainder} of {num_rows} rows that do not fill {sizes}")
    starts = range(0, steps * rows_per_step, micro_batch_size)
    ranges = [(start, start + micro_batch_size) for start in starts]
    return [ranges[i : i + accumulate_steps] for i in range(0, len(ranges), accumulate_steps)]


def pad_micro_batches(micro_batches, pad_token_id, prompt_len=None, response_len=None):
    """Micro-batch dicts padded to one shape: prompts on the left (pad id, mask 0), responses on the right
    (pad id in input_ids, 0 in every mask and [b, R] tensor). Widths default to the largest present; fixed
    `prompt_len` / `response_len` keep the shape constant across steps. Masked positions do not count in
    any loss, so padding leaves the losses unchanged. None entries stay None."""
    prompt_lens = [b["input_ids"].shape[1] - b["response_mask"].shape[1] for b in micro_batches]
    response_lens = [b["response_mask"].shape[1] for b in micro_batches]
    prompt_len = max(prompt_lens) if prompt_len is None else prompt_len
    response_len = max(response_lens) if response_len is None else response_len
    if prompt_len < max(prompt_lens) or response_len < max(response_lens):
        raise ValueError(
            f"cannot pad micro-batches of prompt/response widths {max(prompt_lens)}/{max(response_lens)} "
            f"to the smaller {prompt_len}/{response_len}"
        )
    padded = []
    for batch, own_prompt, own_response in zip(micro_batches, prompt_lens, response_lens):
        left, right = prompt_len - own_prompt, response_len - own_response
        padded.append({key: pad_entry(key, value, left, right, pad_token_id) for key, value in batch.items()})
    return padded


def pad_entry(key, tensor, left, right, pad_token_id):
    """One micro-batch entry widened: sequence tensors on both sides, response tensors on the right."""
    if key not in SEQUENCE_KEYS:
        left = 0
    return pad_width(tensor, left, right, pad_token_id if key == "input_ids" else 0)


def pad_width(tensor, left, right, value):
    """`tensor` [b, T] padded with `value` to [b, left + T + right]; None stays None."""
    if tensor is None or left == right == 0:
        return tensor
    return F.pad(tensor, [left, right], value=value, mode="constant", data_format="NL")


def same_width(micro_batches, right_pad_values):
    """A step's collated micro-batch dicts (paddlenlp's Trainer hands a pipe a list of them, each padded to its
    own longest row) padded on the right to the widest: fleet sends a step's activation shape once. Every key
    is padded with its value in `right_pad_values` (positions past every row's end, which no loss reads)."""
    width = max(batch["input_ids"].shape[1] for batch in micro_batches)
    padded = []
    for batch in micro_batches:
        unknown = sorted(key for key, value in batch.items() if value.shape[1] != width and key not in right_pad_values)
        if unknown:
            raise ValueError(f"cannot pad the pipeline's micro-batches' {unknown} to one width: no pad value for them")
        padded.append({key: pad_width(value, 0, width - value.shape[1], right_pad_values.get(key)) for key, value in batch.items()})
    return padded


def absent_as_empty(tensor, batch_size):
    """A zero-width float32 [batch_size, 0] tensor for a None entry (see the module docstring)."""
    return paddle.zeros([batch_size, 0], dtype="float32") if tensor is None else tensor


def empty_as_absent(tensor):
    return None if tensor.shape[-1] == 0 else tensor


def first_stage_inputs(batch):
    attention_mask = batch["attention_mask"]
    return (batch["input_ids"], attention_mask.astype("bool"), None, position_ids_from_mask(attention_mask))


def policy_labels(batch):
    """(response labels, old_logprobs, ref_logprobs, advantages, response_mask, rollout_logprobs) of a policy
    micro-batch."""
    batch_size, response_len = batch["response_mask"].shape
    return (
        batch["input_ids"][:, -response_len:],
        absent_as_empty(batch["old_logprobs"], batch_size),
        absent_as_empty(batch["ref_logprobs"], batch_size),
        batch["advantages"],
        batch["response_mask"],
        absent_as_empty(batch["rollout_logprobs"], batch_size),
        absent_as_empty(batch.get("loss_scale"), batch_size),
    )


def value_labels(batch):
    """(old_values, returns, response_mask, loss_scale) of a value micro-batch."""
    batch_size = batch["response_mask"].shape[0]
    return (batch["old_values"], batch["returns"], batch["response_mask"], absent_as_empty(batch.get("loss_scale"), batch_size))


def pair_labels(batch):
    """(input_ids, attention_mask) of a collated batch of preference pairs (PreferenceCollator's)."""
    return (batch["input_ids"], batch["attention_mask"])


def split_pipeline_inputs(inputs, labels_of):
    """`[first_stage_inputs, labels]` for `train_batch` from one micro-batch dict (tuples of tensors) or a
    list of them (tuples of lists, one tensor per micro-batch); `labels_of` is `policy_labels` or
    `value_labels`."""
    if isinstance(inputs, dict):
        return [first_stage_inputs(inputs), labels_of(inputs)]
    first = [first_stage_inputs(batch) for batch in inputs]
    labels = [labels_of(batch) for batch in inputs]
    return [tuple(map(list, zip(*first))), tuple(map(list, zip(*labels)))]


class StatsKeepingLoss(nn.Layer):
    """A pipeline loss layer that keeps each micro-batch's statistics: fleet's pipeline returns only the
    loss, so the trainer reads the rest with `pop_stats()` on the last stage after the step."""

    def __init__(self, objective):
        super().__init__()
        self.objective = objective
        self.recorded_stats = []

    def record(self, stats):
        self.recorded_stats.append({key: detached(value) for key, value in stats.items()})

    def pop_stats(self):
        """The statistics of each micro-batch since the last call, as the objective gave them (floats, and
        (sum, count) pairs of floats); empty off the last stage."""
        recorded, self.recorded_stats = self.recorded_stats, []
        return recorded

    def step_share(self, entry):
        return step_share(entry, getattr(self.objective, "max_dec_len", None))


def detached(value):
    """A statistic as floats: a tensor's value, or a (sum, count) pair's."""
    if isinstance(value, tuple):
        return tuple(float(part) for part in value)
    return float(value)


class PolicyPipeLoss(StatsKeepingLoss):
    """The RL policy objective (a `PolicyObjective`) as the pipeline's loss on the final logits [b, P+R, V]."""

    def forward(self, logits, labels):
        response_labels, old_logprobs, ref_logprobs, advantages, response_mask, rollout_logprobs, loss_scale = labels
        response_len = response_labels.shape[1]
        scale, accumulate_steps = self.step_share(loss_scale)
        loss, stats = self.objective(
            logits[:, -response_len - 1 : -1],
            response_labels,
            empty_as_absent(old_logprobs),
            empty_as_absent(ref_logprobs),
            advantages,
            response_mask,
            scale,
            rollout_logprobs=empty_as_absent(rollout_logprobs),
        )
        self.record(stats)
        return loss * accumulate_steps


class ValuePipeLoss(StatsKeepingLoss):
    """The critic's objective (a `ValueObjective`) as the pipeline's loss on the scores [b, P+R, score_dim]:
    the values are channel 0 at the states before each response token, as the trainer's `response_values`."""

    def forward(self, scores, labels):
        old_values, returns, response_mask, loss_scale = labels
        response_len = response_mask.shape[1]
        scale, accumulate_steps = self.step_share(loss_scale)
        loss, stats = self.objective(scores[:, -response_len - 1 : -1, 0], old_values, returns, response_mask, scale)
        self.record(stats)
        return loss * accumulate_steps


class PairwisePipeLoss(nn.Layer):
    """Reward-model training's loss (`objective`: a `NormalizedPairObjective`) on the scores [2N, L, 1] of a
    collated batch of N pairs; fleet divides it by the accumulation steps, as paddlenlp's Trainer does the
    plain model's. It runs in training only: evaluation takes the pipeline's scores (`objective.evaluated`)."""

    def __init__(self, objective):
        super().__init__()
        self.objective = objective

    def forward(self, scores, labels):
        input_ids, attention_mask = labels
        loss, _, _ = self.objective(scores, input_ids, attention_mask)
        return loss


class NormalizedPairObjective:
    """The pairwise objective (`pair_objective`: algos/pairwise.py's `scored_pairs` with the run's loss) of a
    reward pipe's last stage, with the score model's `normalizer` as its forward uses it: in training the
    statistics take each batch's end scores (over `group`, the last stage's data ranks), and with
    `do_normalize` the loss sees normalized scores. The normalizer is the whole model's, whose saved buffers
    the pipeline's checkpoints carry (pipeline_parallel.save_stages)."""

    def __init__(self, pair_objective, normalizer, do_normalize, group):
        self.pair_objective, self.normalizer, self.do_normalize, self.group = pair_objective, normalizer, do_normalize, group

    def __call__(self, scores, input_ids, attention_mask):
        """Training: (loss, better end scores, worse end scores) of scores [2N, L, D]."""
        if not isinstance(self.normalizer, IdentityNormalizer):
            ends = scores[paddle.arange(scores.shape[0]), end_positions(attention_mask)]
            self.normalizer.update(ends.detach(), self.group)
        return self.evaluated(scores, input_ids, attention_mask)

    def evaluated(self, scores, input_ids, attention_mask):
        """(loss, better end scores, worse end scores) with the statistics as they are."""
        if self.do_normalize:
            scores = self.normalizer.normalize(scores)
        return self.pair_objective(scores[..., 0], input_ids, attention_mask)


class ScoreHeadPipe(nn.Linear):
    """The critic's score head as the last pipeline layer: final hidden states [b, L, H] -> float32 scores
    [b, L, score_dim]. Under the name prefix `score_head` its weights are those of the plain score model's."""

    def __init__(self, config):
        super().__init__(config.hidden_size, config.score_dim, bias_attr=config.score_bias)

    def forward(self, hidden_states):
        return super().forward(hidden_states).astype("float32")


class TiedLMHead:
    """`forward_func` for the tied LM head's SharedLayerDesc; `head_class` is the model's LM head
    (`Qwen2LMHead`, `LlamaLMHead`).

    paddlenlp's pipes leave it None, so the head's slot runs the stage's shared layer itself; when the
    embedding and the head sit on one stage (a single-stage pipe), that layer is the embedding, and it
    fails on hidden states. This runs the LM head on the shared weight instead: the stage's own head
    layer where the stage built one, else a head over the embedding's weight (built per call: it creates
    no parameters, and never holds on to a weight the embedding has since replaced).
    """

    def __init__(self, head_class, config):
        self.head_class = head_class
        self.config = config

    def __call__(self, shared_layer, hidden_states):
        if isinstance(shared_layer, self.head_class):
            return shared_layer(hidden_states)
        head = self.head_class(self.config, embedding_weights=shared_layer.embedding_weight, transpose_y=True)
        return head(hidden_states)
