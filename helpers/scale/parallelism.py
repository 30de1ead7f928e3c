"""Notebook 11, section 5: the kinds of parallelism, what each splits and what it sends per step.

The USF notes ask "What are the aspects of Transformer parallelization?". Inside one process the
course already runs the batch, the heads, the positions and the query tiles in parallel. Across
processes there are five things to split (the batch, the weight matrices, the layers, the tokens,
the experts), and the batch two ways (with or without sharding the training state), six rows in
all; `communication_per_step` counts the bytes each rank sends per training step for each, from
the model's sizes, with the assumptions written beside each formula. `memory_per_rank` counts what
ZeRO's stages save, in float32 or in the ZeRO paper's mixed precision. `bubble_fraction` is the
idle share of a pipeline; `time_all_reduce_warm` and `fit_latency_bandwidth` measure a link as
latency + bytes / bandwidth.

Conventions: P parameters, L layers, D = d_model, B sequences of N tokens per data-parallel rank,
`bytes_per_value` (2 for bf16), p ranks in the split being discussed. A ring all-reduce sends
2 (p - 1) / p of the tensor, an all-gather or a reduce-scatter (p - 1) / p.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from helpers import checks
from helpers.model.gpt import GPTConfig, exact_parameters
from helpers.timing import best_time


@dataclass(frozen=True)
class Parallelism:
    name: str
    splits: str
    sends: str
    bytes_per_rank: float
    use_when: str


def communication_per_step(config: GPTConfig, batch_size: int, world_size: int,
                           bytes_per_value: int = 2) -> list[Parallelism]:
    """The bytes each rank sends in one training step, for each way of splitting over p ranks.

    batch_size: sequences of config.context_length tokens each rank processes per step.
    """
    p = checks.positive_int("world_size", world_size)
    checks.positive_int("batch_size", batch_size)
    n_params = exact_parameters(config)
    layers, d, n = config.n_layers, config.d_model, config.context_length
    activations = batch_size * n * d * bytes_per_value  # one (B, N, D) tensor
    ring, gather = 2 * (p - 1) / p, (p - 1) / p
    return [
        Parallelism("data (DDP)", "the batch; every rank holds the whole model",
                    "all-reduce of the gradients, once per step",
                    ring * n_params * bytes_per_value,
                    "the model fits on one device: always the outermost split"),
        Parallelism("sharded data (ZeRO-3 / FSDP)", "the batch, and weights, gradients, optimizer state",
                    "all-gather the weights (forward and backward), reduce-scatter the gradients",
                    3 * gather * n_params * bytes_per_value,
                    "the model's training state does not fit on one device"),
        Parallelism("tensor (Megatron)", "every weight matrix: heads, MLP units",
                    "all-reduce of the (B, N, D) activations, 2 per layer forward, 2 backward",
                    4 * layers * ring * activations,
                    "a layer is too big or slow for one device; needs a fast link (inside a node)"),
        Parallelism("pipeline", "the layers: rank r runs blocks r L/p ... (r+1) L/p",
                    "the (B, N, D) activations to the next stage, their gradient back",
                    2 * activations if p > 1 else 0.0,
                    "many layers, slow links between nodes; micro-batches hide the idle 'bubble'"),
        Parallelism("sequence / context (ring attention)", "the N tokens of each sequence",
                    "keys and values passed around the ring, every layer, forward and backward",
                    2 * layers * 2 * (p - 1) * activations / p,
                    "long contexts whose activations do not fit on one device"),
        Parallelism("expert (mixture of experts)", "the MLP experts: one per rank",
                    "all-to-all: tokens to their expert and back, forward and backward",
                    4 * layers * gather * activations,
                    "models with many experts (each token uses only a few)"),
    ]


# Bytes per parameter of (weights, gradients, optimizer state). "mixed" is the ZeRO paper's
# accounting: 16-bit weights and gradients, and in the state a float32 master copy of the weights
# plus AdamW's m and v (4 + 4 + 4 = 12 bytes).
PRECISIONS = {"fp32": (4, 4, 8), "mixed": (2, 2, 12)}


def memory_per_rank(n_params: int, world_size: int, precision: str = "fp32") -> dict[str, float]:
    """Bytes of weights + gradients + AdamW state per rank: "fp32" 4 + 4 + 8 bytes a parameter,
    "mixed" 2 + 2 + 12 (the ZeRO paper's).

    data parallel keeps all of it everywhere; ZeRO-1 splits the optimizer state, ZeRO-2 the
    gradients too, ZeRO-3 (FSDP) the weights too.
    """
    checks.positive_int("n_params", n_params)
    p = checks.positive_int("world_size", world_size)
    checks.one_of("precision", precision, PRECISIONS)
    weights, grads, adam = (n * n_params for n in PRECISIONS[precision])
    return {"data parallel": weights + grads + adam,
            "ZeRO-1 (optimizer state)": weights + grads + adam / p,
            "ZeRO-2 (+ gradients)": weights + (grads + adam) / p,
            "ZeRO-3 / FSDP (+ weights)": (weights + grads + adam) / p}


def readable_bytes(n: float) -> str:
    """'1.49 GB', '12.3 MB', '512 B' (powers of 1000)."""
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n:.0f} B"


def bubble_fraction(stages: int, micro_batches: int) -> float:
    """The share of a GPipe-style pipeline step a stage sits idle: (p - 1) / (m + p - 1).

    p stages, m micro-batches: the step lasts m + p - 1 slots of one micro-batch's stage time
    (p - 1 to fill the pipeline, p - 1 to drain it, forward and backward alike), of which each
    stage works m.
    """
    p = checks.positive_int("stages", stages)
    m = checks.positive_int("micro_batches", micro_batches)
    return (p - 1) / (m + p - 1)


def time_all_reduce_warm(rank: int, world_size: int, sizes: Sequence[int], repeats: int = 7,
                         warmup: int = 3) -> dict[int, float]:
    """The best time, in seconds, of one all-reduce of a float32 tensor of each size (in values),
    after warming the connection up: the first collectives of a process group pay for setting it
    up, which would make the first size look slower than larger ones."""
    checks.positive_int("repeats", repeats)
    checks.positive_int("warmup", warmup)
    for size in sizes:
        checks.positive_int("size", size)
    for _ in range(warmup):  # the whole sweep, untimed, so no size is the first one measured
        for size in sizes:
            dist.all_reduce(torch.ones(size))
    times = {}
    for size in sizes:
        tensor = torch.ones(size)
        dist.barrier()
        times[size] = best_time(lambda t=tensor: dist.all_reduce(t), repeats=repeats, warmup=warmup)
    return times


def fit_latency_bandwidth(n_bytes: Sequence[float], seconds: Sequence[float]) -> tuple[float, float]:
    """Fit seconds = latency + n_bytes / bandwidth by least squares on the relative error (so the
    small and the large messages count alike); returns (latency in s, bandwidth in bytes/s)."""
    if len(n_bytes) != len(seconds) or len(n_bytes) < 2:
        raise ValueError(f"n_bytes and seconds have {len(n_bytes)} and {len(seconds)} entries, "
                         "expected the same number, at least 2")
    for name, values in (("n_bytes", n_bytes), ("seconds", seconds)):
        if not all(math.isfinite(v) and v > 0 for v in values):
            raise ValueError(f"{name} is {list(values)}, expected finite positive numbers")
    t = torch.tensor(seconds, dtype=torch.float64)
    design = torch.stack([1 / t, torch.tensor(n_bytes, dtype=torch.float64) / t], dim=1)  # (k, 2)
    latency, per_byte = torch.linalg.lstsq(design, torch.ones_like(t)[:, None]).solution[:, 0].tolist()
    return max(latency, 0.0), 1 / per_byte if per_byte > 0 else math.inf
