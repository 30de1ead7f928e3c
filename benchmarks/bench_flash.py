"""Budgets of notebook 8: tiled attention against PyTorch's, in time and in peak memory.

    python benchmarks/bench_flash.py          # CPU budgets (about a minute, up to ~7 GB of memory)
    python benchmarks/bench_flash.py --gpu    # on a CUDA GPU: the Triton kernel's budgets, and
                                              # data/flash_gpu_benchmark.json for the notebook

CPU, float32, (B, H, N, d) = (1, 8, 8192, 64), one thread by default (--threads): on a shared
2-core machine a second thread measures the neighbours more than the algorithms, because every
operation of the Python tile loop waits for both threads, while SDPA's kernel waits once:
  - helpers.flash.tiled.tiled_attention_fa2 takes at most 2 x the time of F.scaled_dot_product_attention
    (4-D inputs: only then does PyTorch use its fused, low-memory CPU kernel);
  - it holds at most 1/50 of the peak memory of naive attention (helpers.model.attention).
GPU (--gpu), float16 (--dtype), batch 4, 16 heads, N from 512 to 16384, d = 64 and 128, causal
and not: TFLOP/s and peak memory of naive attention, F.scaled_dot_product_attention with each
backend this machine has (math, memory-efficient, flash, cuDNN) and our Triton kernels, forward
and forward+backward, saved with the device name, date and versions to
data/flash_gpu_benchmark.json, which notebook 8 draws. Budgets at N >= 4096:
  - forward: our kernel reaches at least 90% of the TFLOP/s of SDPA's flash backend;
  - forward+backward: at least 70%;
  - its peak memory grows linearly in N (doubling N at most 2.5 x the memory).
FLOPs counted: forward 4 B H N^2 d (two products of 2 N^2 d); the backward 2.5 times that (five
products, one of them the recomputed Q K^T), as the FlashAttention-2 paper counts; half when causal.
That nominal count is the same work for every method, so their TFLOP/s compare. Our backward is two
kernels without atomics, and each recomputes Q K^T and dO V^T: 7 products, 3.5 times the forward,
so forward+backward really executes 4.5 / 3.5 of the nominal FLOPs; its rows also carry
`executed_tflops`, the rate at the FLOPs it really executes.
Prints every figure; exits 1 when a budget is missed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Callable
from datetime import date
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
GPU_RESULTS = ROOT / "data" / "flash_gpu_benchmark.json"
MAX_TIME_RATIO = 2.0
MIN_MEMORY_RATIO = 50.0
MIN_FRACTION_OF_FLASH = {"forward": 0.9, "forward+backward": 0.7}
OUR_METHOD = "triton (ours)"
GPU_SEQ_LENS = (512, 1024, 2048, 4096, 8192, 16384)
GPU_HEAD_DIMS = (64, 128)
GPU_BATCH, GPU_HEADS = 4, 16
MAX_GROWTH_PER_DOUBLING = 2.5


def best_times(fns: dict[str, Callable[[], Any]], repeats: int) -> dict[str, float]:
    """The best wall time of each function, measured in turns so that load hits all alike."""
    for fn in fns.values():
        fn()
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - start)
    return best


def cpu_budgets(n: int, repeats: int) -> bool:
    import torch.nn.functional as F

    from helpers.flash.profiling import peak_memory_bytes
    from helpers.flash.tiled import tiled_attention_fa2
    from helpers.model.attention import scaled_dot_product_attention
    from helpers.timing import format_duration

    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 8, n, 64) for _ in range(3))
    methods = {"naive (helpers.model.attention)": lambda: scaled_dot_product_attention(q, k, v),
               "F.scaled_dot_product_attention": lambda: F.scaled_dot_product_attention(q, k, v),
               "tiled FA-2 (helpers.flash.tiled)": lambda: tiled_attention_fa2(q, k, v)}
    print(f"CPU, float32, (B, H, N, d) = (1, 8, {n}, 64), {torch.get_num_threads()} threads")
    peaks = {name: peak_memory_bytes(fn) for name, fn in methods.items()}
    del methods["naive (helpers.model.attention)"]  # its time is not budgeted; it would double the run
    times = best_times(methods, repeats)
    for name, peak in peaks.items():
        timing = f", {format_duration(times[name])}" if name in times else ""
        print(f"  {name:32s} peak {peak / 2**20:9.1f} MiB{timing}")
    naive_peak = peaks["naive (helpers.model.attention)"]
    tiled, sdpa = "tiled FA-2 (helpers.flash.tiled)", "F.scaled_dot_product_attention"
    time_ratio = times[tiled] / times[sdpa]
    memory_ratio = naive_peak / peaks[tiled]
    ok_time = time_ratio <= MAX_TIME_RATIO
    ok_memory = memory_ratio >= MIN_MEMORY_RATIO
    print(f"  time: tiled / SDPA = {time_ratio:.2f} (budget <= {MAX_TIME_RATIO}) "
          f"{'ok' if ok_time else 'MISSED'}")
    print(f"  memory: naive / tiled = {memory_ratio:.0f} (budget >= {MIN_MEMORY_RATIO:.0f}) "
          f"{'ok' if ok_memory else 'MISSED'}")
    return ok_time and ok_memory


FORWARD_PRODUCTS, PAPER_BACKWARD_PRODUCTS, OUR_BACKWARD_PRODUCTS = 2, 5, 7


def nominal_flops(n: int, d: int, pass_name: str, causal: bool) -> float:
    """The FlashAttention-2 paper's FLOPs of one pass over the GPU batch: each product 2 N^2 d per
    head, 2 in the forward, 5 more in the backward; half of them when causal."""
    products = FORWARD_PRODUCTS + (PAPER_BACKWARD_PRODUCTS if pass_name == "forward+backward" else 0)
    flops = 2 * n * n * d * products * GPU_BATCH * GPU_HEADS
    return flops / 2 if causal else flops


def executed_over_nominal(pass_name: str) -> float:
    """How many more FLOPs our kernels execute than the nominal count: 1 forward, 9/7 with backward."""
    if pass_name == "forward":
        return 1.0
    return (FORWARD_PRODUCTS + OUR_BACKWARD_PRODUCTS) / (FORWARD_PRODUCTS + PAPER_BACKWARD_PRODUCTS)


def gpu_benchmark(dtype: torch.dtype, seq_lens: tuple[int, ...] = GPU_SEQ_LENS,
                  head_dims: tuple[int, ...] = GPU_HEAD_DIMS) -> dict[str, Any]:
    """Every method, pass, causal flag, head dim and N: {'ms', 'tflops', 'peak_mb'} on this GPU.

    Time is the median of triton.testing.do_bench; peak memory is torch.cuda.max_memory_allocated
    during one call, minus what was allocated before it (q, k, v). A method that runs out of
    memory, or has no kernel for these inputs, is recorded with None.
    """
    import triton

    rows = []
    for causal in (False, True):
        for d in head_dims:
            for n in seq_lens:
                for name, fn in _attention_methods(causal).items():
                    for pass_name in ("forward", "forward+backward"):
                        flops = nominal_flops(n, d, pass_name, causal)
                        measured = _measure(fn, n, d, dtype, pass_name, flops, may_fail=name != OUR_METHOD)
                        if name == OUR_METHOD and measured["tflops"] is not None:
                            measured["executed_tflops"] = measured["tflops"] * executed_over_nominal(pass_name)
                        rows.append({"method": name, "pass": pass_name, "causal": causal, "head_dim": d,
                                     "n": n, **measured})
                        print(f"  {pass_name:16s} {'causal' if causal else 'full':6s} d={d:3d} N={n:5d} "
                              f"{name:20s} {_show(measured['tflops'], 'TFLOP/s')} "
                              f"{_show(measured['peak_mb'], 'MiB')}", flush=True)
    return {"device": torch.cuda.get_device_name(), "date": date.today().isoformat(),
            "torch": torch.__version__, "triton": triton.__version__, "cuda": torch.version.cuda,
            "dtype": str(dtype).replace("torch.", ""), "batch": GPU_BATCH, "heads": GPU_HEADS,
            "flops": "forward 4 B H N^2 d, forward+backward 3.5 times that (the FlashAttention-2 "
                     "paper's 5 backward products); half when causal. executed_tflops: our kernels' "
                     "rate at the 7 backward products they execute (4.5 times the forward)",
            "results": rows}


def _show(value: float | None, unit: str) -> str:
    return f"{'-':>8s} {unit}" if value is None else f"{value:8.1f} {unit}"


def _attention_methods(causal: bool) -> dict[str, Callable[[Any, Any, Any], Any]]:
    """name -> function(q, k, v) returning the attention output (B, H, N, d)."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from helpers.flash.triton_attention import triton_attention
    from helpers.model.attention import causal_mask, scaled_dot_product_attention

    def naive(q: Any, k: Any, v: Any) -> Any:
        mask = causal_mask(q.shape[2], k.shape[2], device=q.device) if causal else None
        return scaled_dot_product_attention(q, k, v, mask=mask)[0]

    def sdpa_with(backend: Any) -> Callable[[Any, Any, Any], Any]:
        def run(q: Any, k: Any, v: Any) -> Any:
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        return run

    backends = {"sdpa math": "MATH", "sdpa mem-efficient": "EFFICIENT_ATTENTION",
                "sdpa flash": "FLASH_ATTENTION", "sdpa cuDNN": "CUDNN_ATTENTION"}
    methods = {OUR_METHOD: lambda q, k, v: triton_attention(q, k, v, causal=causal)[0], "naive": naive}
    methods |= {name: sdpa_with(getattr(SDPBackend, backend)) for name, backend in backends.items()
                if hasattr(SDPBackend, backend)}  # cuDNN's backend is newer than the others
    return methods


