"""RL trainer: orchestration only. One step is rollout -> reward -> log-probs -> advantages -> update -> log.

The math lives in `algos/` (selected by config names), rollout in `infer_utils.py`, rewards in `rewards/`.
paddlenlp's `Trainer` supplies the optimizer, data-parallel wrapping, callbacks (progress bar, VisualDL)
and RNG-state restore.
"""

import contextlib
import json
import os
import shutil
import time

import numpy as np
import paddle
import paddle.distributed as dist
from paddle.io import DistributedBatchSampler
from paddlenlp.trainer import Trainer
from paddlenlp.trainer.trainer_callback import TrainerState
from paddlenlp.utils.log import logger

from llm.alignment.ppo.algos import ADVANTAGE_ESTIMATORS, KL_ESTIMATORS, LOSS_AGGREGATIONS, POLICY_LOSSES
from llm.alignment.ppo.algos.registry import call_with_options
from llm.alignment.ppo.algos.reward_shaping import overlong_penalty
from llm.alignment.ppo.algos.schedules import build_lr_scheduler
from llm.alignment.ppo.algos.token_stats import entropy_from_logits, gather_logprobs
from llm.alignment.ppo.checkpoint_utils import (
    atomic_directory,
    barrier,
    collect_rng_states,
    load_optimizer_state,
    optimizer_state_by_structured_name,
)
from llm.alignment.ppo.comm_utils import all_reduce_scalars, is_distributed, masked_mean, mean_over_ranks
from llm.alignment.ppo.infer_utils import SamplingConfig, generate_rollouts

OPTIMIZER_FILE, SCHEDULER_FILE, STATE_FILE = "optimizer.pdopt", "scheduler.pdparams", "trainer_state.json"


def position_ids_from_mask(attention_mask):
    """Positions counted over real tokens only, so left padding does not shift the prompt."""
    return (paddle.cumsum(attention_mask, axis=-1) - 1).clip(min=0)


def response_logits(model, exp):
    """Logits that predict each response token: [B, R, V]."""
    logits = model(
        input_ids=exp.input_ids,
        attention_mask=exp.attention_mask,
        position_ids=position_ids_from_mask(exp.attention_mask),
        return_dict=True,
    ).logits
    return logits[:, exp.prompt_len - 1 : -1]


def response_labels(exp):
    return exp.input_ids[:, exp.prompt_len :]


