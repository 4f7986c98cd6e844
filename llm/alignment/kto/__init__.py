"""KTO: run_kto.py (entry point) and kto_trainer.py (unpaired preference losses)."""
