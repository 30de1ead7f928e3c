"""Notebook 11, part two: pipeline parallelism by hand, GPipe and 1F1B, with point-to-point sends.

The GPT's blocks are cut into `p` consecutive stages, one per rank: rank 0 also embeds the tokens,
the last rank also holds ln_f and the output matrix. The batch is cut into `m` micro-batches; a
stage's forward of micro-batch i sends its activations (b, N, D) to the next rank, whose backward
later sends their gradient back. Stage r must wait for stage r - 1, so some ranks sit idle at the
start and the end of each step: the bubble, (p - 1) / (m + p - 1) of the step when forward and
backward take one slot each.

    gpipe_order(p, m)          per rank: all m forwards, then all m backwards
    one_f_one_b_order(p, m)    per rank: p - 1 - r forwards to fill the pipe, then one forward and
                               one backward in turn (at most p - r activations kept, not m)
    timeline(orders)           [(rank, slot, "F" or "B", micro-batch)], each op one slot, as soon
                               as its rank is free and its input has arrived
    timeline_bubble(events)    the idle share of the slots in a timeline
    pipeline_worker            worker: one step of a schedule; gradients, loss, busy and wall time
    run_pipeline(workers, ...) checks the sizes before any process starts, then runs the worker
    reference_gradients        one process, whole batch: the gradients the pipeline must give

The token matrix is tied (embedding on rank 0, output on the last rank): each holds a copy, and
after the backward the two gradients are added with one all-reduce, as Megatron-LM does.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from helpers import checks
from helpers.model.gpt import GPT, GPTConfig
from helpers.scale.workers import Workers

PIPE_GPT = GPTConfig(vocab_size=32, context_length=16, n_layers=4, n_heads=2, d_model=32)
SCHEDULES = ("gpipe", "1f1b")
Op = tuple[str, int]  # ("F" or "B", micro-batch)


def _check_sizes(stages: int, micro_batches: int) -> None:
    checks.positive_int("stages", stages)
    checks.positive_int("micro_batches", micro_batches)


def gpipe_order(stages: int, micro_batches: int) -> list[list[Op]]:
    """GPipe: every rank runs F0 ... F(m-1), then B0 ... B(m-1). Keeps m activations per stage."""
    _check_sizes(stages, micro_batches)
    ops = [("F", i) for i in range(micro_batches)] + [("B", i) for i in range(micro_batches)]
    return [list(ops) for _ in range(stages)]


def one_f_one_b_order(stages: int, micro_batches: int) -> list[list[Op]]:
    """1F1B: rank r first runs min(p - 1 - r, m) forwards (warm-up), then alternates one forward
    and one backward, then runs the backwards left (cool-down). Same bubble as GPipe, less memory."""
    _check_sizes(stages, micro_batches)
    orders = []
    for rank in range(stages):
        warmup = min(stages - 1 - rank, micro_batches)
        ops = [("F", i) for i in range(warmup)]
        for i in range(micro_batches - warmup):
            ops += [("F", warmup + i), ("B", i)]
        ops += [("B", i) for i in range(micro_batches - warmup, micro_batches)]
        orders.append(ops)
    return orders


ORDERS = {"gpipe": gpipe_order, "1f1b": one_f_one_b_order}


def _check_orders(orders: list[list[Op]]) -> int:
    """Raise unless every rank runs each F i and B i once, F i before B i; returns m."""
    if not isinstance(orders, list) or not orders:
        raise ValueError(f"orders is {orders!r:.60}, expected one list of ('F' or 'B', i) per rank")
    m = sum(1 for kind, _ in orders[0] if kind == "F")
    for rank, ops in enumerate(orders):
        expected = sorted([("F", i) for i in range(m)] + [("B", i) for i in range(m)])
        if sorted(ops) != expected:
            raise ValueError(f"orders[{rank}] is {ops}, expected each of ('F', i) and ('B', i) for "
                             f"i < {m} exactly once")
        if any(ops.index(("B", i)) < ops.index(("F", i)) for i in range(m)):
            raise ValueError(f"orders[{rank}] runs a backward before its forward: {ops}")
    return m


def timeline(orders: list[list[Op]]) -> list[tuple[int, int, str, int]]:
    """(rank, slot, kind, micro-batch) for every op, each lasting one slot. F i on rank r waits
    for F i on r - 1; B i waits for B i on r + 1 (the last rank's B i for its own F i)."""
    _check_orders(orders)
    p = len(orders)
    done: dict[tuple[int, str, int], int] = {}  # (rank, kind, i) -> slot it ends
    free_at, position, events = [0] * p, [0] * p, []
    while any(position[r] < len(orders[r]) for r in range(p)):
        progressed = False
        for r in range(p):
            if position[r] == len(orders[r]):
                continue
            kind, i = orders[r][position[r]]
            need = (r - 1, "F", i) if kind == "F" else (r + 1, "B", i) if r < p - 1 else (r, "F", i)
            if kind == "F" and r == 0:
                need = None
            if need is not None and need not in done:
                continue
            slot = max(free_at[r], done[need] if need else 0)
            events.append((r, slot, kind, i))
            done[(r, kind, i)] = free_at[r] = slot + 1
            position[r] += 1
            progressed = True
        if not progressed:
            raise ValueError("orders deadlock: every rank waits for an op no rank can run")
    return sorted(events, key=lambda e: (e[1], e[0]))


def timeline_bubble(events: list[tuple[int, int, str, int]]) -> float:
    """1 - busy slots / (ranks x slots of the step)."""
    if not events:
        raise ValueError("events is empty, expected the output of timeline()")
    ranks = {e[0] for e in events}
    return 1 - len(events) / (len(ranks) * (max(e[1] for e in events) + 1))


class Stage(nn.Module):
    """Rank r's share of a GPT: blocks r L/p ... (r + 1) L/p, plus the embedding on the first
    rank and ln_f + output matrix on the last. forward: ids (b, N) or x (b, N, D) -> x or logits."""

    def __init__(self, model: GPT, rank: int, world_size: int) -> None:
        super().__init__()
        per = len(model.blocks) // world_size
        self.first, self.last = rank == 0, rank == world_size - 1
        self.names = {}  # my parameter -> its name in the whole model
        full_names = {id(p): n for n, p in model.named_parameters()}
        self.embed = model.embed if self.first else None
        self.blocks = model.blocks[rank * per:(rank + 1) * per]
        self.ln_f, self.lm_head = (model.ln_f, model.lm_head) if self.last else (None, None)
        for p in self.parameters():
            self.names[p] = full_names[id(p)]

    def forward(self, x: Tensor) -> Tensor:
        if self.first:
            x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x)) if self.last else x


