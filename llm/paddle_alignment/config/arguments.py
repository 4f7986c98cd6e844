"""Arguments of RL alignment, read from one JSON or YAML file with PaddleNLP's `PdArgumentParser`.

Keys, meanings and defaults follow PaddleNLP's RL arguments (`paddlenlp/rl/utils/config_utils.py`), so
its configs run here unchanged; its keys that change nothing here are accepted with a log line saying
why (paddlenlp_keys.py). The training keys are grouped by concern (batch sizes, rollout, algorithm,
schedule, reward, critic, decoupled rollout, memory layout, logging, model kernels), each group a dataclass
that validates its own keys; `RLTrainingArguments` joins them with paddlenlp's TrainingArguments into one
flat set of keys. Everything is checked at start: unknown keys and impossible combinations stop the run
with a message naming the key. docs/configuration.md is generated from the help strings here
(`python -m llm.tools.config_reference`).
"""

import dataclasses
import difflib
import math
import os
import re
from dataclasses import dataclass, field
from typing import Optional

import paddle
from paddlenlp.trainer import PdArgumentParser, TrainingArguments
from paddlenlp.utils.log import logger

from paddle_alignment.agents.tools import TOOL_CALL_STYLES
from paddle_alignment.algos import (
    ADVANTAGE_ESTIMATORS,
    KL_ESTIMATORS,
    LOSS_AGGREGATIONS,
    LR_SCHEDULES,
    POLICY_LOSSES,
    ROLLOUT_CORRECTIONS,
)
from paddle_alignment.config.paddlenlp_keys import canonical_options, config_tokens, drop_keys_without_effect, read_config, split_options
from paddle_alignment.distributed import rendezvous_each_gloo_group_apart
from paddle_alignment.models.head_logprobs import DEFAULT_CHUNK_TOKENS
from paddle_alignment.offload import parse_offload_level
from paddle_alignment.rewards import REWARD_TASKS

# paddlenlp's recompute granularities (config.recompute_granularity of Qwen2 and Llama).
RECOMPUTE_GRANULARITIES = ("full", "full_attn", "core_attn")
ROLLOUT_MODES = ("colocated", "decoupled")


@dataclass
class ModelArgument:
    actor_model_name_or_path: str = field(metadata={"help": "Local path of the policy (actor) model."})
    reference_model_name_or_path: Optional[str] = field(
        default=None, metadata={"help": "Frozen reference model for the KL term; defaults to the actor's path."}
    )
    tokenizer_name_or_path: Optional[str] = field(default=None, metadata={"help": "Tokenizer path; defaults to the actor's."})
    reward_model_name_or_path: Optional[str] = field(
        default=None, metadata={"help": "Reward model (llm/alignment/rm output) that scores responses."}
    )
    reward_critic_model_name_or_path: Optional[str] = field(
        default=None, metadata={"help": "Initial critic (ppo); defaults to the reward model, else the actor's backbone."}
    )
    lora: bool = field(default=False, metadata={"help": "Train LoRA adapters of the actor (paddlenlp.peft) instead of all its weights. The reference log-probs then come from the actor with its adapters switched off, so no reference model is loaded unless reference_model_name_or_path names one."})
    lora_path: Optional[str] = field(default=None, metadata={"help": "Adapters (a saved policy folder) to start the LoRA actor from."})
    lora_rank: int = field(default=8, metadata={"help": "Rank of the LoRA adapters."})
    lora_alpha: Optional[int] = field(default=None, metadata={"help": "LoRA scaling numerator (adapters scale by alpha / rank); default 2 x lora_rank."})
    lora_target_modules: Optional[str] = field(
        default=None,
        metadata={"help": "Comma-separated regexes of the layers that get adapters; default the attention and MLP projections."},
    )
    lora_save_merged: bool = field(
        default=False, metadata={"help": "Also save output_dir/policy_merged: the actor with its adapters merged into the weights."}
    )
    export_hf: bool = field(
        default=False,
        metadata={"help": "Also write output_dir/policy_hf: the final policy (LoRA adapters merged) in Hugging Face's layout, with the tokenizer, for transformers and vLLM (llm/tools/export_hf.py does the same for any saved policy)."},
    )

    def __post_init__(self):
        # PaddleNLP's configs write "" for an unset model path.
        for key in ("reference_model_name_or_path", "tokenizer_name_or_path", "reward_model_name_or_path",
                    "reward_critic_model_name_or_path", "lora_path"):
            if getattr(self, key) == "":
                setattr(self, key, None)


@dataclass
class DataArgument:
    train_datasets: str = field(
        metadata={"help": "Prompts for rollouts: `name[:proportion[:path]]` entries or data files, comma separated."}
    )
    eval_datasets: Optional[str] = field(default=None, metadata={"help": "Held-out prompts, in the same format."})
    ptx_datasets: Optional[str] = field(default=None, metadata={"help": "Supervised data of the ptx loss (ppo), in the same format."})
    prompt_key: str = field(default="src", metadata={"help": "Column of data files holding the literal prompt."})
    label_key: str = field(default="tgt", metadata={"help": "Column of data files holding the reference answer given to the reward."})
    max_prompt_len: int = field(
        default=4096,
        metadata={"help": "Prompts with more tokens keep their first max_prompt_len tokens (PaddleNLP; the reward still sees the whole prompt text, and their number is logged), or are skipped with filter_overlong_prompts. When max_prompt_len + max_dec_len exceeds max_length, prompts are limited to max_length - max_dec_len tokens, with a log line."},
    )
    filter_overlong_prompts: bool = field(
        default=False, metadata={"help": "Skip (and count) prompts over max_prompt_len tokens instead of truncating them."}
    )
    max_length: int = field(
        default=2048, metadata={"help": "Upper bound of prompt plus response tokens; prompts are cut to max_length - max_dec_len when that is shorter."}
    )
    max_eval_samples: int = field(default=0, metadata={"help": "Evaluate on at most this many prompts (0: all)."})

    def __post_init__(self):
        for key in ("max_prompt_len", "max_length"):
            if getattr(self, key) <= 0:
                raise ValueError(f"{key} must be positive, got {getattr(self, key)}")
        if self.max_eval_samples < 0:
            raise ValueError(f"max_eval_samples must be >= 0 (0: all), got {self.max_eval_samples}")


