"""The fused CPU kernels (csrc/fused_ops.cc, csrc/attention_ops.cc via models/fused_kernels.py) against Paddle's
unfused ops.

    python benchmarks/bench_fused_kernels.py [--repeats 7]

Prints, in microseconds (median over repeats; fused and unfused runs interleaved, so load from other
processes falls on both):
- each op at the tiny demo's shapes (64 x 14 tokens, hidden 128, MLP 512, 4 heads of 32 and 2 KV heads,
  vocabulary 259), forward and forward + backward;
- the demo's model (a fresh 4-layer, hidden-128 Qwen2 from llm/tools/build_tiny_model.py) on 64 x 14
  tokens: the forward without gradients, and forward + token log-probs and entropy + backward, unpatched
  and with `use_fused_kernels(model)` (and the fused log-prob op).

The whole GRPO step with and without them: `PADDLE_ALIGNMENT_FUSED_KERNELS=off` switches them off, so

    python benchmarks/compare_env.py --rounds 3 --variant "unfused=PADDLE_ALIGNMENT_FUSED_KERNELS=off" \
        --variant "fused=" -- benchmarks/bench_grpo.py --random_model
"""

import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))

from paddle_alignment.cpu_runtime import configure_cpu_runtime, describe  # noqa: E402

configure_cpu_runtime()  # before paddle loads

import paddle  # noqa: E402
import paddle.nn.functional as F  # noqa: E402

from paddle_alignment.algos.token_stats import entropy_from_logits, gather_logprobs, tempered_logits  # noqa: E402
from paddle_alignment.models import fused_kernels  # noqa: E402
from paddle_alignment.models.fused_kernels import (  # noqa: E402
    fused_ops,
    rms_norm_reference,
    rotary_reference,
    token_logprobs_and_entropy,
    use_fused_kernels,
    use_unfused_kernels,
)
from llm.tools.build_tiny_model import build_tiny_model  # noqa: E402
from llm.tools.build_tokenizer import build_tokenizer  # noqa: E402

REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
TOKENS = (64, 14)  # 8 prompts x 8 samples, prompt + response positions of the demo
HIDDEN, MLP, HEADS, KV_HEADS, HEAD_DIM, VOCAB, RESPONSE = 128, 512, 4, 2, 32, 259, 8


def seconds_per_call(fn, calls):
    started = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - started) / calls


def compare(variants, repeats, calls, setup=None):
    """{name: median seconds per call}, the variants run in turn within each repeat; `setup[name]()`, when
    given, runs (untimed) before each block of a variant's calls."""
    setup = setup or {}
    for name, fn in variants.items():
        setup.get(name, lambda: None)()
        fn()  # warm-up
    samples = {name: [] for name in variants}
    for _ in range(repeats):
        for name, fn in variants.items():
            setup.get(name, lambda: None)()
            samples[name].append(seconds_per_call(fn, calls))
    return {name: statistics.median(values) for name, values in samples.items()}


def leaf(*shape, scale=1.0):
    t = paddle.randn(shape) * scale
    t.stop_gradient = False
    return t


def backward(outputs):
    def run():
        results = outputs()
        results = results if isinstance(results, (tuple, list)) else (results,)
        paddle.autograd.backward([r for r in results], [paddle.ones_like(r) for r in results])

    return run


def add_rms_norm_reference(x, residual, weight):
    total = x + residual
    return rms_norm_reference(total, weight, 1e-6), total


