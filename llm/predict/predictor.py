"""Batch prediction and chat with a trained policy, with PaddleNLP's predictor flags.

    python llm/predict/predictor.py --model_name_or_path checkpoints/grpo/policy \\
        --data_file data/rl/eval.jsonl --output_file output.jsonl [--decode_strategy sampling]
    python llm/predict/predictor.py --model_name_or_path checkpoints/grpo/policy --chat

Prompts are built exactly as for RL training (data/datasets.py `format_prompt`): a `src` is used as it is,
a chat history goes through the tokenizer's chat template. Decoding runs on the rollout's decode loop
(rollout/decode.py generate_rollouts: the fast loop when paddlenlp_ops is built, else generate()).
"""

import json
import os
import sys
from dataclasses import dataclass, field
from typing import Optional

if not __package__:  # run as a script path: make the repository root importable
    sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))

from paddle_alignment.cpu_runtime import configure_cpu_runtime

configure_cpu_runtime()  # MKL's code path and threads for this CPU, before paddle loads

import paddle
from paddlenlp.trainer import PdArgumentParser
from paddlenlp.utils.env import LORA_CONFIG_NAME
from tqdm import tqdm

from paddle_alignment.data.builtin import JsonFileDataset
from paddle_alignment.data.datasets import format_prompt
from paddle_alignment.data.raw import RawSample, read_rows
from paddle_alignment.models.loading import load_policy
from paddle_alignment.models.lora_utils import is_adapters_folder
from paddle_alignment.rollout.decode import SamplingConfig, generate_rollouts

DECODE_STRATEGIES = ("sampling", "greedy_search")
DTYPES = ("float32", "float16", "bfloat16")


