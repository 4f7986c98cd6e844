"""Kahneman-Tversky optimisation: single responses marked desirable or not -> an aligned policy, without
pairs or a reward model. PaddleNLP's llm/alignment/kto/run_kto.py, its config keys and data format.

    python -m paddle.distributed.launch --devices 0,1,2,3,4,5,6,7 \\
        llm/alignment/kto/run_kto.py config/qwen/kto_argument.json [--key value ...]

The model (usually the SFT model) is saved with its tokenizer to `output_dir` (LoRA: its adapters);
docs/preference.md describes the data, the loss and the reference options.
"""

import os
import sys

if not __package__:  # run as a script path: make the repository root importable
    sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..")))

from paddle_alignment.cpu_runtime import configure_cpu_runtime

configure_cpu_runtime()  # MKL's code path and threads for this CPU, before paddle loads

from paddle_alignment.config.preference import KTOTrainingArguments, PreferenceDataArgument, PreferenceModelArgument
from llm.alignment.kto.kto_trainer import KTOTrainer
from paddle_alignment.data.preference import rated_responses
from paddle_alignment.preference.runs import build_preference_trainer, run

ARGUMENT_CLASSES = (PreferenceModelArgument, PreferenceDataArgument, KTOTrainingArguments)


def build_trainer(argv):
    return build_preference_trainer(argv, ARGUMENT_CLASSES, rated_responses, KTOTrainer)


def main(argv):
    run(build_trainer(argv))


if __name__ == "__main__":
    main(sys.argv[1:])
