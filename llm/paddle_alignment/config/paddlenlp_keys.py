"""PaddleNLP's RL, reward-model, DPO and KTO config files, read as PaddleNLP reads them.

PaddleNLP's `run_ppo.py` / `run_rl.py` take a JSON or a YAML file of keys. Here every key of theirs is
either a key of this project's argument classes with PaddleNLP's meaning and default, another name for
one (ALIASES), or a key that changes nothing here: those are accepted with one log line saying why
(NO_EFFECT), never dropped silently.
"""

import json

import yaml
from paddlenlp.utils.log import logger

# PaddleNLP's and PaddleFormers' other names for this project's keys (their releases differ).
ALIASES = {
    "num_return_sequences": "rollout_n",
    "response_key": "label_key",
    "critic_model_name_or_path": "reward_critic_model_name_or_path",
    "mini_batch_size": "global_mini_batch_size",
    "rollout_logprob_batch_size": "per_device_logprob_batch_size",
    "fused_linear": "use_fused_linear",
    "rpo_alpha": "sft_loss_ratio",  # TRL's name of the NLL term on the chosen replies (run_dpo)
    # PaddleFormers' (Megatron-style) names of paddlenlp's parallel degrees.
    "tensor_model_parallel_size": "tensor_parallel_degree",
    "pipeline_model_parallel_size": "pipeline_parallel_degree",
    "sharding_parallel_size": "sharding_parallel_degree",
    "sep_parallel_size": "sep_parallel_degree",
    "context_parallel_size": "context_parallel_degree",
}

_SAME_LAYOUT = "this entry point evaluates on its training layout (run_ppo.py reads it under pipeline parallel)"
_NO_DROPOUT = "the models train with the dropout their config.json sets (PaddleNLP's RL default is none)"
_NO_TOKENIZER_SAMPLING = "prompts and labels are tokenized deterministically"
_NO_EARLY_STOP = "a run goes to max_steps; there is no early stopping on evaluation metrics"

# PaddleNLP keys that change nothing here, and why.
NO_EFFECT = {
    "eval_mode": _SAME_LAYOUT,
    "rollout_tensor_parallel_degree": _SAME_LAYOUT,
    "tensor_parallel_output": "the tensor-parallel plan returns whole logits (Paddle gathers the split LM head)",
    "use_fused_head_and_loss_fn": "the LM head projects the response positions logprob_chunk_tokens at a time, from the hidden states",
    "use_fp32_compute": "log-probs, rewards, advantages and losses are always computed in float32 here",
    "balance_batch": "each rank trains on its own prompts' rollouts; valid tokens are not rebalanced across ranks",
    "use_remove_padding": "micro-batches are formed by a token budget and cut to their rows' width (use_dynamic_batch_size); sequences are not packed into one row",
    "rollout_max_num_seqs": "the decode loop takes per_device_rollout_batch_size prompts at a time",
    "rollout_quant_type": "rollouts decode with the training weights; weight-only quantisation is not implemented",
    "quant_type": "rollouts decode with the training weights; weight-only quantisation is not implemented",
    "skip_profile_timer": "PaddleNLP's profile timers are not used; step_time and rollout_tokens_per_s are logged",
    "unified_checkpoint": "checkpoints use this project's layout (docs/checkpoints.md)",
    "unified_checkpoint_config": "checkpoints use this project's layout (docs/checkpoints.md)",
    "use_tgt_len_value": "the KL penalty covers the generated tokens only",
    "dropout_warmup_steps": _NO_DROPOUT,
    "hidden_dropout_prob": _NO_DROPOUT,
    "attention_probs_dropout_prob": _NO_DROPOUT,
    "early_stopping": _NO_EARLY_STOP,
    "early_stopping_patience": _NO_EARLY_STOP,
    "early_stopping_threshold": _NO_EARLY_STOP,
    "actor_tokenizer_alpha": _NO_TOKENIZER_SAMPLING,
    "reward_tokenizer_alpha": _NO_TOKENIZER_SAMPLING,
    "critic_tokenizer_alpha": _NO_TOKENIZER_SAMPLING,
    "reward_critic_tokenizer_alpha": _NO_TOKENIZER_SAMPLING,
    "use_attn_mask_start_row_indices": "sequences are not packed, so there are no row-start attention masks",
    "stage": "the stage is the entry point (run_ppo.py for RL, run_reward.py for reward models)",
    "chat_template": "prompts are used as written in prompt_key, as PaddleNLP's default chat_template 'none' does",
    "max_src_len": "PaddleNLP overwrites it with max_prompt_len, which is used here",
    "virtual_pp_degree": "each rank holds one pipeline stage (no interleaved virtual stages)",
    "per_device_sample_batch_size": "an older PaddleNLP dynamic-sampling key: here the kept batch is "
    "global_batch_size (or per_device_prompt_batch_size) and the generated one global_gen_batch_size",
    "dataloader_drop_last": "an RL step always takes a whole prompt batch; an epoch's last partial batch is dropped "
    "(under pipeline parallel it drops the rollouts that do not fill a whole optimizer step of micro-batches)",
    "flash_mask": "preference rows are packed with a dense attention mask built from their layout (docs/preference.md)",
    "lazy": "preference data files are read whole at start (their bad rows refused before training)",
    "use_quick_lora": "LoRA layers run paddlenlp's standard implementation",
}


