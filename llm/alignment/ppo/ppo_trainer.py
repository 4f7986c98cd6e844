"""RL trainer: orchestration only. One step is rollout -> reward -> log-probs (and values) -> advantages
-> update of the actor (and critic) -> log.

The math lives in paddle_alignment's `algos/` (selected by config names, their options the config's keys);
the experience comes from one rollout handle, `self.rollout` (rollout/engines.py: generation and scoring,
then the behaviour and reference log-probs and the critic's values the run needs); rewards in `rewards/`, the
critic in `models/score_model.py`; checkpoints hold what `run_state` hands them (checkpoints/saving.py); each
layout's optimizer step is optimizer_step.py's. paddlenlp's `Trainer` supplies the actor's optimizer,
data-parallel wrapping and callbacks (progress bar, VisualDL).
"""

import functools
import json
import math
import os
import time

import numpy as np
import paddle.distributed as dist
from paddle.io import DistributedBatchSampler
from paddlenlp.data import DataCollatorForSeq2Seq
from paddlenlp.trainer import Trainer
from paddlenlp.utils.log import logger

from paddle_alignment import watchdog
from paddle_alignment.agents.trajectories import called_tools, turn_metrics
from paddle_alignment.algos.advantages import AdvantageEstimation
from paddle_alignment.algos.losses import LossScale
from paddle_alignment.algos.masked import masked_mean
from paddle_alignment.algos.metrics import explained_variance, rlhf_objective_metrics, score_part_metrics
from paddle_alignment.algos.reward_shaping import groups_with_reward_variance, shape_rewards
from paddle_alignment.algos.schedules import build_lr_scheduler
from paddle_alignment.checkpoints import saving as checkpoint_io
from paddle_alignment.checkpoints.folders import output_dir_claimed
from paddle_alignment.distributed import (
    all_reduce_scalars,
    barrier,
    collective,
    data_parallel_rank_and_size,
    is_distributed,
    mean_over_ranks,
    rank_shard,
    sum_over_data_ranks,
)
from paddle_alignment.data import IGNORE_INDEX
from paddle_alignment.experience import Experience
from paddle_alignment.fused_optimizer import FusedOptimizerMixin, build_optimizer
from paddle_alignment.group_sharded import forwards_in_lockstep, measure_gradient_norm
from paddle_alignment.micro_batches import MicroBatching
from paddle_alignment.models.lora_utils import is_lora
from paddle_alignment.models.ppo_model_utils import PolicyObjective, ValueObjective, response_token_stats, response_values
from paddle_alignment.models.score_model_utils import RunningMeanStd
from paddle_alignment.offload import OffloadPlan
from paddle_alignment.optimizer_step import step_optimizer
from paddle_alignment.pipeline_parallel import seed_stages_alike
from paddle_alignment.rollout import ColocatedRollout, RolloutTiming
from paddle_alignment.rollout.decode import draw_seed
from paddle_alignment.rollout.worker import ExperienceNeeds, RolloutWorker
from paddle_alignment.split_training import SplitModelMixin
from paddle_alignment.update_metrics import UpdateMetrics

from llm.alignment.ppo.pipeline_update import PipelineUpdate


