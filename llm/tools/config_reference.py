"""Writes the configuration reference, docs/configuration.md, from the argument dataclasses' help strings (their
one source): the keys of run_ppo.py by group, of run_reward.py, run_dpo.py, run_kto.py and run_finetune.py, the paddlenlp
TrainingArguments keys the trainers read, PaddleNLP's other key names and its keys without effect here.

    python -m llm.tools.config_reference            # rewrite docs/configuration.md
    python -m llm.tools.config_reference --check    # exit 1 when the page is out of date
"""

import argparse
import dataclasses
import os
import sys

from paddle_alignment.cpu_runtime import configure_cpu_runtime

configure_cpu_runtime()  # before paddle loads (the argument modules import it)

from paddlenlp.trainer import TrainingArguments  # noqa: E402

from llm.alignment.rm.run_reward import RewardDataArgument, RewardModelArgument, RewardTrainingArguments  # noqa: E402
from llm.run_finetune import FinetuneDataArgument, FinetuneModelArgument  # noqa: E402
from paddle_alignment.config.arguments import GROUPS  # noqa: E402
from paddle_alignment.config.model import DataArgument, ModelArgument  # noqa: E402
from paddle_alignment.config.paddlenlp_keys import ALIASES, NO_EFFECT  # noqa: E402
from paddle_alignment.config.preference import (  # noqa: E402
    DPOTrainingArguments, KTOTrainingArguments, PreferenceDataArgument, PreferenceModelArgument, PreferenceTrainingArguments,
    ReferenceArguments,
)

PAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "docs", "configuration.md")

GROUP_TITLES = {
    "BatchSizeArguments": "Batch sizes",
    "RolloutArguments": "Rollout",
    "AlgorithmArguments": "Algorithm",
    "ScheduleArguments": "Learning-rate schedule",
    "RewardArguments": "Reward",
    "JudgeArguments": "LLM judge",
    "DistillationArguments": "On-policy distillation",
    "CriticArguments": "Critic",
    "MultiTurnArguments": "Multi-turn rollouts with tools or environments",
    "DecoupledRolloutArguments": "Decoupled rollout",
    "ParallelLayoutArguments": "Memory and layout",
    "LoggingArguments": "Logging",
    "WatchdogArguments": "Watchdog",
    "ModelKernelArguments": "Model kernels",
}

# paddlenlp's TrainingArguments keys the trainers read; their meaning is paddlenlp's (its help strings below).
TRAINING_KEYS = (
    "output_dir", "logging_dir", "device", "seed", "max_steps", "num_train_epochs", "learning_rate",
    "lr_scheduler_type", "warmup_ratio", "warmup_steps", "weight_decay", "adam_beta1", "adam_beta2", "adam_epsilon",
    "max_grad_norm", "per_device_train_batch_size", "per_device_eval_batch_size", "gradient_accumulation_steps",
    "logging_steps", "evaluation_strategy", "eval_steps", "save_strategy", "save_steps", "save_total_limit",
    "ignore_save_lr_and_optim", "ignore_load_lr_and_optim", "do_train", "do_eval", "resume_from_checkpoint",
    "overwrite_output_dir", "report_to", "disable_tqdm", "bf16", "fp16", "fp16_opt_level", "amp_custom_black_list",
    "amp_custom_white_list", "recompute", "tensor_parallel_degree", "pipeline_parallel_degree", "sharding",
    "sharding_parallel_degree",
)

INTRO = """# Configuration reference

Generated from the help strings of the argument classes by `python -m llm.tools.config_reference`; a test
fails when this page and the code differ. Back to the [README](../README.md).

Every entry script reads one JSON or YAML file (`.json`, `.yaml`, `.yml`) with paddlenlp's `PdArgumentParser`;
`--key value` pairs after the file override it. Keys are flat, as in PaddleNLP: the groups below are how the
code and this page are organised, not levels in the file. An unknown key stops the run naming the closest
known one; an impossible combination stops it naming the keys. PaddleNLP's other names for a key and its keys
without effect here are listed at the end ([Migrating from PaddleNLP](migrating_from_paddlenlp.md)).
"""


def default_text(spec):
    if spec.default is not dataclasses.MISSING:
        value = spec.default
    elif spec.default_factory is not dataclasses.MISSING:
        value = spec.default_factory()
    else:
        return "required"
    if value is None:
        return "unset"
    if value == "":
        return '`""`'
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"  # as JSON writes it
    return f"`{getattr(value, 'value', value)}`"


