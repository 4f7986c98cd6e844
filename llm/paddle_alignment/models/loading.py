"""Loading models and tokenizers from local paths, one way for every stage (run_finetune, run_reward,
run_ppo): paddlenlp's `from_pretrained`, half-precision weights with O2 mixed precision, the split
over the tensor-parallel group (models/tensor_parallel.py), and on CPU the fused kernels of csrc in the
layers (models/fused_kernels.py; results equal to 1e-5, about twice as fast)."""

from paddlenlp.transformers import AutoModelForCausalLM, AutoTokenizer
from paddlenlp.utils.log import logger

from paddle_alignment.models.fused_kernels import use_fused_kernels
from paddle_alignment.models.score_model import AutoModelForScore
from paddle_alignment.models.tensor_parallel import shard_model


def load_options(training_args, recompute_granularity=None):
    """from_pretrained options: with O2 mixed precision, half-precision weights (PaddleNLP's choice);
    `recompute_granularity` for the models that train; PaddleNLP's fused-kernel switches
    (arguments.ModelKernelArguments) as model-config attributes."""
    options = dict(training_args.model_config_flags()) if hasattr(training_args, "model_config_flags") else {}
    if training_args.fp16_opt_level == "O2" and (training_args.bf16 or training_args.fp16):
        options["dtype"] = "bfloat16" if training_args.bf16 else "float16"
    if recompute_granularity is not None:
        options["recompute_granularity"] = recompute_granularity
    return options


def tensor_parallel_degree(training_args):
    return max(training_args.tensor_parallel_degree, 1)


def load_causal_lm(path, training_args, recompute_granularity=None):
    """The causal LM at `path`, split over the tensor-parallel group."""
    model = AutoModelForCausalLM.from_pretrained(path, **load_options(training_args, recompute_granularity))
    return with_cpu_kernels(shard_model(model, tensor_parallel_degree(training_args)), training_args)


def load_score_model(path, training_args, recompute_granularity=None, **score_options):
    """The score model (backbone + score head) at `path` with `score_options`, split over the
    tensor-parallel group; a causal LM's path gives its backbone and a fresh head."""
    model = AutoModelForScore.from_pretrained(path, **score_options, **load_options(training_args, recompute_granularity))
    return with_cpu_kernels(shard_model(model, tensor_parallel_degree(training_args)), training_args)


def with_cpu_kernels(model, training_args):
    """`model` with the fused CPU kernels in its layers when it runs on CPU (GPU runs keep Paddle's ops and
    PaddleNLP's fused-kernel switches, arguments.ModelKernelArguments)."""
    if training_args.device == "cpu":
        use_fused_kernels(model)
    return model


def frozen(model):
    model.eval()
    for parameter in model.parameters():
        parameter.stop_gradient = True
    return model


def load_tokenizer(path, eos_token=""):
    """The tokenizer at `path`; `eos_token` (PaddleNLP's key) replaces its EOS token when given."""
    tokenizer = AutoTokenizer.from_pretrained(path)
    if eos_token:
        if tokenizer.convert_tokens_to_ids(eos_token) in (None, tokenizer.unk_token_id):
            raise ValueError(f"eos_token={eos_token!r} is not a token of the tokenizer at {path}")
        logger.info(f"responses end at eos_token={eos_token!r} instead of {tokenizer.eos_token!r}")
        tokenizer.eos_token = eos_token
    if tokenizer.pad_token_id is None:
        # Llama 3 ships no pad token. EOS is a safe pad here: padding sits under a zero attention mask,
        # and response masks end at the first EOS.
        logger.info(f"the tokenizer of {path} has no pad token; padding with its EOS token {tokenizer.eos_token!r}")
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer
