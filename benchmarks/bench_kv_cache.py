"""Greedy generation with the KV cache against recomputing the whole sequence at every step.

    python benchmarks/bench_kv_cache.py           # 50 ... 500 new tokens, best of 3
    python benchmarks/bench_kv_cache.py --quick   # fewer lengths, one run each

The model is the course's small GPT (n_layers=4, n_heads=4, d_model=128) with a context of 512
tokens and the corpus's character vocabulary, untrained: speed does not depend on the weights.
Three ways, all greedy, all of which must produce the same tokens:

    recompute         generate(use_cache=False): the whole window through GPT.forward each step
    recompute, fused  the same with GPT.forward(fast=True), PyTorch's fused kernels
    KV cache          generate(use_cache=True): one token per step through GPT.forward_cached,
                      the course's own blocks, as in the first way

Budget (exit status 1 when missed): with the cache, 500 new tokens after a 12-token prompt
(512 in all) come at least 10x faster than recomputation. The fused column shows how much of
that is the cache alone.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from helpers.model.generation import generate
from helpers.model.gpt import GPT, GPTConfig
from helpers.model.kv_cache import KVCache

CONTEXT, PROMPT, VOCAB = 512, 12, 52
SPEEDUP_BUDGET, BUDGET_TOKENS = 10.0, 500


@torch.no_grad()
def recompute_fused(model: GPT, prompt: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """Greedy generation without a cache, each step a fused full pass over the last window."""
    ids = prompt
    for _ in range(new_tokens):
        logits = model(ids[:, -model.config.context_length:], fast=True)[:, -1]
        ids = torch.cat([ids, logits.argmax(dim=-1, keepdim=True)], dim=1)
    return ids


WAYS = {
    "recompute": lambda m, p, n: generate(m, p, n, temperature=0.0, use_cache=False),
    "recompute, fused": recompute_fused,
    "KV cache": lambda m, p, n: generate(m, p, n, temperature=0.0, use_cache=True),
}


def best_time(way: str, model: GPT, prompt: torch.Tensor, new_tokens: int,
              repeats: int) -> tuple[float, torch.Tensor]:
    """The fastest of `repeats` greedy generations one way, and the tokens they produced."""
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        tokens = WAYS[way](model, prompt, new_tokens)
        times.append(time.perf_counter() - started)
    return min(times), tokens


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer lengths, one run each")
    parser.add_argument("--threads", type=int, default=None,
                        help="CPU threads for PyTorch (default: PyTorch's choice, one per core)")
    args = parser.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    lengths = (50, 500) if args.quick else (50, 100, 200, 300, 400, 500)
    repeats = 1 if args.quick else 3

    torch.manual_seed(0)
    config = GPTConfig(vocab_size=VOCAB, context_length=CONTEXT, n_layers=4, n_heads=4, d_model=128)
    model = GPT(config).eval()
    prompt = torch.randint(0, VOCAB, (1, PROMPT))
    generate(model, prompt, 5)  # warm-up
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; GPT n_layers=4 n_heads=4 "
          f"d_model=128, context {CONTEXT}, prompt {PROMPT} tokens, greedy")
    print(f"{'new tokens':>10}" + "".join(f"{way:>18}" for way in WAYS) + f"{'speed-up':>10}{'vs fused':>10}")
    failures, speedup = [], 0.0
    for new_tokens in lengths:
        results = {way: best_time(way, model, prompt, new_tokens, repeats) for way in WAYS}
        seconds = {way: result[0] for way, result in results.items()}
        speedup = seconds["recompute"] / seconds["KV cache"]
        print(f"{new_tokens:>10}" + "".join(f"{t:>17.3f}s" for t in seconds.values())
              + f"{speedup:>9.1f}x{seconds['recompute, fused'] / seconds['KV cache']:>9.1f}x")
        tokens = [result[1] for result in results.values()]
        if not all(torch.equal(tokens[0], other) for other in tokens[1:]):
            failures.append(f"{new_tokens} tokens: the three ways did not write the same tokens")
        if new_tokens == BUDGET_TOKENS and speedup < SPEEDUP_BUDGET:
            failures.append(f"{new_tokens} tokens: the cache is {speedup:.1f}x faster, "
                            f"expected at least {SPEEDUP_BUDGET:.0f}x")
    cache = KVCache.for_model(model, batch_size=1)
    formula = 2 * config.n_layers * config.n_heads * config.head_dim * CONTEXT * 4
    print(f"cache for {CONTEXT} tokens: {cache.nbytes():,} bytes (2 x L x H x d_h x n x 4 bytes = {formula:,})")
    print("budgets: " + ("all met" if not failures else "MISSED: " + "; ".join(failures)))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
