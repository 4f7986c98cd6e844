"""Parameters of on-policy distillation: the teacher whose log-probs of the student's samples train it."""

from dataclasses import dataclass, field

from paddle_alignment.algos import DISTILL_LOSSES
from paddle_alignment.config.checks import check_choices, check_non_negative


@dataclass
class DistillationArguments:
    """Parameters that control on-policy distillation (docs/distillation.md): set teacher_model_name_or_path."""

    teacher_model_name_or_path: str = field(
        default="",
        metadata={"help": "A frozen teacher (Paddle's or Hugging Face's layout; any size, the student's tokenizer) that scores every sampled token: its log-probs join the experience (teacher_logprobs) and distill_coeff x the distillation loss joins the advantages. Loaded and offloaded like the reference model."},
    )
    distill_coeff: float = field(
        default=1.0,
        metadata={"help": "Weight of the teacher's signal beside the reward's advantages (0: the teacher is only measured, distill/* metrics; the step equals the run's without a teacher)."},
    )
    distill_loss: str = field(
        default="reverse_kl",
        metadata={"help": "Distillation loss: " + ", ".join(DISTILL_LOSSES.names()) + " (reverse_kl: each sampled token's advantage -(log p_student - log p_teacher), optimised by the policy loss, as verl and Thinking Machines do)."},
    )

    @property
    def uses_teacher(self):
        return bool(self.teacher_model_name_or_path)

    def validate_distillation(self):
        check_choices(self, {"distill_loss": DISTILL_LOSSES})
        check_non_negative(self, ["distill_coeff"])
        if self.rl_algorithm == "on_policy_distill" and not self.uses_teacher:
            raise ValueError("rl_algorithm=on_policy_distill learns from a teacher alone: set teacher_model_name_or_path")
