"""Raw datasets: rows of any source turned into `RawSample`s, registered by name, mixed by proportion.

A dataset spec is a comma-separated list of `name[:proportion[:path]]` entries (safe-rlhf's and
PaddleNLP's format): `PKU-SafeRLHF/train`, `alpaca:0.5`, `jsonfile::data/pref.jsonl`,
`PKU-SafeRLHF-30K/train:1:/data/PKU-SafeRLHF-30K`. An entry that is the path of an existing .json,
.jsonl or .parquet file reads that file (`jsonfile`), so the `src`/`tgt` files of PaddleNLP's GRPO
configs work as they are.
"""

import json
import math
import os
from dataclasses import dataclass
from typing import ClassVar, Dict, List, Optional, Union

from paddle_alignment.algos.registry import call_with_options

DATA_FILE_SUFFIXES = (".json", ".jsonl", ".parquet")


@dataclass
class RawSample:
    """One example, in safe-rlhf's fields.

    input          the user's text, or alternating user/assistant turns ending with the user's
    answer         the reply to `input` (preference data: the first of two replies)
    other_answer   the second reply (preference data)
    dialogue       a whole conversation ending with the assistant's reply (supervised data)
    better         `answer` is better than `other_answer`
    safer          `answer` is safer than `other_answer`
    is_safe, is_other_safe: safety labels of the two replies
    prompt         literal prompt text used as it is, without a chat template (`src`/`tgt` data)
    environment    the multi-turn environment of the row's episodes (its class name; agents/environments.py)
    """

    input: Union[str, List[str], None] = None
    answer: Optional[str] = None
    other_answer: Optional[str] = None
    dialogue: Optional[List[str]] = None
    better: Optional[bool] = None
    safer: Optional[bool] = None
    is_safe: Optional[bool] = None
    is_other_safe: Optional[bool] = None
    prompt: Optional[str] = None
    environment: Optional[str] = None


RAW_DATASETS = {}


class RawDataset:
    """A list of RawSamples read from `path`. Subclasses set `NAME` (registering themselves under it)
    and implement `load(path, ...)`; `PATH` is where the files are looked for when the spec gives none."""

    NAME: ClassVar[str] = ""
    PATH: ClassVar[Optional[str]] = None
    SOURCE: ClassVar[str] = ""  # where users get the files, for the missing-file error

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls.NAME:
            if cls.NAME in RAW_DATASETS:
                raise ValueError(f"raw dataset {cls.NAME!r} is registered twice")
            RAW_DATASETS[cls.NAME] = cls

    def __init__(self, path=None, **options):
        path = path or self.PATH
        if path is None:
            raise ValueError(f"dataset {self.NAME!r} needs a path: write it as {self.NAME}:PROPORTION:PATH")
        if not os.path.exists(path):
            where = f" (get it from {self.SOURCE})" if self.SOURCE else ""
            raise FileNotFoundError(f"dataset {self.NAME!r}: {path} does not exist{where}")
        self.path = path
        self.samples = list(call_with_options(self.load, path, **options))
        if not self.samples:
            raise ValueError(f"dataset {self.NAME!r} at {path} holds no rows")

    def load(self, path):
        raise NotImplementedError

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, index):
        return self.samples[index]

    def location(self, index):
        """Where sample `index` comes from, for errors."""
        return f"dataset {self.NAME!r} ({self.path}) row {index + 1}"


@dataclass
class DatasetSpec:
    name: str
    proportion: float = 1.0
    path: Optional[str] = None


def parse_dataset_specs(datasets: Union[str, Dict[str, float]]) -> List[DatasetSpec]:
    """`"a:0.5,b"` or `{"a": 0.5, "b": 1}` -> specs; a bare data file path becomes `jsonfile` of it."""
    if isinstance(datasets, dict):
        entries = [
            f"jsonfile:{proportion}:{name}" if name.endswith(DATA_FILE_SUFFIXES) else f"{name}:{proportion}"
            for name, proportion in datasets.items()
        ]
    else:
        entries = [entry.strip() for entry in datasets.split(",") if entry.strip()]
    if not entries:
        raise ValueError(f"no dataset named in {datasets!r}")
    return [parse_dataset_spec(entry) for entry in entries]


def parse_dataset_spec(entry):
    if entry.endswith(DATA_FILE_SUFFIXES) and os.path.isfile(entry):
        return DatasetSpec("jsonfile", 1.0, entry)
    name, _, rest = entry.partition(":")
    proportion_text, _, path = rest.partition(":")
    if name not in RAW_DATASETS:
        if entry.endswith(DATA_FILE_SUFFIXES):
            raise FileNotFoundError(f"dataset file {entry} does not exist")
        raise ValueError(f"dataset {name!r} is not registered; choose from {sorted(RAW_DATASETS)} or give a data file path")
    try:
        proportion = float(proportion_text) if proportion_text else 1.0
    except ValueError:
        raise ValueError(f"dataset entry {entry!r}: proportion {proportion_text!r} is not a number") from None
    if not math.isfinite(proportion) or proportion <= 0:
        raise ValueError(f"dataset entry {entry!r}: proportion must be a finite number > 0")
    return DatasetSpec(name, proportion, path or None)


def load_raw_dataset(spec: DatasetSpec, **options):
    """The registered dataset of `spec`; `options` (column names) reach the datasets that take them."""
    return RAW_DATASETS[spec.name](spec.path, **options)


def read_rows(path):
    """Rows of a local .jsonl / .json (lines or one array) / .parquet file as dicts; errors name file and line."""
    return [row for _, row in numbered_rows(path)]


def numbered_rows(path):
    """(line, row) of each row of a data file (`read_rows`); the line is the row's number in a JSON array
    or a parquet file."""
    if path.endswith(".parquet"):
        import datasets

        return list(enumerate(datasets.load_dataset("parquet", data_files=path, split="train"), start=1))
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if text.lstrip().startswith("["):
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}:{error.lineno}: not valid JSON ({error})") from None
        numbered = enumerate(rows, start=1)
    else:
        numbered = ((n, parse_line(line, path, n)) for n, line in enumerate(text.splitlines(), start=1) if line.strip())
    rows = []
    for number, row in numbered:
        if not isinstance(row, dict):
            raise ValueError(f"{path}:{number}: a row must be a JSON object")
        rows.append((number, row))
    return rows


def parse_line(line, path, number):
    try:
        return json.loads(line)
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}:{number}: not valid JSON ({error})") from None
