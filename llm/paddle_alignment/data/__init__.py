"""Datasets: raw datasets registered by name (`raw.py`, `builtin.py`) and tokenized datasets mixed from them."""

from paddle_alignment.data.datasets import (  # noqa: F401
    IGNORE_INDEX,
    PreferenceCollator,
    PreferenceDataset,
    PromptOnlyDataset,
    SafetyPreferenceDataset,
    SupervisedDataset,
)
from paddle_alignment.data.raw import RAW_DATASETS, RawDataset, RawSample  # noqa: F401
