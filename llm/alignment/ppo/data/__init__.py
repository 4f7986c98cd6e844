"""Datasets of `src`/`tgt` jsonl rows (PaddleNLP's ppo-kk and SFT format)."""

from llm.alignment.ppo.data.jsonl import PromptDataset, SupervisedDataset, read_jsonl  # noqa: F401
