"""Mixed precision as paddlenlp's Trainer gives it to its model, for a process that runs the trainer's policy
without a Trainer (a decoupled sampler): the same weights' dtype and the same autocast lists, so that the
sampler's passes run the kernels the trainer's do."""

import contextlib
import functools

import paddle
from paddlenlp.quantization.quantization_linear import QuantizationLinear


def trainer_autocast(args, model):
    """The autocast factory of `Trainer.autocast_smart_context_manager` for `args` (fp16 or bf16 at
    fp16_opt_level; a null context otherwise). At O2 the Trainer casts its model's weights when it is built
    (paddle.amp.decorate), and so is `model` here."""
    if not (args.fp16 or args.bf16):
        return contextlib.nullcontext
    dtype = "float16" if args.fp16 else "bfloat16"
    white_list = list(args.amp_custom_white_list or [])
    if args.fp16_opt_level == "O2":
        paddle.amp.decorate(models=model, level="O2", dtype=dtype, excluded_layers=[QuantizationLinear])
        white_list += ["lookup_table", "lookup_table_v2"]  # embeddings return the half dtype at O2
    black_list = ["reduce_sum", "c_softmax_with_cross_entropy", *(args.amp_custom_black_list or [])]
    return functools.partial(
        paddle.amp.auto_cast, True, custom_black_list=set(black_list), custom_white_list=set(white_list),
        level=args.fp16_opt_level, dtype=dtype,
    )
