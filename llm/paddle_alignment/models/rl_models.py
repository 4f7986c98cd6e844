"""The models of an RL run, as its config names them: the actor (optionally with LoRA adapters), the frozen
reference, reward and distillation-teacher models, and the critic; from the checkpoint being resumed where it has them. Used by
run_ppo.py for the trainer and by a decoupled sampler for its rollout worker."""

import os

from paddlenlp.peft import LoRAConfig, LoRAModel
from paddlenlp.trl.llm_utils import get_lora_target_modules

from paddle_alignment.models.loading import frozen, load_causal_lm, load_score_model, load_tokenizer


def checkpoint_or(path, training_args, name):
    """`path`, or the `name` folder of the checkpoint being resumed."""
    if not training_args.resume_from_checkpoint:
        return path
    folder = os.path.join(training_args.resume_from_checkpoint, name)
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"resume_from_checkpoint={training_args.resume_from_checkpoint} has no {name}/ folder")
    return folder


def with_lora(actor, model_args, training_args):
    """The actor wrapped with LoRA adapters (only they train): the resumed checkpoint's, else `lora_path`'s,
    else fresh ones on `lora_target_modules` (default: the attention and MLP projections)."""
    adapters = checkpoint_or(model_args.lora_path, training_args, "policy")
    if adapters:
        actor = LoRAModel.from_pretrained(actor, adapters)
    else:
        targets = model_args.lora_target_modules
        config = LoRAConfig(
            target_modules=targets.split(",") if targets else get_lora_target_modules(actor),
            r=model_args.lora_rank,
            lora_alpha=model_args.lora_alpha or 2 * model_args.lora_rank,
            dtype=actor.config.dtype,
            base_model_name_or_path=model_args.actor_model_name_or_path,
        )
        actor = LoRAModel(actor, config)
    actor.mark_only_lora_as_trainable()
    actor.print_trainable_parameters()
    return actor


def load_rl_models(model_args, training_args, with_critic=True):
    """The actor and critic (from the checkpoint when resuming), and the frozen reference and reward models
    the config calls for. With LoRA the reference is the actor with its adapters disabled, unless
    `reference_model_name_or_path` names another model. The critic starts from
    `reward_critic_model_name_or_path`, else the reward model, else the actor's backbone (with a fresh score head)."""
    actor_path = model_args.actor_model_name_or_path
    actor = load_causal_lm(
        actor_path if model_args.lora else checkpoint_or(actor_path, training_args, "policy"),
        training_args, training_args.recompute_granularity,
    )
    if model_args.lora:
        actor = with_lora(actor, model_args, training_args)
    reference = None
    if training_args.uses_reference_model and not (model_args.lora and model_args.reference_model_name_or_path is None):
        reference = frozen(load_causal_lm(model_args.reference_model_name_or_path or actor_path, training_args))
    reward_model = None
    if model_args.reward_model_name_or_path:
        reward_model = frozen(load_score_model(model_args.reward_model_name_or_path, training_args))
    critic = None
    if training_args.uses_critic and with_critic:
        initial = model_args.reward_critic_model_name_or_path or model_args.reward_model_name_or_path or actor_path
        # Raw values, and no score statistics to track (a collective in every training forward).
        critic = load_score_model(
            checkpoint_or(initial, training_args, "value"), training_args, training_args.critic_recompute_granularity,
            score_type="critic", do_normalize=False, normalizer_type=None,
        )
        if training_args.critic_recompute:
            critic.recompute_enable()
    return actor, reference, reward_model, critic


def load_teacher(training_args, tokenizer):
    """The frozen distillation teacher of `teacher_model_name_or_path` (None without one), loaded like the
    reference (tensor parallel, precision). Its log-probs are read at the student's token ids, so a teacher whose
    tokenizer maps tokens to other ids, or whose vocabulary is smaller, is refused naming both folders."""
    path = training_args.teacher_model_name_or_path
    if not path:
        return None
    if not os.path.isdir(path):
        raise FileNotFoundError(f"teacher_model_name_or_path={path!r} is not a folder")
    student = tokenizer.name_or_path
    try:
        teacher_tokenizer = load_tokenizer(path)
    except Exception as error:
        raise ValueError(
            f"teacher_model_name_or_path={path!r}: its tokenizer does not load ({error}); the teacher scores the "
            f"student's token ids, so its folder must hold the tokenizer it shares with the student ({student})"
        ) from None
    student_vocab, teacher_vocab = tokenizer.get_vocab(), teacher_tokenizer.get_vocab()
    if student_vocab != teacher_vocab:
        differ = sorted(t for t in student_vocab.keys() | teacher_vocab.keys() if student_vocab.get(t) != teacher_vocab.get(t))
        raise ValueError(
            f"the teacher's tokenizer ({path}, {len(teacher_vocab)} tokens) is not the student's ({student}, "
            f"{len(student_vocab)} tokens): {len(differ)} tokens have other ids, e.g. {differ[:5]}; on-policy "
            "distillation compares their log-probs of the same token ids"
        )
    teacher = frozen(load_causal_lm(path, training_args))
    if teacher.config.vocab_size < len(tokenizer):
        raise ValueError(
            f"the teacher ({path}) predicts {teacher.config.vocab_size} token ids, fewer than the student's tokenizer's "
            f"{len(tokenizer)} ({student})"
        )
    return teacher
