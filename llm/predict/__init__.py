"""Prediction with a trained policy: batch prediction over a JSONL file and interactive chat."""