def _batch(config: GPTConfig, batch_size: int, seed: int) -> tuple[Tensor, Tensor]:
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, config.vocab_size, (batch_size, config.context_length + 1), generator=generator)
    return ids[:, :-1], ids[:, 1:]


def _model(config: GPTConfig, seed: int, dtype: torch.dtype) -> GPT:
    torch.manual_seed(seed)
    return GPT(config).to(dtype)


def pipeline_worker(rank: int, world_size: int, schedule: str, micro_batches: int, batch_size: int,
                    config: GPTConfig = PIPE_GPT, seed: int = 0, double: bool = True,
                    fail_at: tuple[int, int] | None = None) -> dict[str, object]:
    """Worker: one forward + backward of the batch (batch_size, N) in `micro_batches` pieces, in
    the order of `schedule`. Returns this rank's gradients by full-model name, the loss (last
    rank), the seconds spent computing ("busy") and in the whole step ("wall"), and the ops run.
    fail_at=(rank, i): that rank raises at micro-batch i's forward (to test failures)."""
    dtype = torch.float64 if double else torch.float32
    stage = Stage(_model(config, seed, dtype), rank, world_size)
    ids, targets = _batch(config, batch_size, seed)
    ids, targets = ids.chunk(micro_batches), targets.chunk(micro_batches)
    b, n, d = batch_size // micro_batches, config.context_length, config.d_model
    saved: dict[int, tuple[Tensor | None, Tensor]] = {}
    sends, busy, loss_sum = [], 0.0, 0.0
    dist.barrier()
    start = time.perf_counter()
    for kind, i in ORDERS[schedule](world_size, micro_batches)[rank]:
        if fail_at is not None and (rank, i) == tuple(fail_at) and kind == "F":
            raise RuntimeError(f"rank {rank} fails on purpose at the forward of micro-batch {i}")
        if kind == "F":
            x = ids[i]
            if not stage.first:
                x = torch.empty(b, n, d, dtype=dtype)
                dist.recv(x, src=rank - 1)
                x.requires_grad_(True)
            tick = time.perf_counter()
            out = stage(x)
            if stage.last:
                out = F.cross_entropy(out.flatten(0, 1), targets[i].flatten()) / micro_batches
                loss_sum += out.item()
            busy += time.perf_counter() - tick
            if not stage.last:
                sends.append(dist.isend(out.detach(), dst=rank + 1))
            saved[i] = (None if stage.first else x, out)
        else:
            x, out = saved.pop(i)
            grad = None
            if not stage.last:
                grad = torch.empty_like(out)
                dist.recv(grad, src=rank + 1)
            tick = time.perf_counter()
            out.backward(grad)
            busy += time.perf_counter() - tick
            if not stage.first:
                sends.append(dist.isend(x.grad, dst=rank - 1))
    for work in sends:
        work.wait()
    wall = time.perf_counter() - start
    _add_tied_gradient(stage, config, dtype)
    grads = {name: p.grad.clone() for p, name in stage.names.items()}
    return {"grads": grads, "loss": loss_sum, "busy": busy, "wall": wall}


