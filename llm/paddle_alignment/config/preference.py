"""The keys of offline preference alignment, run_dpo.py and run_kto.py: PaddleNLP's DPOConfig / KTOConfig,
DPO data and model arguments (same names, meanings and defaults), with TRL's reference options beside them."""

from dataclasses import dataclass, field
from typing import Optional

from paddlenlp.trainer import TrainingArguments

from paddle_alignment.algos import PREFERENCE_LOSSES, UNPAIRED_PREFERENCE_LOSSES
from paddle_alignment.config.layout import ModelKernelArguments, check_launch_layout, runs_on_accelerator


@dataclass
class PreferenceModelArgument:
    model_name_or_path: str = field(metadata={"help": "Local path of the model to align (usually the SFT model); the reference starts from it too."})
    tokenizer_name_or_path: Optional[str] = field(default=None, metadata={"help": "Tokenizer path; defaults to the model's."})
    reference_model_name_or_path: Optional[str] = field(
        default=None, metadata={"help": "The frozen reference model; default model_name_or_path (with lora: the model with its adapters off)."}
    )
    recompute_granularity: str = field(default="full", metadata={"help": "What the model recomputes with recompute: full, full_attn or core_attn."})
    lora_rank: int = field(default=8, metadata={"help": "Rank of the LoRA adapters (lora true)."})
    lora_path: Optional[str] = field(default=None, metadata={"help": "Adapters to start from (a saved LoRA output_dir)."})
    lora_alpha: int = field(default=-1, metadata={"help": "LoRA scaling numerator (adapters scale by alpha / rank); -1: 2 x lora_rank, or 4 with rslora (PaddleNLP)."})
    rslora: bool = field(default=False, metadata={"help": "Rank-stabilised LoRA: adapters scale by alpha / sqrt(rank)."})
    lora_plus_scale: float = field(default=1.0, metadata={"help": "LoRA+: the learning rate of the B matrices is this many times the A matrices'."})
    rslora_plus: bool = field(default=False, metadata={"help": "PaddleNLP's shorthand for rslora true, lora_plus_scale 4, lora_alpha 4."})
    lora_target_modules: Optional[str] = field(
        default=None, metadata={"help": "Comma-separated regexes of the layers that get adapters; default the attention and MLP projections."}
    )

    def __post_init__(self):
        for key in ("tokenizer_name_or_path", "reference_model_name_or_path", "lora_path"):
            if getattr(self, key) == "":
                setattr(self, key, None)
        if self.rslora_plus:
            self.rslora, self.lora_plus_scale, self.lora_alpha = True, 4.0, 4
        if self.lora_alpha == -1:
            self.lora_alpha = 4 if self.rslora else 2 * self.lora_rank
        if self.lora_rank <= 0:
            raise ValueError(f"lora_rank must be positive, got {self.lora_rank}")


@dataclass
class PreferenceDataArgument:
    train_dataset_path: str = field(default="./data/train.jsonl", metadata={"help": "Training data: a .jsonl/.json/.parquet file of preference rows (docs/preference.md), or several, comma separated."})
    dev_dataset_path: Optional[str] = field(default=None, metadata={"help": "Held-out rows in the same format, evaluated with do_eval."})
    max_seq_len: int = field(default=4096, metadata={"help": "Most tokens of a prompt with its replies (the prompt counted once); longer rows are cut as PaddleNLP cuts them, and counted."})
    max_prompt_len: int = field(default=2048, metadata={"help": "Where a row is too long, its prompt keeps its last max_prompt_len tokens before the replies are cut."})
    greedy_zero_padding: bool = field(
        default=False,
        metadata={"help": "Pack several rows into each max_seq_len-token sequence (first fit by decreasing length): per_device_train_batch_size then counts packed sequences, and a micro-batch holds as many rows as fit (PaddleNLP's zero-padding stream)."},
    )

    def __post_init__(self):
        if self.dev_dataset_path == "":
            self.dev_dataset_path = None
        for key in ("max_seq_len", "max_prompt_len"):
            if getattr(self, key) <= 0:
                raise ValueError(f"{key} must be positive, got {getattr(self, key)}")
        if self.max_prompt_len >= self.max_seq_len:
            raise ValueError(f"max_prompt_len={self.max_prompt_len} leaves no room for replies in max_seq_len={self.max_seq_len}")


