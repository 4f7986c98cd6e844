"""Offline preference alignment (DPO and its family, KTO): packed batches of a prompt and its replies, the
reference's log-probs (online, precomputed and cached, or the model with its LoRA adapters off), and the trainer
both run_dpo.py and run_kto.py build on."""
