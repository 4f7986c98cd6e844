"""Supervised fine-tuning (the warm start for RL) on `src`/`tgt` jsonl, with paddlenlp's Trainer.

    python llm/run_finetune.py config/tiny/sft_argument.json [--key value ...]

`dataset_name_or_path` is a folder with train.json (and optionally dev.json), one {"src", "tgt"} object
per line, as in PaddleNLP. The loss covers the target tokens and EOS only. The model and tokenizer are
saved to `output_dir`. On CPU, AdamW steps every parameter in one fused op (llm/paddle_alignment/fused_optimizer.py).
"""

import os
import sys
from dataclasses import dataclass, field

if not __package__:  # run as a script path: make the repository root importable
    sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))

from paddle_alignment.cpu_runtime import configure_cpu_runtime

configure_cpu_runtime()  # MKL's code path and threads for this CPU, before paddle loads

import paddle
from paddlenlp.data import DataCollatorForSeq2Seq
from paddlenlp.trainer import Trainer, TrainingArguments, set_seed
from paddlenlp.utils.log import logger

from llm.alignment.ppo.models.model_pp import causal_lm_stage
from paddle_alignment.checkpoints.folders import output_dir_claimed
from paddle_alignment.config.arguments import parse_arguments
from paddle_alignment.config.layout import check_launch_layout
from paddle_alignment.data import IGNORE_INDEX, SupervisedDataset
from paddle_alignment.distributed import finish_distributed_run
from paddle_alignment.fused_optimizer import FusedOptimizerMixin
from paddle_alignment.models.loading import load_causal_lm, load_tokenizer
from paddle_alignment.pipeline_parallel import check_whole_micro_batches, seed_stages_alike
from paddle_alignment.split_training import AverageSplitGradients, SplitModelMixin


class FinetuneTrainer(SplitModelMixin, FusedOptimizerMixin, Trainer):
    """paddlenlp's Trainer, with the fused CPU AdamW (llm/paddle_alignment/fused_optimizer.py), over models split
    by the tensor-parallel plan too (llm/paddle_alignment/split_training.py)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.add_callback(AverageSplitGradients)


@dataclass
class FinetuneModelArgument:
    model_name_or_path: str = field(metadata={"help": "Local path of the model to fine-tune."})


@dataclass
class FinetuneDataArgument:
    dataset_name_or_path: str = field(metadata={"help": "Folder with train.json and optionally dev.json (src/tgt jsonl)."})
    max_length: int = field(default=2048, metadata={"help": "Longest prompt + target in tokens; longer ones are cut."})
    prompt_key: str = field(default="src", metadata={"help": "Column holding the prompt."})
    label_key: str = field(default="tgt", metadata={"help": "Column holding the target."})


@dataclass
class FinetuneTrainingArguments(TrainingArguments):
    """paddlenlp's TrainingArguments, the parallel layout checked against the launch first (config/layout.py:
    under pipeline parallel the stages exchange each micro-batch's shape, since batches are padded to their
    own longest row)."""

    def __post_init__(self):
        check_launch_layout(self, pipeline_parallel=True)
        super().__post_init__()


ARGUMENT_CLASSES = (FinetuneModelArgument, FinetuneDataArgument, FinetuneTrainingArguments)


def fit_pipeline_evaluation(training_args, eval_dataset):
    """paddlenlp's pipeline evaluates batches of whole pipeline steps (per_device_train_batch_size x
    gradient_accumulation_steps rows): the eval batch is set to that, and a dev set it does not divide needs
    dataloader_drop_last (PaddleNLP's advice under pipeline parallel), which leaves the remainder out."""
    rows = training_args.per_device_train_batch_size * training_args.gradient_accumulation_steps
    if training_args.per_device_eval_batch_size != rows:
        logger.info(f"per_device_eval_batch_size={training_args.per_device_eval_batch_size} -> {rows}: the pipeline evaluates whole steps")
        training_args.per_device_eval_batch_size = rows
    if eval_dataset is not None and len(eval_dataset) % rows and not training_args.dataloader_drop_last:
        raise ValueError(
            f"dev.json's {len(eval_dataset)} rows do not divide into pipeline steps of {rows} (per_device_train_batch_size x "
            "gradient_accumulation_steps): set dataloader_drop_last true to leave the remainder out, or change the dev set"
        )


def main(argv):
    model_args, data_args, training_args = parse_arguments(argv, ARGUMENT_CLASSES)
    paddle.set_device(training_args.device)
    set_seed(training_args.seed)
    seed_stages_alike(training_args.seed)  # every stage draws the same batches
    tokenizer = load_tokenizer(model_args.model_name_or_path)
    model = load_causal_lm(model_args.model_name_or_path, training_args)
    if training_args.pipeline_parallel_degree > 1:  # trained by paddlenlp's pipeline loop
        model = causal_lm_stage(model)

    def dataset(split):
        path = os.path.join(data_args.dataset_name_or_path, f"{split}.json")
        if split == "dev" and not os.path.isfile(path):
            return None
        return SupervisedDataset(
            path, tokenizer, data_args.max_length, seed=training_args.seed, prompt_key=data_args.prompt_key, label_key=data_args.label_key
        )

    train_dataset, eval_dataset = dataset("train"), dataset("dev")
    check_whole_micro_batches(training_args, len(train_dataset))
    if training_args.pipeline_parallel_degree > 1:
        fit_pipeline_evaluation(training_args, eval_dataset)
    trainer = FinetuneTrainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        tokenizer=tokenizer,
        data_collator=DataCollatorForSeq2Seq(tokenizer, padding=True, label_pad_token_id=IGNORE_INDEX),
    )
    os.makedirs(training_args.logging_dir, exist_ok=True)  # VisualDL's writer threads race to create it
    with output_dir_claimed(training_args.output_dir):
        trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
        trainer.save_model(training_args.output_dir)
        if trainer.eval_dataset is not None:
            trainer.log(trainer.evaluate())
    finish_distributed_run()


if __name__ == "__main__":
    main(sys.argv[1:])
