"""Reward-model training, the second of the three RLHF stages: preference pairs -> score model.

    python -m paddle.distributed.launch --devices 0,1,2,3,4,5,6,7 \\
        llm/alignment/rm/run_reward.py config/llama/rm_argument.json [--key value ...]

The score model starts from a causal LM (usually the SFT model): its backbone plus a fresh score head.
It is saved with its tokenizer to `output_dir`, ready for `reward_model_name_or_path` in run_ppo.py.
"""

import os
import sys
from dataclasses import dataclass, field
from typing import Optional

if not __package__:  # run as a script path: make the repository root importable
    sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..")))

from paddle_alignment.cpu_runtime import configure_cpu_runtime

configure_cpu_runtime()  # MKL's code path and threads for this CPU, before paddle loads

import paddle
from paddlenlp.trainer import TrainingArguments, set_seed

from paddle_alignment.algos import PAIRWISE_LOSSES
from paddle_alignment.config.arguments import parse_arguments
from paddle_alignment.config.layout import ModelKernelArguments, check_launch_layout, runs_on_accelerator
from llm.alignment.ppo.models.model_pp import reward_model_stage
from llm.alignment.rm.reward_trainer import RewardTrainer, pair_objective
from paddle_alignment.checkpoints.folders import output_dir_claimed
from paddle_alignment.data import PreferenceCollator, PreferenceDataset
from paddle_alignment.distributed import finish_distributed_run
from paddle_alignment.models.loading import load_score_model, load_tokenizer
from paddle_alignment.models.score_model_utils import NORMALIZERS
from paddle_alignment.pipeline_parallel import check_whole_micro_batches, seed_stages_alike


@dataclass
class RewardModelArgument:
    model_name_or_path: str = field(metadata={"help": "Local path of the causal LM (or score model) to start from."})


@dataclass
class RewardDataArgument:
    train_datasets: str = field(metadata={"help": "Preference pairs: `name[:proportion[:path]]` entries or data files, comma separated."})
    eval_datasets: Optional[str] = field(default=None, metadata={"help": "Held-out pairs, in the same format."})
    max_length: int = field(default=512, metadata={"help": "Prompt + answer tokens; longer sequences are cut."})
    prompt_key: str = field(default="src", metadata={"help": "Column of data files holding the literal prompt."})
    label_key: str = field(default="tgt", metadata={"help": "Column of data files holding the first answer."})


@dataclass
class RewardTrainingArguments(ModelKernelArguments, TrainingArguments):
    loss_type: str = field(default="sequence-wise", metadata={"help": "Pairwise loss: " + ", ".join(PAIRWISE_LOSSES.names())})
    regularization: float = field(default=0.0, metadata={"help": "Weight of the mean square of the scores in the loss."})
    normalize_score_during_training: bool = field(
        default=False, metadata={"help": "Normalise scores by the normalizer's running statistics while training."}
    )
    normalizer_type: Optional[str] = field(
        default=None, metadata={"help": "Score statistics kept with the model: " + ", ".join(NORMALIZERS) + " (None: none)."}
    )
    normalizer_momentum: float = field(default=0.9, metadata={"help": "Momentum of ExponentialMovingAverage."})

    def __post_init__(self):
        check_launch_layout(self, pipeline_parallel=True)
        self.switch_off_gpu_kernels(runs_on_accelerator(self))
        super().__post_init__()
        if self.loss_type not in PAIRWISE_LOSSES.names():
            raise ValueError(f"loss_type={self.loss_type!r} is not available; choose from {PAIRWISE_LOSSES.names()}")
        if self.regularization < 0:
            raise ValueError(f"regularization must be >= 0, got {self.regularization}")
        if self.normalizer_type is not None and self.normalizer_type not in NORMALIZERS:
            raise ValueError(f"normalizer_type={self.normalizer_type!r} is not available; choose from {sorted(NORMALIZERS)}")
        if self.normalize_score_during_training and self.normalizer_type in (None, "identity"):
            raise ValueError("normalize_score_during_training needs a normalizer_type (RunningMeanStd or ExponentialMovingAverage)")
        if not 0 <= self.normalizer_momentum < 1:
            raise ValueError(f"normalizer_momentum must lie in [0, 1), got {self.normalizer_momentum}")


ARGUMENT_CLASSES = (RewardModelArgument, RewardDataArgument, RewardTrainingArguments)


def build_trainer(argv):
    model_args, data_args, training_args = parse_arguments(argv, ARGUMENT_CLASSES)
    paddle.set_device(training_args.device)
    set_seed(training_args.seed)
    seed_stages_alike(training_args.seed)  # every stage draws the same batches
    tokenizer = load_tokenizer(model_args.model_name_or_path)
    model = load_score_model(
        model_args.model_name_or_path,
        training_args,
        score_type="reward",
        do_normalize=training_args.normalize_score_during_training,
        normalizer_type=training_args.normalizer_type,
        normalizer_momentum=training_args.normalizer_momentum,
    )
    if training_args.pipeline_parallel_degree > 1:  # trained by paddlenlp's pipeline loop
        model = reward_model_stage(model, pair_objective(training_args))

    def pairs(datasets):
        return PreferenceDataset(
            datasets, tokenizer, data_args.max_length, seed=training_args.seed,
            prompt_key=data_args.prompt_key, label_key=data_args.label_key,
        )

    train_dataset = pairs(data_args.train_datasets)
    check_whole_micro_batches(training_args, len(train_dataset))
    return RewardTrainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=pairs(data_args.eval_datasets) if data_args.eval_datasets else None,
        tokenizer=tokenizer,
        data_collator=PreferenceCollator(tokenizer.pad_token_id),
    )


def main(argv):
    trainer = build_trainer(argv)
    os.makedirs(trainer.args.logging_dir, exist_ok=True)  # VisualDL's writer threads race to create it
    with output_dir_claimed(trainer.args.output_dir):
        trainer.train(resume_from_checkpoint=trainer.args.resume_from_checkpoint)
        trainer.save_model(trainer.args.output_dir)
        if trainer.eval_dataset is not None:
            metrics = trainer.evaluate()
            if trainer.is_world_process_zero():
                trainer.save_metrics("eval", metrics)
    finish_distributed_run()


if __name__ == "__main__":
    main(sys.argv[1:])