@dataclass
class ReferenceArguments:
    """Parameters that control the reference model."""

    reference_free: bool = field(default=False, metadata={"help": "No reference model: the reference log-probs are 0 (for sigmoid, hinge, ipo and the like)."})
    precompute_ref_log_probs: bool = field(
        default=False,
        metadata={"help": "Compute the reference log-probs of the whole data set once, before training, and keep them on disk (reference_cache_dir): a run over the same data, reference and tokenizer reuses them and loads no reference model."},
    )
    reference_cache_dir: Optional[str] = field(default=None, metadata={"help": "Folder of the precomputed reference log-probs; default output_dir/reference_logps."})
    ref_model_update_steps: int = field(default=-1, metadata={"help": "Every this many steps the reference takes the policy's weights (TR-DPO; -1: never)."})
    ref_model_mixup_alpha: float = field(default=1.0, metadata={"help": "At each such update the reference becomes alpha x policy + (1 - alpha) x reference (TRL's TR-DPO; 1: a copy)."})
    lora: bool = field(default=False, metadata={"help": "Train LoRA adapters (paddlenlp.peft) instead of all weights; the reference is then the model with its adapters off, not a second copy."})
    logprob_chunk_tokens: int = field(default=512, metadata={"help": "The LM head projects this many reply tokens at a time (0: all at once): no [tokens, vocabulary] logits beyond one chunk."})

    def validate_reference(self, uses_reference):
        if self.ref_model_update_steps == 0 or self.ref_model_update_steps < -1:
            raise ValueError(f"ref_model_update_steps must be positive, or -1 for never; got {self.ref_model_update_steps}")
        if not 0 < self.ref_model_mixup_alpha <= 1:
            raise ValueError(f"ref_model_mixup_alpha must lie in (0, 1], got {self.ref_model_mixup_alpha}")
        if self.logprob_chunk_tokens < 0:
            raise ValueError(f"logprob_chunk_tokens must be >= 0, got {self.logprob_chunk_tokens}")
        updates = self.ref_model_update_steps > 0
        if not uses_reference and (updates or self.precompute_ref_log_probs):
            raise ValueError("ref_model_update_steps and precompute_ref_log_probs need a reference model: not with reference_free "
                             "or a reference-free loss_type")
        if updates and self.precompute_ref_log_probs:
            raise ValueError("ref_model_update_steps updates the reference while precompute_ref_log_probs fixes its log-probs: choose one")
        if updates and self.lora:
            raise ValueError("ref_model_update_steps with lora: the reference is the model with its adapters off; it has no weights of its own to update")


@dataclass
class PreferenceTrainingArguments(ReferenceArguments, ModelKernelArguments, TrainingArguments):
    """paddlenlp's TrainingArguments with the reference's keys, PaddleNLP's model-kernel switches, its benchmark
    switches and the loss's beta (DPO's and KTO's alike)."""

    autotuner_benchmark: bool = field(default=False, metadata={"help": "PaddleNLP's benchmark run: 5 steps, no evaluation, checkpoints or reports."})
    benchmark: bool = field(default=False, metadata={"help": "PaddleNLP's timing run: a log line every step, no evaluation, checkpoints or saved model."})
    beta: float = field(default=0.1, metadata={"help": "Strength of the reference: the temperature of the implicit reward beta x log(policy / reference)."})

    def __post_init__(self):
        check_launch_layout(self)
        self.switch_off_gpu_kernels(runs_on_accelerator(self))
        if self.autotuner_benchmark:
            self.max_steps, self.report_to = 5, ["none"]
        if self.autotuner_benchmark or self.benchmark:
            self.do_eval, self.evaluation_strategy, self.save_strategy = False, "no", "no"
            self.load_best_model_at_end, self.logging_steps = False, 1
        super().__post_init__()
        self.evaluation_strategy = getattr(self.evaluation_strategy, "value", self.evaluation_strategy)
        if self.beta <= 0:
            raise ValueError(f"beta must be positive, got {self.beta}")
        if self.lora and self.tensor_parallel_degree > 1:
            raise ValueError(
                f"lora with tensor_parallel_degree={self.tensor_parallel_degree}: the tensor-parallel plan splits the base "
                "layers LoRA wraps; train LoRA adapters with data parallel or sharding stage1"
            )