def one_line(text):
    return " ".join(str(text or "").split()).replace("|", "\\|")


def key_table(fields, aliases=None):
    aliases = aliases or {}
    rows = ["| key | default | meaning |", "|---|---|---|"]
    for spec in fields:
        other = [alias for alias, key in aliases.items() if key == spec.name]
        note = f" Also read as {', '.join(f'`{a}`' for a in sorted(other))}." if other else ""
        rows.append(f"| `{spec.name}` | {default_text(spec)} | {one_line(spec.metadata.get('help'))}{note} |")
    return "\n".join(rows) + "\n"


def own_fields(cls):
    """The fields `cls` declares itself (not those of the classes it derives from)."""
    inherited = {spec.name for base in cls.__mro__[1:] if dataclasses.is_dataclass(base) for spec in dataclasses.fields(base)}
    return [spec for spec in dataclasses.fields(cls) if spec.init and spec.name not in inherited]


def section(title, cls, aliases=None, text=None):
    """A table of the keys `cls` declares, under its title and its docstring (dataclass's generated one left out)."""
    doc = text or ("" if (cls.__doc__ or "").startswith(cls.__name__ + "(") else one_line(cls.__doc__))
    return f"\n### {title}\n\n" + (f"{doc}\n\n" if doc else "") + key_table(own_fields(cls), aliases)


def training_keys_table():
    specs = {spec.name: spec for spec in dataclasses.fields(TrainingArguments)}
    return key_table([specs[name] for name in TRAINING_KEYS])


def reference():
    parts = [INTRO, "\n## run_ppo.py: RL (PPO, GRPO, REINFORCE++ ...)\n"]
    parts.append(section("Models", ModelArgument, ALIASES, "The policy, reference, reward and critic models, and LoRA."))
    parts.append(section("Data", DataArgument, ALIASES, "Prompts, their columns and lengths."))
    parts += [section(GROUP_TITLES[group.__name__], group, ALIASES) for group in GROUPS]
    parts.append("\n## run_reward.py: reward-model training\n\nBesides the model-kernel keys above and paddlenlp's keys below.\n")
    parts += [section(title, cls) for title, cls in (("Model", RewardModelArgument), ("Data", RewardDataArgument), ("Training", RewardTrainingArguments))]
    parts.append("\n## run_dpo.py and run_kto.py: preference alignment\n\nBoth read the model, data, reference and "
                 "benchmark keys; then each its loss's. Besides the model-kernel keys above and paddlenlp's keys below "
                 "([preference.md](preference.md)).\n")
    parts += [section(title, cls, ALIASES) for title, cls in (
        ("Model", PreferenceModelArgument), ("Data", PreferenceDataArgument), ("Reference", ReferenceArguments),
        ("Shared by DPO and KTO", PreferenceTrainingArguments), ("DPO loss (run_dpo.py)", DPOTrainingArguments),
        ("KTO loss (run_kto.py)", KTOTrainingArguments),
    )]
    parts.append("\n## run_finetune.py: SFT\n\nBesides paddlenlp's keys below.\n")
    parts += [section(title, cls) for title, cls in (("Model", FinetuneModelArgument), ("Data", FinetuneDataArgument))]
    parts.append("\n## paddlenlp's TrainingArguments keys the trainers read\n\nTheir meaning and help are paddlenlp's. "
                 "`max_steps` counts RL steps in run_ppo.py (one rollout batch and its updates); "
                 "`per_device_train_batch_size` is responses per micro-batch there.\n\n" + training_keys_table())
    parts.append("\n## PaddleNLP's other names for these keys\n\n| PaddleNLP key | read as |\n|---|---|\n"
                 + "".join(f"| `{alias}` | `{key}` |\n" for alias, key in sorted(ALIASES.items())))
    parts.append("\n## PaddleNLP keys without effect here\n\nAccepted, with one log line saying why.\n\n| key | why |\n|---|---|\n"
                 + "".join(f"| `{key}` | {one_line(why)} |\n" for key, why in sorted(NO_EFFECT.items())))
    return "".join(parts)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="exit 1 when docs/configuration.md is out of date")
    args = parser.parse_args(argv)
    text = reference()
    if args.check:
        current = open(PAGE, encoding="utf-8").read() if os.path.exists(PAGE) else ""
        if current != text:
            sys.exit(f"{PAGE} is out of date: run python -m llm.tools.config_reference")
        return
    with open(PAGE, "w", encoding="utf-8") as f:
        f.write(text)
    print(f"wrote {PAGE}")


if __name__ == "__main__":
    main()
