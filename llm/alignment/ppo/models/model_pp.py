"""Pipeline-parallel policy, value and reward models, on paddlenlp's Qwen2 / Llama causal-LM pipes.

The policy pipes keep the causal LM's layers and take the RL policy objective as their pipeline loss; the
value and reward pipes replace the LM head with a score head and take the value objective, or the pairwise
loss of reward-model training (run_reward.py). Each builds its loss from an objective given at construction
(`PolicyObjective` / `ValueObjective` of ppo_model_utils.py, `scored_pairs` of algos/pairwise.py), the same
the plain models train with:

    Qwen2PolicyPipe.from_pretrained(path, objective=PolicyObjective.from_args(args))
    Qwen2ValuePipe.from_pretrained(path, objective=ValueObjective.from_args(args))

`from_pretrained` reads the plain checkpoints: a causal LM's for the policy (`qwen2.*`, `lm_head.*`), a
score model's for the value pipe (`qwen2.*`, `score_head.*`; a causal LM's starts a fresh score head).
paddlenlp's PipelinePretrainedModel names each pipeline layer's parameters with the prefix it was added
under (`add_sequential_layer(desc, prefix)`), so `state_dict()` / `set_state_dict()` speak the plain
names; the score head is added under `score_head`, the name the score model gives it. For the same reason
`save_pretrained` of a single-stage pipe writes a checkpoint the plain classes load (a value pipe's has no
normalizer statistics: the score model starts an identity normalizer). How to pack a batch for
`train_batch` is described in pp_model_utils.py.
"""

from paddle.distributed.fleet.meta_parallel import LayerDesc, SharedLayerDesc
from paddlenlp.transformers import LlamaForCausalLMPipe, Qwen2ForCausalLMPipe
from paddlenlp.transformers.llama.modeling import LlamaLMHead
from paddlenlp.transformers.qwen2.modeling import Qwen2LMHead

from llm.alignment.ppo.models.pp_model_utils import (
    NormalizedPairObjective,
    PairwisePipeLoss,
    PolicyPipeLoss,
    ScoreHeadPipe,
    TiedLMHead,
    ValuePipeLoss,
    pair_labels,
    policy_labels,
    same_width,
    split_pipeline_inputs,
    value_labels,
)
from paddle_alignment.data import IGNORE_INDEX
from paddle_alignment.distributed import hybrid_communicate_group
from paddle_alignment.models.ppo_model_utils import PolicyObjective, ValueObjective
from paddle_alignment.models.score_model import apply_score_config, refuse_sequence_parallel
from paddle_alignment.pipeline_parallel import pipe_from_whole

LM_HEAD_PREFIX = "lm_head"
SCORE_HEAD_PREFIX = "score_head"


class ObjectivePipeMixin:
    """What the policy, value and reward pipes share: the objective their pipeline loss is built from."""

    def __init__(self, config, objective):
        # PipelineLayer builds the loss inside the base __init__ (get_loss_fn), so the objective goes first.
        self.objective = objective
        super().__init__(config)

    @property
    def pipeline_loss(self):
        """The pipeline's loss layer; on the last stage its `pop_stats()` gives the statistics of the
        micro-batches it has seen since the last call (policy and value pipes)."""
        return self._loss_fn[0]


class PolicyPipeMixin(ObjectivePipeMixin):
    """A causal-LM pipe whose pipeline loss is the RL policy objective. `lm_head_class`: the model's LM head."""

    lm_head_class = None

    @classmethod
    def _prepare_pipeline_inputs_func(cls, inputs):
        return split_pipeline_inputs(inputs, policy_labels)

    def get_loss_fn(self, config):
        return PolicyPipeLoss(self.objective)

    def add_sequential_layer(self, layer_desc, name_prefix=""):
        if name_prefix == LM_HEAD_PREFIX and isinstance(layer_desc, SharedLayerDesc):
            # Tied embeddings: without a forward_func the head fails on a stage that also holds the embedding.
            layer_desc.forward_func = TiedLMHead(self.lm_head_class, self.config)
        super().add_sequential_layer(layer_desc, name_prefix)


class ScorePipeMixin(ObjectivePipeMixin):
    """A causal-LM pipe with a score head in place of the LM head. Score settings come from the config (a score
    checkpoint's) or keyword overrides, as for the plain score models; the pipe returns raw scores."""

    def __init__(self, config, objective, **score_overrides):
        apply_score_config(config, **score_overrides)
        self.check_score_config(config)
        refuse_sequence_parallel(config)
        super().__init__(config, objective)

    def check_score_config(self, config):
        pass

    def add_sequential_layer(self, layer_desc, name_prefix=""):
        if name_prefix == LM_HEAD_PREFIX:
            layer_desc, name_prefix = LayerDesc(ScoreHeadPipe, config=self.config), SCORE_HEAD_PREFIX
        elif isinstance(layer_desc, SharedLayerDesc):
            # Without an LM head there is nothing to tie the embedding to: an ordinary layer, no shared weight.
            layer_desc = LayerDesc(layer_desc.layer_func, *layer_desc.inputs, **layer_desc.kwargs)
        super().add_sequential_layer(layer_desc, name_prefix)


