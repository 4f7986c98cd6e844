"""Checkpoints: saving and loading a run (saving.py), and its folders: atomic writes, rotation, resume and the output_dir lock (folders.py)."""
