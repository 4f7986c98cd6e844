"""The no-gradient passes with the native decoder op (csrc/decoder_ops.cc) against Paddle's eager ops.

    python benchmarks/bench_native_forward.py [--repeats 15]

On a random tiny Qwen2 of the demo's shape (4 layers, hidden 128, 4 heads / 2 kv heads, intermediate 512,
the byte vocabulary), with the fused CPU kernels in its layers as run_ppo loads it, the GRPO benchmark's work:
- reference: one log-prob forward of 64 rows x (6 prompt + 8 response) tokens (RolloutWorker.compute_logprobs);
- decode: the static-cache decode loop's forwards for 64 rows, a 6-token prefill and 8 steps.
The eager and native variants alternate (the machine may be shared); each line gives the medians in ms
(weights gathering included), last line: reference_speedup=<eager / native>.
"""

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))

from paddle_alignment.cpu_runtime import configure_cpu_runtime, describe  # noqa: E402

configure_cpu_runtime()  # before paddle loads

import paddle  # noqa: E402
from paddlenlp.transformers import Qwen2Config, Qwen2ForCausalLM  # noqa: E402

from paddle_alignment.algos.token_stats import position_ids_from_mask  # noqa: E402
from paddle_alignment.models.fused_kernels import use_fused_kernels  # noqa: E402
from paddle_alignment.models.head_logprobs import head_logits  # noqa: E402
from paddle_alignment.models.native_forward import SWITCH, NativeDecoder, native_ops  # noqa: E402
from paddle_alignment.models.static_cache_decoder import StaticCacheDecoder  # noqa: E402

ROWS, PROMPT, RESPONSE, VOCAB = 64, 6, 8, 260


def demo_shaped_model():
    config = Qwen2Config(
        vocab_size=VOCAB, hidden_size=128, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=True,
    )
    paddle.seed(0)
    model = Qwen2ForCausalLM(config)
    model.eval()
    use_fused_kernels(model)
    return model


def reference_pass(model, input_ids, mask):
    native = NativeDecoder.for_model(model)
    if native is not None:
        hidden = native.response_hidden(input_ids, mask, PROMPT)
        return head_logits(hidden, native.lm_head.weight, native.lm_head.transpose)
    position_ids = position_ids_from_mask(mask)
    return model(input_ids=input_ids, attention_mask=mask, position_ids=position_ids, return_dict=True).logits


def decode_pass(model, input_ids, mask):
    decoder = StaticCacheDecoder(model, ROWS, PROMPT + RESPONSE, mask[:, :PROMPT])
    logits = decoder.prefill(input_ids[:, :PROMPT])
    for _ in range(RESPONSE):
        logits = decoder.step(paddle.argmax(logits, axis=-1))
    return logits


def timed(function, *args):
    started = time.perf_counter()
    function(*args)
    return 1000 * (time.perf_counter() - started)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    if native_ops() is None:
        sys.exit("paddlenlp_ops with native_decoder_forward is not installed (or switched off): python csrc/setup_cpu.py install")
    print(describe())
    model = demo_shaped_model()
    input_ids = paddle.randint(0, VOCAB, [ROWS, PROMPT + RESPONSE])
    mask = paddle.ones([ROWS, PROMPT + RESPONSE], dtype="int64")
    medians = {}
    with paddle.no_grad():
        for name, function in [("reference", reference_pass), ("decode", decode_pass)]:
            times = {"eager": [], "native": []}
            for round_index in range(args.repeats + 1):  # the first round warms up
                for variant in times:
                    os.environ[SWITCH] = "off" if variant == "eager" else "on"
                    elapsed = timed(function, model, input_ids, mask)
                    if round_index > 0:
                        times[variant].append(elapsed)
            medians[name] = {variant: statistics.median(values) for variant, values in times.items()}
            print(f"{name}: eager {medians[name]['eager']:.1f} ms, native {medians[name]['native']:.1f} ms "
                  f"({medians[name]['eager'] / medians[name]['native']:.2f}x), medians of {args.repeats}")
    print(f"reference_speedup={medians['reference']['eager'] / medians['reference']['native']:.2f}")


if __name__ == "__main__":
    main()