def _measure(fn: Callable[[Any, Any, Any], Any], n: int, d: int, dtype: torch.dtype, pass_name: str,
             flops: float, may_fail: bool) -> dict[str, float | None]:
    """{'ms', 'tflops', 'peak_mb'} of one pass of fn on fresh (B, H, N, d) inputs; all None if it
    may fail and does (out of memory, or no kernel of this SDPA backend for these inputs)."""
    import triton

    backward = pass_name == "forward+backward"
    q, k, v = (torch.randn(GPU_BATCH, GPU_HEADS, n, d, device="cuda", dtype=dtype, requires_grad=backward)
               for _ in range(3))
    grad_out = torch.randn_like(q)

    def run() -> None:
        out = fn(q, k, v)
        if backward:
            out.backward(grad_out)

    try:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        run()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - before
        ms = triton.testing.do_bench(run, warmup=25, rep=100, grad_to_none=[q, k, v] if backward else None)
    except (torch.cuda.OutOfMemoryError, RuntimeError):
        if not may_fail:
            raise  # our kernel failing is a bug, not a data point
        return {"ms": None, "tflops": None, "peak_mb": None}
    finally:
        q.grad = k.grad = v.grad = None
        torch.cuda.empty_cache()
    return {"ms": ms, "tflops": flops / (ms * 1e-3) / 1e12, "peak_mb": peak / 2**20}


