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
from paddlenlp.utils.log import logger

from llm.alignment.ppo.arguments import parse_arguments
from llm.alignment.ppo.comm_utils import finish_distributed_run
from llm.alignment.ppo.data import PromptDataset
from llm.alignment.ppo.ppo_trainer import PPOTrainer
from llm.alignment.ppo.rewards.scoring import build_reward_scorer


def load_models(model_args, training_args):
    """The actor (from the checkpoint when resuming) and, when a KL term needs it, a frozen reference."""
    actor_path = model_args.actor_model_name_or_path
    if training_args.resume_from_checkpoint:
        actor_path = os.path.join(training_args.resume_from_checkpoint, "policy")
        if not os.path.isdir(actor_path):
            raise FileNotFoundError(f"resume_from_checkpoint={training_args.resume_from_checkpoint} has no policy/ folder")
    actor = AutoModelForCausalLM.from_pretrained(actor_path)
    reference = None
    if training_args.uses_reference_model:
        reference = AutoModelForCausalLM.from_pretrained(
            model_args.reference_model_name_or_path or model_args.actor_model_name_or_path
        )
        reference.eval()
        for parameter in reference.parameters():
            parameter.stop_gradient = True
    return actor, reference


def build_trainer(argv):
    """Parse the config and build the tokenizer, models, datasets, reward and trainer it describes."""
    model_args, data_args, training_args = parse_arguments(argv)
    paddle.set_device(training_args.device)
    set_seed(training_args.seed)
    tokenizer = AutoTokenizer.from_pretrained(model_args.tokenizer_name_or_path or model_args.actor_model_name_or_path)
    if tokenizer.pad_token_id is None:
        # Llama 3 ships no pad token. EOS is a safe pad here: prompts are padded under a zero attention
        # mask, and response masks end at the first EOS.
        logger.info(f"the tokenizer has no pad token; padding with its EOS token {tokenizer.eos_token!r}")
        tokenizer.pad_token = tokenizer.eos_token
    actor, reference = load_models(model_args, training_args)

    def prompts(paths, max_samples=0):
        return PromptDataset(
            paths, tokenizer, data_args.max_prompt_len, data_args.prompt_key, data_args.label_key, max_samples
        )

    return PPOTrainer(
        model=actor,
        reference_model=reference,
        tokenizer=tokenizer,
        args=training_args,
        train_dataset=prompts(data_args.train_datasets),
        eval_dataset=prompts(data_args.eval_datasets, data_args.max_eval_samples) if data_args.eval_datasets else None,
        reward_scorer=build_reward_scorer(training_args),
    )


def main(argv):
    trainer = build_trainer(argv)
    trainer.train(resume_from_checkpoint=trainer.args.resume_from_checkpoint)
    finish_distributed_run()


if __name__ == "__main__":
    main(sys.argv[1:])