class PPOTrainer(SplitModelMixin, FusedOptimizerMixin, Trainer):
    def __init__(
        self, model, reference_model, tokenizer, args, train_dataset, eval_dataset, reward_scorer,
        critic_model=None, ptx_dataset=None, lora_save_merged=False, export_hf=False, rollout=ColocatedRollout,
        whole_models=None, teacher_model=None,
    ):
        """`rollout`: the engine (rollout/engines.py), called with the worker over this trainer's models; the
        default samples each batch in this process. `whole_models`: under pipeline parallel, where `model`
        and `critic_model` are this rank's pipeline stages, the whole (actor, critic) the rollout runs on.
        `teacher_model`: the frozen teacher of on-policy distillation (its log-probs join the experience)."""
        super().__init__(model=model, args=args, train_dataset=train_dataset, eval_dataset=eval_dataset, tokenizer=tokenizer)
        seed_stages_alike(args.seed)  # after paddlenlp's Trainer seeded each pipeline stage apart again
        self.whole_models = whole_models
        rollout_actor, rollout_critic = whole_models or (model, critic_model)
        self.reference_model = reference_model
        self.teacher_model = teacher_model
        self.reward_scorer = reward_scorer
        # A judge's rows without a readable verdict leave the batch (rewards/judge.py); other sources score every row.
        self.excludes_unread_rows = getattr(reward_scorer, "excludes_unscored", False)
        self.critic = critic_model
        self.ptx_dataset = ptx_dataset
        self.lora_save_merged = lora_save_merged
        self.export_hf = export_hf
        self.rollout = rollout(RolloutWorker(
            args, rollout_actor, tokenizer, reward_scorer, reference_model, rollout_critic,
            ExperienceNeeds.for_trainer(args, critic_model), autocast=self.autocast_smart_context_manager,
            teacher=teacher_model,
        ))
        watchdog.WATCHDOG.configure(args.watchdog_timeout)
        if args.uses_reference_model and reference_model is None and not is_lora(model):
            raise ValueError("the KL term needs a reference model (or a LoRA actor, whose base weights serve as one)")
        self.reward_normalizer = RunningMeanStd(1) if args.normalize_reward else None
        # Batches drawn from the prompt (train) and ptx data; more than one prompt batch per step with
        # dynamic sampling, so resume needs the counts.
        self.batches_drawn = {"train": 0, "ptx": 0}
        self.advantages = AdvantageEstimation.from_args(args)
        self.policy_objective = PolicyObjective.from_args(args)
        self.value_objective = ValueObjective.from_args(args)

    def run_state(self):
        """What this run's checkpoints hold, handed to checkpoints/saving.py."""
        trained = [checkpoint_io.TrainedModel("policy", self.model, self.model_wrapped, self.optimizer, self.lr_scheduler)]
        actor, critic = self.whole_models or (self.model, self.critic)
        finals = [checkpoint_io.FinalModel("policy", actor)]
        if self.critic is not None:
            trained.append(checkpoint_io.TrainedModel(
                "value", self.critic, getattr(self, "critic_wrapped", self.critic), self.critic_optimizer,
                self.critic_lr_scheduler, checkpoint_io.CRITIC_OPTIMIZER_NAME, checkpoint_io.CRITIC_SCHEDULER_NAME,
            ))
            finals.append(checkpoint_io.FinalModel("value", critic))
        if self.lora_save_merged:
            finals.append(checkpoint_io.FinalModel("policy_merged", self.model, merge_lora=True))
        if self.export_hf:
            finals.append(checkpoint_io.FinalModel("policy_hf", actor, is_lora(actor), hf_layout=True))
        return checkpoint_io.RunState(
            self.args, self.state, self.tokenizer, trained, finals,
            stateful={"reward_normalizer": self.reward_normalizer} if self.reward_normalizer is not None else {},
            data_position={"batches_drawn": self.batches_drawn}, pending=self.rollout, reward=self.reward_scorer,
        )

    # ---- set-up -------------------------------------------------------------------------------------

    def decay_steps(self, rl_steps):
        """Optimizer steps over which a schedule decays: `rl_steps` RL steps (decay_steps), else the run's."""
        return (rl_steps or self.args.max_steps) * self.args.optimizer_steps_per_rl_step

    def create_scheduler(self, num_training_steps):
        warmup = self.args.warmup_steps or int(self.args.warmup_ratio * num_training_steps)
        self.lr_scheduler = build_lr_scheduler(
            self.args.lr_scheduler_type, self.args.learning_rate, self.args.min_learning_rate, warmup,
            self.decay_steps(self.args.decay_steps),
        )
        return self.lr_scheduler

    def create_critic_optimizer(self, num_training_steps):
        """The critic's own schedule (critic_* keys) and an optimizer of the actor's kind."""
        args = self.args
        self.critic_lr_scheduler = build_lr_scheduler(
            args.critic_lr_scheduler_type, args.critic_learning_rate, args.critic_min_learning_rate,
            int(args.critic_warmup_ratio * num_training_steps), self.decay_steps(args.critic_decay_steps),
        )
        self.critic_optimizer = build_optimizer(args, self.critic, self.critic_lr_scheduler, args.critic_weight_decay)

    def wrap_with_optimizer(self, model, optimizer):
        """`Trainer._wrap_model` wraps `self.optimizer` along with the model (mixed precision, fleet's hybrid or
        sharded optimizer): the critic's optimizer is passed through it the same way."""
        actor_optimizer, self.optimizer = self.optimizer, optimizer
        try:
            return self._wrap_model(model), self.optimizer
        finally:
            self.optimizer = actor_optimizer

    def endless_batches(self, stream, dataset, batch_size, collate=list):
        """Endless batches of this rank's share of `dataset`, counted in `self.batches_drawn[stream]` and
        resumed after that many (epochs reshuffle deterministically from the seed)."""
        rank, ranks = data_parallel_rank_and_size()
        sampler = DistributedBatchSampler(
            dataset, batch_size, num_replicas=ranks, rank=rank, shuffle=self.args.dataloader_shuffle, drop_last=True
        )
        if len(sampler) == 0:
            raise ValueError(
                f"{stream}_datasets has {len(dataset)} usable examples, fewer than one batch of {batch_size} per rank"
            )
        epoch, skip = divmod(self.batches_drawn[stream], len(sampler))
        while True:
            sampler.set_epoch(epoch + self.args.seed)
            for indices in sampler:
                if skip:
                    skip -= 1
                    continue
                self.batches_drawn[stream] += 1
                yield collate([dataset[i] for i in indices])
            epoch += 1

    # ---- the loop -----------------------------------------------------------------------------------

    def train(self, resume_from_checkpoint=None):
        with output_dir_claimed(self.args.output_dir):  # build_trainer claimed it already, before picking a checkpoint
            self.train_in_output_dir(resume_from_checkpoint)

    def train_in_output_dir(self, resume_from_checkpoint):
        args = self.args
        start_step = self.prepare_training(resume_from_checkpoint)
        if start_step >= args.max_steps:
            self.rerun_finished(start_step)
            return
        batches = self.endless_batches("train", self.train_dataset, args.generation_batch_size)
        self.state.max_steps, self.state.global_step = args.max_steps, start_step
        self.control = self.callback_handler.on_train_begin(args, self.state, self.control)
        evaluates = self.eval_dataset is not None and args.evaluation_strategy != "no"
        try:
            self.rollout.start(start_step, self.offload)
            watchdog.STEPS.begin(start_step)  # loading models and starting samplers is not a step
            self.train_steps(batches, start_step, evaluates)
        finally:
            self.rollout.close()
        if evaluates:
            self.log_evaluation("eval")
        self.control = self.callback_handler.on_train_end(args, self.state, self.control)
        if args.save_strategy != "no":
            checkpoint_io.save_checkpoint(self.run_state())
        checkpoint_io.save_final_models(self.run_state())

    def train_steps(self, batches, start_step, evaluates):
        args = self.args
        if evaluates and start_step == 0:
            self.log_evaluation("initial_eval")
        for step in range(start_step + 1, args.max_steps + 1):
            exp, metrics = self.advance(batches)
            self.control = self.callback_handler.on_step_end(args, self.state, self.control)
            if args.logging_steps and step % args.logging_steps == 0:
                self.log(metrics)
            if args.logging_steps and step % (args.logging_steps * args.sample_log_interval) == 0:
                self.log_samples(exp)
            if evaluates and self.is_interval_step(args.evaluation_strategy, args.eval_steps, step):
                self.log(self.evaluate())
            if self.is_interval_step(args.save_strategy, args.save_steps, step):
                checkpoint_io.save_checkpoint(self.run_state())

    def advance(self, batches):
        """One RL step, after which the policy is at the next version (state.global_step)."""
        exp, metrics = self.rl_step(batches)
        watchdog.STEPS.step_done()
        self.state.global_step += 1
        self.rollout.policy_updated(self.state.global_step)
        return exp, metrics

    def steps_per_epoch(self):
        """RL steps in one pass over this rank's share of the prompts (one prompt batch per step)."""
        ranks = data_parallel_rank_and_size()[1]
        return max(1, len(self.train_dataset) // (self.args.per_device_prompt_batch_size * ranks))

    def is_interval_step(self, strategy, steps, step):
        """Whether `step`, before the last, ends an interval of paddlenlp's IntervalStrategy `strategy`:
        every `steps` steps, every epoch, or never ("no")."""
        if strategy == "epoch":
            interval = self.steps_per_epoch()
        else:
            interval = (steps or 0) if strategy == "steps" else 0
        return interval > 0 and step % interval == 0 and step < self.args.max_steps

    def resolve_max_steps(self):
        """max_steps -1: the steps of num_train_epochs passes over the prompts (PaddleNLP's meaning)."""
        if self.args.max_steps > 0:
            return
        per_epoch = self.steps_per_epoch()
        self.args.max_steps = max(1, math.ceil(self.args.num_train_epochs * per_epoch))
        logger.info(f"max_steps -1: {self.args.num_train_epochs} epoch(s) of {per_epoch} steps = {self.args.max_steps} steps")

    def rerun_finished(self, step):
        """A rerun of a finished run changes nothing, except that it writes the final models from the last
        checkpoint when a crash came between that checkpoint and the final save."""
        logger.info(f"the run in {self.args.output_dir} already finished at step {step} (max_steps {self.args.max_steps})")
        folders = [final.folder for final in self.run_state().finals]
        missing = [name for name in folders if not os.path.isdir(os.path.join(self.args.output_dir, name))]
        barrier()  # every rank has looked before rank 0 writes, so all agree on whether to save
        if missing:
            logger.info(f"writing the missing final models {', '.join(missing)} from the checkpoint")
            checkpoint_io.save_final_models(self.run_state())

    def log_evaluation(self, split):
        """Evaluate, log, and write output_dir/{split}_results.json (rank 0)."""
        metrics = self.evaluate()
        self.log(metrics)
        if self.is_world_process_zero():
            self.save_metrics(split, metrics)
        return metrics

    def prepare_training(self, resume_from_checkpoint=None):
        """Optimizer, schedule, data-parallel wrapper and, when resuming, their saved state; returns the start step."""
        # VisualDL's writer threads race to create a missing log folder; create it first.
        os.makedirs(self.args.logging_dir, exist_ok=True)
        self.resolve_max_steps()
        num_steps = self.args.max_steps * self.args.optimizer_steps_per_rl_step
        self.create_optimizer_and_scheduler(num_training_steps=num_steps)
        self.model_wrapped = self._wrap_model(self.model)
        measure_gradient_norm(self.model_wrapped, self.optimizer)
        if self.critic is not None:
            self.create_critic_optimizer(num_steps)
            self.critic_wrapped, self.critic_optimizer = self.wrap_with_optimizer(self.critic, self.critic_optimizer)
            measure_gradient_norm(self.critic_wrapped, self.critic_optimizer)
        self.pipeline = self.pipeline_update() if self.whole_models else None
        if self.pipeline is not None:  # fleet gave every data rank the first one's stages: so are the whole models
            self.pipeline.move_weights()
        start_step = 0
        if resume_from_checkpoint:
            start_step, position = checkpoint_io.load_checkpoint(self.run_state(), resume_from_checkpoint)
            self.batches_drawn = position["batches_drawn"]
        self.offload = OffloadPlan.from_level(
            self.args.offload_level, self.args.device,
            # The reward model, when rewards come from one, sits in its scorer.
            frozen=[self.reference_model, self.teacher_model, getattr(self.reward_scorer, "model", None)],
            trained=[self.model, self.critic],
            optimizers=[self.optimizer, getattr(self, "critic_optimizer", None)],
        )
        self.offload.offload_all()
        self.ptx_batches = None
        if self.ptx_dataset is not None:
            collate = DataCollatorForSeq2Seq(self.tokenizer, padding=True, label_pad_token_id=IGNORE_INDEX, return_tensors="pd")
            self.ptx_batches = self.endless_batches("ptx", self.ptx_dataset, self.args.per_device_train_batch_size, collate)
        return start_step

    def pipeline_update(self):
        """The update of pipeline stages, and the weight move into the whole models after it."""
        actor, critic = self.whole_models
        policy = PipelineUpdate.policy_part(self.model, self.model_wrapped, self.optimizer, self.lr_scheduler, actor)
        value = None
        if self.critic is not None:
            value = PipelineUpdate.critic_part(
                self.critic, self.critic_wrapped, self.critic_optimizer, self.critic_lr_scheduler, critic
            )
        return PipelineUpdate(self.args, policy, value)

    def rl_step(self, batches):
        started = time.time()
        exp, generation = self.make_experience(batches)
        exp = self.rollout.complete(exp)
        exp.advantages, exp.returns = self.advantages(exp, sum_over_data_ranks)
        with self.offload.on_device("train_model", "optimizer"):
            train_stats = self.update(exp)
        if self.pipeline is not None:
            train_stats["weight_move_seconds"] = self.pipeline.move_weights()
        metrics = self.rollout_metrics(exp, generation) | train_stats
        metrics["step_time"] = time.time() - started
        metrics["eps"] = len(exp) * data_parallel_rank_and_size()[1] / metrics["step_time"]
        return exp, metrics

    def make_experience(self, batches):
        """The step's rollouts with their rewards. With DAPO's dynamic sampling (`dynamic_sampling`), groups
        whose rewards are all equal are dropped and more batches (of global_gen_batch_size's share of
        prompts) are taken, at most `max_gen_batches`, until a full batch of groups is kept; if that is not
        reached, the dropped groups fill the rest (they carry no group-relative advantage)."""
        args = self.args
        kept, dropped, timing, generated = [], [], RolloutTiming(), 0
        for taken in range(1, (args.max_gen_batches if args.dynamic_sampling else 1) + 1):
            exp = self.next_rollouts(batches, timing)
            generated += len(exp)
            exp = self.without_unread_verdicts(exp)
            self.shape_rewards(exp)
            if not args.dynamic_sampling:
                return exp, timing.metrics() | self.judge_metrics(len(exp), generated)
            keep = groups_with_reward_variance(exp.rewards, exp.group_index, exp.scored).numpy()
            for pool, rows in [(kept, np.flatnonzero(keep)), (dropped, np.flatnonzero(~keep))]:
                if len(rows):
                    pool.append(exp.take(rows.tolist()))
            if sum(map(len, kept)) >= args.rollout_batch_size:
                break
        exp = Experience.concat(kept + dropped, self.tokenizer.pad_token_id).select(0, args.rollout_batch_size)
        kept_share = sum(map(len, kept)) / (taken * args.generation_batch_size * args.rollout_n)
        scored = sum(map(len, kept + dropped))
        return exp, timing.metrics() | self.judge_metrics(scored, generated) | {
            "dynamic_sampling/gen_batches": taken, "dynamic_sampling/kept_group_frac": kept_share,
        }

    def without_unread_verdicts(self, exp):
        """With a judge (a scorer that `excludes_unscored`), the rows it gave no readable verdict leave the batch
        before rewards are shaped: nothing the judge did not say trains the policy. A batch left empty on any
        rank stops the run on every rank (the judge's replies are logged above it)."""
        if not self.excludes_unread_rows:
            return exp
        kept = np.flatnonzero(~exp.unscored.numpy())
        fewest = all_reduce_scalars({"kept": float(len(kept))}, op=dist.ReduceOp.MIN, what="rows with a verdict")["kept"]
        if fewest == 0:
            raise RuntimeError(
                f"the judge ({self.reward_scorer.record['judge']}) gave no readable verdict on a whole batch at step "
                f"{self.state.global_step + 1}: check judge_prompt_template and judge_verdict_pattern against its replies "
                "(logged above)"
            )
        return exp if len(kept) == len(exp) else exp.take(kept.tolist())

    def judge_metrics(self, scored, generated):
        """judge/excluded_frac: the share of this step's rollouts the judge gave no readable verdict."""
        if not self.excludes_unread_rows:
            return {}
        return {"judge/excluded_frac": 1.0 - scored / generated}

    def next_rollouts(self, batches, timing):
        """The next batch of scored rollouts from `self.rollout`, keeping its `lookahead` batches requested
        behind it (none past the last step); each request names the policy version now (the steps done)."""
        version = self.state.global_step
        ahead = min(self.rollout.lookahead, self.args.max_steps - version - 1)
        while self.rollout.requested() <= ahead:
            self.rollout.request(next(batches), draw_seed(), version)
        started = time.time()
        batch = self.rollout.take()
        timing.add(batch, waited=time.time() - started, staleness=version - batch.version)
        return batch.exp

    def shape_rewards(self, exp):
        """exp.rewards: the scores after penalties, normalisation and clipping."""
        args = self.args
        exp.rewards = shape_rewards(
            exp.scores, exp.finished, exp.response_mask.sum(axis=-1), args.missing_eos_penalty, args.max_dec_len,
            args.overlong_reward_buffer if args.enable_overlong_reward_buffer else 0, args.overlong_penalty_factor,
            normalize=functools.partial(self.normalize_rewards, scored=exp.scored) if self.reward_normalizer is not None else None,
            clip_range=args.clip_range_score,
        )

    def normalize_rewards(self, rewards, scored=None):
        """Rewards [B] standardised by the running mean and std of every reward so far (updated first with the
        `scored` rows')."""
        self.reward_normalizer.update((rewards if scored is None else rewards[scored]).unsqueeze(-1))
        return self.reward_normalizer.normalize(rewards.unsqueeze(-1)).squeeze(-1)

    def update(self, exp):
        """`update_iters` passes over micro-batches, one optimizer step of the actor (and critic) every
        `gradient_accumulation_steps`; each step's loss is averaged over the whole step (see LossScale).
        Metrics as UpdateMetrics reduces them."""
        args = self.args
        size, accumulate = args.per_device_train_batch_size, args.gradient_accumulation_steps
        self.model.train()
        if self.pipeline is not None:
            return self.pipeline.update(exp, self.loss_scales) | self.learning_rates()
        statistics = UpdateMetrics()
        grad_norms = {"grad_norm": [], "critic_grad_norm": []}
        # Each optimizer step takes the rows of `accumulate` micro-batches of `size` rows in rollout order,
        # which micro_batches.py then splits by their tokens.
        starts = [s for _ in range(args.update_iters) for s in range(0, len(exp), size)]
        steps = [
            [row for start in starts[i : i + accumulate] for row in range(start, min(start + size, len(exp)))]
            for i in range(0, len(starts), accumulate)
        ]
        batching = MicroBatching.from_args(args, size)
        # The ranks' backward passes must pair up.
        splits = batching.splits_in_lockstep(exp, steps, "the update")
        computed_tokens = real_tokens = 0
        for micro_rows, scale in zip(splits, self.loss_scales(exp.trained_mask, steps)):
            for i, rows in enumerate(micro_rows):
                steps_now = i == len(micro_rows) - 1
                micro = batching.micro_batch(exp, rows)
                computed_tokens += micro.input_ids.shape[0] * micro.input_ids.shape[1]
                real_tokens += int(micro.attention_mask.sum())
                stats = self.backward(self.model_wrapped, self.policy_loss, micro, scale, steps_now)
                if self.critic is not None:
                    stats |= self.backward(self.critic_wrapped, self.value_loss, micro, scale, steps_now)
                statistics.add(stats)
            grad_norms["grad_norm"].append(step_optimizer(self.model, self.optimizer, self.lr_scheduler))
            if self.critic is not None:
                critic_norm = step_optimizer(self.critic, self.critic_optimizer, self.critic_lr_scheduler)
                grad_norms["critic_grad_norm"].append(critic_norm)
        metrics = statistics.reduced(len(steps))
        metrics |= {name: float(np.mean(norms)) for name, norms in grad_norms.items() if norms}
        metrics |= self.learning_rates()
        metrics["update_padding_ratio"] = computed_tokens / max(real_tokens, 1)
        return metrics

    def learning_rates(self):
        rates = {"lr": self.lr_scheduler.get_lr()}
        if self.critic is not None:
            rates["critic_lr"] = self.critic_lr_scheduler.get_lr()
        return rates

    def loss_scales(self, trained_mask, steps):
        """The LossScale of each optimizer step (a list of its rows): its trained response tokens and responses
        (a row without a score has none), summed over its micro-batches and the data ranks, and the response
        budget max_dec_len. A step with nothing to train counts one of each, so its loss is 0, not 0/0."""
        tokens = trained_mask.sum(axis=1).numpy()
        local = {}
        for i, rows in enumerate(steps):
            local[f"tokens_{i}"], local[f"sequences_{i}"] = float(tokens[rows].sum()), float((tokens[rows] > 0).sum())
        totals = all_reduce_scalars(local, what="token and response counts of the update")
        ranks = data_parallel_rank_and_size()[1]
        budget = self.args.max_dec_len
        return [
            LossScale(max(totals[f"tokens_{i}"], 1.0), max(totals[f"sequences_{i}"], 1.0), ranks, budget)
            for i in range(len(steps))
        ]

    def backward(self, wrapped, loss_fn, micro, scale, steps_now):
        """Backward of `loss_fn(micro, scale)`, the micro-batch's share of its step's loss; gradients are
        synchronised across data-parallel ranks only on the micro-batch that steps."""
        # fleet's hybrid-parallel wrappers have no no_sync: their optimizer reduces gradients when it steps.
        deferred = not steps_now and is_distributed() and hasattr(wrapped, "no_sync")
        sync = wrapped.no_sync() if deferred else collective("the backward pass's gradient all-reduce")
        with sync:
            loss, stats = loss_fn(micro, scale)
            loss.backward()
        return stats

    def policy_loss(self, micro, scale):
        """The policy objective on a micro-batch, plus ptx_coeff x the language-model loss of a ptx
        micro-batch (a mean per micro-batch, so averaged over the accumulation steps)."""
        with self.autocast_smart_context_manager():
            # With a distribution-matching distillation loss, also the student's log-probs of the teacher's top tokens.
            logprobs, entropy, *student_topk = response_token_stats(
                self.model_wrapped, micro, self.args.temperature, self.args.logprob_chunk_tokens,
                share_prompts=self.args.share_prompt_forward, extra_ids=micro.teacher_topk_ids,
            )
        loss, stats = self.policy_objective.loss(
            logprobs, entropy, micro.old_logprobs, micro.ref_logprobs, micro.advantages, micro.trained_mask, scale,
            micro.rollout_logprobs, micro.turn_ids, micro.teacher_logprobs, micro.teacher_topk_logprobs, *student_topk,
        )
        if self.ptx_batches is not None:
            with self.autocast_smart_context_manager():
                ptx_loss = self.model_wrapped(**next(self.ptx_batches), return_dict=True).loss
            ptx_share = ptx_loss / self.args.gradient_accumulation_steps
            loss = loss + self.args.ptx_coeff * ptx_share
            stats["loss/ptx"] = ptx_share.detach()
        return loss, stats

    def value_loss(self, micro, scale):
        with self.autocast_smart_context_manager():
            values = response_values(self.critic_wrapped, micro)
        return self.value_objective(values, micro.values, micro.returns, micro.trained_mask, scale)

    # ---- metrics, samples, evaluation ---------------------------------------------------------------

    def rollout_metrics(self, exp, generation):
        """Metrics of the experience, averaged over ranks (TRL PPOv2's `objective/*`, `val/*` among them)."""
        args = self.args
        lengths = exp.response_mask.sum(axis=1)
        rewards, groups = exp.rewards.numpy(), exp.group_index.numpy()
        local = {
            "reward_mean": float(rewards.mean()),
            "reward_std": float(rewards.std()),
            # (by group index: rows a judge gave no verdict have left their groups)
            "zero_std_group_frac": float(np.mean([rewards[groups == group].std() == 0 for group in np.unique(groups)])),
            "response_length_mean": float(lengths.mean()),
            "response_clipped_ratio": float(1.0 - exp.finished.astype("float32").mean()),
        }
        if self.reward_scorer.max_score is not None:
            local["accuracy"] = float((exp.scores >= self.reward_scorer.max_score).astype("float32").mean())
        local |= score_part_metrics(exp, self.reward_scorer.parts)
        local |= rlhf_objective_metrics(exp.scores, exp.response_mask, exp.old_logprobs, exp.ref_logprobs, args.kl_coeff)
        if exp.values is not None:
            local["val/value_mean"] = float(masked_mean(exp.values, exp.response_mask))
            local["val/explained_variance"] = float(explained_variance(exp.values, exp.returns, exp.response_mask))
        if exp.turn_stats is not None:
            local |= turn_metrics(exp.turn_stats)
        local |= {k: v for k, v in generation.items() if k != "rollout_seconds"}
        metrics = mean_over_ranks(local, "rollout metrics")
        totals = all_reduce_scalars(
            {
                "rate": float(lengths.sum()) / max(generation["rollout_seconds"], 1e-9),
                "eos": float(exp.finished.astype("float32").sum()),
                "unscored": float(exp.unscored.astype("float32").sum()) if exp.unscored is not None else 0.0,
            }
        )
        # Ranks decode at the same time, so their rates add up.
        metrics["rollout_tokens_per_s"] = totals["rate"]
        metrics["val/num_eos_tokens"] = totals["eos"]
        metrics["reward_error_rows"] = totals["unscored"]
        metrics["response_length_max"] = all_reduce_scalars({"max": float(lengths.max())}, op=dist.ReduceOp.MAX)["max"]
        return metrics

    def log_samples(self, exp):
        """A table of sample prompts, responses and rewards, to the console and VisualDL text."""
        if not self.is_world_process_zero():
            return
        rows = [
            f"| {json.dumps(exp.prompts[i])[:200]} | {json.dumps(exp.responses[i])[:300]} | {float(exp.rewards[i]):.3f} |"
            for i in range(0, len(exp), max(1, len(exp) // self.args.num_sample_logs))
        ][: self.args.num_sample_logs]
        table = "\n".join(["| prompt | response | reward |", "|---|---|---|", *rows])
        logger.info(f"samples at step {self.state.global_step}:\n{table}")
        for callback in self.callback_handler.callbacks:
            writer = getattr(callback, "vdl_writer", None)
            if writer is not None:
                writer.add_text("samples", table, self.state.global_step)

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix="eval"):
        """Greedy accuracy (when the reward has a max score), mean reward and, with tools, the fraction of answers
        that called one, on this rank's share of the eval prompts, summed over ranks. With a judge, the answers
        it gave no readable verdict are left out of the accuracy and the mean, and counted; with none read, neither is
        reported."""
        dataset = eval_dataset or self.eval_dataset
        shard = rank_shard(len(dataset))
        size = self.args.per_device_eval_batch_size
        totals = {"correct": 0.0, "reward": 0.0, "tool_callers": 0.0, "scored": 0.0, "count": 0.0}
        batches = math.ceil(len(shard) / size)
        if forwards_in_lockstep(self.model):
            batches = int(all_reduce_scalars({"batches": batches}, dist.ReduceOp.MAX, "evaluation batch counts")["batches"])
        for start in range(0, batches * size, size):
            if start >= len(shard):  # in lockstep, out of prompts: generate (a prompt, uncounted) while the peers do
                self.rollout.greedy_rollouts([dataset[shard[0] if shard else 0]])
                continue
            exp = self.rollout.greedy_rollouts([dataset[i] for i in shard[start : start + size]])
            scores = exp.scores.numpy()[~exp.unscored.numpy()] if self.excludes_unread_rows else exp.scores.numpy()
            if self.reward_scorer.max_score is not None:
                totals["correct"] += float(np.sum(scores >= self.reward_scorer.max_score))
            if exp.turn_stats is not None:
                totals["tool_callers"] += float(np.sum(called_tools(exp.turn_stats)))
            totals["reward"] += float(scores.sum())
            totals["scored"] += len(scores)
            totals["count"] += len(exp)
        totals = all_reduce_scalars(totals, what="evaluation totals")
        metrics = {}
        if totals["scored"]:
            metrics[f"{metric_key_prefix}_reward_mean"] = totals["reward"] / totals["scored"]
            if self.reward_scorer.max_score is not None:
                metrics[f"{metric_key_prefix}_accuracy"] = totals["correct"] / totals["scored"]
        else:
            logger.warning(f"evaluation at step {self.state.global_step}: the judge read no verdict on any of the "
                           f"{int(totals['count'])} answers, so no {metric_key_prefix}_reward_mean or accuracy is reported")
        if self.args.tool_paths:
            metrics[f"{metric_key_prefix}_tool_call_rate"] = totals["tool_callers"] / totals["count"]
        if self.excludes_unread_rows:
            metrics[f"{metric_key_prefix}_judge_excluded_frac"] = 1.0 - totals["scored"] / totals["count"]
        return metrics
