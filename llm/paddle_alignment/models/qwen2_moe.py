"""Qwen2-MoE (Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B) on paddlenlp's Qwen2-MoE classes, its experts routed as
transformers' `modeling_qwen2_moe` routes them.

paddlenlp 3.0.0b4's sparse block dispatches tokens through a capacity-based gate written for expert parallel,
which stops under Paddle 3 (an int32/int64 cumsum) and is not the model's math anyway: here each token goes to
its `num_experts_per_tok` experts of highest router probability (softmax over all experts in float32,
renormalised over the chosen ones with `norm_topk_prob`), their SwiGLU outputs are summed by those weights, and
the shared expert is added under its sigmoid gate. Experts run one after another on the tokens routed to them.
The router's load-balancing loss is not computed (`output_router_logits` true is refused at load; the released
configs set it false). The parameter names are paddlenlp's, which are transformers' (`mlp.gate.weight`,
`mlp.experts.E.gate_proj.weight`, `mlp.shared_expert...`).
"""

import paddle
import paddle.nn.functional as F
from paddle import nn
from paddlenlp.transformers.qwen2_moe import modeling as qwen2_moe_modeling

from paddle_alignment.models.layer_swap import add_decoder_layers, without_decoder_layers


class SparseMoeBlock(nn.Layer):
    """Qwen2-MoE's sparse block (and Qwen3-MoE's, which has no shared expert: shared_expert_intermediate_size 0)."""

    def __init__(self, config):
        super().__init__()
        self.top_k, self.norm_topk_prob = config.num_experts_per_tok, config.norm_topk_prob
        self.gate = nn.Linear(config.hidden_size, config.num_experts, bias_attr=False)
        self.experts = nn.LayerList([qwen2_moe_modeling.Qwen2MoeMLP(config) for _ in range(config.num_experts)])
        self.shared_expert = None
        if getattr(config, "shared_expert_intermediate_size", 0):
            self.shared_expert = qwen2_moe_modeling.Qwen2MoeMLP(config, is_shared=True)
            self.shared_expert_gate = nn.Linear(config.hidden_size, 1, bias_attr=False)

    def forward(self, hidden_states):
        """hidden_states [..., hidden] -> the block's output, of that shape."""
        tokens = hidden_states.reshape([-1, hidden_states.shape[-1]])
        router_logits = self.gate(tokens)
        probabilities = F.softmax(router_logits.astype("float32"), axis=-1)
        weights, chosen = paddle.topk(probabilities, self.top_k, axis=-1)  # [tokens, top_k]
        if self.norm_topk_prob:
            weights = weights / weights.sum(axis=-1, keepdim=True)
        weights = weights.astype(tokens.dtype)
        output = paddle.zeros_like(tokens)
        for index, expert in enumerate(self.experts):
            pairs = paddle.nonzero(chosen == index)  # [routed tokens, 2]: (row, slot of the top k)
            if pairs.shape[0] == 0:
                continue
            rows, slots = pairs[:, 0], pairs[:, 1]
            routed = expert(paddle.gather(tokens, rows)) * weights[rows, slots].unsqueeze(-1)
            output = paddle.index_add(output, rows, 0, routed)
        if self.shared_expert is not None:
            output = output + F.sigmoid(self.shared_expert_gate(tokens)) * self.shared_expert(tokens)
        return output.reshape(hidden_states.shape)


class Qwen2MoeDecoderLayer(qwen2_moe_modeling.Qwen2MoeDecoderLayer):
    def __init__(self, config, layerwise_recompute=False, skip_recompute_ops=None):
        experts, config.num_experts = config.num_experts, 0  # paddlenlp's sparse block is never allocated
        try:
            super().__init__(config, layerwise_recompute)
        finally:
            config.num_experts = experts
        self.mlp = SparseMoeBlock(config)


class Qwen2MoeModel(qwen2_moe_modeling.Qwen2MoeModel):
    def __init__(self, config):
        with without_decoder_layers(config):
            super().__init__(config)
        add_decoder_layers(self, config, Qwen2MoeDecoderLayer)


class Qwen2MoeForCausalLM(qwen2_moe_modeling.Qwen2MoeForCausalLM):
    def __init__(self, config):
        with without_decoder_layers(config):
            super().__init__(config)
        add_decoder_layers(self.qwen2_moe, config, Qwen2MoeDecoderLayer)
