"""Entry point of RL alignment: JSON config -> arguments -> models -> PPOTrainer -> train -> policy.

    python -m paddle.distributed.launch --devices 0,1,2,3,4,5,6,7 \\
        llm/alignment/ppo/run_ppo.py config/qwen/grpo_argument.json [--key value ...]
"""

import os
import sys

if not __package__:  # run as a script path: make the repository root importable
    sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..")))

from llm.cpu_runtime import configure_cpu_runtime

configure_cpu_runtime()  # MKL's code path and threads for this CPU, before paddle loads

import paddle
from paddlenlp.peft import LoRAConfig, LoRAModel
from paddlenlp.trainer import set_seed
from paddlenlp.trl.llm_utils import get_lora_target_modules

from llm.alignment.ppo.arguments import parse_arguments
from llm.alignment.ppo.checkpoint_utils import claim_output_dir, resolve_resume_checkpoint
from llm.alignment.ppo.comm_utils import finish_distributed_run
from llm.alignment.ppo.data import PromptOnlyDataset, SupervisedDataset
from llm.alignment.ppo.models.loading import frozen, load_causal_lm, load_score_model, load_tokenizer
from llm.alignment.ppo.ppo_trainer import PPOTrainer
from llm.alignment.ppo.rollout.decoupled import DecoupledRollout
from llm.alignment.ppo.rewards.scoring import build_reward_scorer


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


def load_models(model_args, training_args, with_critic=True):
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


def evaluation_only(training_args):
    """PaddleNLP's evaluation-only run: do_eval without do_train as the config wrote them (any other run
    trains; evaluation_strategy alone sets paddlenlp's do_eval too, and trains with evaluations)."""
    return training_args.evaluation_only


def build_trainer(argv, role="trainer"):
    """Parse the config and build the tokenizer, models, datasets, reward and trainer it describes. The
    "sampler" role (a decoupled rollout's sampler process, rollout/sampler.py) builds only what samples and
    scores: no critic, no datasets; its policy weights come from the trainer."""
    model_args, data_args, training_args = parse_arguments(argv)
    sampler = role == "sampler"
    if sampler:
        training_args.resume_from_checkpoint = None
    training = not evaluation_only(training_args)
    if training and not sampler:
        claim_output_dir(training_args.output_dir)  # before a checkpoint is picked, or removed
    # Before the models load: they come from the resumed checkpoint (checkpoint_or).
    resolve_resume_checkpoint(training_args, training=training)
    paddle.set_device(training_args.device)
    set_seed(training_args.seed)
    tokenizer = load_tokenizer(model_args.tokenizer_name_or_path or model_args.actor_model_name_or_path, training_args.eos_token)
    actor, reference, reward_model, critic = load_models(model_args, training_args, with_critic=not sampler)
    columns = {"seed": training_args.seed, "prompt_key": data_args.prompt_key, "label_key": data_args.label_key}

    def prompts(datasets, max_samples=0):
        # Rule rewards and the reward server compare responses with the reference answer.
        return PromptOnlyDataset(
            datasets, tokenizer, data_args.max_prompt_len, max_samples, require_label=reward_model is None,
            filter_overlong_prompts=data_args.filter_overlong_prompts, **columns,
        )

    reward_tokenizer = load_tokenizer(model_args.reward_model_name_or_path) if reward_model is not None else None
    decoupled = training_args.rollout_mode == "decoupled" and not sampler
    return PPOTrainer(
        model=actor,
        reference_model=reference,
        tokenizer=tokenizer,
        args=training_args,
        train_dataset=None if sampler else prompts(data_args.train_datasets),
        eval_dataset=prompts(data_args.eval_datasets, data_args.max_eval_samples) if data_args.eval_datasets and not sampler else None,
        reward_scorer=build_reward_scorer(training_args, reward_model, reward_tokenizer),
        critic_model=critic,
        ptx_dataset=SupervisedDataset(data_args.ptx_datasets, tokenizer, data_args.max_length, **columns) if data_args.ptx_datasets and not sampler else None,
        lora_save_merged=model_args.lora_save_merged,
        rollout=DecoupledRollout(training_args, argv) if decoupled else None,
    )


def main(argv):
    trainer = build_trainer(argv)
    if evaluation_only(trainer.args):
        # Greedy eval of the actor, written to output_dir/eval_results.json.
        if trainer.eval_dataset is None:
            raise ValueError("do_eval without do_train evaluates the actor: set eval_datasets")
        os.makedirs(trainer.args.logging_dir, exist_ok=True)
        trainer.log_evaluation("eval")
    else:
        trainer.train(resume_from_checkpoint=trainer.args.resume_from_checkpoint)
    finish_distributed_run()


if __name__ == "__main__":
    main(sys.argv[1:])
