"""The rollout worker: everything that turns prompts into experience, owned in one place.

It holds the sampling policy, the frozen reference model (and a distillation teacher), the critic, the reward
scorer and the tokenizer; it generates and scores (`generate_sequences`), and completes the experience with what
the run needs (`complete`: behaviour, reference and teacher log-probs, values), told at construction (`ExperienceNeeds`). The
trainer's rollout engine owns one over the trainer's models (rollout/engines.py); a decoupled sampler
process builds one from the config (rollout/sampler.py `build_worker`) and loads each policy version the
trainer publishes (`update_weights`). No trainer is involved in either: the trainer asks its engine for
experience, the worker never reaches back.
"""

import contextlib
import time
from dataclasses import dataclass

import paddle
import paddle.distributed as dist
from paddlenlp.utils.log import logger

from paddle_alignment import watchdog
from paddle_alignment.agents.chat_turns import observation_ids
from paddle_alignment.agents.environments import Environments
from paddle_alignment.agents.trajectories import EnvironmentReplies, ToolReplies, TurnSettings, multi_turn_rollouts
from paddle_alignment.agents.tools import ToolBox, load_tools
from paddle_alignment.deadline_workers import WorkerPool
from paddle_alignment.distributed import collective, is_distributed
from paddle_alignment.experience import Experience
from paddle_alignment.group_sharded import forwards_in_lockstep
from paddle_alignment.micro_batches import MicroBatching
from paddle_alignment.models.head_logprobs import head_token_stats, head_topk_logprobs
from paddle_alignment.models.lora_utils import adapters_disabled
from paddle_alignment.models.native_forward import NativeDecoder
from paddle_alignment.models.ppo_model_utils import response_labels, response_token_stats, response_topk_logprobs, response_values
from paddle_alignment.models.shared_prompts import shared_prompt_groups
from paddle_alignment.models.tensor_parallel import is_tensor_parallel, whole
from paddle_alignment.offload import OffloadPlan
from paddle_alignment.rollout import sync_check, weights
from paddle_alignment.rollout.decode import SamplingConfig, draw_seed, generate_rollouts, sample_turn

MAX_LOGGED_ROW_ERRORS = 8  # of one batch: the count is logged too


def tensor_parallel_waits(model, what):
    """`what`, guarded as a collective when `model` is split over ranks (its layers wait on each other)."""
    split = is_distributed() and is_tensor_parallel(model)  # scanning the parameters only when it can be
    return collective(f"tensor-parallel {what}") if split else contextlib.nullcontext()


def turn_replies(args, tokenizer):
    """What answers the turns of multi-turn rollouts: the config's environments (EnvironmentReplies) or tools
    (ToolReplies), each with its worker pool; None for single-turn rollouts."""
    kind = EnvironmentReplies if args.environment_paths else ToolReplies if args.tool_paths else None
    if kind is None:
        return None
    observation_ids(tokenizer, [], kind.role)  # a template the answers cannot follow stops the run here, not mid-run
    if kind is ToolReplies:
        return ToolReplies(ToolBox(load_tools(args.tool_paths), args.tool_timeout, args.tool_workers), args.tool_call_style)
    pool = WorkerPool("paddle_alignment.agents.tool_worker", "environment", args.tool_workers, args.tool_timeout)
    return EnvironmentReplies(Environments(args.environment_paths, pool))


