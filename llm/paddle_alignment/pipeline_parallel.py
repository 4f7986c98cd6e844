"""Training through fleet's pipeline parallel (`PipelineLayer` + `PipelineParallel`, 1F1B) on every device,
and the whole model a pipeline-trained run generates with.

Each pipeline stage holds its layers with their optimizer states; generation, the behaviour and reference
log-probs and the critic's values run on a whole, non-pipeline model on each rank (PaddleNLP's `eval_mode
single`), whose layers of the rank's own stage are the stage's parameters (hold_stage_parameters); after each
update `move_weights` brings it the other stages' weights, each stage broadcasting over the pipeline group
what some rank lacks, in buckets of at most BUCKET_BYTES (tensor_parallel.py).

On CPU, two of fleet's device calls have no gloo path, and `bridge_to_gloo` replaces them (the same kind of
bridge as the sharding stages' in group_sharded.py): `PipelineLayer` reads `ParallelEnv().device_id`, which a
CPU process never sets, and the p2p layer sends on the "calc stream", which gloo's process group does not
implement; its plain asynchronous send and receive are used instead, every transfer of one exchange posted
before any is waited on, so the two directions of 1F1B's steady state cannot block each other. On GPUs
fleet's NCCL path runs unchanged.
"""

import copy
import json
import os
import random
import weakref
from dataclasses import dataclass

import numpy as np
import paddle
import paddle.distributed as dist
import safetensors.numpy
from paddle.distributed.fleet.meta_parallel import PipelineLayer
from paddle.distributed.fleet.meta_parallel.pp_utils import p2p_communication
from paddlenlp.trainer.trainer_utils import _get_distributed_seeds
from paddlenlp.utils.env import SAFE_WEIGHTS_INDEX_NAME
from safetensors import safe_open

from paddle_alignment.distributed import collective, hybrid_communicate_group
from paddle_alignment.models.hf_layout import safetensors_files
from paddle_alignment.models.tensor_parallel import broadcast_parts, buckets, check_splittable, is_tensor_parallel, shard_model
from paddle_alignment.stage_tensor_parallel import (
    bridge_mp_ops_to_gloo,
    gathered_weights,
    split_weight_names,
    stage_weights_from_whole,
)


def bridge_to_gloo():
    """Make fleet's pipeline parallel run between CPU processes (see the module docstring); idempotent."""
    if getattr(dist.ParallelEnv(), "_device_id", None) is None:
        dist.ParallelEnv._device_id = 0  # the CPU "device"; PipelineLayer only records it
    p2p_communication.batch_send_recv_on_calc_stream = gloo_send_recv
    p2p_communication.allgather_partial = already_whole


def already_whole(tensor, nranks=1, rank_id=0, group=None, use_calc_stream=True):
    """fleet's gather of a tensor-parallel rank's share of a received activation: gloo_send_recv sends each
    tensor whole (gloo has no partial send), so nothing is left to gather."""
    return tensor


def gloo_send_recv(p2p_ops):
    """fleet's batched exchange between neighbouring stages (P2PonCalcStream ops) as gloo's asynchronous
    sends and receives, all posted, then all waited on."""
    tasks = []
    for op in p2p_ops:
        peer = op.group.get_group_rank(op.peer)
        if op.op is p2p_communication._send_on_calc_stream:
            tasks.append(op.group.process_group.send(op.tensor, peer, False))
        else:
            tasks.append(op.group.process_group.recv(op.tensor, peer, False))
    with collective("a pipeline stage's activation exchange"):
        for task in tasks:
            task.wait()


def pipeline_group():
    """fleet's pipeline group when the run has more than one stage, else None."""
    hcg = hybrid_communicate_group()
    if hcg is None or hcg.get_pipe_parallel_world_size() <= 1:
        return None
    return hcg.get_pipe_parallel_group()


