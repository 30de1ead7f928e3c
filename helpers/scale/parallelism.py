"""Notebook 11, section 5: the kinds of parallelism, what each splits and what it sends per step.

The USF notes ask "What are the aspects of Transformer parallelization?". Inside one process the
course already runs the batch, the heads, the positions and the query tiles in parallel. Across
processes there are five ways to split the work; `communication_per_step` counts the bytes each
rank sends per training step for each, from the model's sizes, with the assumptions written
beside each formula. `memory_per_rank` counts what ZeRO's stages save.

Conventions: P parameters, L layers, D = d_model, B sequences of N tokens per data-parallel rank,
`bytes_per_value` (2 for bf16), p ranks in the split being discussed. A ring all-reduce sends
2 (p - 1) / p of the tensor, an all-gather or a reduce-scatter (p - 1) / p.
"""

from __future__ import annotations

from dataclasses import dataclass

from helpers import checks
from helpers.model.gpt import GPTConfig, exact_parameters


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


def memory_per_rank(n_params: int, world_size: int) -> dict[str, float]:
    """Bytes of weights + gradients + AdamW state per rank, float32 (4 + 4 + 8 bytes a parameter).

    data parallel keeps all of it everywhere; ZeRO-1 splits the optimizer state, ZeRO-2 the
    gradients too, ZeRO-3 (FSDP) the weights too.
    """
    p = checks.positive_int("world_size", world_size)
    weights, grads, adam = 4 * n_params, 4 * n_params, 8 * n_params
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
