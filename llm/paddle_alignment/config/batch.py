"""Parameters that control the batch sizes, PaddleNLP's global keys resolved into per-rank ones."""

from dataclasses import dataclass, field

from paddlenlp.utils.log import logger

from paddle_alignment.models.head_logprobs import DEFAULT_CHUNK_TOKENS


@dataclass
class BatchSizeArguments:
    """Parameters that control the batch sizes: prompts per step and per optimizer step, and the micro-batches of each pass."""

    per_device_prompt_batch_size: int = field(
        default=16, metadata={"help": "Prompts per rank per RL step (set from global_batch_size when that is given)."}
    )
    global_batch_size: int = field(
        default=-1, metadata={"help": "Prompts per RL step over all data-parallel ranks (PaddleNLP's newer key): sets per_device_prompt_batch_size = this / ranks; giving both with different values stops the run (-1: unset)."}
    )
    global_mini_batch_size: int = field(
        default=-1,
        metadata={"help": "Prompts per optimizer step over all ranks: sets gradient_accumulation_steps = this x rollout_n x update_iters / (per_device_train_batch_size x ranks), PaddleNLP's formula, when either global key is given (-1: global_batch_size)."},
    )
    global_gen_batch_size: int = field(
        default=-1, metadata={"help": "With dynamic_sampling: prompts generated per batch over all ranks (-1: the RL step's prompts)."}
    )
    per_device_rollout_batch_size: int = field(
        default=-1, metadata={"help": "Prompts decoded together (the rollout micro-batch; -1: all of the rank's prompts)."}
    )
    per_device_logprob_batch_size: int = field(
        default=-1, metadata={"help": "Responses per forward of the old and reference log-probs (-1: per_device_train_batch_size)."}
    )
    per_device_reward_batch_size: int = field(
        default=-1, metadata={"help": "Responses per forward of the reward model (-1: per_device_train_batch_size)."}
    )
    per_device_value_batch_size: int = field(
        default=-1, metadata={"help": "Responses per forward of the critic's rollout values (-1: per_device_train_batch_size)."}
    )
    use_dynamic_batch_size: bool = field(
        default=True,
        metadata={"help": "Micro-batches of the update, log-prob and value passes formed by a token budget (max_token_len_per_device): rows ordered by length, each micro-batch cut to its own rows' width, so no pass computes on the padding of the batch's longest response (verl's use_dynamic_bsz). The loss is unchanged: it is averaged over the whole optimizer step. false: per_device_*_batch_size rows at a time in rollout order, padded to the batch's width."},
    )
    max_token_len_per_device: int = field(
        default=-1,
        metadata={"help": "With use_dynamic_batch_size: padded tokens (rows x (longest prompt + longest response) of the micro-batch) per micro-batch. -1: per_device_*_batch_size of the pass x the batch's longest prompt plus longest response, so no micro-batch holds more than the fixed split would."},
    )
    logprob_chunk_tokens: int = field(
        default=DEFAULT_CHUNK_TOKENS,
        metadata={"help": "Response tokens whose logits exist at once in the log-prob and entropy passes, forward and backward: the LM head projects this many positions at a time, so memory does not grow with the vocabulary times the batch (Qwen2.5's 151,936 entries: 0.3 GB of float32 logits per 512 tokens, and as much again for their gradient). More tokens than this in a micro-batch cost one more product of the head in the backward (each chunk's logits are made again there). 0: the whole micro-batch at once."},
    )
    share_prompt_forward: bool = field(
        default=False,
        metadata={"help": "Rows of one micro-batch with the same prompt (a GRPO group's samples) run its forward once: its keys and values go to each row's response, and the gradient through them sums over the rows. The log-probs, entropies and gradients are the whole rows' (to float rounding); the saving is the prompt tokens of all but one row of each group: at 4 samples of 256 prompt and 512 response tokens, a quarter of the tokens. Applies to the policy's update and to the log-prob passes (reference and behaviour), with a plain LM head; rows share only within a micro-batch. From its first shared forward a model recomputes without reentrancy and rotates unfused, and on the flash-attention branch the responses' attention takes the whole mask (proven on CPU's math backend only; docs/real_size.md): off until checked on GPUs."},
    )
    dataloader_shuffle: bool = field(default=True, metadata={"help": "Shuffle the prompts (each epoch anew, from the seed)."})

    def resolve_batch_sizes(self):
        """PaddleNLP's global batch keys in this project's per-rank ones: global_batch_size prompts per step
        over the dataset_world_size data ranks; global_mini_batch_size prompts per optimizer step, which sets
        gradient_accumulation_steps = global_mini_batch_size x rollout_n x update_iters /
        (per_device_train_batch_size x dataset_world_size) as PaddleNLP computes it; -1 batch sizes of the
        rollout, log-prob, reward and value passes take PaddleNLP's defaults."""
        ranks = self.dataset_world_size
        if self.global_batch_size > 0 or self.global_mini_batch_size > 0:
            if self.global_batch_size <= 0:
                self.global_batch_size = self.per_device_prompt_batch_size * ranks
            if self.global_mini_batch_size <= 0:
                self.global_mini_batch_size = self.global_batch_size
            for key in ("global_batch_size", "global_mini_batch_size"):
                if getattr(self, key) % ranks:
                    raise ValueError(f"{key}={getattr(self, key)} must divide over the {ranks} data-parallel ranks (dataset_world_size)")
            self.per_device_prompt_batch_size = self.global_batch_size // ranks
            responses = self.global_mini_batch_size * self.rollout_n * self.update_iters
            accumulate = responses // (self.per_device_train_batch_size * ranks)
            if accumulate <= 0 or responses % (self.per_device_train_batch_size * ranks):
                raise ValueError(
                    f"global_mini_batch_size={self.global_mini_batch_size} x rollout_n={self.rollout_n} x update_iters="
                    f"{self.update_iters} responses must split into micro-batches of per_device_train_batch_size="
                    f"{self.per_device_train_batch_size} on each of {ranks} data-parallel ranks"
                )
            if self.gradient_accumulation_steps not in (1, accumulate):
                raise ValueError(
                    f"gradient_accumulation_steps={self.gradient_accumulation_steps} contradicts global_mini_batch_size="
                    f"{self.global_mini_batch_size}, which sets it to {accumulate}: give one of them"
                )
            self.gradient_accumulation_steps = accumulate
            logger.info(
                f"global_batch_size={self.global_batch_size}, global_mini_batch_size={self.global_mini_batch_size}: "
                f"per_device_prompt_batch_size={self.per_device_prompt_batch_size}, gradient_accumulation_steps={accumulate}"
            )
        if self.per_device_rollout_batch_size <= 0:
            self.per_device_rollout_batch_size = self.per_device_prompt_batch_size
        for key in ("per_device_logprob_batch_size", "per_device_reward_batch_size", "per_device_value_batch_size"):
            if getattr(self, key) <= 0:
                setattr(self, key, self.per_device_train_batch_size)

    def validate_batch_sizes(self):
        positive = [
            "per_device_prompt_batch_size", "per_device_rollout_batch_size", "per_device_logprob_batch_size",
            "per_device_reward_batch_size", "per_device_value_batch_size", "generation_batch_size",
        ]
        for key in positive:
            if getattr(self, key) <= 0:
                raise ValueError(f"{key} must be positive, got {getattr(self, key)}")
        if self.logprob_chunk_tokens < 0:
            raise ValueError(f"logprob_chunk_tokens must be 0 (no chunks) or positive, got {self.logprob_chunk_tokens}")
        if self.dynamic_sampling and self.global_gen_batch_size > 0 and self.global_gen_batch_size % self.dataset_world_size:
            raise ValueError(
                f"global_gen_batch_size={self.global_gen_batch_size} must divide over the {self.dataset_world_size} data-parallel ranks"
            )
        if self.rollout_batch_size % self.per_device_train_batch_size:
            raise ValueError(
                f"per_device_prompt_batch_size * rollout_n = {self.rollout_batch_size} responses must split into "
                f"micro-batches of per_device_train_batch_size={self.per_device_train_batch_size}"
            )
        micro_batches = self.rollout_batch_size // self.per_device_train_batch_size
        if (self.update_iters * micro_batches) % self.gradient_accumulation_steps:
            raise ValueError(
                f"gradient_accumulation_steps={self.gradient_accumulation_steps} must divide the "
                f"{self.update_iters * micro_batches} micro-batches of one RL step (update_iters * rollout_batch / per_device_train_batch_size)"
            )

    @property
    def generation_batch_size(self):
        """Prompts per rank per generated batch: with dynamic sampling global_gen_batch_size's share, else
        the step's prompts."""
        if self.dynamic_sampling and self.global_gen_batch_size > 0:
            return self.global_gen_batch_size // self.dataset_world_size
        return self.per_device_prompt_batch_size

    @property
    def rollout_batch_size(self):
        """Responses generated per rank per RL step."""
        return self.per_device_prompt_batch_size * self.rollout_n

    @property
    def optimizer_steps_per_rl_step(self):
        micro_batches = self.rollout_batch_size // self.per_device_train_batch_size
        return self.update_iters * micro_batches // self.gradient_accumulation_steps
