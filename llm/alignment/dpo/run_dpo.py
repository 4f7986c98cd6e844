"""Direct preference optimisation and its family (IPO, SimPO, ORPO, ...): preference pairs -> an aligned policy,
without a reward model. PaddleNLP's llm/alignment/dpo/run_dpo.py, its config keys and data format.

    python -m paddle.distributed.launch --devices 0,1,2,3,4,5,6,7 \\
        llm/alignment/dpo/run_dpo.py config/qwen/dpo_argument.json [--key value ...]

The model (usually the SFT model) is saved with its tokenizer to `output_dir` (LoRA: its adapters);
docs/preference.md describes the data, every loss and the reference options.
"""

import os
import sys

if not __package__:  # run as a script path: make the repository root importable
    sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..")))

from paddle_alignment.cpu_runtime import configure_cpu_runtime

configure_cpu_runtime()  # MKL's code path and threads for this CPU, before paddle loads

from paddle_alignment.config.preference import DPOTrainingArguments, PreferenceDataArgument, PreferenceModelArgument
from llm.alignment.dpo.dpo_trainer import DPOTrainer
from paddle_alignment.data.preference import preference_pairs
from paddle_alignment.preference.runs import build_preference_trainer, run

ARGUMENT_CLASSES = (PreferenceModelArgument, PreferenceDataArgument, DPOTrainingArguments)


def build_trainer(argv):
    return build_preference_trainer(argv, ARGUMENT_CLASSES, preference_pairs, DPOTrainer)


def main(argv):
    run(build_trainer(argv))


if __name__ == "__main__":
    main(sys.argv[1:])
