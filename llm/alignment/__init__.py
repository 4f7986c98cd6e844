"""RLHF with PaddlePaddle."""