def op_cases():
    """name -> (unfused forward, fused forward), each a no-argument function returning the outputs."""
    ops = fused_ops()
    x, residual, weight = leaf(*TOKENS, HIDDEN), leaf(*TOKENS, HIDDEN), leaf(HIDDEN)
    gate, up = leaf(*TOKENS, MLP, scale=2.0), leaf(*TOKENS, MLP)
    q, k = leaf(*TOKENS, HEADS, HEAD_DIM), leaf(*TOKENS, KV_HEADS, HEAD_DIM)
    rope = fused_kernels.qwen2_modeling.Qwen2RotaryEmbedding(HEAD_DIM, max_position_embeddings=32)
    cos, sin = rope(q, seq_len=TOKENS[1])
    positions = paddle.arange(TOKENS[1], dtype="int64").expand(list(TOKENS))
    logits = leaf(TOKENS[0], RESPONSE, VOCAB, scale=3.0)
    labels = paddle.randint(0, VOCAB, [TOKENS[0], RESPONSE], dtype="int64")
    v = leaf(*TOKENS, KV_HEADS, HEAD_DIM)
    padding = paddle.to_tensor([i % 4 for i in range(TOKENS[0])])  # left padding of 0-3 tokens
    attention_mask = (paddle.arange(TOKENS[1])[None, :] >= padding[:, None]).astype("int64")
    mask = fused_kernels.qwen2_modeling.Qwen2Model._prepare_decoder_attention_mask(attention_mask, TOKENS, 0, paddle.float32)
    config = fused_kernels.qwen2_modeling.Qwen2Config(hidden_size=HEADS * HEAD_DIM, num_attention_heads=HEADS)
    groups = HEADS // KV_HEADS

    def reference_attention():
        repeat_kv = fused_kernels.UNFUSED_REPEAT_KV.get(fused_kernels.qwen2_modeling, fused_kernels.qwen2_modeling.repeat_kv)
        return fused_kernels.qwen2_modeling.scaled_dot_product_attention(
            q, config, repeat_kv(k, groups), repeat_kv(v, groups), mask, False, training=False
        )

    def reference_token_stats():
        tempered = tempered_logits(logits, 1.0)
        return gather_logprobs(tempered, labels), entropy_from_logits(tempered)

    return {
        "rms_norm [64,14,128]": (lambda: rms_norm_reference(x, weight, 1e-6), lambda: ops.fused_rms_norm(x, weight, 1e-6)[0]),
        "add + rms_norm [64,14,128]": (
            lambda: add_rms_norm_reference(x, residual, weight),
            lambda: tuple(ops.fused_add_rms_norm(x, residual, weight, 1e-6)[:2]),
        ),
        "swiglu [64,14,512]": (lambda: F.swiglu(gate, up), lambda: ops.fused_swiglu(gate, up)),
        "rotary q[64,14,4,32] k[64,14,2,32]": (
            lambda: rotary_reference(q, k, cos, sin, positions),
            lambda: tuple(ops.fused_rotary(q, k, cos, sin, positions)),
        ),
        "log-prob + entropy [64,8,259]": (reference_token_stats, lambda: tuple(ops.fused_token_logprobs(logits, labels, 1.0)[:2])),
        "attention q[64,14,4,32] kv[64,14,2,32]": (
            reference_attention, lambda: ops.fused_attention(q, k, v, mask, HEAD_DIM**-0.5)[0]
        ),
    }


def bench_ops(repeats):
    print(f"{'op':38s} {'unfused fwd':>12s} {'fused fwd':>10s} {'unfused f+b':>12s} {'fused f+b':>10s}   (us)")
    for name, (unfused, fused) in op_cases().items():
        with paddle.no_grad():
            forward = compare({"unfused": unfused, "fused": fused}, repeats, 50)
        both = compare({"unfused": backward(unfused), "fused": backward(fused)}, repeats, 20)
        print(
            f"{name:38s} {forward['unfused'] * 1e6:12.0f} {forward['fused'] * 1e6:10.0f} "
            f"{both['unfused'] * 1e6:12.0f} {both['fused'] * 1e6:10.0f}"
        )


def tiny_model(work):
    build_tokenizer(os.path.join(work, "tokenizer"))
    return build_tiny_model(os.path.join(work, "tokenizer"), os.path.join(work, "model"))


def bench_model(repeats):
    model = tiny_model(tempfile.mkdtemp(prefix="bench_fused_"))
    input_ids = paddle.randint(0, VOCAB, list(TOKENS), dtype="int64")
    attention_mask = paddle.ones(list(TOKENS), dtype="int64")
    labels = input_ids[:, -RESPONSE:]

    def forward():
        with paddle.no_grad():
            return model(input_ids=input_ids, attention_mask=attention_mask)[0]

    def train_step(stats):
        def run():
            logits = model(input_ids=input_ids, attention_mask=attention_mask)[0][:, -RESPONSE - 1 : -1]
            logprobs, entropy = stats(logits, labels)
            (logprobs.mean() + 0.01 * entropy.mean()).backward()
            model.clear_gradients()

        return run

    def reference_stats(logits, labels):
        tempered = tempered_logits(logits, 1.0)
        return gather_logprobs(tempered, labels), entropy_from_logits(tempered)

    switch = {"unfused": lambda: use_unfused_kernels(model), "fused": lambda: use_fused_kernels(model)}
    model.eval()
    fwd = compare({"unfused": forward, "fused": forward}, repeats, 10, switch)
    model.train()
    step = compare(
        {"unfused": train_step(reference_stats), "fused": train_step(token_logprobs_and_entropy)}, repeats, 5, switch
    )
    use_unfused_kernels(model)
    print("\ntiny Qwen2 (4 layers, hidden 128) on 64 x 14 tokens   unfused     fused   (ms)")
    print(f"{'forward (no grad)':50s} {fwd['unfused'] * 1e3:9.1f} {fwd['fused'] * 1e3:9.1f}")
    print(f"{'forward + log-probs/entropy + backward':50s} {step['unfused'] * 1e3:9.1f} {step['fused'] * 1e3:9.1f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    if fused_ops() is None:
        sys.exit("paddlenlp_ops lacks the fused ops: python csrc/setup_cpu.py install")
    paddle.set_device("cpu")
    print(describe())
    paddle.seed(0)
    bench_ops(args.repeats)
    bench_model(args.repeats)


if __name__ == "__main__":
    main()