@dataclass
class ModelKernelArguments:
    """PaddleNLP's fused-kernel switches of the models (paddlenlp's LlmMetaConfig keys), set on the model
    configs at load. The fused kernels are GPU kernels: on CPU they are switched off, with a log line."""

    use_flash_attention: bool = field(default=False, metadata={"help": "Flash attention in the models (GPU; set on the model configs, switched off with a log line on CPU)."})
    use_fused_rms_norm: bool = field(default=False, metadata={"help": "Fused RMSNorm kernel in the models (GPU; set on the model configs, switched off with a log line on CPU)."})
    use_fused_rope: bool = field(default=False, metadata={"help": "Fused rotary-embedding kernel in the models (GPU; set on the model configs, switched off with a log line on CPU)."})
    use_fused_linear: bool = field(
        default=False, metadata={"help": "fused_gemm_epilogue linear layers; paddlenlp's Qwen2 and Llama do not read it."}
    )
    recompute_use_reentrant: Optional[bool] = field(
        default=None, metadata={"help": "Reentrant recompute (paddle's recompute use_reentrant); default the model config's."}
    )

    def model_config_flags(self):
        """The model-config attributes these keys set (recompute_use_reentrant only when given)."""
        flags = {key: getattr(self, key) for key in FUSED_KERNEL_KEYS}
        if self.recompute_use_reentrant is not None:
            flags["recompute_use_reentrant"] = self.recompute_use_reentrant
        return flags

    def switch_off_gpu_kernels(self, on_accelerator):
        for key in FUSED_KERNEL_KEYS:
            if getattr(self, key) and not on_accelerator:
                logger.info(f"{key}=True has no effect on CPU: it selects a fused GPU kernel")
                setattr(self, key, False)
        if self.use_fused_linear:
            logger.info("use_fused_linear (fused_linear) has no effect: paddlenlp's Qwen2 and Llama layers do not read it")


FUSED_KERNEL_KEYS = ("use_flash_attention", "use_fused_rms_norm", "use_fused_rope", "use_fused_linear")


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


@dataclass
class RolloutArguments:
    """Parameters that control generation: samples per prompt, lengths and sampling."""

    rollout_n: int = field(default=1, metadata={"help": "Samples per prompt."})
    max_dec_len: int = field(default=512, metadata={"help": "Most tokens generated per response."})
    min_dec_len: int = field(default=1, metadata={"help": "EOS is forbidden before this many tokens."})
    top_p: float = field(default=1.0, metadata={"help": "Nucleus sampling mass during rollout."})
    temperature: float = field(default=1.0, metadata={"help": "Sampling temperature during rollout; log-probs, KL and entropy are computed from the same softmax(logits / temperature)."})
    repetition_penalty: float = field(default=1.0, metadata={"help": "CTRL-style repetition penalty during rollout."})
    top_k: int = field(default=0, metadata={"help": "Sample among the k most likely tokens (0: no limit)."})
    use_fusemt: bool = field(
        default=True, metadata={"help": "Decode with the paddlenlp_ops fast loop when installed (else generate())."}
    )
    eos_token: str = field(default="", metadata={"help": "A token that ends responses instead of the tokenizer's EOS (\"\": the tokenizer's)."})


    def validate_rollout(self):
        for key in ("rollout_n", "max_dec_len"):
            if getattr(self, key) <= 0:
                raise ValueError(f"{key} must be positive, got {getattr(self, key)}")
        if not 0 <= self.min_dec_len <= self.max_dec_len:
            raise ValueError(f"min_dec_len={self.min_dec_len} must lie in [0, max_dec_len={self.max_dec_len}]")
        if self.temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0: no limit), got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must lie in (0, 1], got {self.top_p}")


