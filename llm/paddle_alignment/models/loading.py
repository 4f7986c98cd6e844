"""Loading models and tokenizers from local paths, one way for every stage (run_finetune, run_reward,
run_ppo, the predictor): paddlenlp's `from_pretrained` for Paddle-layout folders and hf_layout.py for
Hugging Face-layout ones (told apart by their files, no flag), float32 weights unless O2 mixed precision
asks for half precision, the split
over the tensor-parallel group (models/tensor_parallel.py; from safetensors each rank reads only its part,
models/split_loading.py), and on CPU the fused kernels of csrc in the
layers (models/fused_kernels.py; results equal to 1e-5, about twice as fast)."""

import json
import os

from paddlenlp.peft import LoRAModel
from paddlenlp.transformers import AutoModelForCausalLM, AutoTokenizer
from paddlenlp.transformers.tokenizer_utils_fast import PretrainedTokenizerFast
from paddlenlp.utils.log import logger

from paddle_alignment.chat_template import compile_chat_template, template_source
from paddle_alignment.models.fused_kernels import use_fused_kernels
from paddle_alignment.models.checkpoint_config import from_paddle_folder
from paddle_alignment.models.families import CAUSAL_LM_CLASSES
from paddle_alignment.models.hf_layout import safetensors_files, weight_files
from paddle_alignment.models.score_model import AutoModelForScore
from paddle_alignment.models.split_loading import load_hf_folder, load_split
from paddle_alignment.models.tensor_parallel import shard_model


def load_options(training_args, recompute_granularity=None):
    """from_pretrained options: the weights' dtype (load_dtype); `recompute_granularity` for the models
    that train; PaddleNLP's fused-kernel switches (config/layout.py ModelKernelArguments) as model-config attributes."""
    options = dict(training_args.model_config_flags()) if hasattr(training_args, "model_config_flags") else {}
    options["dtype"] = load_dtype(training_args)
    if recompute_granularity is not None:
        options["recompute_granularity"] = recompute_granularity
    return options


def load_dtype(training_args):
    """Half precision with O2 mixed precision, float32 otherwise (PaddleNLP's choice), for every model of a
    run alike. Never the checkpoint's own dtype: bfloat16 in most downloads' config.json, it would make O1
    train half-precision weights, where a 1e-6 learning rate's updates round away. Frozen models take the
    trained ones' dtype too: with half-precision weights their residual stream would round differently
    under the same autocast, and the KL to the reference would not start at 0."""
    if training_args.fp16_opt_level == "O2" and (training_args.bf16 or training_args.fp16):
        return "bfloat16" if training_args.bf16 else "float16"
    return "float32"


def tensor_parallel_degree(training_args):
    """The degree the tensor-parallel plan splits the loaded models by: 1 under pipeline parallel, where every
    rank keeps whole models for the rollout and the trained stages split with fleet's layers (PaddleNLP's
    eval_mode single)."""
    if training_args.pipeline_parallel_degree > 1:
        return 1
    return max(training_args.tensor_parallel_degree, 1)


def load_causal_lm(path, training_args, recompute_granularity=None):
    """The causal LM at `path`, split over the tensor-parallel group."""
    options = load_options(training_args, recompute_granularity)
    model = split_from_folder(path, causal_lm_class, options, tensor_parallel_degree(training_args))
    return with_cpu_kernels(model, training_args)


def load_score_model(path, training_args, recompute_granularity=None, **score_options):
    """The score model (backbone + score head) at `path` with `score_options`, split over the
    tensor-parallel group; a causal LM's path gives its backbone and a fresh head."""
    options = {**score_options, **load_options(training_args, recompute_granularity)}
    model = split_from_folder(path, AutoModelForScore.class_for, options, tensor_parallel_degree(training_args))
    return with_cpu_kernels(model, training_args)


def pretrained_causal_lm(path, **options):
    """The causal LM at `path` in either layout, with from_pretrained's `options` (dtype, config attributes)."""
    return from_folder(path, causal_lm_class, options)


def split_from_folder(path, class_for_config, options, degree):
    """from_folder's model split over `degree` tensor-parallel ranks: from safetensors each rank reads only its
    part (split_loading.py); Paddle's pickles (model_state.pdparams) load whole on every rank first."""
    found = safetensors_files(path) if degree > 1 else None
    if found:
        return load_split(path, class_for_config, options, degree, *found)
    if degree > 1:
        logger.info(
            f"{path} holds no safetensors: every rank loads the whole model, then keeps its part "
            "(from safetensors, in Hugging Face's or paddlenlp's layout, each rank reads only its part)"
        )
    return shard_model(from_folder(path, class_for_config, options), degree)


def from_folder(path, class_for_config, options):
    """The model `class_for_config(config)` of the folder `path`, its config read by read_config: from a Hugging
    Face-layout folder by hf_layout.py, else by paddlenlp's loader; its RoPE tables as transformers computes them."""
    if weight_files(path):
        return load_hf_folder(path, class_for_config, **options)
    return from_paddle_folder(path, class_for_config, options)


