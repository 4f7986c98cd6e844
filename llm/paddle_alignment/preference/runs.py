"""What run_dpo.py and run_kto.py share: arguments to a ready trainer (tokenizer, data sets, the policy with or
without LoRA adapters, the reference or its precomputed log-probs), and the run itself."""

import logging
import os

import paddle
from paddlenlp.peft import LoRAConfig, LoRAModel
from paddlenlp.trainer import set_seed
from paddlenlp.trl.llm_utils import get_lora_target_modules

from paddle_alignment.checkpoints.folders import output_dir_claimed
from paddle_alignment.config.arguments import parse_arguments
from paddle_alignment.distributed import finish_distributed_run
from paddle_alignment.models.loading import frozen, load_causal_lm, load_dtype, load_tokenizer
from paddle_alignment.preference.batches import GroupCollator, GroupDataset
from paddle_alignment.preference.reference import Reference, cache_path, cached_reference, compute_reference, save_reference

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


def load_reference(model_args, training_args):
    return frozen(load_causal_lm(reference_path(model_args), training_args))


def precompute_reference(datasets, model_args, training_args, policy, pad_token_id):
    """Each data set's reference log-probs from its cache file, or computed (with a reference loaded for that and
    dropped after) and cached."""
    cache_dir = training_args.reference_cache_dir or os.path.join(training_args.output_dir, "reference_logps")
    reference = None
    for dataset in datasets:
        path = cache_path(cache_dir, dataset.records, reference_path(model_args), load_dtype(training_args))
        replies = 2
        values = cached_reference(path, len(dataset.records), replies)
        if values is not None:
            logger.info(f"reference log-probs of {len(dataset.records)} rows read from {path}")
        else:
            if reference is None:
                model = None if model_args.reference_model_name_or_path is None and training_args.lora else load_reference(model_args, training_args)
                reference = Reference(model, chunk_tokens=training_args.logprob_chunk_tokens)
            values = compute_reference(reference, policy, dataset.records, pad_token_id, training_args.per_device_eval_batch_size)
            save_reference(path, values)
            logger.info(f"reference log-probs of {len(dataset.records)} rows computed ({reference.forwards} forwards) and written to {path}")
        dataset.reference = values
    return reference


def build_preference_trainer(argv, argument_classes, read_records, trainer_class):
    """The trainer of a run_dpo/run_kto command line: `read_records(path, tokenizer, max_seq_len, max_prompt_len)`
    reads its data files."""
    model_args, data_args, training_args = parse_arguments(argv, argument_classes)
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
    reference = Reference(free=not training_args.uses_reference, chunk_tokens=training_args.logprob_chunk_tokens)
    if training_args.uses_reference and training_args.precompute_ref_log_probs:
        counted = precompute_reference([d for d in (train, evaluation) if d], model_args, training_args, model, tokenizer.pad_token_id)
        reference = Reference(precomputed=True, forwards=counted.forwards if counted else 0)
    elif training_args.uses_reference:
        external = not training_args.lora or model_args.reference_model_name_or_path is not None
        reference = Reference(load_reference(model_args, training_args) if external else None,
                              chunk_tokens=training_args.logprob_chunk_tokens)
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
