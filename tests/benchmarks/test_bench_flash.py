"""benchmarks/bench_flash.py counts FLOPs as the FlashAttention-2 paper does, and says how many
more its own two-kernel backward executes (7 products against the paper's 5)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

SPEC = importlib.util.spec_from_file_location(
    "bench_flash", Path(__file__).resolve().parents[2] / "benchmarks" / "bench_flash.py")
bench = importlib.util.module_from_spec(SPEC)
sys.modules[SPEC.name] = bench
SPEC.loader.exec_module(bench)


def test_nominal_flops_follow_the_flashattention2_paper():
    n, d, heads = 1024, 64, bench.GPU_BATCH * bench.GPU_HEADS
    forward = bench.nominal_flops(n, d, "forward", causal=False)
    assert forward == 4 * n * n * d * heads  # two products of 2 N^2 d
    assert bench.nominal_flops(n, d, "forward+backward", causal=False) == 3.5 * forward
    assert bench.nominal_flops(n, d, "forward+backward", causal=True) == 1.75 * forward


def test_our_backward_executes_two_more_products():
    assert bench.executed_over_nominal("forward") == 1.0
    assert bench.executed_over_nominal("forward+backward") == 4.5 / 3.5