@dataclass
class AlgorithmArguments:
    """Parameters that control the algorithm: advantages, policy loss, KL, clipping, aggregation and DAPO's dynamic sampling."""

    rl_algorithm: str = field(
        default="ppo", metadata={"help": "Advantage estimator (PaddleNLP's default ppo): " + ", ".join(ADVANTAGE_ESTIMATORS.names())}
    )
    update_iters: int = field(default=1, metadata={"help": "Passes over each rollout batch."})
    policy_loss: str = field(default="ppo_clip", metadata={"help": "Policy loss: " + ", ".join(POLICY_LOSSES.names()) + " (ppo_clip: per-token ratio; gspo, gmpo: per-sequence ratio, always aggregated with seq-mean-token-mean; cispo: clipped, detached IS weight times log-prob; sapo: soft gate instead of the clip)."})
    sapo_tau_pos: float = field(default=1.0, metadata={"help": "sapo: gate temperature of tokens with positive advantage (the paper's 1.0)."})
    sapo_tau_neg: float = field(default=1.05, metadata={"help": "sapo: gate temperature of tokens with negative advantage (the paper's 1.05)."})
    pg_loss_coeff: float = field(default=1.0, metadata={"help": "Weight of the policy-gradient loss."})
    entropy_coeff: float = field(default=0.0, metadata={"help": "Weight of the entropy bonus (0: off)."})
    clip_range_ratio: float = field(default=0.2, metadata={"help": "PPO ratio clip, both sides unless _low/_high are given."})
    clip_range_ratio_low: Optional[float] = field(default=None, metadata={"help": "Lower clip: ratio >= 1 - this (cispo: 1 sets no lower bound; gmpo: log-ratio >= -this)."})
    clip_range_ratio_high: Optional[float] = field(default=None, metadata={"help": "Upper clip: ratio <= 1 + this (DAPO clip-higher; gmpo: log-ratio <= this)."})
    clip_ratio_c: float = field(
        default=3.0,
        metadata={"help": "Dual-clip PPO (ppo_clip): the loss of a negative-advantage token is at most -A x this (verl's key and default; 0: off)."},
    )
    loss_agg_mode: Optional[str] = field(
        default=None,
        metadata={
            "help": "Loss aggregation over the optimizer step's tokens: " + ", ".join(LOSS_AGGREGATIONS.names())
            + " (default token-mean; gspo and gmpo always seq-mean-token-mean; seq-mean-token-sum-norm: Dr.GRPO's, divided by max_dec_len)."
        },
    )
    kl_loss_coeff: float = field(default=0.001, metadata={"help": "Weight of the KL-to-reference loss (0 disables the reference model)."})
    kl_estimator: str = field(default="k3", metadata={"help": "KL estimator of the KL loss and the logged kl: k1, k2 or k3 (k3 clamped as verl does: log-ratio to +-20, estimate to +-10)."})
    kl_coeff: float = field(
        default=0.02,
        metadata={"help": "Weight of the KL penalty in the token rewards (ppo, reinforce_plus_plus; other algorithms ignore it, with a warning)."},
    )
    reward_kl_estimator: str = field(default="k1", metadata={"help": "KL estimator of the KL penalty in the token rewards: k1 (verl's and PaddleNLP's default), k2 or k3."})
    gamma: float = field(default=1.0, metadata={"help": "Discount of the token returns (ppo, reinforce_plus_plus)."})
    lam: float = field(default=0.95, metadata={"help": "GAE lambda (ppo)."})
    normalize_advantage: bool = field(default=False, metadata={"help": "Whiten GAE advantages over valid tokens (ppo; off for grpo, as in PaddleNLP)."})
    norm_adv_by_std_in_grpo: bool = field(default=True, metadata={"help": "Divide group advantages by the group std (False: Dr.GRPO)."})
    ptx_coeff: float = field(default=0.0, metadata={"help": "Weight of the language-model loss on ptx_datasets (ppo)."})
    dynamic_sampling: bool = field(
        default=False, metadata={"help": "DAPO dynamic sampling: drop groups of equal rewards and generate more batches to fill the step."}
    )
    max_gen_batches: int = field(default=32, metadata={"help": "With dynamic_sampling: at most this many generated batches per step."})
    rollout_correction: str = field(
        default="",
        metadata={"help": "Weights of the policy loss for the gap between the sampler's and the trainer's log-probs (docs/rollout_correction.md): "
                  + ", ".join(ROLLOUT_CORRECTIONS.names()) + ", or empty: none (the rollout_corr/* metrics are logged either way)."},
    )
    rollout_is_threshold: float = field(
        default=2.0, metadata={"help": "rollout_correction: the upper bound of the importance ratio pi_old / pi_rollout (the cap of token_tis and sequence_tis; the upper bound kept by sequence_mis, geometric_mask and icepop)."}
    )
    rollout_is_threshold_lower: Optional[float] = field(
        default=None, metadata={"help": "rollout_correction: the lower bound kept by sequence_mis, geometric_mask and icepop (default 1 / rollout_is_threshold)."}
    )

    @property
    def kl_in_reward(self):
        """The token rewards carry a KL penalty, which needs the rollout policy's and the reference's log-probs."""
        return ADVANTAGE_ESTIMATORS.traits(self.rl_algorithm).kl_in_reward and self.kl_coeff > 0

    @property
    def uses_critic(self):
        return ADVANTAGE_ESTIMATORS.traits(self.rl_algorithm).critic

    @property
    def uses_reference_model(self):
        return self.kl_loss_coeff > 0 or self.kl_in_reward

    def resolve_loss_agg_mode(self):
        """An unset loss_agg_mode is token-mean; a policy loss defined with its own aggregation (gspo, gmpo:
        per sequence) always gets it, with a warning when the config asks for another."""
        if self.policy_loss not in POLICY_LOSSES.names():
            return  # validate_rl names the key
        required = POLICY_LOSSES.traits(self.policy_loss).loss_agg_mode
        if required and self.loss_agg_mode not in (None, required):
            logger.warning(
                f"policy_loss={self.policy_loss} is defined per sequence: loss_agg_mode={self.loss_agg_mode!r} "
                f"is replaced by {required!r} (its paper's mean over sequences, as in verl)"
            )
        self.loss_agg_mode = required or self.loss_agg_mode or "token-mean"


    def validate_algorithm(self):
        if self.clip_range_ratio_low is None:
            self.clip_range_ratio_low = self.clip_range_ratio
        if self.clip_range_ratio_high is None:
            self.clip_range_ratio_high = self.clip_range_ratio
        self.resolve_loss_agg_mode()
        choices = {
            "rl_algorithm": ADVANTAGE_ESTIMATORS,
            "kl_estimator": KL_ESTIMATORS,
            "reward_kl_estimator": KL_ESTIMATORS,
            "policy_loss": POLICY_LOSSES,
            "loss_agg_mode": LOSS_AGGREGATIONS,
        }
        if self.rollout_correction:
            choices["rollout_correction"] = ROLLOUT_CORRECTIONS
        check_choices(self, choices)
        self.validate_rollout_correction()
        for key in ("update_iters", "max_gen_batches"):
            if getattr(self, key) <= 0:
                raise ValueError(f"{key} must be positive, got {getattr(self, key)}")
        if self.clip_ratio_c and self.clip_ratio_c <= 1:
            raise ValueError(f"clip_ratio_c={self.clip_ratio_c} must be > 1 (dual clip caps the loss at -A x clip_ratio_c), or 0 for off")
        if ADVANTAGE_ESTIMATORS.traits(self.rl_algorithm).group_baseline and self.rollout_n < 2:
            raise ValueError(
                f"rollout_n={self.rollout_n}: {self.rl_algorithm} compares samples of one prompt, so it needs rollout_n >= 2"
            )
        check_non_negative(self, [
            "clip_range_ratio_low", "clip_range_ratio_high", "kl_loss_coeff", "entropy_coeff", "kl_coeff", "ptx_coeff",
            "pg_loss_coeff", "clip_ratio_c",
        ])
        if self.clip_range_ratio_low >= 1 and self.policy_loss != "cispo":
            raise ValueError(f"clip_range_ratio_low={self.clip_range_ratio_low} must be < 1 (ratios are positive; only cispo takes 1 or more: no lower bound)")
        if self.policy_loss == "sapo" and not (self.sapo_tau_pos > 0 and self.sapo_tau_neg > 0):
            raise ValueError(f"sapo_tau_pos={self.sapo_tau_pos} and sapo_tau_neg={self.sapo_tau_neg} must be > 0 (the gate divides by them)")
        if not 0 < self.gamma <= 1:
            raise ValueError(f"gamma must lie in (0, 1], got {self.gamma}")
        if not 0 <= self.lam <= 1:
            raise ValueError(f"lam must lie in [0, 1], got {self.lam}")
        if self.dynamic_sampling and self.rollout_n < 2:
            raise ValueError("dynamic_sampling filters groups of samples, so it needs rollout_n >= 2")

    def validate_rollout_correction(self):
        if not self.rollout_is_threshold > 0:
            raise ValueError(f"rollout_is_threshold must be > 0 (a bound of the ratio pi_old / pi_rollout), got {self.rollout_is_threshold}")
        if self.rollout_is_threshold_lower is None:
            self.rollout_is_threshold_lower = 1.0 / self.rollout_is_threshold
        if not 0 <= self.rollout_is_threshold_lower <= self.rollout_is_threshold:
            raise ValueError(
                f"rollout_is_threshold_lower={self.rollout_is_threshold_lower} must lie in [0, rollout_is_threshold={self.rollout_is_threshold}]"
            )