class ValuePipeMixin(ScorePipeMixin):
    """The critic: a score pipe whose pipeline loss is the value objective, on raw values (`do_normalize` off)."""

    def check_score_config(self, config):
        if config.do_normalize:
            raise ValueError("a value pipe returns raw values: load it with do_normalize=False")

    @classmethod
    def _prepare_pipeline_inputs_func(cls, inputs):
        return split_pipeline_inputs(inputs, value_labels)

    def get_loss_fn(self, config):
        return ValuePipeLoss(self.objective)


class RewardPipeMixin(ScorePipeMixin):
    """The reward model in training: a score pipe whose pipeline loss is the pairwise loss of a collated batch
    of preference pairs (a `NormalizedPairObjective`: the normalizer's statistics and `do_normalize` as the
    score model's forward keeps them)."""

    @classmethod
    def _prepare_pipeline_inputs_func(cls, inputs):
        if isinstance(inputs, list):  # a step's collated batches from paddlenlp's Trainer
            inputs = same_width(inputs, {"input_ids": 0, "attention_mask": 0})
        return split_pipeline_inputs(inputs, pair_labels)

    def get_loss_fn(self, config):
        return PairwisePipeLoss(self.objective)


# A score checkpoint's normalizer statistics have no use in a critic that keeps raw values.
CRITIC_IGNORED_KEYS = [r"normalizer\."]


class Qwen2PolicyPipe(PolicyPipeMixin, Qwen2ForCausalLMPipe):
    lm_head_class = Qwen2LMHead


class LlamaPolicyPipe(PolicyPipeMixin, LlamaForCausalLMPipe):
    lm_head_class = LlamaLMHead


class Qwen2ValuePipe(ValuePipeMixin, Qwen2ForCausalLMPipe):
    _keys_to_ignore_on_load_unexpected = Qwen2ForCausalLMPipe._keys_to_ignore_on_load_unexpected + CRITIC_IGNORED_KEYS


class LlamaValuePipe(ValuePipeMixin, LlamaForCausalLMPipe):
    _keys_to_ignore_on_load_unexpected = LlamaForCausalLMPipe._keys_to_ignore_on_load_unexpected + CRITIC_IGNORED_KEYS


class Qwen2RewardPipe(RewardPipeMixin, Qwen2ForCausalLMPipe):
    pass


class LlamaRewardPipe(RewardPipeMixin, LlamaForCausalLMPipe):
    pass


class FinetunePipeMixin:
    """paddlenlp's causal-LM pipe as run_finetune trains it: each step's collated batches padded on the right to
    one width (same_width) before paddlenlp packs them."""

    @classmethod
    def _prepare_pipeline_inputs_func(cls, inputs):
        if isinstance(inputs, list):
            inputs = same_width(inputs, {"input_ids": 0, "labels": IGNORE_INDEX, "attention_mask": 0})
        return super()._prepare_pipeline_inputs_func(inputs)


class Qwen2FinetunePipe(FinetunePipeMixin, Qwen2ForCausalLMPipe):
    pass


class LlamaFinetunePipe(FinetunePipeMixin, LlamaForCausalLMPipe):
    pass


CAUSAL_LM_PIPES = {"qwen2": Qwen2FinetunePipe, "llama": LlamaFinetunePipe}
POLICY_PIPES = {"qwen2": Qwen2PolicyPipe, "llama": LlamaPolicyPipe}
VALUE_PIPES = {"qwen2": Qwen2ValuePipe, "llama": LlamaValuePipe}
REWARD_PIPES = {"qwen2": Qwen2RewardPipe, "llama": LlamaRewardPipe}


def pipe_class(pipes, config):
    model_type = getattr(config, "model_type", None)
    if model_type not in pipes:
        raise ValueError(f"no pipeline model for model_type {model_type!r}; supported: {sorted(pipes)}")
    return pipes[model_type]


def policy_pipe_class(config):
    """The policy pipe for a plain causal LM's config (by `model_type`: qwen2, llama)."""
    return pipe_class(POLICY_PIPES, config)


def value_pipe_class(config):
    """The value pipe for a plain causal LM's or score model's config (by `model_type`)."""
    return pipe_class(VALUE_PIPES, config)


def causal_lm_stage(model):
    """This rank's pipeline stage of the loaded causal LM `model` for supervised fine-tuning: paddlenlp's own
    pipe, its language-modelling loss, holding the model's weights."""
    return pipe_from_whole(pipe_class(CAUSAL_LM_PIPES, model.config), model)


def reward_model_stage(model, pair_objective):
    """This rank's pipeline stage of the loaded score model `model` for reward-model training: its backbone and
    score head as a pipe whose loss is `pair_objective` (algos/pairwise.py's `scored_pairs` with the run's loss)
    on scores normalized as `model` normalizes them, its normalizer's statistics gathered over the last stage's
    data ranks."""
    group = hybrid_communicate_group().get_data_parallel_group()
    objective = NormalizedPairObjective(pair_objective, model.normalizer, model.config.do_normalize, group)
    return pipe_from_whole(pipe_class(REWARD_PIPES, model.config), model, objective)


def pipeline_stages(actor, critic, args):
    """This rank's pipeline stages of the loaded `actor` and `critic` (None without one), holding their
    weights, their pipeline losses the run's policy and value objectives."""
    policy = pipe_from_whole(policy_pipe_class(actor.config), actor, PolicyObjective.from_args(args))
    value = None
    if critic is not None:
        value = pipe_from_whole(value_pipe_class(critic.config), critic, ValueObjective.from_args(args))
    return policy, value
