"""paddle_alignment: the shared core of paddle-alignment, imported by SFT (llm/run_finetune.py), reward-model
training (llm/alignment/rm), RL (llm/alignment/ppo) and prediction (llm/predict).

data/ datasets and prompts; models/ loading, score models and the fast forward passes; algos/ advantages,
losses and KL as registered pure functions; rollout/ the rollout worker, decode loop and decoupled
samplers; rewards/ rule rewards and the reward-server client; checkpoints/ saving, resuming and the
output_dir lock; config/ the grouped arguments; distributed.py the collectives of the data-parallel ranks.
Nothing here imports the entry scripts or trainers above it.
"""
