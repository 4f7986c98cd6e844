"""paddle-alignment: RLHF for PaddlePaddle (PPO, GRPO and friends), laid out like PaddleNLP's llm/."""
