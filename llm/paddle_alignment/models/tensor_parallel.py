"""Tensor parallel through Paddle's auto-parallel plan, one implementation on CPU and GPU.

Every model loads whole (`from_pretrained` without paddlenlp's fleet TP layers, whose `c_identity` and
`all_reduce_on_calc_stream` have no CPU/gloo kernel) and is then split over the tensor-parallel group by
`dist.parallelize`: q/k/v and gate/up column-wise, o/down row-wise, and, when the vocabulary divides
and the LM head is not tied to the embedding, the embedding and LM head over the vocabulary. The
parameters become distributed tensors; Paddle's engine inserts the collectives of the forward and
backward passes (the vocab-parallel softmax of the log-probs among them).
"""

import math
import weakref

import paddle
import paddle.distributed as dist
from paddle.distributed.auto_parallel.api import dtensor_from_local
from paddlenlp.utils.log import logger

from paddle_alignment.distributed import collective, data_parallel_rank_and_size, hybrid_communicate_group

# Parameters and gradients go over the data ranks in buckets of at most this many bytes, the memory it adds.
BUCKET_BYTES = 256 << 20
COLUMN_PARALLEL = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj")
ROW_PARALLEL = ("self_attn.o_proj", "mlp.down_proj")


# The group each model shard_model split is split over, for code that runs the model's collectives itself.
SPLIT_GROUPS = weakref.WeakKeyDictionary()


def split_group(model):
    """The group `model`'s weights are split over by shard_model."""
    group = SPLIT_GROUPS.get(model)
    if group is None:
        raise ValueError(f"{type(model).__name__} was not split by shard_model: the group its weights are split over is unknown")
    return group


def check_splittable(config, degree):
    for key in ("num_attention_heads", "num_key_value_heads", "intermediate_size"):
        value = getattr(config, key)
        if value % degree:
            raise ValueError(f"tensor_parallel_degree={degree} does not divide the model's {key}={value}")
    for key in ("fuse_attention_qkv", "fuse_attention_ffn"):
        if getattr(config, key, False):
            raise ValueError(f"{key}: the tensor-parallel plan splits the separate projections; set it false in the model's config")


def splits_vocabulary(model, degree):
    """Whether the embedding and LM head split over the vocabulary: an untied LM head and a vocabulary
    the degree divides (else both stay whole on every rank, as paddlenlp's own LM head does)."""
    config = model.config
    return hasattr(model, "lm_head") and not config.tie_word_embeddings and config.vocab_size % degree == 0


def parallelize_plan(model, degree):
    """{sublayer name: plan} of `model` (a causal LM or a score model over the same backbone)."""
    plan = {}
    for name, _ in model.named_sublayers():
        if name.endswith(COLUMN_PARALLEL):
            plan[name] = dist.ColWiseParallel()
        elif name.endswith(ROW_PARALLEL):
            plan[name] = dist.RowWiseParallel()
    if splits_vocabulary(model, degree):
        embedding = next(name for name, _ in model.named_sublayers() if name.endswith("embed_tokens"))
        plan[embedding] = dist.RowWiseParallel()  # rows of the [vocab, hidden] table
        plan["lm_head"] = dist.ColWiseParallel()  # columns of the [hidden, vocab] weight
    return plan


def shard_model(model, degree, group=None):
    """`model` split over `group` of `degree` ranks, by default the tensor-parallel group (fleet's model-parallel
    group); unchanged at degree 1."""
    if degree <= 1:
        return model
    group = group or hybrid_communicate_group().get_model_parallel_group()
    check_splittable(model.config, degree)
    plan = parallelize_plan(model, degree)
    if not plan:
        raise ValueError(f"{type(model).__name__} has none of the layers the tensor-parallel plan splits ({COLUMN_PARALLEL + ROW_PARALLEL})")
    mesh = dist.ProcessMesh(group.ranks, dim_names=["mp"])
    model, _ = dist.parallelize(model, None, mesh=mesh, config={"mp_config": {"parallelize_plan": plan}})
    SPLIT_GROUPS[model] = group
    vocabulary = "split" if splits_vocabulary(model, degree) else "whole on every rank"
    logger.info(f"{type(model).__name__} split over {degree} tensor-parallel ranks: {len(plan)} layers, vocabulary {vocabulary}")
    return model


def is_tensor_parallel(model):
    return any(parameter.is_dist() for parameter in model.parameters())


def is_dist_tensor(tensor):
    """Whether `tensor` is a distributed tensor (split by the plan, or its replicated output); a value without
    `is_dist` (not an eager tensor) is not."""
    return hasattr(tensor, "is_dist") and tensor.is_dist()


def local_value(tensor):
    """This rank's part of a distributed tensor; a plain tensor as it is."""
    return tensor._local_value() if tensor.is_dist() else tensor