@dataclass
class ScheduleArguments:
    """Parameters that control the actor's learning-rate schedule, beside paddlenlp's learning_rate, lr_scheduler_type and warm-up keys."""

    min_learning_rate: float = field(default=0.0, metadata={"help": "The schedule decays to this learning rate."})
    decay_steps: Optional[int] = field(default=None, metadata={"help": "RL steps over which the schedule decays to min_learning_rate (default max_steps)."})

    def validate_schedule(self):
        check_choices(self, {"lr_scheduler_type": LR_SCHEDULES})
        check_non_negative(self, ["learning_rate", "warmup_steps"])
        if self.decay_steps is not None and self.decay_steps <= 0:
            raise ValueError(f"decay_steps must be positive (or unset: max_steps), got {self.decay_steps}")
        if not 0 <= self.min_learning_rate <= self.learning_rate:
            raise ValueError(f"min_learning_rate={self.min_learning_rate} must lie in [0, learning_rate={self.learning_rate}]")


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
    reward_server_timeout: float = field(default=60.0, metadata={"help": "Seconds to wait for one reward request."})
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


@dataclass
class CriticArguments:
    """Parameters that control the critic (ppo): its optimizer, schedule, value clipping and recompute."""

    critic_learning_rate: float = field(default=5e-6, metadata={"help": "Critic peak learning rate (ppo)."})
    critic_min_learning_rate: float = field(default=0.0, metadata={"help": "The critic's schedule decays to this."})
    critic_weight_decay: float = field(default=0.0, metadata={"help": "Critic AdamW weight decay."})
    critic_lr_scheduler_type: str = field(default="constant", metadata={"help": "Critic schedule: linear, cosine or constant."})
    critic_warmup_ratio: float = field(default=0.0, metadata={"help": "Share of steps of critic warm-up."})
    critic_decay_steps: Optional[int] = field(default=None, metadata={"help": "The critic's decay_steps (default max_steps)."})
    clip_range_value: float = field(default=5.0, metadata={"help": "Critic values move at most this far from their rollout values (ppo)."})
    critic_recompute: bool = field(default=False, metadata={"help": "Recompute critic activations in backward to save memory."})
    critic_recompute_granularity: str = field(
        default="full", metadata={"help": "What the critic recomputes: full, full_attn or core_attn (as recompute_granularity)."}
    )


    def validate_critic(self):
        check_choices(self, {"critic_lr_scheduler_type": LR_SCHEDULES})
        if self.critic_decay_steps is not None and self.critic_decay_steps <= 0:
            raise ValueError(f"critic_decay_steps must be positive (or unset: max_steps), got {self.critic_decay_steps}")
        check_non_negative(self, ["clip_range_value", "critic_weight_decay", "critic_learning_rate"])
        if not 0 <= self.critic_min_learning_rate <= self.critic_learning_rate:
            raise ValueError(
                f"critic_min_learning_rate={self.critic_min_learning_rate} must lie in [0, critic_learning_rate={self.critic_learning_rate}]"
            )
        if not 0 <= self.critic_warmup_ratio < 1:
            raise ValueError(f"critic_warmup_ratio must lie in [0, 1), got {self.critic_warmup_ratio}")


