"""The model and data keys of run_ppo (ModelArgument, DataArgument): which models and which prompts."""

from dataclasses import dataclass, field
from typing import Optional


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