@dataclass
class PredictorArgument:
    """PaddleNLP's predictor flags with their defaults (its sampling: temperature 0.95, top_p 0.7), plus `--chat`,
    except that decoding is greedy unless `--decode_strategy sampling` asks for PaddleNLP's default: a
    prediction run scores a checkpoint, and greedy outputs do not depend on the seed."""

    model_name_or_path: str = field(default=None, metadata={"help": "Folder of the trained policy (model and tokenizer)."})
    lora_path: Optional[str] = field(
        default=None, metadata={"help": "Folder of LoRA adapters (a LoRA run's output_dir/policy) for the base model --model_name_or_path."}
    )
    data_file: Optional[str] = field(default=None, metadata={"help": "JSONL (or JSON) file of rows with a `src` prompt."})
    output_file: str = field(default="output.json", metadata={"help": "JSONL written with each input row plus `output`."})
    chat: bool = field(default=False, metadata={"help": "Chat on stdin instead of predicting a file; `exit` or EOF quits."})
    batch_size: int = field(default=1, metadata={"help": "Prompts decoded together."})
    src_length: int = field(default=1024, metadata={"help": "Prompt tokens kept (the last ones, as PaddleNLP truncates)."})
    min_length: int = field(default=1, metadata={"help": "Fewest new tokens before EOS may end a response."})
    max_length: int = field(default=1024, metadata={"help": "Most new tokens per response."})
    decode_strategy: str = field(
        default="greedy_search", metadata={"help": f"One of {DECODE_STRATEGIES} (PaddleNLP's default: sampling)."}
    )
    temperature: float = field(default=0.95, metadata={"help": "Sampling temperature."})
    top_p: float = field(default=0.7, metadata={"help": "Nucleus sampling mass."})
    top_k: int = field(default=0, metadata={"help": "Sample among the k likeliest tokens (0: all); top_k 1 with top_p 1 is greedy."})
    repetition_penalty: float = field(default=1.0, metadata={"help": "Penalty on tokens already generated (1: none)."})
    dtype: Optional[str] = field(default=None, metadata={"help": f"Weights dtype, one of {DTYPES} (default: the checkpoint's on GPU; float32 on CPU, which has no bfloat16 or float16 matmul)."})
    device: Optional[str] = field(default=None, metadata={"help": "cpu, gpu or gpu:N (default: gpu when Paddle has CUDA, else cpu)."})
    seed: int = field(default=42, metadata={"help": "Seed of sampling, for reproducible outputs."})

    def __post_init__(self):
        if not self.model_name_or_path or not os.path.isdir(self.model_name_or_path):
            raise ValueError(f"--model_name_or_path {self.model_name_or_path}: not a folder holding a trained model")
        if is_adapters_folder(self.model_name_or_path):
            raise ValueError(
                f"--model_name_or_path {self.model_name_or_path} holds LoRA adapters only: give the base model as "
                "--model_name_or_path and this folder as --lora_path (or predict with a run's policy_merged)"
            )
        if self.lora_path and not is_adapters_folder(self.lora_path):
            raise ValueError(f"--lora_path {self.lora_path}: not a folder of LoRA adapters ({LORA_CONFIG_NAME} missing)")
        if not self.chat and not self.data_file:
            raise ValueError("give --data_file (batch prediction) or --chat (interactive)")
        if self.data_file and not self.chat and not os.path.isfile(self.data_file):
            raise FileNotFoundError(f"--data_file {self.data_file}: no such file")
        for name in ("batch_size", "src_length", "max_length"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name} must be at least 1, got {getattr(self, name)}")
        if self.decode_strategy not in DECODE_STRATEGIES:
            raise ValueError(f"--decode_strategy {self.decode_strategy!r} is not supported here; use one of {DECODE_STRATEGIES}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"--top_p must be in (0, 1], got {self.top_p}")
        if self.temperature <= 0 or self.top_k < 0 or self.min_length < 0 or self.repetition_penalty <= 0:
            raise ValueError("--temperature and --repetition_penalty must be positive, --top_k and --min_length not negative")
        if self.dtype is not None and self.dtype not in DTYPES:
            raise ValueError(f"--dtype {self.dtype!r}: use one of {DTYPES}")

    @property
    def greedy(self):
        # PaddleNLP decodes greedily when asked, and in its stream predictor when top_k 1 and top_p 1 leave one token.
        return self.decode_strategy == "greedy_search" or (self.top_k == 1 and self.top_p == 1.0)

    def sampling(self):
        return SamplingConfig(
            self.max_length, self.min_length, self.temperature, self.top_p, self.repetition_penalty, self.top_k, self.greedy
        )


def parse_arguments(argv):
    (args,) = PdArgumentParser(PredictorArgument).parse_args_into_dataclasses(args=argv)
    return args


def select_device(device):
    device = device or ("gpu" if paddle.is_compiled_with_cuda() else "cpu")
    try:
        paddle.set_device(device)
    except ValueError as error:
        raise ValueError(f"--device {device}: {error}") from None


def encode_prompt(tokenizer, sample, src_length):
    """A rollout item for `sample`, tokenized as PromptOnlyDataset does; over-long prompts keep their last
    `src_length` tokens (PaddleNLP's left truncation) rather than being skipped as in training."""
    prompt = format_prompt(tokenizer, sample)
    input_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    return {"prompt": prompt, "label": "", "input_ids": input_ids[-src_length:]}


def generate_responses(model, tokenizer, items, sampling):
    return generate_rollouts(model, tokenizer, items, 1, sampling).responses


def predict_file(model, tokenizer, args):
    """Write each row of `--data_file` with its `output` to `--output_file`, in input order."""
    rows = read_rows(args.data_file)
    # The training reader turns rows into samples, so `src` (and `input`/`dialogue`) mean what they meant in training.
    samples = JsonFileDataset(args.data_file).samples
    items = [encode_prompt(tokenizer, sample, args.src_length) for sample in samples]
    sampling = args.sampling()
    os.makedirs(os.path.dirname(os.path.abspath(args.output_file)), exist_ok=True)
    with open(args.output_file, "w", encoding="utf-8") as out, tqdm(total=len(rows), desc="predict", unit="row") as bar:
        for start in range(0, len(items), args.batch_size):
            responses = generate_responses(model, tokenizer, items[start : start + args.batch_size], sampling)
            for row, response in zip(rows[start:], responses):
                out.write(json.dumps({**row, "output": response}, ensure_ascii=False) + "\n")
            bar.update(len(responses))


def read_user_turns(stdin, stdout):
    """Lines typed by the user, until `exit` or end of input; blank lines are skipped."""
    while True:
        stdout.write("user: ")
        stdout.flush()
        line = stdin.readline()
        if not line or line.strip() == "exit":
            return
        if line.strip():
            yield line.strip()


def chat(model, tokenizer, args, stdin=sys.stdin, stdout=sys.stdout):
    """A multi-turn chat: every reply sees the whole conversation through the chat template."""
    turns, sampling = [], args.sampling()
    for text in read_user_turns(stdin, stdout):
        turns.append(text)
        item = encode_prompt(tokenizer, RawSample(input=list(turns)), args.src_length)
        (reply,) = generate_responses(model, tokenizer, [item], sampling)
        turns.append(reply)
        stdout.write(f"assistant: {reply}\n")
    return turns


def main(argv, stdin=sys.stdin, stdout=sys.stdout):
    args = parse_arguments(argv)
    select_device(args.device)
    paddle.seed(args.seed)
    dtype = args.dtype or ("float32" if paddle.get_device() == "cpu" else None)
    model, tokenizer = load_policy(args.model_name_or_path, args.lora_path, dtype)
    if args.chat:
        chat(model, tokenizer, args, stdin, stdout)
    else:
        predict_file(model, tokenizer, args)


if __name__ == "__main__":
    main(sys.argv[1:])