@dataclass
class MultiTurnArguments:
    """Parameters of multi-turn rollouts with tools or environments (docs/multi_turn.md): set `tools` or
    `environment` to turn them on."""

    tools: str = field(
        default="", metadata={"help": "Comma-separated tools the policy may call, each a typed, documented Python function as module:function (importable where the run starts; empty: single-turn rollouts)."}
    )
    tool_call_style: str = field(
        default="qwen", metadata={"help": "How tool calls are written: qwen (<tool_call>{\"name\": ..., \"arguments\": {...}}</tool_call>, Qwen2.5) or llama3 (a JSON object with name and parameters, Llama 3.1)."}
    )
    max_turns: int = field(default=4, metadata={"help": "Assistant turns per trajectory at most; max_dec_len bounds a trajectory's sampled and observation tokens together."})
    max_tool_response_tokens: int = field(default=256, metadata={"help": "A tool's answer is cut to this many tokens (and counted in multi_turn/observations_cut)."})
    tool_timeout: float = field(default=10.0, metadata={"help": "Seconds a tool call (or an environment's reset or step) may run before it is stopped: a tool answers with a timeout error, an environment's trajectory ends."})
    tool_workers: int = field(default=2, metadata={"help": "Worker processes running tool calls and environment steps (per rank or sampler)."})
    environment: str = field(
        default="", metadata={"help": "Comma-separated environments that answer each turn, each a subclass of paddle_alignment.agents.environments.Environment as module:Class; a data row picks one by class name in its `environment` column (with one, every row uses it). Instead of tools; its turn rewards add up to each trajectory's environment return, added to the reward source's score (no reward source: the return is the score)."}
    )
    turn_reward_discount: float = field(default=1.0, metadata={"help": "An environment return is the sum of discount**t x the reward of turn t (t from 0); 1.0: their sum."})

    def validate_multi_turn(self):
        if self.tool_call_style not in TOOL_CALL_STYLES:
            raise ValueError(f"tool_call_style={self.tool_call_style!r}: choose from {TOOL_CALL_STYLES}")
        check_import_paths(self.tool_paths, "tools", "module:function")
        check_import_paths(self.environment_paths, "environment", "module:Class")
        for key in ("max_turns", "max_tool_response_tokens", "tool_workers"):
            if getattr(self, key) < 1:
                raise ValueError(f"{key} must be >= 1, got {getattr(self, key)}")
        if self.tool_timeout <= 0:
            raise ValueError(f"tool_timeout must be positive, got {self.tool_timeout}")
        if self.tool_paths and self.environment_paths:
            raise ValueError("tools and environment together: an environment answers every turn itself (call the tools from its step)")
        if not 0 < self.turn_reward_discount <= 1:
            raise ValueError(f"turn_reward_discount must lie in (0, 1], got {self.turn_reward_discount}")
        if self.multi_turn and slices_weights(self):
            raise ValueError(
                "tools or environment (multi-turn rollouts) with sharding stage3: each rank's trajectories take their "
                "own number of turns, and every forward gathers the sliced weights from all ranks; use sharding "
                "stage1 or stage2"
            )

    @property
    def tool_paths(self):
        return [spec.strip() for spec in self.tools.split(",") if spec.strip()]

    @property
    def environment_paths(self):
        return [spec.strip() for spec in self.environment.split(",") if spec.strip()]

    @property
    def multi_turn(self):
        return bool(self.tool_paths or self.environment_paths)


@dataclass
class DecoupledRolloutArguments:
    """Parameters that control decoupled rollout: sampler processes on their own devices."""

    rollout_mode: str = field(
        default="colocated",
        metadata={"help": "colocated: the trainer samples each batch itself; decoupled: sampler processes on rollout_devices sample the next batches while the trainer learns."},
    )
    max_staleness: int = field(
        default=1, metadata={"help": "Decoupled rollout: a batch is sampled by the policy of at most this many RL steps before the one that trains on it."}
    )
    rollout_devices: str = field(
        default="", metadata={"help": "Decoupled rollout: one sampler per entry, comma separated GPU ids not used for training (e.g. 6,7) or cpu (default on CPU: cpu)."}
    )
    rollout_dir: str = field(
        default="", metadata={"help": "Decoupled rollout: folder of the published policy weights and the samplers' logs (default output_dir/rollout; a tmpfs such as /dev/shm is fastest)."}
    )
    rollout_timeout: Optional[float] = field(
        default=None,
        metadata={"help": "Decoupled rollout: seconds the trainer waits for a sampler's batch, or a sampler for weights, before the run stops (default: derived from the steps so far, 10 x the slowest and at least 60 s; 1800 s before the first step)."},
    )
    rollout_sync_check: bool = field(
        default=True,
        metadata={"help": "Decoupled rollout: after loading each policy version a sampler compares its log-probs of a fixed probe batch with the trainer's for that version, and stops the run beyond rollout_sync_tolerance (docs/decoupled_rollout.md)."},
    )
    rollout_sync_tolerance: float = field(
        default=1e-3, metadata={"help": "Decoupled rollout: the largest |log-prob difference| on the probe batch that the weight-sync check lets pass."}
    )

    @property
    def sampler_devices(self):
        """Decoupled rollout: the device of each sampler process ("cpu" or a GPU id)."""
        return [device.strip() for device in self.rollout_devices.split(",") if device.strip()]

    def validate_rollout_mode(self):
        if self.rollout_mode not in ROLLOUT_MODES:
            raise ValueError(f"rollout_mode={self.rollout_mode!r}: choose from {ROLLOUT_MODES}")
        if self.max_staleness < 0:
            raise ValueError(f"max_staleness must be >= 0, got {self.max_staleness}")
        if self.rollout_timeout is not None and self.rollout_timeout <= 0:
            raise ValueError(f"rollout_timeout must be positive (or unset: derived from the steps), got {self.rollout_timeout}")
        if self.rollout_sync_tolerance < 0:
            raise ValueError(f"rollout_sync_tolerance must be >= 0, got {self.rollout_sync_tolerance}")
        if self.rollout_mode != "decoupled":
            return
        if self.pipeline_parallel_degree > 1:
            raise ValueError(
                f"rollout_mode=decoupled: pipeline_parallel_degree={self.pipeline_parallel_degree} is not supported "
                "with it (split the trainer with tensor_parallel_degree, data parallel or sharding stage1)"
            )
        if slices_weights(self):
            raise ValueError(
                "rollout_mode=decoupled with sharding stage3: the trainer publishes the policy's whole weights to its "
                "samplers, and stage 3 holds each only in slices; use sharding stage1 or stage2"
            )
        if not self.rollout_devices:
            if runs_on_accelerator(self):
                raise ValueError(
                    "rollout_mode=decoupled needs rollout_devices: the GPU ids its samplers use, apart from the "
                    "training devices (e.g. --devices 0,1,2,3,4,5 for training and rollout_devices 6,7)"
                )
            self.rollout_devices = "cpu"
        for device in self.sampler_devices:
            if device != "cpu" and not device.isdigit():
                raise ValueError(f"rollout_devices={self.rollout_devices!r}: each entry is a GPU id or cpu, got {device!r}")
        self.rollout_dir = self.rollout_dir or os.path.join(self.output_dir, "rollout")


