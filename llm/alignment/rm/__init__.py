"""Reward-model training: run_reward.py (entry point) and reward_trainer.py (pairwise loss, accuracy)."""