def pipe_from_whole(pipe_class, whole, *args, **kwargs):
    """A pipeline stage of `pipe_class(whole.config, *args, **kwargs)` holding `whole`'s weights of its layers
    (paddlenlp's pipes name their parameters as the plain model does)."""
    if paddle.device.get_device() == "cpu":
        bridge_to_gloo()
    # Each stage initialises different layers (then overwritten): the random state is put back, so that the
    # stages, like one process, draw the same samples afterwards.
    random_state = paddle.get_rng_state()
    try:
        pipe = pipe_class(stage_config(whole.config), *args, **kwargs)
    finally:
        paddle.set_rng_state(random_state)
    state, held = whole.state_dict(), pipe.state_dict()
    missing = set(held) - set(state)
    if missing:
        raise ValueError(f"{type(whole).__name__} has no weights for the pipeline stage's {sorted(missing)[:5]}")
    pipe.set_state_dict(stage_weights_from_whole(pipe, state))
    outside = {name: buffer for name, buffer in whole.named_buffers() if name in state and name not in held}
    WHOLE_MODELS[pipe] = WholeModel(type(whole).__name__, outside)
    mark_shared_weight_copies(pipe)
    hold_stage_parameters(whole, pipe)
    return pipe


def stage_config(config):
    """A copy of a whole model's `config` for its pipeline stage: under tensor parallel, paddlenlp's pipes build
    fleet's split layers from its tensor_parallel_degree and rank, and the LM head gathers whole logits (the RL
    objectives take the log-probs of the whole vocabulary)."""
    config = copy.deepcopy(config)
    hcg = hybrid_communicate_group()
    degree = hcg.get_model_parallel_world_size()
    if degree > 1:
        check_splittable(config, degree)
        if paddle.device.get_device() == "cpu":
            bridge_mp_ops_to_gloo()
        config.tensor_parallel_degree, config.tensor_parallel_rank = degree, hcg.get_model_parallel_rank()
        config.tensor_parallel_output = False
    return config


def hold_stage_parameters(whole, pipe):
    """`whole` made to hold the stage's own parameters in place of its copies of them (every reference to a
    copy, a tied embedding's two included): a rank keeps one copy of its stage's weights, which the whole
    model always has current, and a weight move only brings the other stages' weights."""
    holders = {}  # id(parameter) -> the (layer, attribute) pairs that hold it
    for layer in whole.sublayers(include_self=True):
        for attribute, parameter in layer._parameters.items():
            if parameter is not None:
                holders.setdefault(id(parameter), []).append((layer, attribute))
    copies = whole.state_dict()  # (a tied head's name too: the same parameter as the embedding's)
    split = split_weight_names(pipe)  # blocks of the whole model's weights, which it keeps (move_weights)
    for name, parameter in pipe.state_dict().items():  # the stage's parameters themselves, by their plain names
        if name in copies and name not in split:
            for layer, attribute in holders[id(copies[name])]:
                setattr(layer, attribute, parameter)


def mark_shared_weight_copies(pipe):
    """A weight two stages share (a tied embedding and LM head) counted once in the gradient norm: fleet's
    clip skips a parameter whose `is_firstly_shared` is False, but PipelineLayer compares the parameters'
    generated names with the attribute names when it sets that flag, so it never does, and the clip counts the
    shared gradient on every stage holding it. Set here by the stages' rule: the lowest rank's copy counts."""
    for comm in pipe.shared_comm.values():
        for attribute in comm["weight_attr"]:
            getattr(comm["layer"], attribute).is_firstly_shared = dist.get_rank() == min(comm["ranks"])


@dataclass
class WholeModel:
    """What save_stages writes of the whole model a pipe was cut from, besides the stages' weights: its class
    (config.json's architectures, which paddlenlp's VisualDL callback sets to the pipe's) and its saved buffers
    that no stage holds (a score model's normalizer statistics), so that the folder loads whole with nothing
    missing."""

    architecture: str
    buffers_outside_stages: dict


WHOLE_MODELS = weakref.WeakKeyDictionary()  # pipe -> WholeModel, beside the pipe

# What each stage holds, gathered once per pipe: {pipe: {what: [each stage's]}}, kept beside the pipe (an
# attribute set on paddlenlp's pipe was not kept).
GATHERED = weakref.WeakKeyDictionary()


def gathered_over_stages(pipe, what, value):
    """[every stage's `value`] for `what`, gathered over the pipeline group on the first call for `pipe`."""
    known = GATHERED.setdefault(pipe, {})
    if what not in known:
        known[what] = []
        with collective(f"the pipeline stages' {what}"):
            dist.all_gather_object(known[what], value(), group=pipeline_group())
    return known[what]