@dataclass
class ParallelLayoutArguments:
    """Parameters that control the layout in memory: recompute and offload (the parallel degrees are paddlenlp's TrainingArguments keys)."""

    recompute_granularity: str = field(
        default="full", metadata={"help": "What the actor recomputes with recompute: full, full_attn or core_attn."}
    )
    offload_level: str = field(
        default="",
        metadata={"help": "GPU only: any of freeze_model (reference and reward models), optimizer (optimizer states), train_model (actor and critic), space separated, kept in pinned host memory except while used. On CPU it has no effect, and says so once."},
    )
    offload_optim: bool = field(default=False, metadata={"help": "Offload the optimizer states (adds optimizer to offload_level)."})

    def validate_scale_out(self):
        """The parallel layout, offload groups and recompute granularities."""
        check_launch_layout(self)
        self.switch_off_gpu_kernels(runs_on_accelerator(self))
        self.offload_level = " ".join(sorted(parse_offload_level(self.offload_level)))
        for key in ("recompute_granularity", "critic_recompute_granularity"):
            if getattr(self, key) not in RECOMPUTE_GRANULARITIES:
                raise ValueError(f"{key}={getattr(self, key)!r}: choose from {RECOMPUTE_GRANULARITIES}")


@dataclass
class LoggingArguments:
    """Parameters that control what a run logs, and PaddleNLP's benchmark run."""

    sample_log_interval: int = field(default=5, metadata={"help": "Write a table of sample completions every logging_steps * this steps."})
    num_sample_logs: int = field(default=4, metadata={"help": "Rows in each sample table."})
    autotuner_benchmark: bool = field(
        default=False, metadata={"help": "PaddleNLP's benchmark run: 5 steps of full-length responses, no evaluation, checkpoints or reports."}
    )


@dataclass
class WatchdogArguments:
    """Parameters that bound the waits with no timeout of their own (docs/troubleshooting.md, "Hangs")."""

    watchdog_timeout: Optional[float] = field(
        default=None,
        metadata={"help": "Seconds a collective, a checkpoint write or a weight publication may last before the watchdog ends the process, naming the wait (default: derived from the steps so far, 10 x the slowest and at least 60 s; 1800 s before the first step)."},
    )

    def validate_watchdog(self):
        if self.watchdog_timeout is not None and self.watchdog_timeout <= 0:
            raise ValueError(f"watchdog_timeout must be positive (or unset: derived from the steps), got {self.watchdog_timeout}")


@dataclass
class RLTrainingArguments(
    BatchSizeArguments, RolloutArguments, AlgorithmArguments, ScheduleArguments, RewardArguments, JudgeArguments,
    CriticArguments, MultiTurnArguments, DecoupledRolloutArguments, ParallelLayoutArguments, LoggingArguments,
    WatchdogArguments, ModelKernelArguments, TrainingArguments,
):
    """The training arguments of run_ppo: paddlenlp's TrainingArguments and the groups above, as one flat set of
    keys (PaddleNLP's configs keep parsing); each group validates its own keys."""

    def __post_init__(self):
        # As written: paddlenlp's post-init turns any evaluation_strategy into do_eval.
        self.evaluation_only = bool(self.do_eval and not self.do_train)
        self.apply_paddlenlp_switches()
        self.validate_scale_out()
        super().__post_init__()
        self.lr_scheduler_type = getattr(self.lr_scheduler_type, "value", self.lr_scheduler_type)
        self.critic_lr_scheduler_type = getattr(self.critic_lr_scheduler_type, "value", self.critic_lr_scheduler_type)
        self.evaluation_strategy = getattr(self.evaluation_strategy, "value", self.evaluation_strategy)
        self.save_strategy = getattr(self.save_strategy, "value", self.save_strategy)
        self.resolve_batch_sizes()
        self.validate_algorithm()
        self.validate_rollout()
        self.validate_reward()
        self.validate_judge()
        self.validate_critic()
        self.validate_run()
        self.validate_schedule()
        self.validate_batch_sizes()
        self.validate_rollout_mode()
        self.validate_watchdog()
        self.validate_multi_turn()

    def apply_paddlenlp_switches(self):
        """PaddleNLP's keys that switch other keys: autotuner_benchmark, offload_optim, and grpo's reward and
        advantage normalisation (off: the group baseline normalises)."""
        if self.autotuner_benchmark:
            logger.info(
                "autotuner_benchmark: 5 steps of max_dec_len-token responses without evaluation, checkpoints or "
                "reports (PaddleNLP's benchmark run; the weights still load from their paths)"
            )
            self.max_steps, self.num_train_epochs, self.do_train, self.do_eval = 5, 1, True, False
            self.evaluation_only, self.evaluation_strategy, self.save_strategy = False, "no", "no"
            self.report_to, self.min_dec_len = ["none"], self.max_dec_len
        if self.offload_optim:
            self.offload_level = f"{self.offload_level} optimizer"
        if self.rl_algorithm == "grpo":
            for key in ("normalize_reward", "normalize_advantage"):
                if getattr(self, key):
                    logger.info(f"{key}=True has no effect with rl_algorithm=grpo: the group baseline normalises (as in PaddleNLP)")
                    setattr(self, key, False)

    def validate_run(self):
        """paddlenlp's keys as this trainer reads them."""
        positive = ["per_device_train_batch_size", "per_device_eval_batch_size", "gradient_accumulation_steps", "sample_log_interval"]
        for key in positive:
            if getattr(self, key) <= 0:
                raise ValueError(f"{key} must be positive, got {getattr(self, key)}")
        if self.max_steps <= 0 and not (self.max_steps == -1 and self.num_train_epochs > 0):
            raise ValueError(
                f"max_steps={self.max_steps}: give a positive max_steps, or max_steps -1 with num_train_epochs > 0 "
                "(the steps of that many passes over train_datasets)"
            )
        check_non_negative(self, [
            "save_steps", "eval_steps", "logging_steps", "save_total_limit", "num_sample_logs", "weight_decay",
            "max_grad_norm",
        ])


