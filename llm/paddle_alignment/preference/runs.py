"""What run_dpo.py and run_kto.py share: arguments to a ready trainer (tokenizer, data sets, the policy with or
without LoRA adapters, the reference or its precomputed log-probs), and the run itself."""

import logging
import os

import paddle
from paddlenlp.peft import LoRAConfig, LoRAModel
from paddlenlp.trainer import set_seed
from paddlenlp.trl.llm_utils import get_lora_target_modules

from paddle_alignment.checkpoints.folders import output_dir_claimed, resolve_resume_checkpoint
from paddle_alignment.config.arguments import parse_arguments
from paddle_alignment.distributed import finish_distributed_run
from paddle_alignment.models.loading import frozen, load_causal_lm, load_dtype, load_tokenizer
from paddle_alignment.preference.batches import GroupCollator, GroupDataset, group_of
from paddle_alignment.preference.reference import (
    Reference, cache_path, cached_reference, compute_reference, load_reference_weights, save_reference,
)

logger = logging.getLogger(__name__)


def with_lora(model, model_args, training_args):
    """`model` with LoRA adapters (only they train): `lora_path`'s, else fresh ones as PaddleNLP's run_dpo makes them."""
    if model_args.lora_path:
        model = LoRAModel.from_pretrained(model=model, lora_path=model_args.lora_path)
    else:
        targets = model_args.lora_target_modules
        model = LoRAModel(model, LoRAConfig(
            target_modules=targets.split(",") if targets else get_lora_target_modules(model), r=model_args.lora_rank,
            lora_alpha=model_args.lora_alpha, rslora=model_args.rslora, lora_plus_scale=model_args.lora_plus_scale,
            dtype=load_dtype(training_args), base_model_name_or_path=model_args.model_name_or_path,
        ))
    model.mark_only_lora_as_trainable()
    model.print_trainable_parameters()
    return model


def reference_path(model_args):
    return model_args.reference_model_name_or_path or model_args.model_name_or_path


def reference_model(model_args, training_args):
    """The frozen reference model, or None where the reference is the model with its LoRA adapters off."""
    if training_args.lora and model_args.reference_model_name_or_path is None:
        return None
    return frozen(load_causal_lm(reference_path(model_args), training_args))


def precompute_reference(datasets, model_args, training_args, policy, pad_token_id):
    """Each data set's reference log-probs from its cache file, or computed (with a reference loaded for that and
    dropped after) and cached. Returns the reference forwards run."""
    cache_dir = training_args.reference_cache_dir or os.path.join(training_args.output_dir, "reference_logps")
    reference = None
    for dataset in datasets:
        path = cache_path(cache_dir, dataset.records, reference_path(model_args), load_dtype(training_args))
        values = cached_reference(path, len(dataset.records), len(group_of(dataset.records[0])[1]))
        if values is not None:
            logger.info(f"reference log-probs of {len(dataset.records)} rows read from {path}")
        else:
            reference = reference or Reference(reference_model(model_args, training_args), chunk_tokens=training_args.logprob_chunk_tokens)
            values = compute_reference(reference, policy, dataset.records, pad_token_id, training_args.per_device_eval_batch_size)
            save_reference(path, values)
            logger.info(f"reference log-probs of {len(dataset.records)} rows computed and written to {path}")
        dataset.reference = values
    return reference.forwards if reference else 0


def build_reference(model_args, training_args, policy, datasets, pad_token_id):
    """The run's Reference: none, precomputed (the data sets given their log-probs), or a model run every batch
    (with TR-DPO's weights back from the checkpoint resumed)."""
    if not training_args.uses_reference:
        return Reference(free=True)
    if training_args.precompute_ref_log_probs:
        forwards = precompute_reference(datasets, model_args, training_args, policy, pad_token_id)
        return Reference(precomputed=True, forwards=forwards)
    reference = Reference(reference_model(model_args, training_args), chunk_tokens=training_args.logprob_chunk_tokens)
    if training_args.ref_model_update_steps > 0 and training_args.resume_from_checkpoint:
        load_reference_weights(reference.model, training_args.resume_from_checkpoint)
    return reference


def build_preference_trainer(argv, argument_classes, read_records, trainer_class):
    """The trainer of a run_dpo/run_kto command line: `read_records(path, tokenizer, max_seq_len, max_prompt_len)`
    reads its data files."""
    model_args, data_args, training_args = parse_arguments(argv, argument_classes)
    resolve_resume_checkpoint(training_args, training=True)
    paddle.set_device(training_args.device)
    set_seed(training_args.seed)
    tokenizer = load_tokenizer(model_args.tokenizer_name_or_path or model_args.model_name_or_path)
    if training_args.evaluation_strategy != "no" and not data_args.dev_dataset_path:
        raise ValueError(f"evaluation_strategy={training_args.evaluation_strategy} needs dev_dataset_path")
    evaluates = bool(data_args.dev_dataset_path) and training_args.do_eval  # paddlenlp sets do_eval for a strategy
    if data_args.dev_dataset_path and not evaluates:
        logger.info("dev_dataset_path is not evaluated: set do_eval true, or evaluation_strategy steps")

    def dataset(path, pack):
        records = read_records(path, tokenizer, data_args.max_seq_len, data_args.max_prompt_len)
        return GroupDataset(records, data_args.max_seq_len, pack)

    train = dataset(data_args.train_dataset_path, data_args.greedy_zero_padding)
    evaluation = dataset(data_args.dev_dataset_path, False) if evaluates else None
    model = load_causal_lm(model_args.model_name_or_path, training_args, model_args.recompute_granularity)
    if training_args.lora:
        model = with_lora(model, model_args, training_args)
    reference = build_reference(model_args, training_args, model, [d for d in (train, evaluation) if d], tokenizer.pad_token_id)
    return trainer_class(
        model=model, args=training_args, train_dataset=train, eval_dataset=evaluation, tokenizer=tokenizer,
        data_collator=GroupCollator(tokenizer.pad_token_id), reference=reference,
    )


def run(trainer):
    """Train (resuming where resume_from_checkpoint says), save the model with its tokenizer to output_dir, and
    evaluate on the dev set where there is one."""
    args = trainer.args
    os.makedirs(args.logging_dir, exist_ok=True)  # VisualDL's writer threads race to create it
    with output_dir_claimed(args.output_dir):
        trainer.train(resume_from_checkpoint=args.resume_from_checkpoint)
        if not (args.benchmark or args.autotuner_benchmark):
            trainer.save_model(args.output_dir)
        if trainer.eval_dataset is not None:
            metrics = trainer.evaluate()
            if trainer.is_world_process_zero():
                trainer.save_metrics("eval", metrics)
    finish_distributed_run()