@dataclass
class DPOTrainingArguments(PreferenceTrainingArguments):
    """Parameters that control the DPO loss (PaddleNLP's DPOConfig keys)."""

    loss_type: str = field(default="sigmoid", metadata={"help": "Preference loss: " + ", ".join(PREFERENCE_LOSSES.names()) + " (docs/preference.md)."})
    label_smoothing: float = field(default=0.0, metadata={"help": "Share of pairs taken as mislabelled (cDPO with sigmoid, rDPO with robust; EXO's epsilon)."})
    simpo_gamma: float = field(default=0.5, metadata={"help": "SimPO's target reward margin."})
    dpop_lambda: float = field(default=50.0, metadata={"help": "DPO-Positive's weight of the penalty on a chosen likelihood below the reference's."})
    pref_loss_ratio: float = field(default=1.0, metadata={"help": "Weight of the preference loss."})
    sft_loss_ratio: float = field(default=0.0, metadata={"help": "Weight of the NLL of the chosen replies per token (RPO; TRL's rpo_alpha)."})

    def __post_init__(self):
        super().__post_init__()
        PREFERENCE_LOSSES.traits(self.loss_type)  # raises naming the choices
        smoothing_limit = 0.5 if self.loss_type == "robust" else 1.0
        if not 0 <= self.label_smoothing < smoothing_limit:
            raise ValueError(f"label_smoothing must lie in [0, {smoothing_limit}) for loss_type={self.loss_type}, got {self.label_smoothing}")
        if self.loss_type == "exo_pair" and self.label_smoothing == 0:
            raise ValueError("loss_type=exo_pair needs label_smoothing > 0 (its epsilon; TRL suggests 1e-3)")
        if self.reference_free and self.loss_type not in ("sigmoid", "hinge", "ipo", "or", "simpo"):
            raise ValueError(f"reference_free with loss_type={self.loss_type}: PaddleNLP allows it for sigmoid, hinge, ipo, or and simpo only")
        if self.pref_loss_ratio < 0 or self.sft_loss_ratio < 0:
            raise ValueError("pref_loss_ratio and sft_loss_ratio must be >= 0")
        self.validate_reference(self.uses_reference)

    @property
    def uses_reference(self):
        return PREFERENCE_LOSSES.traits(self.loss_type).reference and not self.reference_free


@dataclass
class KTOTrainingArguments(PreferenceTrainingArguments):
    """Parameters that control the KTO loss (PaddleNLP's KTOConfig keys)."""

    loss_type: str = field(default="kto", metadata={"help": "Unpaired preference loss: " + ", ".join(UNPAIRED_PREFERENCE_LOSSES.names()) + "."})
    desirable_weight: float = field(default=1.0, metadata={"help": "Weight of the desirable responses' losses (raise it when they are fewer)."})
    undesirable_weight: float = field(default=1.0, metadata={"help": "Weight of the undesirable responses' losses."})

    def __post_init__(self):
        super().__post_init__()
        UNPAIRED_PREFERENCE_LOSSES.traits(self.loss_type)
        if self.desirable_weight <= 0 or self.undesirable_weight <= 0:
            raise ValueError("desirable_weight and undesirable_weight must be positive")
        if self.reference_free:
            raise ValueError("reference_free: KTO compares every response with the reference; it has no reference-free form")
        self.validate_reference(True)

    @property
    def uses_reference(self):
        return True