def check_choices(args, choices):
    """Each key's value is a name in its registry."""
    for key, registry in choices.items():
        value = getattr(args, key)
        if value not in registry.names():
            raise ValueError(f"{key}={value!r} is not available; choose from {registry.names()}")


def check_import_paths(paths, key, form):
    """Each entry of the config's `key` is written `form` (module:name)."""
    for spec in paths:
        if spec.count(":") != 1 or not all(spec.split(":")):
            raise ValueError(f"{key}: {spec!r} is not {form}")


def check_non_negative(args, keys):
    for key in keys:
        if getattr(args, key) is not None and getattr(args, key) < 0:
            raise ValueError(f"{key} must be >= 0, got {getattr(args, key)}")


GROUPS = (
    BatchSizeArguments, RolloutArguments, AlgorithmArguments, ScheduleArguments, RewardArguments, JudgeArguments,
    CriticArguments, MultiTurnArguments, DecoupledRolloutArguments, ParallelLayoutArguments, LoggingArguments,
    WatchdogArguments, ModelKernelArguments,
)


def check_parallel_degrees(args, world_size, on_accelerator):
    """Parallel degrees against the launched processes, before paddlenlp's own asserts: tensor x pipeline
    (x sharding) ranks must divide the world. Tensor parallel (Paddle's auto-parallel plan,
    models/tensor_parallel.py) runs with data parallel and sharding stage 1 over the other ranks; sharding
    stage 1 runs on CPU too; stages 2 and 3 (paddle's group_sharded_parallel) need GPUs."""
    sharding = args.sharding not in ("", [], None, False)
    degrees = {
        "tensor_parallel_degree": max(args.tensor_parallel_degree, 1),
        "pipeline_parallel_degree": max(args.pipeline_parallel_degree, 1),
        "sharding_parallel_degree": max(args.sharding_parallel_degree, 1) if sharding else 1,
    }
    used = {key: value for key, value in degrees.items() if value > 1}
    replica = math.prod(degrees.values())
    if world_size % replica:
        product = " x ".join(f"{key}={value}" for key, value in used.items())
        raise ValueError(
            f"{product} = {replica} ranks per data-parallel replica does not divide the {world_size} launched "
            "process(es) (paddle.distributed.launch --devices / --nproc_per_node)"
        )
    tensor_parallel = degrees["tensor_parallel_degree"]
    if args.sequence_parallel:
        logger.info(
            "sequence_parallel=True has no effect: "
            + ("the tensor-parallel plan splits weights, not activations" if tensor_parallel > 1 else "tensor_parallel_degree is 1")
        )
        args.sequence_parallel = False
    stages = sharding_stages(args.sharding)
    sharding_ranks = args.sharding_parallel_degree if args.sharding_parallel_degree > 0 else world_size // replica
    if sharding and sharding_ranks <= 1:
        logger.info(f"sharding={args.sharding} over one rank has no effect (sharding_parallel_degree={args.sharding_parallel_degree})")
        args.sharding = ""
    elif sharding and stages - {"stage1"} and not on_accelerator:
        raise ValueError(
            f"sharding={args.sharding}: stages 2 and 3 (paddle's group_sharded_parallel) need GPUs; "
            "on CPU use sharding stage1"
        )
    elif sharding and tensor_parallel > 1:
        logger.info(
            f"sharding={args.sharding} with tensor_parallel_degree={tensor_parallel}: each of the {sharding_ranks} sharding "
            "ranks steps and keeps the optimizer states of its share of its tensor-parallel part's parameters (stage 1"
            + ("; stages 2 and 3, which would also divide gradients and parameters, run as stage 1 under tensor parallel)" if stages - {"stage1"} else ")")
        )


def sharding_stages(sharding):
    """The names in paddlenlp's `sharding` key: its string ("stage1 offload"), or the ShardingOption list its
    TrainingArguments makes of it."""
    options = sharding if isinstance(sharding, (list, tuple)) else str(sharding or "").split()
    return {getattr(option, "value", option) for option in options}


def slices_weights(args):
    """Whether sharding stage 3 holds the weights in slices: `sharding stage3` without tensor parallel (under
    which it runs as stage 1)."""
    return "stage3" in sharding_stages(args.sharding) and args.tensor_parallel_degree <= 1


def check_launch_layout(args):
    """`check_parallel_degrees` for this launch (its process count, whether it runs on an accelerator), after
    refusing pipeline parallel, which neither the RL loop nor reward-model training drives yet."""
    if args.pipeline_parallel_degree > 1:
        raise ValueError(
            f"pipeline_parallel_degree={args.pipeline_parallel_degree}: training does not run pipeline-parallel "
            "models yet (the pipe policy and value models of models/model_pp.py are checked single-stage only); "
            "split large models with tensor_parallel_degree and sharding instead"
        )
    check_parallel_degrees(args, paddle.distributed.get_world_size(), runs_on_accelerator(args))


def runs_on_accelerator(args):
    return args.device != "cpu" and paddle.device.get_device() != "cpu"


ARGUMENT_CLASSES = (ModelArgument, DataArgument, RLTrainingArguments)