def gpu_budgets(results: dict[str, Any]) -> bool:
    """Check the GPU budgets on the rows written by gpu_benchmark."""
    rows = results["results"]

    def row(method: str, pass_name: str, causal: bool, d: int, n: int) -> dict[str, Any]:
        return next(r for r in rows if (r["method"], r["pass"], r["causal"], r["head_dim"], r["n"])
                    == (method, pass_name, causal, d, n))

    ok = True
    for pass_name, causal, d in sorted({(r["pass"], r["causal"], r["head_dim"]) for r in rows}):
        seq_lens = sorted({r["n"] for r in rows if (r["pass"], r["causal"], r["head_dim"]) == (pass_name, causal, d)})
        label = f"{pass_name} {'causal' if causal else 'full'} d={d}"
        budget = MIN_FRACTION_OF_FLASH[pass_name]
        for n in (n for n in seq_lens if n >= 4096):
            ours = row(OUR_METHOD, pass_name, causal, d, n)["tflops"]
            flash = row("sdpa flash", pass_name, causal, d, n)["tflops"]
            fraction = ours / flash if ours and flash else 0.0
            passed = fraction >= budget
            ok &= passed
            print(f"  {label} N={n}: ours {ours or 0:.1f} TFLOP/s, SDPA flash {flash or 0:.1f} "
                  f"-> {fraction:.0%} (budget >= {budget:.0%}) {'ok' if passed else 'MISSED'}")
        peaks = [row(OUR_METHOD, pass_name, causal, d, n)["peak_mb"] for n in seq_lens]
        for n_small, n_big, small, big in zip(seq_lens, seq_lens[1:], peaks, peaks[1:], strict=False):
            doublings = math.log2(n_big / n_small)
            growth = (big / small) ** (1 / doublings) if small and big else math.inf
            passed = growth <= MAX_GROWTH_PER_DOUBLING
            ok &= passed
            print(f"  {label} peak memory N={n_small}->{n_big}: x{growth:.2f} per doubling "
                  f"(budget <= {MAX_GROWTH_PER_DOUBLING}) {'ok' if passed else 'MISSED'}")
    return ok


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpu", action="store_true", help="benchmark the Triton kernel on CUDA")
    parser.add_argument("--n", type=int, default=8192, help="sequence length of the CPU budgets")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per method (CPU)")
    parser.add_argument("--dtype", choices=("float16", "bfloat16"), default="float16",
                        help="GPU dtype of q, k, v")
    parser.add_argument("--threads", type=int, default=1,
                        help="CPU threads for PyTorch, the same for every method; 0: PyTorch's choice")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if not args.gpu:
        return 0 if cpu_budgets(args.n, args.repeats) else 1
    if not torch.cuda.is_available():
        print("--gpu needs a CUDA GPU; none is visible", file=sys.stderr)
        return 2
    os.environ.pop("TRITON_INTERPRET", None)
    results = gpu_benchmark(getattr(torch, args.dtype))
    GPU_RESULTS.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    print(f"{results['device']}, {results['dtype']}, batch {results['batch']}, heads "
          f"{results['heads']}: wrote {GPU_RESULTS.relative_to(ROOT)}")
    return 0 if gpu_budgets(results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
