"""What a PPO/GRPO checkpoint holds and which rank writes and reads each file (PaddleNLP's names).

    output_dir/checkpoint-N/
        policy/, value/                 the models, from_pretrained-loadable (rank 0 writes; save_model)
        optimizer[.SUFFIX].pdopt        each optimizer part's state, one file per part (save_optimizer_state):
        value_optimizer[.SUFFIX].pdopt  SUFFIX is paddlenlp's optimizer_name_suffix, e.g. `shard01` under
                                        sharding stage 1, where each sharding rank's optimizer holds only
                                        its own parameters' states; none in a single process or data parallel
        scheduler.pdparams, value_scheduler.pdparams, reward_normalizer.pdparams, trainer_state.json,
        data_state.json, rng_state.pth (one process) or rng_state_<world>.pth (every rank's)   rank 0
        judge.json                      with an LLM judge: its identity and prompt hash (a resume with another
                                        judge stops: rewards/judge.py)                           rank 0
        rollout_queue.rank<R>.pkl       rank R's rollout batches requested before the checkpoint and not yet
                                        trained on (decoupled rollout samples ahead), each rank its own

Every rank calls save_checkpoint, save_final_models and load_checkpoint (they hold collectives). All
ranks write into one temp folder that rank 0 renames once every rank has written (atomic_directory).
A checkpoint resumes at the parallel layout it was saved with. With `ignore_save_lr_and_optim` (PaddleNLP's
key) the optimizer and scheduler files are left out; resuming such a checkpoint (or any with
`ignore_load_lr_and_optim`) restarts the optimizer's moments and continues the schedule at the step.

A trainer hands this module what its checkpoints hold as one `RunState` (the models with their optimizers
and schedules, the final models, state objects, data position, pending batches); nothing here reads a
trainer itself.
"""

import json
import os
import pickle
from dataclasses import dataclass, field
from typing import Optional

import paddle
import paddle.distributed as dist
from paddlenlp.trainer.trainer import OPTIMIZER_NAME, SCHEDULER_NAME, TRAINER_STATE_NAME
from paddlenlp.trainer.trainer_callback import TrainerState
from paddlenlp.transformers.model_utils import _add_variant
from paddlenlp.utils.log import logger

from paddle_alignment.checkpoints.folders import (
    atomic_directory,
    collect_rng_states,
    optimizer_state_by_parameter_name,
    optimizer_state_by_structured_name,
    restore_rng_states,
    rotate_checkpoints,
)
from paddle_alignment import watchdog
from paddle_alignment.distributed import collective, is_distributed
from paddle_alignment.group_sharded import gather_whole_weights
from paddle_alignment.models.hf_layout import save_hf_folder
from paddle_alignment.models.lora_utils import merged_state_dict
from paddle_alignment.models.tensor_parallel import complete_state_dict, is_tensor_parallel
from paddle_alignment.pipeline_parallel import is_pipeline_stage, save_stages
from paddle_alignment.rewards.judge import check_judge_record, save_judge_record
from paddle_alignment.rollout.engines import RolloutBatch

CRITIC_OPTIMIZER_NAME, CRITIC_SCHEDULER_NAME = "value_optimizer.pdopt", "value_scheduler.pdparams"
DATA_STATE_NAME = "data_state.json"
ROLLOUT_QUEUE_NAME = "rollout_queue.rank{rank}.pkl"


@dataclass(frozen=True)
class TrainedModel:
    """A model that trains, as its trainer wrapped it (`wrapped`), with its optimizer and schedule, and their
    names in a checkpoint."""

    folder: str
    model: object
    wrapped: object
    optimizer: object
    lr_scheduler: object
    optimizer_name: str = OPTIMIZER_NAME
    scheduler_name: str = SCHEDULER_NAME


@dataclass(frozen=True)
class FinalModel:
    """A model written to output_dir/`folder` at the end of a run."""

    folder: str
    model: object
    merge_lora: bool = False
    hf_layout: bool = False


@dataclass
class RunState:
    """What a checkpoint holds, as the trainer that writes it hands it over: the one interface between a
    trainer and this module, which reads nothing else of it.

    args           the run's TrainingArguments: output_dir, save_total_limit, ignore_save_lr_and_optim,
                   ignore_load_lr_and_optim, the parallel layout (optimizer_name_suffix, use_hybrid_parallel,
                   data_parallel_rank), optimizer_steps_per_rl_step
    trainer_state  paddlenlp's TrainerState (global_step, log history): trainer_state.json
    tokenizer      written beside each model
    trained        the TrainedModels, each with its optimizer and schedule
    finals         the FinalModels written at the end of the run
    stateful       {file name: an object with state_dict() and set_state_dict()} (the reward normalizer)
    data_position  JSON-able position in the data (batches drawn), handed back by load_checkpoint
    pending        what was requested and not yet trained on, with drain() -> RolloutBatches and restore(batches)
    reward         the reward scorer, whose identity a resume must keep (a judge's record)
    """

    args: object
    trainer_state: object
    tokenizer: object
    trained: list
    finals: list
    stateful: dict = field(default_factory=dict)
    data_position: dict = field(default_factory=dict)
    pending: Optional[object] = None
    reward: Optional[object] = None

    def wrapped_models(self):
        return [part.wrapped for part in self.trained]


