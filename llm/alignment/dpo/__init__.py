"""DPO and its family: run_dpo.py (entry point) and dpo_trainer.py (pairwise preference losses)."""