def parse_arguments(argv, argument_classes=ARGUMENT_CLASSES):
    """`argv` = [config.json or config.yaml, --key value ...]: the file first, command-line overrides after
    it. PaddleNLP's and PaddleFormers' other key names are mapped to this project's (ALIASES; two names of
    one key with different values in one source stop the run), its keys without effect here are logged
    and dropped (NO_EFFECT), and unknown keys stop the run naming the closest known key."""
    if not argv or not argv[0].endswith((".json", ".yaml", ".yml")):
        raise ValueError("usage: <script> CONFIG.json|CONFIG.yaml [--key value ...]")
    valid = {f.name for cls in argument_classes for f in dataclasses.fields(cls) if f.init}
    options = canonical_options(split_options(config_tokens(read_config(argv[0]))), f"config file {argv[0]}")
    options += canonical_options(split_options(list(argv[1:])), "the command line")
    options = drop_keys_without_effect(options, valid)
    for key, _ in options:
        if key not in valid:
            hint = difflib.get_close_matches(key, valid, n=1)
            raise ValueError(f"unknown config key {key!r}" + (f"; did you mean {hint[0]!r}?" if hint else ""))
    tokens = [token for key, values in options for token in (f"--{key}", *values)]
    rendezvous_each_gloo_group_apart()  # before paddlenlp's arguments initialise fleet's groups
    parsed = PdArgumentParser(argument_classes).parse_args_into_dataclasses(args=tokens, look_for_args_file=False)
    validate_across(parsed, given=dict(options))
    return parsed


def validate_across(parsed, given=None):
    """Checks that involve keys of more than one argument class, or what the config wrote (`given`: key ->
    value tokens)."""
    given = given or {}
    model_args = next((a for a in parsed if isinstance(a, ModelArgument)), None)
    data_args = next((a for a in parsed if isinstance(a, DataArgument)), None)
    training_args = next((a for a in parsed if isinstance(a, RLTrainingArguments)), None)
    if model_args and training_args:
        sources = [training_args.use_rm_server, training_args.use_rule_reward, model_args.reward_model_name_or_path is not None,
                   training_args.uses_judge]
        if sum(sources) > 1 or (sum(sources) == 0 and not training_args.environment_paths):
            raise ValueError(
                "set exactly one reward source: use_rm_server (reward server), use_rule_reward (in-process rule), "
                "reward_model_name_or_path (reward model) or a judge (judge_model_name_or_path or judge_server); with an "
                "environment, none (its returns are the scores)"
            )
    if model_args and not model_args.lora:
        for key in ("lora_path", "lora_target_modules", "lora_save_merged"):
            if getattr(model_args, key):
                raise ValueError(f"{key}={getattr(model_args, key)!r} applies to LoRA adapters: set lora true")
    if model_args and model_args.lora and model_args.lora_rank <= 0:
        raise ValueError(f"lora_rank must be positive, got {model_args.lora_rank}")
    if model_args and training_args and model_args.lora and training_args.tensor_parallel_degree > 1:
        raise ValueError(
            f"lora with tensor_parallel_degree={training_args.tensor_parallel_degree}: the tensor-parallel plan splits "
            "the base layers LoRA wraps; train LoRA adapters with data parallel or sharding stage1"
        )
    if data_args and training_args:
        check_ptx(data_args, training_args)
        fit_prompts(data_args, training_args)
    if training_args:
        note_keys_without_effect(training_args, given, data_args)


def check_ptx(data_args, training_args):
    """ptx data needs its coefficient; a coefficient without data (PaddleNLP's GRPO config) does nothing."""
    if data_args.ptx_datasets and training_args.ptx_coeff <= 0:
        raise ValueError(f"ptx_datasets={data_args.ptx_datasets!r} needs ptx_coeff > 0, the weight of its loss")
    if training_args.ptx_coeff > 0 and not data_args.ptx_datasets:
        logger.info(f"ptx_coeff={training_args.ptx_coeff} has no effect without ptx_datasets")
        training_args.ptx_coeff = 0.0


def fit_prompts(data_args, training_args):
    """Prompts are cut to max_length - max_dec_len tokens when max_prompt_len leaves no room for a whole response."""
    room = data_args.max_length - training_args.max_dec_len
    if room <= 0:
        raise ValueError(f"max_dec_len={training_args.max_dec_len} leaves no room for a prompt in max_length={data_args.max_length}")
    if data_args.max_prompt_len > room:
        logger.info(
            f"max_prompt_len={data_args.max_prompt_len} + max_dec_len={training_args.max_dec_len} exceeds "
            f"max_length={data_args.max_length}: prompts are limited to {room} tokens"
        )
        data_args.max_prompt_len = room


def note_keys_without_effect(args, given, data_args):
    """One log line for each key the config wrote that its switch leaves without effect, and the
    conflicts between PaddleNLP's global batch keys and this project's per-rank ones."""
    switched = {
        "max_gen_batches": ("dynamic_sampling", args.dynamic_sampling),
        "global_gen_batch_size": ("dynamic_sampling", args.dynamic_sampling),
        "overlong_reward_buffer": ("enable_overlong_reward_buffer", args.enable_overlong_reward_buffer),
        "overlong_penalty_factor": ("enable_overlong_reward_buffer", args.enable_overlong_reward_buffer),
    }
    for key, (switch, on) in switched.items():
        if key in given and not on:
            logger.info(f"{key}={getattr(args, key)} has no effect without {switch}=True")
    if "kl_coeff" in given and args.kl_coeff > 0 and not ADVANTAGE_ESTIMATORS.traits(args.rl_algorithm).kl_in_reward:
        logger.warning(
            f"kl_coeff={args.kl_coeff} has no effect with rl_algorithm={args.rl_algorithm}: it puts a KL penalty in "
            "the token rewards of ppo and reinforce_plus_plus; use kl_loss_coeff for a KL loss"
        )
    if "num_train_epochs" in given and args.max_steps > 0:
        logger.info(f"max_steps={args.max_steps} sets the run's length; num_train_epochs={args.num_train_epochs} has no effect")
    if "eval_steps" in given and args.evaluation_strategy == "no" and data_args and data_args.eval_datasets:
        logger.info("evaluation_strategy is 'no' (PaddleNLP's default): eval_datasets are not evaluated; set evaluation_strategy steps")
    if "per_device_prompt_batch_size" in given and "global_batch_size" in given:
        written = int(given["per_device_prompt_batch_size"][0])
        if written != args.per_device_prompt_batch_size:
            raise ValueError(
                f"per_device_prompt_batch_size={written} contradicts global_batch_size={args.global_batch_size} over "
                f"{args.dataset_world_size} data-parallel ranks ({args.per_device_prompt_batch_size} per rank): give one of them"
            )