class PPOTrainer(Trainer):
    def __init__(self, model, reference_model, tokenizer, args, train_dataset, eval_dataset, reward_scorer):
        super().__init__(model=model, args=args, train_dataset=train_dataset, eval_dataset=eval_dataset, tokenizer=tokenizer)
        self.reference_model = reference_model
        self.reward_scorer = reward_scorer
        self.sampling = SamplingConfig.from_args(args)
        self.advantage_fn = ADVANTAGE_ESTIMATORS.get(args.rl_algorithm)
        self.policy_loss_fn = POLICY_LOSSES.get(args.policy_loss)
        self.kl_fn = KL_ESTIMATORS.get(args.kl_estimator)
        self.aggregate = LOSS_AGGREGATIONS.get(args.loss_agg_mode)
        # With a single optimizer step per rollout the policy has not moved when the loss is computed,
        # so the old log-probs equal the current ones (detached): one forward pass saved, unless the
        # token rewards need them before the update (a KL penalty in the reward).
        self.needs_old_logprobs = args.optimizer_steps_per_rl_step > 1 or args.kl_in_reward

    # ---- set-up -------------------------------------------------------------------------------------

    def create_scheduler(self, num_training_steps):
        warmup = self.args.warmup_steps or int(self.args.warmup_ratio * num_training_steps)
        self.lr_scheduler = build_lr_scheduler(
            self.args.lr_scheduler_type, self.args.learning_rate, self.args.min_learning_rate, warmup, num_training_steps
        )
        return self.lr_scheduler

    def prompt_batches(self, start_step):
        """Endless prompt batches of this rank, resumable at any step (epochs reshuffle deterministically)."""
        sampler = DistributedBatchSampler(
            self.train_dataset, batch_size=self.args.per_device_prompt_batch_size, shuffle=True, drop_last=True
        )
        if len(sampler) == 0:
            raise ValueError(
                f"train_datasets has {len(self.train_dataset)} usable prompts, fewer than one batch of "
                f"per_device_prompt_batch_size={self.args.per_device_prompt_batch_size} per rank"
            )
        epoch, skip = divmod(start_step, len(sampler))
        while True:
            sampler.set_epoch(epoch + self.args.seed)
            for indices in sampler:
                if skip:
                    skip -= 1
                    continue
                yield [self.train_dataset[i] for i in indices]
            epoch += 1

    # ---- the loop -----------------------------------------------------------------------------------

    def train(self, resume_from_checkpoint=None):
        args = self.args
        start_step = self.prepare_training(resume_from_checkpoint)
        batches = self.prompt_batches(start_step)
        self.state.max_steps, self.state.global_step = args.max_steps, start_step
        self.control = self.callback_handler.on_train_begin(args, self.state, self.control)
        if self.eval_dataset is not None and start_step == 0:
            self.log_evaluation("initial_eval")
        for step in range(start_step + 1, args.max_steps + 1):
            exp, metrics = self.rl_step(next(batches))
            self.state.global_step = step
            self.control = self.callback_handler.on_step_end(args, self.state, self.control)
            if args.logging_steps and step % args.logging_steps == 0:
                self.log(metrics)
            if args.logging_steps and step % (args.logging_steps * args.sample_log_interval) == 0:
                self.log_samples(exp)
            if self.eval_dataset is not None and args.eval_steps and step % args.eval_steps == 0 and step < args.max_steps:
                self.log(self.evaluate())
            if args.save_steps and step % args.save_steps == 0 and step < args.max_steps:
                self.save_checkpoint()
        if self.eval_dataset is not None:
            self.log_evaluation("eval")
        self.control = self.callback_handler.on_train_end(args, self.state, self.control)
        self.save_checkpoint()
        self.save_policy(os.path.join(args.output_dir, "policy"))

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
        self.create_optimizer_and_scheduler(num_training_steps=self.args.max_steps * self.args.optimizer_steps_per_rl_step)
        self.model_wrapped = self._wrap_model(self.model)
        return self.load_checkpoint(resume_from_checkpoint) if resume_from_checkpoint else 0

    def rl_step(self, items):
        args = self.args
        started = time.time()
        with self.autocast_smart_context_manager():
            exp = generate_rollouts(self.model, self.tokenizer, items, args.rollout_n, self.sampling, args.use_fusemt)
        rollout_seconds = time.time() - started
        scores = self.reward_scorer.score(exp.prompts, exp.labels, exp.responses)
        exp.rewards = paddle.to_tensor(scores, dtype="float32").clip(-args.clip_range_score, args.clip_range_score)
        if args.overlong_reward_buffer:
            lengths = exp.response_mask.sum(axis=-1)
            exp.rewards += overlong_penalty(lengths, args.max_dec_len, args.overlong_reward_buffer, args.overlong_penalty_factor)
        if self.needs_old_logprobs:
            exp.old_logprobs = self.compute_logprobs(self.model, exp)
        if self.reference_model is not None:
            exp.ref_logprobs = self.compute_logprobs(self.reference_model, exp)
        token_kl = exp.old_logprobs - exp.ref_logprobs if args.kl_in_reward else None
        exp.advantages = call_with_options(
            self.advantage_fn, exp.rewards, exp.response_mask, group_index=exp.group_index,
            norm_adv_by_std=args.norm_adv_by_std_in_grpo, token_kl=token_kl, kl_coeff=args.kl_coeff, gamma=args.gamma,
        )
        train_stats = self.update_policy(exp)
        metrics = self.rollout_metrics(exp, scores, rollout_seconds) | train_stats
        metrics["step_time"] = time.time() - started
        return exp, metrics

    @paddle.no_grad()
    def compute_logprobs(self, model, exp):
        """Log-probs of the response tokens under `model`, in micro-batches: [B, R]."""
        size = self.args.per_device_train_batch_size
        chunks = []
        for start in range(0, len(exp), size):
            micro = exp.select(start, start + size)
            with self.autocast_smart_context_manager():
                logits = response_logits(model, micro)
            chunks.append(gather_logprobs(logits, response_labels(micro)))
        return paddle.concat(chunks, axis=0)

    def update_policy(self, exp):
        """`update_iters` passes over micro-batches, one optimizer step every `gradient_accumulation_steps`."""
        args = self.args
        size, accumulate = args.per_device_train_batch_size, args.gradient_accumulation_steps
        self.model.train()
        sums, count, grad_norms = {}, 0, []
        starts = [s for _ in range(args.update_iters) for s in range(0, len(exp), size)]
        for i, start in enumerate(starts):
            steps_now = (i + 1) % accumulate == 0
            sync = contextlib.nullcontext() if steps_now or not is_distributed() else self.model_wrapped.no_sync()
            with sync:
                loss, stats = self.policy_loss(exp.select(start, start + size))
                (loss / accumulate).backward()
            for key, value in stats.items():
                sums[key] = sums.get(key, 0.0) + float(value)
            count += 1
            if steps_now:
                grad_norms.append(self.optimizer_step())
        metrics = mean_over_ranks({k: v / count for k, v in sums.items()})
        metrics["grad_norm"] = float(np.mean(grad_norms))
        metrics["lr"] = self.lr_scheduler.get_lr()
        return metrics

    def policy_loss(self, micro):
        """Policy loss plus the KL-to-reference term minus the entropy bonus, aggregated over response tokens."""
        args = self.args
        with self.autocast_smart_context_manager():
            logits = response_logits(self.model_wrapped, micro)
        logprobs = gather_logprobs(logits, response_labels(micro))
        old_logprobs = logprobs.detach() if micro.old_logprobs is None else micro.old_logprobs
        token_loss, stats = self.policy_loss_fn(
            logprobs, old_logprobs, micro.advantages, micro.response_mask, args.clip_range_ratio_low, args.clip_range_ratio_high
        )
        policy_loss = self.aggregate(token_loss, micro.response_mask)
        loss = policy_loss
        if micro.ref_logprobs is not None:
            kl = self.aggregate(self.kl_fn(logprobs, micro.ref_logprobs), micro.response_mask)
            if args.kl_loss_coeff > 0:
                loss = loss + args.kl_loss_coeff * kl
            stats["kl"] = kl.detach()
        # The entropy is differentiated only when it is part of the loss.
        token_entropy = entropy_from_logits(logits if args.entropy_coeff > 0 else logits.detach())
        if args.entropy_coeff > 0:
            loss = loss - args.entropy_coeff * self.aggregate(token_entropy, micro.response_mask)
        stats["entropy"] = masked_mean(token_entropy.detach(), micro.response_mask)
        stats["policy_loss"] = policy_loss
        return loss, stats

    def optimizer_step(self):
        """Clip (by the optimizer's global-norm clip), step, schedule; returns the pre-clip gradient norm."""
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        grad_norm = float(paddle.sqrt(sum((g.astype("float32") ** 2).sum() for g in grads)))
        self.optimizer.step()
        self.lr_scheduler.step()
        self.optimizer.clear_grad()
        return grad_norm

    # ---- metrics, samples, evaluation ---------------------------------------------------------------

    def rollout_metrics(self, exp, scores, rollout_seconds):
        lengths = exp.response_mask.sum(axis=1)
        rewards = exp.rewards.numpy()
        groups = rewards.reshape(-1, self.args.rollout_n)
        local = {
            "reward_mean": float(rewards.mean()),
            "reward_std": float(rewards.std()),
            "accuracy": float(np.mean([s >= self.reward_scorer.max_score for s in scores])),
            "zero_std_group_frac": float(np.mean(groups.std(axis=1) == 0)),
            "response_length_mean": float(lengths.mean()),
            "response_clipped_ratio": float(1.0 - exp.finished.astype("float32").mean()),
        }
        metrics = mean_over_ranks(local)
        # Ranks decode at the same time, so their rates add up.
        metrics["rollout_tokens_per_s"] = all_reduce_scalars({"rate": float(lengths.sum()) / max(rollout_seconds, 1e-9)})["rate"]
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
        """Greedy accuracy and mean reward on this rank's share of the eval prompts, summed over ranks."""
        dataset = eval_dataset or self.eval_dataset
        # Every prompt exactly once over all ranks (no padding repeats), so the counts are exact.
        shard = list(range(dist.get_rank() if is_distributed() else 0, len(dataset), self.args.world_size))
        size = self.args.per_device_eval_batch_size
        greedy = SamplingConfig.from_args(self.args, greedy=True)
        totals = {"correct": 0.0, "reward": 0.0, "count": 0.0}
        for start in range(0, len(shard), size):
            with self.autocast_smart_context_manager():
                items = [dataset[i] for i in shard[start : start + size]]
                exp = generate_rollouts(self.model, self.tokenizer, items, 1, greedy, self.args.use_fusemt)
            scores = self.reward_scorer.score(exp.prompts, exp.labels, exp.responses)
            totals["correct"] += sum(s >= self.reward_scorer.max_score for s in scores)
            totals["reward"] += sum(scores)
            totals["count"] += len(scores)
        totals = all_reduce_scalars(totals)
        return {
            f"{metric_key_prefix}_accuracy": totals["correct"] / totals["count"],
            f"{metric_key_prefix}_reward_mean": totals["reward"] / totals["count"],
        }

    # ---- checkpoints --------------------------------------------------------------------------------

    def save_policy(self, path):
        """Write a `from_pretrained`-loadable policy to `path` atomically: a temp folder, then a rename."""
        if self.is_world_process_zero():
            with atomic_directory(path) as tmp:
                self.model.save_pretrained(tmp)
                self.tokenizer.save_pretrained(tmp)
        barrier()

    def save_checkpoint(self):
        """output_dir/checkpoint-N: policy, optimizer, scheduler, trainer state and every rank's RNG state."""
        path = os.path.join(self.args.output_dir, f"checkpoint-{self.state.global_step}")
        rng_states = collect_rng_states()
        if self.is_world_process_zero():
            with atomic_directory(path) as tmp:
                self.model.save_pretrained(os.path.join(tmp, "policy"))
                self.tokenizer.save_pretrained(os.path.join(tmp, "policy"))
                paddle.save(optimizer_state_by_structured_name(self.optimizer, self.model), os.path.join(tmp, OPTIMIZER_FILE))
                paddle.save(self.lr_scheduler.state_dict(), os.path.join(tmp, SCHEDULER_FILE))
                self.state.save_to_json(os.path.join(tmp, STATE_FILE))
                world = len(rng_states)
                rng_file = "rng_state.pth" if world == 1 else f"rng_state_{world}.pth"
                paddle.save(rng_states[0] if world == 1 else rng_states, os.path.join(tmp, rng_file))
            self.rotate_checkpoints()
        barrier()
        logger.info(f"checkpoint written to {path}")

    def rotate_checkpoints(self):
        limit = self.args.save_total_limit
        if not limit:
            return
        steps = sorted(
            int(name.split("-")[1]) for name in os.listdir(self.args.output_dir) if name.startswith("checkpoint-")
        )
        for step in steps[:-limit]:
            shutil.rmtree(os.path.join(self.args.output_dir, f"checkpoint-{step}"))

    def load_checkpoint(self, path):
        """Restore optimizer, scheduler, RNG and step from a checkpoint folder; the policy weights were
        loaded from `path/policy` by run_ppo. Returns the step to continue from."""
        for name in [OPTIMIZER_FILE, SCHEDULER_FILE, STATE_FILE]:
            if not os.path.isfile(os.path.join(path, name)):
                raise FileNotFoundError(f"resume_from_checkpoint={path} is not a complete checkpoint: {name} is missing")
        load_optimizer_state(self.optimizer, self.model, paddle.load(os.path.join(path, OPTIMIZER_FILE)))
        self.lr_scheduler.set_state_dict(paddle.load(os.path.join(path, SCHEDULER_FILE)))
        self._load_rng_state(path)
        step = TrainerState.load_from_json(os.path.join(path, STATE_FILE)).global_step
        logger.info(f"resumed from {path} at step {step}")
        return step