def is_first_rank():
    return dist.get_rank() == 0


# ---- models -----------------------------------------------------------------------------------------


def save_model(model, folder, tokenizer, merge_lora=False, hf_layout=False):
    """`model` to `folder`, from_pretrained-loadable with the tokenizer beside it. Every rank calls this (the
    one place a model's weights are written); rank 0 writes. A tensor-parallel model's parts are gathered
    first, so the folder holds the whole model whatever the layout. `merge_lora`: a LoRA model's base
    weights with the adapters folded in. `hf_layout`: written as Hugging Face ships models (hf_layout.py). A
    pipeline stage writes its part of one loadable folder (pipeline_parallel.save_stages)."""
    if is_pipeline_stage(model):
        save_stages(model, folder, tokenizer)
        return
    state = complete_state_dict(model) if is_tensor_parallel(model) else None
    if not is_first_rank():
        return
    if merge_lora:
        model, state = model.model, merged_state_dict(model)
    if hf_layout:
        save_hf_folder(model, folder, tokenizer, state)
        return
    # safetensors (paddlenlp's layout), so that tensor-parallel ranks loading it read only their slices
    # (models/split_loading.py); a LoRA model's adapters stay paddlenlp's lora_model_state.pdparams.
    model.save_pretrained(folder, state_dict=state, safe_serialization=True)
    tokenizer.save_pretrained(folder)


def save_final_models(run):
    """output_dir/policy, output_dir/value ... (`run.finals`), each written to a temp folder and renamed when
    complete; with a judge, output_dir/judge.json."""
    gather_whole_weights(*run.wrapped_models())
    for final in run.finals:
        path = os.path.join(run.args.output_dir, final.folder)
        with watchdog.guarded("checkpoint write", f"the final model {path}"), atomic_directory(path) as tmp:
            save_model(final.model, tmp, run.tokenizer, final.merge_lora, final.hf_layout)
    if is_first_rank():
        save_judge_record(run.reward, run.args.output_dir)


# ---- optimizer parts --------------------------------------------------------------------------------


def optimizer_file(name, args):
    """This rank's optimizer file, paddlenlp's `name` with `optimizer_name_suffix` (e.g. optimizer.shard01.pdopt
    under sharding; optimizer.pdopt in a single process or data parallel)."""
    return _add_variant(name, args.optimizer_name_suffix)


def writes_optimizer_part(args):
    """Whether this rank writes its optimizer file: under fleet hybrid parallel each tensor/pipeline/sharding
    part is written by its data-parallel rank 0 (as paddlenlp's Trainer does); otherwise rank 0 writes the
    one file every rank shares."""
    return args.data_parallel_rank == 0 if args.use_hybrid_parallel else is_first_rank()


def save_optimizer_state(optimizer, model, folder, name, args):
    """This rank's part of `optimizer`'s state, keyed by parameter paths, to `folder`/optimizer_file(name)
    (under tensor parallel, this rank's slices of the split moments: split_training.SplitOptimizer)."""
    if writes_optimizer_part(args):
        paddle.save(optimizer_state_by_structured_name(optimizer, model), os.path.join(folder, optimizer_file(name, args)))


def load_optimizer_state(optimizer, model, folder, name, args):
    optimizer.set_state_dict(optimizer_state_by_parameter_name(paddle.load(os.path.join(folder, optimizer_file(name, args))), model))


# ---- checkpoints ------------------------------------------------------------------------------------


def save_checkpoint(run):
    """output_dir/checkpoint-N (N the global step): every rank's part, then rotation (save_total_limit)."""
    args, step = run.args, run.trainer_state.global_step
    path = os.path.join(args.output_dir, f"checkpoint-{step}")
    rng_states = collect_rng_states()
    gather_whole_weights(*run.wrapped_models())
    with watchdog.guarded("checkpoint write", path), atomic_directory(path) as tmp:
        for part in run.trained:
            save_model(part.model, os.path.join(tmp, part.folder), run.tokenizer)
            if not args.ignore_save_lr_and_optim:
                save_optimizer_state(part.optimizer, part.model, tmp, part.optimizer_name, args)
        save_pending_batches(run.pending, tmp)
        if is_first_rank():
            save_shared_state(run, tmp, rng_states)
    if is_first_rank():
        rotate_checkpoints(args.output_dir, args.save_total_limit, just_written=step)
    logger.info(f"checkpoint written to {path}")


def save_shared_state(run, folder, rng_states):
    """The state every rank holds alike (schedules, `run.stateful`, step, data position), and every rank's RNG
    states in paddlenlp's file."""
    for part in run.trained:
        if not run.args.ignore_save_lr_and_optim:
            paddle.save(part.lr_scheduler.state_dict(), os.path.join(folder, part.scheduler_name))
    for name, owner in run.stateful.items():
        paddle.save(owner.state_dict(), os.path.join(folder, f"{name}.pdparams"))
    run.trainer_state.save_to_json(os.path.join(folder, TRAINER_STATE_NAME))
    save_judge_record(run.reward, folder)
    with open(os.path.join(folder, DATA_STATE_NAME), "w") as f:
        json.dump(run.data_position, f)
    world = len(rng_states)
    paddle.save(rng_states[0] if world == 1 else rng_states, os.path.join(folder, rng_file_name(world)))