def data_rank_groups():
    """fleet's groups whose ranks hold the same part of the model and different batches: the data-parallel
    and the sharding group (of more than one rank). Summing over one, then the other, sums over every data
    rank (the rank's data-parallel x sharding grid)."""
    hcg = hybrid_communicate_group()
    groups = (hcg.get_data_parallel_group(), hcg.get_sharding_parallel_group()) if hcg is not None else ()
    return [group for group in groups if group.nranks > 1]


def broadcast_parameters_from_first_data_rank(model):
    """Give every data rank the parameters of the first, as paddle.DataParallel does when it wraps a model
    (it does not wrap these, see split_training.py): each data rank draws from its own seed, so parts
    initialised at load (a critic's fresh score head) would otherwise differ between the model's copies."""
    for group in data_rank_groups():
        broadcast_parts(model.parameters(), group.ranks[0], group, "the broadcast of the parameters over the data ranks")


def broadcast_parts(tensors, source, group, what):
    """This rank's parts of `tensors` replaced by global rank `source`'s (in `group`), in fused buckets."""
    for bucket in buckets([local_value(tensor) for tensor in tensors]):
        fused = paddle.concat([tensor.flatten() for tensor in bucket])
        with collective(what):
            dist.broadcast(fused, src=source, group=group)
        write_back(bucket, fused)


def average_gradients_over_data_ranks(parameters):
    """Average the gradients of a tensor-parallel model's `parameters` over the data ranks, as
    paddle.DataParallel does during backward for a model it wraps: each rank's part of each gradient with
    the same part on the other data ranks. In place."""
    groups = data_rank_groups()
    if not groups:
        return
    ranks = data_parallel_rank_and_size()[1]
    for bucket in buckets([local_value(p.grad) for p in parameters if p.grad is not None]):
        fused = paddle.concat([grad.flatten() for grad in bucket])
        with collective("the gradient all-reduce over the data ranks"):
            for group in groups:
                dist.all_reduce(fused, group=group)
        write_back(bucket, fused / ranks)


def buckets(items, tensor_of=lambda item: item):
    """`items` (tensors, or what `tensor_of` finds a tensor in) in consecutive runs of one dtype and at most
    BUCKET_BYTES of their tensors' (global) shapes (a larger tensor alone), each fused into one tensor for one
    collective."""
    bucket, size = [], 0
    for item in items:
        tensor = tensor_of(item)
        nbytes = math.prod(tensor.shape) * tensor.element_size()
        if bucket and (tensor.dtype != tensor_of(bucket[0]).dtype or size + nbytes > BUCKET_BYTES):
            yield bucket
            bucket, size = [], 0
        bucket.append(item)
        size += nbytes
    if bucket:
        yield bucket


def write_back(bucket, fused):
    """The parts of `fused` (a bucket's tensors flattened end to end) into the bucket's tensors, in place."""
    for tensor, part in zip(bucket, paddle.split(fused, [tensor.size for tensor in bucket])):
        paddle.assign(part.reshape(tensor.shape), output=tensor)


def whole(tensor):
    """The whole value of a distributed tensor on every rank (a collective); a plain tensor as it is."""
    if not tensor.is_dist():
        return tensor
    replicated = dist.reshard(tensor, tensor.process_mesh, [dist.Replicate()] * len(tensor.placements))
    return replicated._local_value()


def complete_state_dict(model):
    """`model.state_dict()` with every tensor whole: what `save_pretrained` writes for a one-device model.
    Every rank of the group must call it."""
    return {name: whole(tensor) for name, tensor in model.state_dict().items()}


def local_state(state):
    """An optimizer state with each distributed tensor replaced by this rank's part (what a rank saves)."""
    return {key: local_value(value) if isinstance(value, paddle.Tensor) else value for key, value in state.items()}


def set_local_state(optimizer, state):
    """Load into `optimizer` (over a tensor-parallel model) the state its rank saved with `local_state`.

    Paddle creates an optimizer's accumulators on the first step as whole tensors and splits them like
    their parameter in that step; they are created and split here first, so that each rank's part loads
    into its own slice (Paddle's AutoTrainer creates them the same way before loading)."""
    optimizer._create_accumulators(paddle.base.framework.default_main_program().global_block(), optimizer._parameter_list)
    for accumulators in optimizer._accumulators.values():
        for parameter in optimizer._parameter_list:
            whole_value = accumulators.get(parameter.name)
            if whole_value is None or not parameter.is_dist() or whole_value.is_dist():
                continue
            # Moments split like their parameter; the scalar beta powers are whole on every rank.
            like_parameter = list(whole_value.shape) == list(parameter.shape)
            placements = parameter.placements if like_parameter else [dist.Replicate()] * len(parameter.placements)
            split = dist.shard_tensor(whole_value, parameter.process_mesh, placements)
            split.name = whole_value.name  # the state dict is keyed by accumulator names
            accumulators[parameter.name] = split
    targets = optimizer.state_dict()
    optimizer.set_state_dict({
        key: dtensor_from_local(value, targets[key].process_mesh, targets[key].placements)
        if isinstance(targets.get(key), paddle.Tensor) and targets[key].is_dist() else value
        for key, value in state.items()
    })