def stage_names(pipe):
    """Every stage's {parameter name (the plain model's): bytes of the whole weight}."""
    degree = hybrid_communicate_group().get_model_parallel_world_size()

    def sizes():
        split = split_weight_names(pipe)
        return {name: int(np.prod(t.shape)) * t.element_size() * (degree if name in split else 1) for name, t in pipe.state_dict().items()}

    return gathered_over_stages(pipe, "parameter names", sizes)


def owning_stages(pipe, whole):
    """{stage: [parameters of `whole` that stage broadcasts]}: each parameter of `whole` that some stage does not
    hold, under the first stage that holds it. With hold_stage_parameters a stage's parameters are its own,
    current without a move (a tied embedding is so on the first and the last stage)."""

    def held():  # the stage's own parameters and the whole weights it gathers from tensor-parallel blocks
        copies = whole.state_dict()
        own = {id(copies[name]) for name in pipe.state_dict()}
        return sorted(name for name, parameter in whole.named_parameters() if id(parameter) in own)

    stages = [set(names) for names in gathered_over_stages(pipe, f"parameters of {type(whole).__name__}", held)]
    owned, unowned = {}, []
    for name, parameter in whole.named_parameters():
        holders = [stage for stage, names in enumerate(stages) if name in names]
        if not holders:
            unowned.append(name)
        elif len(holders) < len(stages):
            owned.setdefault(holders[0], []).append(parameter)
    if unowned:
        raise ValueError(f"no pipeline stage holds {unowned[:5]} of {type(whole).__name__}")
    return owned


@paddle.no_grad()
def move_weights(pipe, whole):
    """`whole`'s parameters that this rank's stage does not hold (see hold_stage_parameters) set to the stages'
    current values: those the stage holds in tensor-parallel blocks gathered over the tensor-parallel group,
    then each broadcast over the pipeline group by the first stage holding it. Every rank calls it. A `whole`
    split for the rollout (eval_mode tensor_parallel) takes them by move_into_split_model."""
    if is_tensor_parallel(whole):
        return move_into_split_model(pipe, whole)
    copies = whole.state_dict()
    for name in split_weight_names(pipe):  # one whole weight at a time
        paddle.assign(gathered_weights(pipe, [name])[name], output=copies[name])
    group = pipeline_group()
    for source_stage, parameters in sorted(owning_stages(pipe, whole).items()):
        broadcast_parts(parameters, group.ranks[source_stage], group, "the weight move from the pipeline stages")


def split_for_rollout(model, degree):
    """`model` (None as None) split by the tensor-parallel plan over the `degree` ranks of this data replica, its
    pipeline x tensor-parallel ranks (eval_mode tensor_parallel; unchanged at degree 1). Nothing trains through
    it: the stages train, and move_weights gives it their weights."""
    if model is None or degree <= 1:
        return model
    model = shard_model(model, degree, hybrid_communicate_group().get_check_parallel_group())
    for parameter in model.parameters():
        parameter.stop_gradient = True
    return model


def stage_sources(pipe, whole):
    """{stage: [(parameter of `whole`, its name on that stage)]}: each parameter under the first stage holding
    it by one of its names (a tied LM head is the embedding under a second name)."""
    stages, names_of = stage_names(pipe), {}
    for name, tensor in whole.state_dict().items():
        names_of.setdefault(id(tensor), []).append(name)
    sources = {}
    for name, parameter in whole.named_parameters():
        held = [(stage, alias) for stage, names in enumerate(stages) for alias in names_of[id(parameter)] if alias in names]
        if not held:
            raise ValueError(f"no pipeline stage holds {name} of {type(whole).__name__}")
        stage, alias = held[0]
        sources.setdefault(stage, []).append((parameter, alias))
    return sources