@dataclass(frozen=True)
class ExperienceNeeds:
    """What a run's experience holds beyond its scored rollouts: the behaviour policy's log-probs by the
    trainer's forward (old_logprobs), the reference's, a distillation teacher's, the critic's values, and whether
    the sampler's own log-probs (rollout_logprobs) must be there (a rollout correction weights the loss by them)."""

    behaviour: bool = False
    reference: bool = False
    values: bool = False
    sampler_logprobs: bool = False
    teacher: bool = False
    teacher_topk: int = 0  # with the teacher: its this many most likely tokens at each position, and their log-probs

    @classmethod
    def for_trainer(cls, args, critic=None):
        """The trainer's: with one optimizer step per rollout the policy has not moved when the loss is computed,
        so the old log-probs equal the current ones (detached) and their forward is saved, unless the token
        rewards need them before the update (a KL penalty in the reward)."""
        behaviour = args.optimizer_steps_per_rl_step > 1 or args.kl_in_reward
        return cls(behaviour, args.uses_reference_model, critic is not None, bool(args.rollout_correction), args.uses_teacher,
                   args.teacher_topk)

    @classmethod
    def for_sampler(cls, args):
        """A decoupled sampler's: its batches train a policy that has moved since they were sampled, so they
        bring the log-probs of the policy that sampled them (the trainer's engine checks the rest)."""
        return cls(behaviour=True, reference=args.uses_reference_model, teacher=args.uses_teacher, teacher_topk=args.teacher_topk)


