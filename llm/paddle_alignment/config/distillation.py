"""Parameters of on-policy distillation: the teacher whose log-probs of the student's samples train it."""

from dataclasses import dataclass, field

from paddle_alignment.algos import DISTILL_LOSSES
from paddle_alignment.algos.distillation import matches_distributions
from paddle_alignment.config.checks import check_choices, check_non_negative


@dataclass
class DistillationArguments:
    """Parameters that control on-policy distillation (docs/distillation.md): set teacher_model_name_or_path."""

    teacher_model_name_or_path: str = field(
        default="",
        metadata={"help": "A frozen teacher (Paddle's or Hugging Face's layout; any size, the student's tokenizer) that scores every sampled token: its log-probs join the experience (teacher_logprobs) and distill_coeff x the distillation loss joins the advantages (reverse_kl) or the loss (gkd). Loaded and offloaded like the reference model."},
    )
    distill_coeff: float = field(
        default=1.0,
        metadata={"help": "Weight of the teacher's signal beside the reward's advantages (0: the teacher is only measured, distill/* metrics; the step equals the run's without a teacher)."},
    )
    distill_loss: str = field(
        default="reverse_kl",
        metadata={"help": "Distillation loss: " + ", ".join(DISTILL_LOSSES.names()) + " (reverse_kl: each sampled token's advantage -(log p_student - log p_teacher), optimised by the policy loss, as verl and Thinking Machines do; gkd: GKD's generalised Jensen-Shannon divergence between the teacher's and the student's distributions at each position, over the teacher's distill_topk tokens and the rest, added to the loss)."},
    )
    distill_beta: float = field(
        default=0.5,
        metadata={"help": "gkd: GKD's (and TRL's) beta in [0, 1]: 0 the forward KL(teacher || student), 1 the reverse KL(student || teacher), between them the generalised JSD."},
    )
    distill_topk: int = field(
        default=20,
        metadata={"help": "gkd: the teacher's most likely tokens per position the divergence covers, the rest of the vocabulary one more outcome (a vocabulary's worth: the whole distributions; the student holds distill_topk head rows per response token for the backward)."},
    )

    @property
    def uses_teacher(self):
        return bool(self.teacher_model_name_or_path)

    @property
    def teacher_topk(self):
        """The teacher's top tokens per position the run's experience holds: distill_topk for a loss that matches
        distributions, else 0."""
        return self.distill_topk if self.uses_teacher and matches_distributions(self.distill_loss) else 0

    def validate_distillation(self):
        check_choices(self, {"distill_loss": DISTILL_LOSSES})
        check_non_negative(self, ["distill_coeff"])
        if not 0 <= self.distill_beta <= 1:
            raise ValueError(f"distill_beta must lie in [0, 1] (0: forward KL, 1: reverse KL), got {self.distill_beta}")
        if self.distill_topk < 1:
            raise ValueError(f"distill_topk must be >= 1, got {self.distill_topk}")
        if self.rl_algorithm == "on_policy_distill" and not self.uses_teacher:
            raise ValueError("rl_algorithm=on_policy_distill learns from a teacher alone: set teacher_model_name_or_path")
