"""The models of an RL run, as its config names them: the actor (optionally with LoRA adapters), the frozen
reference and reward models, and the critic; from the checkpoint being resumed where it has them. Used by
run_ppo.py for the trainer and by a decoupled sampler for its rollout worker."""

import os

from paddlenlp.peft import LoRAConfig, LoRAModel
from paddlenlp.trl.llm_utils import get_lora_target_modules

from paddle_alignment.models.loading import frozen, load_causal_lm, load_score_model


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
