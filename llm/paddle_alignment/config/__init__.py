"""Arguments of the SFT, reward-model and RL runs, grouped by concern, and the configuration reference built from them."""