def read_config(path):
    """The key -> value mapping of a JSON or YAML config file, with a message naming the file when it
    cannot be read."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    try:
        config = yaml.safe_load(text) if path.endswith((".yaml", ".yml")) else json.loads(text)
    except (json.JSONDecodeError, yaml.YAMLError) as error:
        kind = "YAML" if path.endswith((".yaml", ".yml")) else "JSON"
        raise ValueError(f"config file {path} is not valid {kind}: {error}") from None
    if not isinstance(config, dict):
        raise ValueError(f"config file {path} must hold a mapping of keys to values, not {type(config).__name__}")
    return config


def config_tokens(config):
    """Command-line tokens of a config mapping, as paddlenlp's PdArgumentParser.read_json makes them: lists
    spread into values, mappings as JSON. YAML's bare exponents (`5e-7`) are floats here too."""
    tokens = []
    for key, value in config.items():
        values = value if isinstance(value, list) else [value]
        tokens.append(f"--{key}")
        tokens += [json.dumps(v) if isinstance(v, dict) else str(v) for v in values]
    return tokens


def split_options(tokens):
    """[(key, [values])] of `--key value...` or `--key=value` tokens (a value never starts with `--`)."""
    options = []
    for token in tokens:
        if token.startswith("--"):
            key, equals, value = token[2:].partition("=")
            options.append((key, [value] if equals else []))
        elif options:
            options[-1][1].append(token)
        else:
            raise ValueError(f"{token!r} is not preceded by a --key")
    return options


def canonical_options(options, source):
    """`options` ([(key, [values])]) under this project's key names (ALIASES). Two names of one key set to
    different values in one `source` (the config file, or the command line) are an error naming both; the
    command line still overrides the file, under either name."""
    named = {}
    for key, values in options:
        canonical = ALIASES.get(key, key)
        first = named.setdefault(canonical, (key, values))
        if first[0] != key and first[1] != values:
            raise ValueError(
                f"{source} sets {first[0]}={' '.join(first[1])} and {key}={' '.join(values)}, two names of "
                f"{canonical}: keep one"
            )
    return [(ALIASES.get(key, key), values) for key, values in options]


def drop_keys_without_effect(options, known):
    """`options` without the NO_EFFECT keys this run's argument classes do not define, each logged once
    with why it changes nothing."""
    kept = []
    for key, values in options:
        if key in NO_EFFECT and key not in known:
            logger.info(f"config key {key}={' '.join(values)} has no effect here: {NO_EFFECT[key]}")
        else:
            kept.append((key, values))
    return kept
