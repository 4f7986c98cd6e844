"""Parameters that control generation: samples per prompt, lengths and sampling."""

from dataclasses import dataclass, field


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
