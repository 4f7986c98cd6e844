"""Model wrappers used by the RL stages."""