class RolloutWorker:
    """Generation, scoring and the completion of experience by one policy, with the reference model, critic,
    distillation teacher and reward of its config.

    `needs`: what `complete` adds to the scored rollouts (ExperienceNeeds). `autocast`: a factory of the
    mixed-precision context the passes run in (the trainer's own, so that rollout and training run the same
    kernels). The trainer's OffloadPlan (`offload`), handed in when training starts, brings its groups onto the
    device around each pass (until then nothing is offloaded).
    """

    def __init__(self, args, policy, tokenizer, reward_scorer, reference_model=None, critic=None, needs=None,
                 autocast=contextlib.nullcontext, teacher=None):
        self.args = args
        self.policy = policy
        self.tokenizer = tokenizer
        self.reward_scorer = reward_scorer
        self.reference_model = reference_model
        self.critic = critic
        self.teacher = teacher
        self.needs = needs or ExperienceNeeds()
        if self.needs.teacher and teacher is None:
            raise ValueError("the run distils from a teacher (teacher_model_name_or_path), but no teacher model was handed to the rollout worker")
        self.autocast = autocast
        self.offload = OffloadPlan({}, None, None)
        self.sampling = SamplingConfig.from_args(args)
        self.replies = turn_replies(args, tokenizer)  # None: single-turn rollouts
        self.turns = TurnSettings.from_args(args) if self.replies else None

    def generate_sequences(self, items, seed):
        """Rollouts of the prompt `items` sampled from `seed`, with their scores, and the seconds the
        generation took."""
        started = time.time()
        exp = self.generate(items, seed)
        seconds = time.time() - started
        self.score(exp)
        return exp, seconds

    def complete(self, exp):
        """`exp` (scored rollouts) with what the run needs and it lacks (`self.needs`): the behaviour policy's
        log-probs, the reference's, the teacher's, the critic's values. What a decoupled sampler brought is not computed again."""
        if self.needs.sampler_logprobs and exp.rollout_logprobs is None:
            raise ValueError(
                f"rollout_correction={self.args.rollout_correction} weights the loss by the sampler's log-probs, which only "
                "the fast decode loop records; this batch was decoded by paddlenlp's generate() (use_fusemt false, "
                "paddlenlp_ops not built, or a model the fast loop does not run: the log says which)"
            )
        with self.offload.on_device("train_model"):
            if self.needs.behaviour and exp.old_logprobs is None:
                exp.old_logprobs = self.compute_logprobs(self.policy, exp)
            if self.needs.values and exp.values is None:
                exp.values = self.compute_values(exp)
        if self.needs.reference and exp.ref_logprobs is None:
            exp.ref_logprobs = self.compute_reference_logprobs(exp)
        if self.needs.teacher and exp.teacher_logprobs is None:
            taken = self.compute_teacher_logprobs(exp)
            if self.needs.teacher_topk:
                exp.teacher_logprobs, exp.teacher_topk_logprobs, exp.teacher_topk_ids = taken
            else:
                exp.teacher_logprobs = taken
        return exp

    def generate(self, prompts, seed):
        """`rollout_n` rollouts of each prompt, decoded per_device_rollout_batch_size prompts at a time (the
        i-th from seed + i); see generate_rollouts."""
        size = self.args.per_device_rollout_batch_size
        with self.offload.on_device("train_model"), self.autocast(), tensor_parallel_waits(self.policy, "decoding"):
            parts = [
                self.rollouts(prompts[start : start + size], self.args.rollout_n, self.sampling, seed + i)
                for i, start in enumerate(range(0, len(prompts), size))
            ]
        return parts[0] if len(parts) == 1 else Experience.concat(parts, self.tokenizer.pad_token_id)

    def score(self, exp):
        """exp.scores (and score_parts, unscored): the reward source's scores of the responses, plus the
        environment returns of multi-turn trajectories."""
        scored = self.reward_scores(exp)
        exp.scores = paddle.to_tensor(scored.scores, dtype="float32")
        if exp.env_returns is not None:
            exp.scores = exp.scores + exp.env_returns
        unscored = {index for index, _ in scored.errors}
        exp.unscored = paddle.to_tensor([row in unscored for row in range(len(exp))], dtype="bool")
        names = list(self.reward_scorer.parts)
        if names and all(name in scored.parts for name in names):
            columns = [scored.parts[name] for name in names]
            exp.score_parts = paddle.to_tensor(columns, dtype="float32").T

    def reward_scores(self, exp):
        """The reward source's ScoredBatch of `exp`'s responses; rows it could not score are logged."""
        with self.offload.on_device("freeze_model"), self.autocast():
            scored = self.reward_scorer.score(exp)
        if scored.errors:
            shown = "\n".join(f"  row {index}: {message}" for index, message in scored.errors[:MAX_LOGGED_ROW_ERRORS])
            fate = (
                "leave the batch (counted in judge/excluded_frac)" if getattr(self.reward_scorer, "excludes_unscored", False)
                else "leave the loss and their groups' statistics (counted in reward_error_rows)"
            )
            logger.warning(f"{len(scored.errors)} of {len(exp)} responses could not be scored and {fate}:\n{shown}")
        return scored

    def greedy_rollouts(self, items):
        """One greedy rollout of each prompt of `items`, with its reward scores in exp.scores (evaluation)."""
        greedy = SamplingConfig.from_args(self.args, greedy=True)
        with self.offload.on_device("train_model"), self.autocast():
            exp = self.rollouts(items, 1, greedy, seed=None)
        self.score(exp)
        return exp

    def rollouts(self, items, n, sampling, seed):
        """`n` rollouts of each prompt item: single responses (decode.py), or with `tools` multi-turn trajectories
        (agents/trajectories.py)."""
        if self.replies is None:
            return generate_rollouts(self.policy, self.tokenizer, items, n, sampling, self.args.use_fusemt, seed)

        def sample(histories, caches, turn_sampling, turn_seed):
            return sample_turn(self.policy, self.tokenizer, histories, caches, turn_sampling, self.args.use_fusemt, turn_seed)

        seed = draw_seed() if seed is None else seed
        return multi_turn_rollouts(sample, self.tokenizer, items, n, sampling, self.replies, self.turns, seed)

    @paddle.no_grad()
    def compute_logprobs(self, model, exp, topk=0):
        """Log-probs of the response tokens under `model` at the sampling temperature: [B, R], in micro-batches
        of per_device_logprob_batch_size rows' tokens (micro_batches.py), the LM head applied logprob_chunk_tokens
        positions at a time. A float32 CPU Qwen2/Llama runs the native no-gradient forward (on the model's own
        weight tensors). With `topk`, also the log-probs and ids of the `topk` most likely tokens at each
        position ([B, R, topk] each): (log-probs, top log-probs, top ids)."""
        native = NativeDecoder.for_model(model)  # None: the model's own forward (said once why)
        micro_batching = MicroBatching.from_args(self.args, self.args.per_device_logprob_batch_size)
        with tensor_parallel_waits(model, "the log-prob forward"):
            return micro_batching.run(exp, lambda micro: self.batch_logprobs(model, native, micro, topk), forwards_in_lockstep(model))

    @paddle.no_grad()
    def batch_logprobs(self, model, native, exp, topk=0):
        """compute_logprobs of `exp` in one forward (`native`: `model`'s NativeDecoder, or None): a micro-batch,
        or the weight-sync probe (sync_check.py), which is too small to split."""
        chunk_tokens, temperature, share = self.args.logprob_chunk_tokens, self.sampling.temperature, self.args.share_prompt_forward
        with self.autocast():
            if native is None:
                if topk:
                    return response_topk_logprobs(model, exp, topk, temperature, chunk_tokens, share)
                return whole(response_token_stats(model, exp, temperature, chunk_tokens, share)[0])
            groups = shared_prompt_groups(exp) if share else None
            hidden = native.response_hidden(exp.input_ids, exp.attention_mask, exp.prompt_len, groups)
            head, labels = native.lm_head, response_labels(exp)
            if topk:
                return head_topk_logprobs(hidden, head.weight, head.transpose, labels, topk, temperature, chunk_tokens)
            return head_token_stats(hidden, head.weight, head.transpose, labels, temperature, chunk_tokens)[0]

    @paddle.no_grad()
    def compute_values(self, exp):
        """The critic's values at rollout time, in micro-batches of per_device_value_batch_size rows' tokens: [B, R]."""
        self.critic.eval()

        def values_of(micro):
            with self.autocast():
                return whole(response_values(self.critic, micro))

        batching = MicroBatching.from_args(self.args, self.args.per_device_value_batch_size)
        values = batching.run(exp, values_of, forwards_in_lockstep(self.critic))
        self.critic.train()
        return values * exp.response_mask

    def compute_reference_logprobs(self, exp):
        """The reference model's log-probs; for a LoRA policy without a separate reference, the policy's own
        with its adapters switched off (the base weights)."""
        if self.reference_model is not None:
            with self.offload.on_device("freeze_model"):
                return self.compute_logprobs(self.reference_model, exp)
        with self.offload.on_device("train_model"), adapters_disabled(self.policy):
            return self.compute_logprobs(self.policy, exp)

    def compute_teacher_logprobs(self, exp):
        """The distillation teacher's log-probs of the sampled tokens, as compute_logprobs takes them; with
        `needs.teacher_topk`, also its top tokens' log-probs and ids at each position."""
        with self.offload.on_device("freeze_model"):
            return self.compute_logprobs(self.teacher, exp, self.needs.teacher_topk)

    def update_weights(self, folder, version, timeout, trainer_alive, engine):
        """Load the policy version the trainer published in `folder` (decoupled rollout), waiting for it at most
        `timeout` seconds while `trainer_alive()`, and check that it computes what the trainer's does
        (sync_check.py; `engine` names this sampler in the error)."""
        published, check = weights.wait_and_load(self.policy, folder, version, timeout, trainer_alive)
        if self.args.rollout_sync_check:
            if not check:
                raise RuntimeError(f"policy version {version} in {folder} was published without the weight-sync check's arrays")
            sync_check.verify(self, check, published, version, engine, self.args.rollout_sync_tolerance)

    def publish_weights(self, folder, version, keep):
        """Publish the policy as `version` into `folder` (decoupled rollout), with the weight-sync check's arrays.
        Every rank calls it; rank 0 writes. A tensor-parallel policy's ranks run the probe and gather the
        whole weights together (collectives); other ranks have nothing to do."""
        split = is_distributed() and is_tensor_parallel(self.policy)  # scanning the parameters only when it can be
        if dist.get_rank() != 0 and not split:
            return
        with watchdog.guarded("weight publication", f"policy version {version} into {folder}"):
            check = sync_check.record(self) if self.args.rollout_sync_check else None
            state = {name: whole(value) for name, value in weights.trained_state(self.policy).items()}
            if dist.get_rank() == 0:
                weights.publish(state, folder, version, keep, check)
