"""Entry point of RL alignment: JSON config -> arguments -> models -> PPOTrainer -> train -> policy.

    python -m paddle.distributed.launch --devices 0,1,2,3,4,5,6,7 \\
        llm/alignment/ppo/run_ppo.py config/qwen/grpo_argument.json [--key value ...]
"""

import functools
import os
import sys

if not __package__:  # run as a script path: make the repository root importable
    sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..")))

from paddle_alignment.cpu_runtime import configure_cpu_runtime

configure_cpu_runtime()  # MKL's code path and threads for this CPU, before paddle loads

import paddle
from paddlenlp.trainer import set_seed

from llm.alignment.ppo.models.model_pp import pipeline_stages
from llm.alignment.ppo.ppo_trainer import PPOTrainer
from paddle_alignment.agents.environments import environment_path
from paddle_alignment.agents.tools import load_tools
from paddle_alignment.checkpoints.folders import claim_output_dir, resolve_resume_checkpoint
from paddle_alignment.config.arguments import parse_arguments
from paddle_alignment.config.layout import rollout_split_degree
from paddle_alignment.data import PromptOnlyDataset, SupervisedDataset
from paddle_alignment.distributed import finish_distributed_run
from paddle_alignment.models.loading import load_tokenizer
from paddle_alignment.models.rl_models import load_rl_models, load_teacher
from paddle_alignment.pipeline_parallel import seed_stages_alike, split_for_rollout
from paddle_alignment.rewards.scoring import build_reward_scorer, reference_checker
from paddle_alignment.rollout import ColocatedRollout
from paddle_alignment.rollout.decode import greedy_responses
from paddle_alignment.rollout.decoupled import DecoupledRollout


def evaluation_only(training_args):
    """PaddleNLP's evaluation-only run: do_eval without do_train as the config wrote them (any other run
    trains; evaluation_strategy alone sets paddlenlp's do_eval too, and trains with evaluations)."""
    return training_args.evaluation_only


def build_trainer(argv):
    """Parse the config and build the tokenizer, models, datasets, reward and trainer it describes."""
    model_args, data_args, training_args = parse_arguments(argv)
    training = not evaluation_only(training_args)
    if training:
        claim_output_dir(training_args.output_dir)  # before a checkpoint is picked, or removed
    # Before the models load: they come from the resumed checkpoint (checkpoint_or).
    resolve_resume_checkpoint(training_args, training=training)
    paddle.set_device(training_args.device)
    set_seed(training_args.seed)
    seed_stages_alike(training_args.seed)
    tokenizer = load_tokenizer(model_args.tokenizer_name_or_path or model_args.actor_model_name_or_path, training_args.eos_token)
    actor, reference, reward_model, critic = load_rl_models(model_args, training_args)
    # Under pipeline parallel the actor and critic train as this rank's pipeline stages; the rollout, the
    # behaviour log-probs and the values run on the non-pipeline models, which take the stages' weights after
    # each update: whole on each rank, or split over the data replica's ranks (eval_mode tensor_parallel).
    whole_models = None
    if training_args.pipeline_parallel_degree > 1:
        stages = pipeline_stages(actor, critic, training_args)
        degree = rollout_split_degree(training_args)
        actor, reference, reward_model, critic = (split_for_rollout(model, degree) for model in (actor, reference, reward_model, critic))
        whole_models = (actor, critic)
        actor, critic = stages
    columns = {"seed": training_args.seed, "prompt_key": data_args.prompt_key, "label_key": data_args.label_key}
    reward_tokenizer = load_tokenizer(model_args.reward_model_name_or_path) if reward_model is not None else None
    reward_scorer = build_reward_scorer(training_args, reward_model, reward_tokenizer, judge_decode=greedy_responses)

    # The model sees the tools' schemas in its prompts as its chat template shows them (Qwen2.5's "# Tools" block).
    tool_schemas = [tool.schema() for tool in load_tools(training_args.tool_paths)]
    environments = training_args.environment_paths
    environment_of = functools.partial(environment_path, environments) if environments else None

    def prompts(datasets, max_samples=0):
        # Rule rewards and the reward server compare responses with the reference answer.
        return PromptOnlyDataset(
            datasets, tokenizer, data_args.max_prompt_len, max_samples,
            require_label=training_args.use_rule_reward or training_args.use_rm_server,
            filter_overlong_prompts=data_args.filter_overlong_prompts, check_label=reference_checker(reward_scorer),
            environment_of=environment_of, tools=tool_schemas, **columns,
        )

    return PPOTrainer(
        model=actor,
        reference_model=reference,
        tokenizer=tokenizer,
        args=training_args,
        train_dataset=prompts(data_args.train_datasets),
        eval_dataset=prompts(data_args.eval_datasets, data_args.max_eval_samples) if data_args.eval_datasets else None,
        reward_scorer=reward_scorer,
        critic_model=critic,
        ptx_dataset=SupervisedDataset(data_args.ptx_datasets, tokenizer, data_args.max_length, **columns) if data_args.ptx_datasets else None,
        lora_save_merged=model_args.lora_save_merged,
        export_hf=model_args.export_hf,
        rollout=functools.partial(DecoupledRollout, training_args, argv) if training_args.rollout_mode == "decoupled" else ColocatedRollout,
        whole_models=whole_models,
        teacher_model=load_teacher(training_args, tokenizer),
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