def _add_tied_gradient(stage: Stage, config: GPTConfig, dtype: torch.dtype) -> None:
    """The token matrix's gradient = embedding's share (rank 0) + output's share (last rank);
    ranks in between add zeros (every rank must join a collective)."""
    if not config.tie_weights or dist.get_world_size() == 1:
        return
    tied = next((p for p, name in stage.names.items() if name == "embed.token.weight"), None)
    total = tied.grad if tied is not None else torch.zeros(config.vocab_size, config.d_model, dtype=dtype)
    dist.all_reduce(total)


def check_pipeline(world_size: int, schedule: str, micro_batches: int, batch_size: int,
                   config: GPTConfig = PIPE_GPT) -> None:
    """Raise before any process starts unless the sizes fit: m >= 1 micro-batches of equal size,
    the blocks split evenly over the ranks."""
    checks.one_of("schedule", schedule, SCHEDULES)
    checks.positive_int("micro_batches", micro_batches)
    checks.positive_int("batch_size", batch_size)
    checks.positive_int("world_size", world_size)
    if batch_size % micro_batches:
        raise ValueError(f"batch_size={batch_size} cannot be cut into micro_batches={micro_batches}: "
                         f"expected a batch_size divisible by {micro_batches} (equal micro-batches, "
                         "so that the mean of their losses is the batch's loss)")
    if config.n_layers % world_size:
        raise ValueError(f"config.n_layers={config.n_layers} cannot be split over world_size="
                         f"{world_size} stages: expected a multiple of {world_size}")


def run_pipeline(workers: Workers, schedule: str, micro_batches: int, batch_size: int = 8,
                 config: GPTConfig = PIPE_GPT, seed: int = 0, double: bool = True,
                 fail_at: tuple[int, int] | None = None) -> list[dict[str, object]]:
    """pipeline_worker on every rank of `workers`, after checking the sizes (no process started
    if they do not fit). Returns one result per rank."""
    if not isinstance(workers, Workers):
        raise TypeError(f"workers is a {type(workers).__name__}, expected a Workers")
    check_pipeline(workers.world_size, schedule, micro_batches, batch_size, config)
    checks.boolean("double", double)
    return workers.run(pipeline_worker, schedule, micro_batches, batch_size, config, seed, double, fail_at)


def reference_gradients(batch_size: int = 8, config: GPTConfig = PIPE_GPT, seed: int = 0) -> dict[str, Tensor]:
    """One process, the whole batch, float64: the gradient of every parameter, by name."""
    checks.positive_int("batch_size", batch_size)
    model = _model(config, seed, torch.float64)
    ids, targets = _batch(config, batch_size, seed)
    F.cross_entropy(model(ids).flatten(0, 1), targets.flatten()).backward()
    return {name: p.grad.clone() for name, p in model.named_parameters()}


TIMING_GPT = GPTConfig(vocab_size=64, context_length=64, n_layers=4, n_heads=4, d_model=128)


def measure_bubble(workers: Workers, schedule: str, micro_batches: list[int], batch_size: int = 16,
                   config: GPTConfig = TIMING_GPT, repeats: int = 3) -> dict[int, dict[str, float]]:
    """For each m: the fastest of `repeats` steps (float32), its wall time and the measured
    bubble, 1 - busy / wall averaged over the ranks, beside the formula (p - 1) / (m + p - 1).
    Communication counts as idle: on CPU processes it is small beside the blocks' compute."""
    if not micro_batches or not isinstance(micro_batches, list | tuple):
        raise ValueError(f"micro_batches is {micro_batches!r}, expected a non-empty list of ints")
    checks.positive_int("repeats", repeats)
    for m in micro_batches:
        check_pipeline(workers.world_size, schedule, m, batch_size, config)
    out = {}
    for m in micro_batches:
        runs = [run_pipeline(workers, schedule, m, batch_size, config, double=False) for _ in range(repeats)]
        best = min(runs, key=lambda results: max(r["wall"] for r in results))
        wall = max(r["wall"] for r in best)
        measured = sum(1 - r["busy"] / r["wall"] for r in best) / len(best)
        p = workers.world_size
        out[m] = {"wall": wall, "measured": measured, "formula": (p - 1) / (m + p - 1)}
    return out
