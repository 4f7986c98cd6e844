"""Built-in raw datasets: PKU-SafeRLHF (preference and safety labels), alpaca (instructions) and local files.

Nothing is downloaded: the Hugging Face datasets are read from a local copy through `datasets`, from the
path in the spec (`PKU-SafeRLHF/train:1:/data/PKU-SafeRLHF`) or, without one, from a folder named like
the Hub repository under the working directory (`PKU-Alignment/PKU-SafeRLHF`).
"""

from dataclasses import fields

from paddle_alignment.data.raw import RawDataset, RawSample, numbered_rows

RAW_SAMPLE_FIELDS = {f.name for f in fields(RawSample)}


def load_hub_dataset(name, path, split, columns):
    """Rows of `split` of a local copy of a Hub dataset, checked for `columns`."""
    import datasets

    rows = datasets.load_dataset(path, split=split)
    missing = [c for c in columns if c not in rows.column_names]
    if missing:
        raise ValueError(f"dataset {name!r} at {path} has no column {missing[0]!r} (columns: {rows.column_names})")
    return rows


class SafeRLHFDataset(RawDataset):
    """PKU-SafeRLHF: a prompt, two responses, which is better, which is safer, and whether each is safe."""

    SPLIT = "train"
    COLUMNS = (
        "prompt", "response_0", "response_1", "better_response_id", "safer_response_id",
        "is_response_0_safe", "is_response_1_safe",
    )

    def load(self, path):
        for row in load_hub_dataset(self.NAME, path, self.SPLIT, self.COLUMNS):
            yield RawSample(
                input=row["prompt"],
                answer=row["response_0"],
                other_answer=row["response_1"],
                better=int(row["better_response_id"]) == 0,
                safer=int(row["safer_response_id"]) == 0,
                is_safe=bool(row["is_response_0_safe"]),
                is_other_safe=bool(row["is_response_1_safe"]),
            )


class SafeRLHFTrain(SafeRLHFDataset):
    NAME, PATH, SOURCE = "PKU-SafeRLHF/train", "PKU-Alignment/PKU-SafeRLHF", "huggingface.co/datasets/PKU-Alignment/PKU-SafeRLHF"


class SafeRLHFTest(SafeRLHFTrain):
    NAME, SPLIT = "PKU-SafeRLHF/test", "test"


class SafeRLHF30KTrain(SafeRLHFDataset):
    NAME, PATH = "PKU-SafeRLHF-30K/train", "PKU-Alignment/PKU-SafeRLHF-30K"
    SOURCE = "huggingface.co/datasets/PKU-Alignment/PKU-SafeRLHF-30K"


class SafeRLHF30KTest(SafeRLHF30KTrain):
    NAME, SPLIT = "PKU-SafeRLHF-30K/test", "test"


class SafeRLHF10KTrain(SafeRLHFDataset):
    NAME, PATH = "PKU-SafeRLHF-10K/train", "PKU-Alignment/PKU-SafeRLHF-10K"
    SOURCE = "huggingface.co/datasets/PKU-Alignment/PKU-SafeRLHF-10K"


class AlpacaDataset(RawDataset):
    """Stanford alpaca: instruction (+ optional input) -> output; the ptx data of PaddleNLP's PPO."""

    NAME, PATH, SOURCE = "alpaca", "tatsu-lab/alpaca", "huggingface.co/datasets/tatsu-lab/alpaca"

    def load(self, path):
        for row in load_hub_dataset(self.NAME, path, "train", ("instruction", "input", "output")):
            text = f"{row['instruction']}\n\n{row['input']}" if row["input"] else row["instruction"]
            yield RawSample(input=text, answer=row["output"])


class JsonFileDataset(RawDataset):
    """A local .jsonl/.json/.parquet file. Columns named like RawSample fields are taken as they are;
    the `prompt_key` column (default `src`) is a literal prompt and the `label_key` column (default `tgt`)
    the answer, as in PaddleNLP's `src`/`tgt` files."""

    NAME = "jsonfile"

    def load(self, path, prompt_key="src", label_key="tgt"):
        renames = {prompt_key: "prompt", label_key: "answer"}
        self.lines = []
        for number, row in numbered_rows(path):
            # A null is an absent value (parquet writes one wherever a row lacks the column).
            values = {renames.get(k, k): v for k, v in row.items() if renames.get(k, k) in RAW_SAMPLE_FIELDS and v is not None}
            if values.get("prompt") is None and values.get("input") is None and values.get("dialogue") is None:
                raise ValueError(f"{path} row {number}: no prompt; it needs a {prompt_key!r}, 'input' or 'dialogue' column")
            for key in ("prompt", "answer", "other_answer"):
                if key in values and not isinstance(values[key], str):
                    column = {"prompt": prompt_key, "answer": label_key}.get(key, key)
                    raise ValueError(f"{path} row {number}: column {column!r} must be a string")
            self.lines.append(number)
            yield RawSample(**values)

    def location(self, index):
        return f"{self.path}:{self.lines[index]}"
