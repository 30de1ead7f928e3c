"""Serving on this CPU: static vs continuous batching, speculative decoding, int8 kernels.

    python benchmarks/bench_serve.py           # three workload seeds, k = 1 ... 6, best of 3
    python benchmarks/bench_serve.py --quick   # one seed, fewer k, one run each

The target (2 blocks, d = 64) and the draft (1 block, d = 32) are trained as in notebook 14:
character-level, the course corpus, 200 Trainer steps in float32, seed 0.

1. Batching. A workload of 24 requests (prompts of 6-24 characters from the validation stories,
   4-36 new tokens, one arriving every 2 engine steps; the workload seed draws the lengths).
   Static batching (`serve_static`, batches of 4) against continuous batching (`Scheduler`,
   at most 4 running, paged cache with blocks of 4). Both are greedy and must give the same
   tokens. Printed: steps, wall time, tokens/s, mean latency in steps and in seconds (latency in
   steps x that scheme's measured seconds per step; arrivals are counted in engine steps).
2. Speculative decoding, greedy, 3 prompts x 40 tokens, against the target alone with its KV
   cache (`generate`): acceptance rate (accepted / checked drafted tokens, as in notebook 14),
   target passes per token, wall-clock speed-up.
3. Weight-only int8 on a 1024 -> 4096 Linear: float32, our dequantize-then-multiply,
   `torch._weight_int8pack_mm` (PyTorch's weight-only int8 CPU kernel) and `torch.ao`'s dynamic
   int8 quantization, for 1 and 16 rows.

No budget is enforced: the script prints its figures (exit status 0).
"""

from __future__ import annotations

import argparse
import random
import time
import warnings

import torch

from helpers.model.generation import generate
from helpers.model.gpt import GPT, GPTConfig
from helpers.serve.quantize import dequantize_int8, quantize_int8
from helpers.serve.scheduler import Request, serve_continuous, serve_static
from helpers.serve.speculative import speculative_generate
from helpers.text.chars import CharTokenizer
from helpers.text.corpus import load_corpus
from helpers.timing import best_time
from helpers.training.trainer import TrainConfig, Trainer, encode_text, split_stories


def train_models() -> tuple[GPT, GPT, CharTokenizer, list[str]]:
    text = load_corpus()[:200_000]
    tokenizer = CharTokenizer.train(text)
    train_text, val_text = split_stories(text)
    train_ids, val_ids = encode_text(tokenizer, train_text), encode_text(tokenizer, val_text)
    models = []
    for layers, heads, width in ((2, 4, 64), (1, 2, 32)):
        torch.manual_seed(0)
        model = GPT(GPTConfig(vocab_size=len(tokenizer.chars), context_length=64, n_layers=layers,
                              n_heads=heads, d_model=width))
        Trainer(model, train_ids, val_ids, TrainConfig(batch_size=16, learning_rate=5e-3,
                                                       precision="fp32")).fit(steps=200, progress_bar=False)
        models.append(model.eval())
    return models[0], models[1], tokenizer, val_text.split("\n\n")


def workload(seed: int, tokenizer: CharTokenizer, stories: list[str], n: int = 24) -> list[Request]:
    rng = random.Random(seed)
    return [Request(i, tuple(tokenizer.encode(stories[i][:rng.randint(6, 24)])), rng.randint(4, 36),
                    arrival=2 * i) for i in range(n)]


def bench_batching(target: GPT, requests: list[Request], repeats: int) -> None:
    results = {}
    for name, serve in (("static", lambda: serve_static(target, requests, batch_size=4)),
                        ("continuous", lambda: serve_continuous(target, requests, 4, 4, 128)[0])):
        seconds, served = [], None
        for _ in range(repeats):
            start = time.perf_counter()
            served = serve()
            seconds.append(time.perf_counter() - start)
        results[name] = (min(seconds), served)
    tokens = sum(r.max_new_tokens for r in requests)
    assert [s.tokens for s in results["static"][1]] == [s.tokens for s in results["continuous"][1]]
    for name, (seconds, served) in results.items():
        steps = max(s.finished for s in served) + 1
        latency = sum(s.latency for s in served) / len(served)
        print(f"  {name:>10}: {steps:4d} steps, {seconds * 1e3:7.1f} ms, {tokens / seconds:7.0f} tokens/s, "
              f"mean latency {latency:5.1f} steps = {latency * seconds / steps * 1e3:6.1f} ms")


NEW = 40  # tokens per prompt: 18-character prompts + 40 + k = 6 fit the context of 64


def bench_speculative(target: GPT, draft: GPT, tokenizer: CharTokenizer, ks: list[int], repeats: int) -> None:
    prompts = [tokenizer.encode(s) for s in ("Once upon a time, ", "The little dog ", "She said ")]
    plain = lambda: [generate(target, torch.tensor([p]), NEW, temperature=0) for p in prompts]  # noqa: E731
    base = best_time(plain, repeats=repeats)
    print(f"  target alone: {base * 1e3:.1f} ms for {NEW * len(prompts)} tokens")
    for k in ks:
        runs = lambda: [speculative_generate(target, draft, p, NEW, k=k, temperature=0) for p in prompts]  # noqa: E731, B023
        seconds = best_time(runs, repeats=repeats)
        stats = [s for _, s in runs()]
        passes = sum(s.target_passes for s in stats)
        rate = sum(s.accepted for s in stats) / sum(s.accepted + s.rejected for s in stats)  # of those checked
        print(f"  k = {k}: acceptance {rate:.2f}, target passes per token {passes / (NEW * len(prompts)):.2f}, "
              f"{seconds * 1e3:.1f} ms, speed-up {base / seconds:.2f}x")


def bench_int8(repeats: int) -> None:
    torch.manual_seed(0)
    linear = torch.nn.Linear(1024, 4096, bias=False).eval()
    q, scale = quantize_int8(linear.weight.detach())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao's eager quantization is deprecated in favour of torchao
        dynamic = torch.ao.quantization.quantize_dynamic(torch.nn.Sequential(linear), {torch.nn.Linear},
                                                         dtype=torch.qint8)
    for rows in (1, 16):
        x = torch.randn(rows, 1024)
        ways = {"float32": lambda: linear(x),  # noqa: B023
                "ours (dequantize, then float matmul)": lambda: x @ dequantize_int8(q, scale).T,  # noqa: B023
                "torch._weight_int8pack_mm": lambda: torch._weight_int8pack_mm(x, q, scale),  # noqa: B023
                "torch.ao dynamic int8": lambda: dynamic(x)}  # noqa: B023
        with torch.no_grad():
            for name, way in ways.items():
                print(f"  {rows:2d} rows, {name:>36}: {best_time(way, repeats=max(repeats, 5) * 4) * 1e6:8.0f} µs")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="one seed, k = 1, 2, 4, one run each")
    args = parser.parse_args()
    repeats = 1 if args.quick else 3
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    start = time.perf_counter()
    target, draft, tokenizer, stories = train_models()
    print(f"trained target and draft (seed 0, 200 steps each) in {time.perf_counter() - start:.1f} s")
    for seed in ([0] if args.quick else [0, 1, 2]):
        print(f"1. static vs continuous batching, workload seed {seed}:")
        bench_batching(target, workload(seed, tokenizer, stories), repeats)
    print("2. speculative decoding (greedy):")
    bench_speculative(target, draft, tokenizer, [1, 2, 4] if args.quick else list(range(1, 7)), repeats)
    print("3. weight-only int8, 1024 -> 4096 Linear:")
    bench_int8(repeats)


if __name__ == "__main__":
    main()