@paddle.no_grad()
def move_into_split_model(pipe, whole):
    """`whole`, split over the ranks of a data replica (split_for_rollout), given the stages' current weights:
    each weight, whole on its stage (its tensor-parallel blocks gathered), broadcast over the data replica in
    buckets by that stage's first tensor-parallel rank; every rank keeps its block of it."""
    hcg = hybrid_communicate_group()
    group, topology = hcg.get_check_parallel_group(), hcg.topology()
    coordinates = topology.get_coord(dist.get_rank())._asdict()
    for stage, weights in sorted(stage_sources(pipe, whole).items()):
        source = topology.get_rank(**{**coordinates, "pipe": stage, "model": 0})
        for bucket in buckets(weights, tensor_of=lambda weight: weight[0]):
            sizes = [int(np.prod(parameter.shape)) for parameter, _ in bucket]
            if stage == hcg.get_stage_id():  # one bucket of the stage's weights whole at a time
                values = whole_stage_weights(pipe, [name for _, name in bucket])
            if dist.get_rank() == source:
                fused = paddle.concat([values[name].flatten() for _, name in bucket])
            else:
                fused = paddle.empty([sum(sizes)], dtype=bucket[0][0].dtype)
            with collective("the weight move from the pipeline stages into the rollout's split models"):
                dist.broadcast(fused, src=source, group=group)
            for (parameter, _), value in zip(bucket, paddle.split(fused, sizes)):
                keep_block(parameter, value.reshape(parameter.shape))


def whole_stage_weights(pipe, names):
    """{name: whole value} of the stage's weights `names`, those fleet splits gathered over the tensor-parallel
    group (every rank of it calls this)."""
    state, split = pipe.state_dict(), split_weight_names(pipe)
    return {name: state[name] for name in names} | gathered_weights(pipe, [name for name in names if name in split])


def keep_block(parameter, value):
    """This rank's block of the whole `value` written into the split `parameter` (a one-dimensional mesh)."""
    placement = parameter.placements[0]
    if placement.is_shard():
        mesh, axis = parameter.process_mesh, placement.get_dim()
        width = value.shape[axis] // mesh.shape[0]
        index = mesh.process_ids.index(dist.get_rank())
        value = paddle.slice(value, [axis], [index * width], [(index + 1) * width])
    paddle.assign(value, output=parameter._local_value())


def check_same_rows(input_ids):
    """Stop when the stages (and tensor-parallel ranks) of a data rank hold different rollouts: each samples its
    own copy of the batch, and one whose copy differed would train on another's activations and labels."""
    group = hybrid_communicate_group().get_check_parallel_group()
    digest = paddle.to_tensor([input_ids.shape[0], input_ids.shape[1], int((input_ids * (paddle.arange(input_ids.shape[1]) + 1)).sum())], dtype="int64")
    gathered = []
    with collective("the pipeline stages' check of their rollouts"):
        dist.all_gather(gathered, digest, group=group)
    digests = [tuple(d.numpy().tolist()) for d in gathered]
    if len(set(digests)) > 1:
        raise RuntimeError(
            f"the pipeline stages (ranks {group.ranks}) sampled different rollouts ({digests}: rows, width, "
            "token digest): their random states or whole models have drifted apart"
        )


def is_pipeline_stage(model):
    return isinstance(model, PipelineLayer) and pipeline_group() is not None


