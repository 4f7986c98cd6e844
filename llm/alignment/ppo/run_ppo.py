"""Entry point of RL alignment: JSON config -> arguments -> models -> PPOTrainer -> train -> policy.

    python -m paddle.distributed.launch --devices 0,1,2,3,4,5,6,7 \\
        llm/alignment/ppo/run_ppo.py config/qwen/grpo_argument.json [--key value ...]
"""

import os
import sys

if not __package__:  # run as a script path: make the repository root importable
    sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..")))

import paddle
from paddlenlp.trainer import set_seed
from paddlenlp.transformers import AutoModelForCausalLM, AutoTokenizer

from llm.alignment.ppo.arguments import parse_arguments
from llm.alignment.ppo.data import PromptDataset
from llm.alignment.ppo.ppo_trainer import PPOTrainer
from llm.alignment.ppo.rewards.scoring import build_reward_scorer


def load_models(model_args, training_args):
    """The actor (from the checkpoint when resuming) and, when the KL term is on, a frozen reference."""
    actor_path = model_args.actor_model_name_or_path
    if training_args.resume_from_checkpoint:
        actor_path = os.path.join(training_args.resume_from_checkpoint, "policy")
        if not os.path.isdir(actor_path):
            raise FileNotFoundError(f"resume_from_checkpoint={training_args.resume_from_checkpoint} has no policy/ folder")
    actor = AutoModelForCausalLM.from_pretrained(actor_path)
    reference = None
    if training_args.kl_loss_coeff > 0:
        reference = AutoModelForCausalLM.from_pretrained(
            model_args.reference_model_name_or_path or model_args.actor_model_name_or_path
        )
        reference.eval()
        for parameter in reference.parameters():
            parameter.stop_gradient = True
    return actor, reference


def main(argv):
    model_args, data_args, training_args = parse_arguments(argv)
    paddle.set_device(training_args.device)
    set_seed(training_args.seed)
    tokenizer = AutoTokenizer.from_pretrained(model_args.tokenizer_name_or_path or model_args.actor_model_name_or_path)
    if tokenizer.pad_token_id is None:
        raise ValueError(f"the tokenizer of {model_args.actor_model_name_or_path} has no pad token; set pad_token in its config")
    actor, reference = load_models(model_args, training_args)

    def prompts(paths, max_samples=0):
        return PromptDataset(
            paths, tokenizer, data_args.max_prompt_len, data_args.prompt_key, data_args.label_key, max_samples
        )

    train_dataset = prompts(data_args.train_datasets)
    eval_dataset = prompts(data_args.eval_datasets, data_args.max_eval_samples) if data_args.eval_datasets else None
    trainer = PPOTrainer(
        model=actor,
        reference_model=reference,
        tokenizer=tokenizer,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        reward_scorer=build_reward_scorer(training_args),
    )
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)


if __name__ == "__main__":
    main(sys.argv[1:])
