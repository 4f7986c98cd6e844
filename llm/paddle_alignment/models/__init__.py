"""Models of the RL stages: loading (local paths, Paddle or Hugging Face layout), score models (reward and critic), the fast no-gradient forward passes and the tensor-parallel plan."""
