"""Datasets: raw datasets registered by name (`raw.py`, `builtin.py`) and tokenized datasets mixed from them."""

from llm.alignment.ppo.data.datasets import (  # noqa: F401
    IGNORE_INDEX,
    PreferenceCollator,
    PreferenceDataset,
    PromptOnlyDataset,
    SafetyPreferenceDataset,
    SupervisedDataset,
)
from llm.alignment.ppo.data.raw import RAW_DATASETS, RawDataset, RawSample  # noqa: F401
