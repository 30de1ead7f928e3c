"""Serving on this CPU: static vs continuous batching, speculative decoding, int8 kernels.

    python benchmarks/bench_serve.py                     # the stored run: data/bench_serve.json
    python benchmarks/bench_serve.py --quick --out /tmp/serve.json   # the test's short run

One thread throughout (`torch.set_num_threads(1)`): the models are tiny, and on a shared machine
a second thread measures the neighbours. Wall-clock figures are contention on a busy machine, so
the two sides of every comparison are timed in turns (A, B, A, B ...) and compared by ratio.

1. Batching. The target (2 blocks, d = 64; 200 Trainer steps, seed 0, as in notebook 14) serves
   three workloads (workload seeds 0, 1, 2) of 24 requests: prompts of 6-24 characters from the
   validation stories, 4-36 new tokens, one arriving every 2 engine steps. Static batching
   (`serve_static`, batches of 4, one contiguous cache) against continuous batching (`Scheduler`,
   at most 4 running, paged cache with blocks of 4). Both are greedy and must give the same
   tokens. Stored per scheme: steps, forward passes, wall seconds of every repeat, mean latency
   and mean wait for the first token in steps. Arrivals are counted in engine steps, so the
   seconds are compute only; latency in seconds = latency in steps x that scheme's median
   seconds per step.
2. Speculative decoding, greedy, 3 prompts x 40 tokens, k = 1 ... 6, for each training seed:
   a target and a draft (1 block, d = 32) trained 200 steps, and the same draft trained
   `--long-steps` steps. Stored per pair and k: per-token acceptance (accepted / checked drafted
   tokens, notebook 14's rate), the share of rounds in which all k drafted tokens were kept,
   tokens per target pass; and every model's validation loss. Wall-clock speed-up of seed 0's
   pair against the target alone, timed in turns.
3. Weight-only int8 on a 1024 -> 4096 Linear: float32, our dequantize-then-multiply,
   `torch._weight_int8pack_mm` (PyTorch's weight-only int8 CPU kernel) and `torch.ao`'s dynamic
   int8 quantization, for 1 and 16 rows (printed, not stored).

No budget is enforced: the script prints its figures and writes the JSON (exit status 0).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
import warnings
from pathlib import Path

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

TARGET, DRAFT = (2, 4, 64), (1, 2, 32)  # (blocks, heads, width), as in notebook 14
NEW = 40  # tokens per prompt: 18-character prompts + 40 + k = 6 fit the context of 64
SPEC_PROMPTS = ("Once upon a time, ", "The little dog ", "She said ")


class Data:
    """The course corpus as notebook 14 cuts it."""

    def __init__(self) -> None:
        text = load_corpus()[:200_000]
        self.tokenizer = CharTokenizer.train(text)
        train_text, val_text = split_stories(text)
        self.train_ids = encode_text(self.tokenizer, train_text)
        self.val_ids = encode_text(self.tokenizer, val_text)
        self.stories = val_text.split("\n\n")


def train(data: Data, shape: tuple[int, int, int], steps: int, seed: int) -> tuple[GPT, float]:
    """A character-level GPT trained as in notebook 14; (the model, its last validation loss)."""
    layers, heads, width = shape
    torch.manual_seed(seed)
    model = GPT(GPTConfig(vocab_size=len(data.tokenizer.chars), context_length=64, n_layers=layers,
                          n_heads=heads, d_model=width))
    trainer = Trainer(model, data.train_ids, data.val_ids,
                      TrainConfig(batch_size=16, learning_rate=5e-3, eval_every=100, precision="fp32"))
    history = trainer.fit(steps=steps, progress_bar=False)
    return model.eval(), history.val_losses[-1]


def workload(seed: int, data: Data, n: int = 24) -> list[Request]:
    rng = random.Random(seed)
    return [Request(i, tuple(data.tokenizer.encode(data.stories[i][:rng.randint(6, 24)])),
                    rng.randint(4, 36), arrival=2 * i) for i in range(n)]


def static_passes(requests: list[Request], batch_size: int = 4) -> int:
    """Forward passes of `serve_static`: each batch runs as many passes as its longest request."""
    ordered = sorted(requests, key=lambda r: (r.arrival, r.id))
    return sum(max(r.max_new_tokens for r in ordered[i:i + batch_size])
               for i in range(0, len(ordered), batch_size))


def bench_batching(target: GPT, requests: list[Request], repeats: int) -> dict:
    """Static and continuous batching of `requests`, timed in turns; steps, passes, latency."""
    seconds: dict[str, list[float]] = {"static": [], "continuous": []}
    served, passes = {}, {"static": static_passes(requests)}
    for _ in range(repeats):
        for name in seconds:  # in turns: static, continuous, static, continuous ...
            start = time.perf_counter()
            if name == "static":
                served[name] = serve_static(target, requests, batch_size=4)
            else:
                served[name], scheduler = serve_continuous(target, requests, 4, 4, 128)
                passes[name] = scheduler.forward_passes
            seconds[name].append(time.perf_counter() - start)
    assert [s.tokens for s in served["static"]] == [s.tokens for s in served["continuous"]]
    tokens = sum(r.max_new_tokens for r in requests)
    out = {"tokens": tokens, "requests": len(requests)}
    for name, done in served.items():
        out[name] = {"steps": max(s.finished for s in done) + 1, "forward_passes": passes[name],
                     "seconds": seconds[name],
                     "mean_latency_steps": sum(s.latency for s in done) / len(done),
                     "mean_first_token_steps": sum(s.first_token - s.request.arrival for s in done) / len(done)}
    return out


def print_batching(result: dict) -> None:
    for name in ("static", "continuous"):
        r = result[name]
        median = statistics.median(r["seconds"])
        print(f"  {name:>10}: {r['steps']:4d} steps, {r['forward_passes']:4d} passes, median {median * 1e3:7.1f} ms, "
              f"{result['tokens'] / median:7.0f} tokens/s, mean latency {r['mean_latency_steps']:5.1f} steps "
              f"= {r['mean_latency_steps'] * median / r['steps'] * 1e3:6.1f} ms")


def acceptance(target: GPT, draft: GPT, data: Data, k: int) -> dict:
    """Greedy speculative decoding of the three prompts: the counts notebook 14 prints."""
    stats = [speculative_generate(target, draft, data.tokenizer.encode(p), NEW, k=k, temperature=0)[1]
             for p in SPEC_PROMPTS]
    accepted, rejected = sum(s.accepted for s in stats), sum(s.rejected for s in stats)
    rounds, passes = sum(s.rounds for s in stats), sum(s.target_passes for s in stats)
    return {"per_token": accepted / (accepted + rejected), "all_k_kept": sum(s.full_rounds for s in stats) / rounds,
            "tokens_per_target_pass": NEW * len(SPEC_PROMPTS) / passes}


def bench_speculative(data: Data, seeds: list[int], steps: int, long_steps: int, ks: list[int]) -> dict:
    out: dict = {"steps": steps, "long_steps": long_steps, "ks": ks, "seeds": {}}
    for seed in seeds:
        target, target_loss = train(data, TARGET, steps, seed)
        draft, draft_loss = train(data, DRAFT, steps, seed)
        long_draft, long_loss = train(data, DRAFT, long_steps, seed)
        row = {"target_loss": target_loss, "draft_loss": draft_loss, "long_draft_loss": long_loss,
               "draft": {k: acceptance(target, draft, data, k) for k in ks},
               "long_draft": {k: acceptance(target, long_draft, data, k) for k in ks}}
        out["seeds"][seed] = row
        print(f"  seed {seed}: validation loss target {target_loss:.3f}, draft {draft_loss:.3f}, "
              f"draft after {long_steps} steps {long_loss:.3f}")
        for k in ks:
            a, b = row["draft"][k], row["long_draft"][k]
            print(f"    k = {k}: per-token acceptance {a['per_token']:.2f} (longer draft {b['per_token']:.2f}), "
                  f"all k kept in {a['all_k_kept']:.0%} of rounds ({b['all_k_kept']:.0%}), "
                  f"tokens per target pass {a['tokens_per_target_pass']:.2f}")
    return out


def bench_speculative_time(target: GPT, draft: GPT, data: Data, ks: list[int], repeats: int) -> dict:
    """Seconds of the target alone and of speculative decoding at each k, timed in turns."""
    prompts = [data.tokenizer.encode(s) for s in SPEC_PROMPTS]
    runs = {"target alone": lambda: [generate(target, torch.tensor([p]), NEW, temperature=0) for p in prompts]}
    for k in ks:
        runs[f"k = {k}"] = lambda k=k: [speculative_generate(target, draft, p, NEW, k=k, temperature=0)
                                        for p in prompts]
    seconds: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            seconds[name].append(time.perf_counter() - start)
    base = statistics.median(seconds["target alone"])
    for name, times in seconds.items():
        print(f"  {name:>12}: median {statistics.median(times) * 1e3:7.1f} ms, "
              f"speed-up {base / statistics.median(times):.2f}x")
    return seconds


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
    parser.add_argument("--quick", action="store_true",
                        help="the test's run: 20 training steps, one seed, k = 1, 2, one repeat, no int8")
    parser.add_argument("--repeats", type=int, default=9, help="timed runs of each side, in turns")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "data" / "bench_serve.json"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    steps, long_steps = (20, 40) if args.quick else (200, 1000)
    seeds, ks, repeats = ([0], [1, 2], 1) if args.quick else ([0, 1, 2], list(range(1, 7)), args.repeats)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread")
    data = Data()
    target, _ = train(data, TARGET, steps, 0)
    draft, _ = train(data, DRAFT, steps, 0)
    result: dict = {"torch": torch.__version__, "threads": 1, "repeats": repeats, "batching": {}}
    for seed in seeds:
        print(f"1. static vs continuous batching, workload seed {seed}:")
        result["batching"][seed] = bench_batching(target, workload(seed, data), repeats)
        print_batching(result["batching"][seed])
    print(f"2. speculative decoding (greedy), {len(seeds)} training seeds:")
    result["speculative"] = bench_speculative(data, seeds, steps, long_steps, ks)
    print("   wall clock, seed 0's target and draft:")
    result["speculative"]["seconds"] = bench_speculative_time(target, draft, data, ks, repeats)
    if not args.quick:
        print("3. weight-only int8, 1024 -> 4096 Linear:")
        bench_int8(3)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