def load_checkpoint(run, path):
    """Restore the optimizers, schedules, `run.stateful`, RNG and pending batches from a checkpoint folder (the
    models' weights were loaded from its model folders when the run built them). Returns the step to continue
    from and the data position."""
    args = run.args
    check_complete(path, files_to_load(run))
    check_judge_record(run.reward, path)
    step = TrainerState.load_from_json(os.path.join(path, TRAINER_STATE_NAME)).global_step
    for part in run.trained:
        if loads_optimizer(path, part, args):
            load_optimizer_state(part.optimizer, part.model, path, part.optimizer_name, args)
            part.lr_scheduler.set_state_dict(paddle.load(os.path.join(path, part.scheduler_name)))
        else:
            logger.warning(
                f"{path}: {part.folder}'s optimizer starts with zero moments (ignore_save_lr_and_optim / "
                f"ignore_load_lr_and_optim); its learning-rate schedule continues at step {step}"
            )
            part.lr_scheduler.step(step * args.optimizer_steps_per_rl_step)
    for name, owner in run.stateful.items():
        owner.set_state_dict(paddle.load(os.path.join(path, f"{name}.pdparams")))
    restore_rng_states(path, rng_file_name(dist.get_world_size()))
    with open(os.path.join(path, DATA_STATE_NAME)) as f:
        data_position = json.load(f)
    load_pending_batches(run.pending, path)
    logger.info(f"resumed from {path} at step {step}")
    return step, data_position


def rng_file_name(world):
    """paddlenlp's name of the RNG states' file: one process's, or every rank's of `world`."""
    return "rng_state.pth" if world == 1 else f"rng_state_{world}.pth"


def pending_file(folder):
    return os.path.join(folder, ROLLOUT_QUEUE_NAME.format(rank=dist.get_rank()))


def save_pending_batches(pending, folder):
    """This rank's requested batches, once sampled (none when every batch was trained on)."""
    batches = pending.drain() if pending is not None else []
    if batches:
        with open(pending_file(folder), "wb") as f:
            pickle.dump([batch.to_numpy() for batch in batches], f, protocol=5)


def load_pending_batches(pending, folder):
    """The batches this rank had requested when the checkpoint was written: they come before any new request."""
    if pending is not None and os.path.isfile(pending_file(folder)):
        with open(pending_file(folder), "rb") as f:
            pending.restore([RolloutBatch.from_numpy(values) for values in pickle.load(f)])


def optimizer_state_optional(args):
    """PaddleNLP's switches that leave checkpoints without optimizer and scheduler state, or skip loading it."""
    return args.ignore_save_lr_and_optim or args.ignore_load_lr_and_optim


def loads_optimizer(path, part, args):
    """Whether `part`'s optimizer and scheduler state is restored from checkpoint `path`."""
    if args.ignore_load_lr_and_optim:
        return False
    return not args.ignore_save_lr_and_optim or os.path.isfile(os.path.join(path, optimizer_file(part.optimizer_name, args)))


def files_to_load(run):
    """The files of a checkpoint this rank must find."""
    names = [TRAINER_STATE_NAME, DATA_STATE_NAME] + [f"{name}.pdparams" for name in run.stateful]
    if not optimizer_state_optional(run.args):
        for part in run.trained:
            names += [optimizer_file(part.optimizer_name, run.args), part.scheduler_name]
    return names


def check_complete(path, names):
    """Raise FileNotFoundError on every rank when any rank misses one of its `names` in `path` (all ranks
    stop, none waits in a collective), naming the files and, for optimizer files, the layout."""
    missing = [name for name in names if not os.path.isfile(os.path.join(path, name))]
    if is_distributed():
        gathered = []
        with collective("the gathering of missing checkpoint files"):
            dist.all_gather_object(gathered, missing)
        missing = sorted(set(sum(gathered, [])))
    if not missing:
        return
    message = f"resume_from_checkpoint={path} is not a complete checkpoint: " + "; ".join(f"{n} is missing" for n in missing)
    optimizer_files = [n for n in missing if n.endswith(".pdopt")]
    if optimizer_files:
        saved = sorted(n for n in os.listdir(path) if n.endswith(".pdopt")) if os.path.isdir(path) else []
        message += (
            f". This run's parallel layout reads {', '.join(optimizer_files)}; the checkpoint holds "
            f"{', '.join(saved) or 'no optimizer file'}. A checkpoint resumes at the layout it was saved with: one "
            "optimizer file per tensor/pipeline/sharding part, named by paddlenlp's optimizer_name_suffix "
            "(e.g. optimizer.shard01.pdopt at sharding_parallel_degree 2)"
        )
    raise FileNotFoundError(message)