def causal_lm_class(config):
    """The causal-LM class for `config`, chosen from its `architectures`: the project's for the families paddlenlp
    lacks (models/families.py), else paddlenlp's, as AutoModelForCausalLM chooses."""
    own = [CAUSAL_LM_CLASSES[name] for name in config.architectures or () if name in CAUSAL_LM_CLASSES]
    if own:
        return own[0]
    return AutoModelForCausalLM._get_model_class_from_config(None, None, config.to_dict())


def with_cpu_kernels(model, training_args):
    """`model` with the fused CPU kernels in its layers when it runs on CPU (GPU runs keep Paddle's ops and
    PaddleNLP's fused-kernel switches, config/layout.py ModelKernelArguments)."""
    if training_args.device == "cpu":
        use_fused_kernels(model)
    return model


def load_policy(path, lora_path=None, dtype=None):
    """The causal LM at `path` (in `dtype`, else the checkpoint's), with the LoRA adapters at `lora_path`
    folded into its weights so it decodes as a plain model, in eval mode; and its tokenizer."""
    model = pretrained_causal_lm(path, **({"dtype": dtype} if dtype else {}))
    if lora_path:
        adapters = LoRAModel.from_pretrained(model, lora_path)
        adapters.merge()
        model = adapters.model
    model.eval()
    return model, load_tokenizer(path)


def frozen(model):
    model.eval()
    for parameter in model.parameters():
        parameter.stop_gradient = True
    return model


# transformers' names of a tokenizer backed by tokenizer.json alone: 4's PreTrainedTokenizerFast (Llama 3's), and
# 5's TokenizersBackend (what it writes for every such tokenizer but the families it has classes for).
GENERIC_FAST_CLASSES = ("PreTrainedTokenizerFast", "TokenizersBackend")
CHAT_TEMPLATE_FILE = "chat_template.jinja"  # where transformers 5 writes the chat template


def pretrained_tokenizer(path):
    """paddlenlp's tokenizer for `path`; from tokenizer.json when the folder has one (as every Hugging Face
    download does), with the `tokenizers` library, so ids equal transformers' own. paddlenlp's Python
    Qwen2Tokenizer reads only vocab.json and tokenizer_config.json, and on Qwen2.5's files it drops the
    newline after each <|im_end|> (special tokens listed as plain strings strip the whitespace around
    them) and splits <tool_call> into bytes. A tokenizer_config.json naming a generic class of transformers
    (GENERIC_FAST_CLASSES) gets paddlenlp's class of that role, which AutoTokenizer does not know by those
    names. The chat template (the folder's chat_template.jinja, where transformers 5 writes it, else
    tokenizer_config.json's) is compiled as transformers compiles it (chat_template.py), not by paddlenlp, whose
    Jinja environment refuses `{% generation %}` and `{% break %}`; it is saved with the tokenizer."""
    config = read_tokenizer_config(path)
    source = chat_template_text(path, config)
    tokenizer = tokenizer_from_files(path, config)
    if source:
        tokenizer.chat_template = compile_chat_template(source)
        tokenizer.init_kwargs["chat_template"] = source
    return tokenizer


def read_tokenizer_config(path):
    """The folder's tokenizer_config.json, {} without one."""
    config_file = os.path.join(path, "tokenizer_config.json")
    if not os.path.isfile(config_file):
        return {}
    with open(config_file, encoding="utf-8") as f:
        return json.load(f)


def chat_template_text(path, tokenizer_config):
    """The chat template of the tokenizer folder `path` as text, None when it has none."""
    template = os.path.join(path, CHAT_TEMPLATE_FILE)
    if os.path.isfile(template):
        with open(template, encoding="utf-8") as f:
            return f.read()
    return template_source(tokenizer_config)


def tokenizer_from_files(path, tokenizer_config):
    options = {"chat_template": None}  # compiled by pretrained_tokenizer
    if not os.path.isfile(os.path.join(path, "tokenizer.json")):
        return AutoTokenizer.from_pretrained(path, **options)
    if tokenizer_config.get("tokenizer_class") in GENERIC_FAST_CLASSES:
        return PretrainedTokenizerFast.from_pretrained(path, **options)
    return AutoTokenizer.from_pretrained(path, use_fast=True, **options)


def load_tokenizer(path, eos_token=""):
    """The tokenizer at `path`; `eos_token` (PaddleNLP's key) replaces its EOS token when given. Its
    `end_token_ids` (tokens.end_ids) are its EOS and the end ids of the folder's generation_config.json."""
    tokenizer = pretrained_tokenizer(path)
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
    tokenizer.end_token_ids = list(dict.fromkeys([tokenizer.eos_token_id, *generation_end_ids(path)]))
    return tokenizer


def generation_end_ids(path):
    """The `eos_token_id` (one id or a list) of the folder's generation_config.json, as a list; [] without one."""
    config_file = os.path.join(path, "generation_config.json")
    if not os.path.isfile(config_file):
        return []
    with open(config_file, encoding="utf-8") as f:
        ids = json.load(f).get("eos_token_id")
    return [] if ids is None else [ids] if isinstance(ids, int) else list(ids)