def save_stages(pipe, folder, tokenizer):
    """The model whose stages the pipeline group holds, written to `folder` as one from_pretrained-loadable
    model in any layout: each stage's weights by its first data rank into a safetensors shard of its own (the
    last stage's with the buffers no stage holds), the shards' index, config and tokenizer by rank 0
    (paddlenlp's sharded-checkpoint layout). Every rank calls it."""
    hcg = hybrid_communicate_group()
    stages, stage = hcg.get_pipe_parallel_world_size(), hcg.get_stage_id()
    names = stage_names(pipe)
    files = [f"model-{index + 1:05d}-of-{stages:05d}.safetensors" for index in range(stages)]
    weight_map, total_size = {}, 0
    for index, held in enumerate(names):
        for name in sorted(set(held) - set(weight_map)):
            weight_map[name], total_size = files[index], total_size + held[name]
    whole = WHOLE_MODELS[pipe]
    outside = whole.buffers_outside_stages
    for name, buffer in outside.items():  # written with the last stage's weights
        weight_map[name], total_size = files[-1], total_size + int(np.prod(buffer.shape)) * buffer.element_size()
    os.makedirs(folder, exist_ok=True)
    own = whole_stage_weights(pipe, sorted(name for name in pipe.state_dict() if weight_map[name] == files[stage]))
    if stage == stages - 1:
        own |= outside
    if hcg.get_data_parallel_rank() == 0 and hcg.get_sharding_parallel_rank() == 0 and hcg.get_model_parallel_rank() == 0:
        own = {name: tensor.cpu().numpy() for name, tensor in own.items()}
        safetensors.numpy.save_file(own, os.path.join(folder, files[stage]), metadata={"format": "np"})
    if dist.get_rank() == 0:
        index = {"metadata": {"total_size": total_size}, "weight_map": weight_map}
        with open(os.path.join(folder, SAFE_WEIGHTS_INDEX_NAME), "w") as f:
            json.dump(index, f, indent=2)
        config = copy.deepcopy(pipe.config)  # the model's, not a tensor-parallel stage's (stage_config)
        config.tensor_parallel_degree, config.tensor_parallel_rank = 1, 0
        config.architectures = [whole.architecture]
        config.save_pretrained(folder)
        tokenizer.save_pretrained(folder)


@paddle.no_grad()
def load_stages(pipe, folder):
    """`pipe`'s weights from the safetensors of `folder` (save_stages' or save_model's, paddlenlp's names), and
    the whole model's buffers no stage holds (WholeModel): each rank reads only its stage's tensors, and cuts
    its tensor-parallel blocks from them."""
    found = safetensors_files(folder)
    if not found or found[1]:
        raise ValueError(f"{folder} holds no safetensors in paddlenlp's layout to resume the pipeline stage from")
    outside = WHOLE_MODELS[pipe].buffers_outside_stages
    wanted, read = set(pipe.state_dict()) | set(outside), {}
    for path in found[0]:
        with safe_open(path, framework="np") as f:
            read |= {name: paddle.to_tensor(f.get_tensor(name)) for name in f.keys() if name in wanted}
    missing = wanted - set(read)
    if missing:
        raise ValueError(f"{folder} lacks the pipeline stage's {sorted(missing)[:5]}")
    for name, buffer in outside.items():
        paddle.assign(read.pop(name), output=buffer)
    pipe.set_state_dict(stage_weights_from_whole(pipe, read))


def check_whole_micro_batches(args, rows):
    """Under pipeline parallel with gradient accumulation, every micro-batch of a step must have as many rows
    (fleet sends a step's activation shape once). A training set of `rows` whose share per data rank does not
    divide into per_device_train_batch_size ends each epoch on a short batch, which needs dataloader_drop_last
    (PaddleNLP's advice under pipeline parallel)."""
    if args.pipeline_parallel_degree <= 1 or args.gradient_accumulation_steps <= 1 or args.dataloader_drop_last:
        return
    ranks, size = args.dataset_world_size, args.per_device_train_batch_size
    share = -(-rows // ranks)
    if share % size:
        raise ValueError(
            f"{rows} training rows over {ranks} data rank(s) end each epoch on a batch of {share % size} rows, short of "
            f"per_device_train_batch_size={size}, which a pipeline step of gradient_accumulation_steps="
            f"{args.gradient_accumulation_steps} cannot hold beside full ones: set dataloader_drop_last true to leave it out"
        )


def seed_stages_alike(seed):
    """After paddlenlp's set_seed, which seeds each pipeline stage apart (for stages that initialise their own
    layers): every stage of a data rank seeded as its first stage is. Here every stage runs the same rollout on
    the whole models, so their samples, and any freshly initialised weight, must be the same."""
    hcg = hybrid_communicate_group()
    if hcg is None or hcg.get_pipe_parallel_world_size() <= 1:
        return
    stage_offset = hcg.get_stage_id() * hcg.get_model_parallel_world_size() * getattr(hcg, "get_sep_parallel_world_size", lambda: 1)()
    global_seed, _, _ = _get_distributed_seeds(seed)
    paddle.seed(global_seed - stage_offset)
    random.seed(seed)  # paddlenlp's random seed of the first stage
    np.random.seed(seed)
