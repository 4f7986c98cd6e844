"""Builders for the embedded tiny world: tokenizer, model and data (nothing is downloaded)."""
