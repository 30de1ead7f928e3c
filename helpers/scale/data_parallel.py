"""Notebook 11, section 2: data parallelism, by hand, with overlapping buckets, then torch's DDP.

Every rank holds the whole model and takes `batch_size / world_size` rows of each batch. After
`backward()` the ranks average their gradients with one all-reduce, so every rank applies the
same update and the weights stay identical: the same weights as one process with the whole batch.

    Run                       what to train (a small MLP or the course GPT), how long, how fast
    make_model, make_batch    the same model and batches in every process, from the seed
    shard_rows                this rank's rows of a batch (ValueError if the world does not divide it)
    broadcast_parameters      rank 0's weights everywhere, before the first step
    average_gradients         all-reduce every gradient, divide by the world size
    GradientBuckets           the same, in buckets started by hooks while backward still runs
    train_single              the reference: one process, whole batches
    data_parallel             run one of the workers below on every process of a Workers
        train_by_hand, train_bucketed, train_torch_ddp

The optimiser is SGD with momentum: AdamW divides each gradient by its own size, so a weight whose
true gradient is zero (notebook 7's key biases) moves by the learning rate in the direction of its
round-off, and two exact-in-principle runs drift apart. SGD keeps round-off at round-off.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from helpers import checks
from helpers.model.gpt import GPT, GPTConfig
from helpers.scale.workers import Workers

# The course GPT at toy size (tied weights, as in notebook 7): fast enough for 2 CPU processes.
TINY_GPT = GPTConfig(vocab_size=32, context_length=16, n_layers=2, n_heads=2, d_model=32)


@dataclass(frozen=True)
class Run:
    """model: "mlp" (16 -> 64 -> 16, regression) or "gpt" (TINY_GPT, next-token loss).

    device: "cpu", or "cuda" for this process's GPU (torchrun's LOCAL_RANK, with nccl).
    """

    model: str = "mlp"
    batch_size: int = 8
    steps: int = 4
    lr: float = 0.1
    seed: int = 0
    device: str = "cpu"

    def __post_init__(self) -> None:
        checks.one_of("model", self.model, ("mlp", "gpt"))
        checks.one_of("device", self.device, ("cpu", "cuda"))
        checks.positive_int("batch_size", self.batch_size)
        checks.positive_int("steps", self.steps)
        checks.positive_float("lr", self.lr)


def device_of(run: Run) -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if run.device == "cuda" else torch.device("cpu")


def make_model(run: Run, seed: int | None = None) -> nn.Module:
    """The run's model on run's device, initialised (on the CPU) from `seed` (default run.seed)."""
    torch.manual_seed(run.seed if seed is None else seed)
    if run.model == "gpt":
        model = GPT(TINY_GPT)
    else:
        model = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 16))
    return model.to(device_of(run))


def make_batch(run: Run, step: int) -> tuple[Tensor, Tensor]:
    """The whole batch of `step`, the same in every process: inputs and targets, batch_size rows."""
    generator = torch.Generator().manual_seed(1000 * run.seed + step)
    if run.model == "gpt":
        ids = torch.randint(0, TINY_GPT.vocab_size, (run.batch_size, TINY_GPT.context_length + 1),
                            generator=generator).to(device_of(run))
        return ids[:, :-1], ids[:, 1:]
    inputs, targets = (torch.randn(run.batch_size, 16, generator=generator) for _ in range(2))
    return inputs.to(device_of(run)), targets.to(device_of(run))


def loss_of(model: nn.Module, inputs: Tensor, targets: Tensor) -> Tensor:
    """Mean squared error (MLP) or the mean next-token cross-entropy (GPT, logits (B, N, V))."""
    out = model(inputs)
    if out.dim() == 3:
        return F.cross_entropy(out.flatten(0, 1), targets.flatten())
    return F.mse_loss(out, targets)


def check_divides(batch_size: int, world_size: int) -> None:
    """Data parallelism gives each rank batch_size / world_size rows: it must be a whole number."""
    if batch_size % world_size:
        raise ValueError(f"batch_size={batch_size} cannot be split over world_size={world_size} ranks: "
                         f"expected a batch_size divisible by {world_size} (each rank takes "
                         "batch_size / world_size rows, and the average of the ranks' losses is the "
                         "whole batch's loss only when the shares are equal)")


def shard_rows(batch: Tensor, rank: int, world_size: int) -> Tensor:
    """Rows rank * b : (rank + 1) * b of a (B, ...) batch, with b = B / world_size."""
    checks.rank_in_world(rank, world_size)
    if not isinstance(batch, Tensor) or batch.dim() == 0:
        raise ValueError(f"batch is {batch!r:.60}, expected a tensor (B, ...) to split by rows")
    check_divides(batch.shape[0], world_size)
    rows = batch.shape[0] // world_size
    return batch[rank * rows:(rank + 1) * rows]


def make_optimizer(model: nn.Module, run: Run) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=run.lr, momentum=0.9)


def train_single(run: Run) -> dict[str, Tensor]:
    """The reference: one process, whole batches. Returns the final weights (a state dict)."""
    model = make_model(run)
    optimizer = make_optimizer(model, run)
    for step in range(run.steps):
        optimizer.zero_grad(set_to_none=True)
        loss_of(model, *make_batch(run, step)).backward()
        optimizer.step()
    return {name: t.detach().clone() for name, t in model.state_dict().items()}


# --- by hand ---------------------------------------------------------------------------------


def check_same_shapes(tensors: list[Tensor], what: str) -> None:
    """Raise on every rank, naming the first rank that differs, unless all ranks hold tensors of
    the same shapes (a collective over tensors of other shapes hangs or fails obscurely)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return
    mine = [(tuple(t.shape), str(t.dtype)) for t in tensors]
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    for rank, theirs in enumerate(every):
        if theirs != every[0]:
            at = next((i for i, (a, b) in enumerate(zip(every[0], theirs, strict=False)) if a != b),
                      min(len(theirs), len(every[0])))
            raise ValueError(f"the {what} differ across ranks: rank {rank} has {len(theirs)} "
                             f"tensors, rank 0 {len(every[0])}; the first difference is tensor {at} "
                             f"({theirs[at] if at < len(theirs) else 'missing'} on rank {rank}, "
                             f"{every[0][at] if at < len(every[0]) else 'missing'} on rank 0): "
                             "expected the same model on every rank")


@torch.no_grad()
def broadcast_parameters(model: nn.Module, src: int = 0) -> None:
    """Overwrite every parameter and buffer with rank `src`'s, so all ranks start equal."""
    checks.rank_in_world(src, dist.get_world_size())
    check_same_shapes(list(model.parameters()) + list(model.buffers()), "model's parameters and buffers")
    for tensor in [*model.parameters(), *model.buffers()]:
        dist.broadcast(tensor, src=src)


@torch.no_grad()
def average_gradients(model: nn.Module) -> None:
    """Every p.grad becomes the mean of the ranks' p.grad: one all-reduce (sum) per parameter.

    model.parameters() lists a tied matrix once, so it is reduced once.
    """
    world_size = dist.get_world_size()  # shapes were compared once, by broadcast_parameters
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad)  # sum over ranks, in place
            p.grad /= world_size


def _train_replica(rank: int, world_size: int, run: Run, model: nn.Module,
                   after_backward: Callable[[], None]) -> dict[str, Tensor]:
    """The loop every data-parallel worker shares: my rows, forward, backward, sync, step."""
    optimizer = make_optimizer(model, run)
    for step in range(run.steps):
        inputs, targets = make_batch(run, step)
        optimizer.zero_grad(set_to_none=True)
        loss_of(model, shard_rows(inputs, rank, world_size), shard_rows(targets, rank, world_size)).backward()
        after_backward()
        optimizer.step()
    return {name: t.detach().clone() for name, t in model.state_dict().items()}


def train_by_hand(rank: int, world_size: int, run: Run) -> dict[str, Tensor]:
    """Worker: each rank starts from its own random weights, so the broadcast is what syncs them."""
    model = make_model(run, seed=run.seed + rank)  # different on purpose: rank 0's = the reference
    broadcast_parameters(model)
    return _train_replica(rank, world_size, run, model, lambda: average_gradients(model))


# --- overlapping communication with backward ------------------------------------------------


class GradientBuckets:
    """All-reduce gradients in buckets of about `bucket_bytes`, each started during backward.

    Parameters are grouped in reverse order (backward reaches the last layers first). A hook on
    each parameter fires once its gradient is complete; when a bucket's last gradient arrives, the
    bucket is flattened into one tensor and its all-reduce starts asynchronously, while backward
    goes on computing earlier layers. `finish()` waits for all of them and writes the averages back.
    `log` holds (bucket, gradients ready when it started) for every launch.
    """

    def __init__(self, model: nn.Module, bucket_bytes: int) -> None:
        checks.positive_int("bucket_bytes", bucket_bytes)
        params = [p for p in model.parameters() if p.requires_grad][::-1]
        self.buckets: list[list[Tensor]] = [[]]
        size = 0
        for p in params:
            if size >= bucket_bytes:
                self.buckets.append([])
                size = 0
            self.buckets[-1].append(p)
            size += p.numel() * p.element_size()
        self.bucket_of = {id(p): i for i, bucket in enumerate(self.buckets) for p in bucket}
        self.n_params = len(params)
        self.log: list[tuple[int, int]] = []
        self._reset()
        for p in params:
            p.register_post_accumulate_grad_hook(self._gradient_ready)

    def _reset(self) -> None:
        self.waiting = [len(bucket) for bucket in self.buckets]
        self.in_flight: list[tuple[int, Tensor, dist.Work]] = []
        self.ready = 0

    def _gradient_ready(self, p: Tensor) -> None:
        self.ready += 1
        i = self.bucket_of[id(p)]
        self.waiting[i] -= 1
        if self.waiting[i] == 0:  # the bucket is full: start its all-reduce now
            flat = torch.cat([q.grad.flatten() for q in self.buckets[i]])
            self.in_flight.append((i, flat, dist.all_reduce(flat, async_op=True)))
            self.log.append((i, self.ready))

    @torch.no_grad()
    def finish(self) -> None:
        """Wait for every bucket's all-reduce; copy the averaged gradients back into p.grad."""
        world_size = dist.get_world_size()
        for i, flat, work in self.in_flight:
            work.wait()
            flat /= world_size
            for p, values in zip(self.buckets[i], flat.split([q.numel() for q in self.buckets[i]]),
                                 strict=True):
                p.grad.copy_(values.view_as(p))
        self._reset()


def train_bucketed(rank: int, world_size: int, run: Run,
                   bucket_bytes: int = 16_384) -> tuple[dict[str, Tensor], list[list[str]], list[tuple[int, int]]]:
    """Worker: as train_by_hand, with GradientBuckets. Returns weights, bucket contents, first step's log."""
    model = make_model(run, seed=run.seed + rank)
    broadcast_parameters(model)
    buckets = GradientBuckets(model, bucket_bytes)
    first_log: list[tuple[int, int]] = []

    def sync() -> None:
        first_log.extend([] if first_log else buckets.log)
        buckets.finish()

    weights = _train_replica(rank, world_size, run, model, sync)
    names = {id(p): name for name, p in model.named_parameters()}
    return weights, [[names[id(p)] for p in bucket] for bucket in buckets.buckets], first_log


# --- the real thing --------------------------------------------------------------------------


def train_torch_ddp(rank: int, world_size: int, run: Run) -> dict[str, Tensor]:
    """Worker: torch.nn.parallel.DistributedDataParallel does the broadcast and the buckets."""
    model = make_model(run, seed=run.seed + rank)
    ddp = nn.parallel.DistributedDataParallel(model)  # broadcasts rank 0's weights
    weights = _train_replica(rank, world_size, run, ddp, lambda: None)
    return {name.removeprefix("module."): t for name, t in weights.items()}


WORKERS = {"by hand": train_by_hand, "bucketed": train_bucketed, "torch DDP": train_torch_ddp}


def data_parallel(workers: Workers, method: str, run: Run) -> list:
    """Run WORKERS[method] on every process of `workers`; its results, one per rank."""
    checks.one_of("method", method, WORKERS)
    check_divides(run.batch_size, workers.world_size)
    return workers.run(WORKERS[method], run)


def max_difference(a: dict[str, Tensor], b: dict[str, Tensor]) -> float:
    """The largest |a - b| over all tensors of two state dicts with the same keys."""
    if a.keys() != b.keys():
        raise ValueError(f"the state dicts differ in names: {sorted(a.keys() ^ b.keys())}")
    return max((a[k].double() - b[k].double()).abs().max().item() for k in a)


def main() -> None:
    """`torchrun --standalone --nproc_per_node N -m helpers.scale.data_parallel`: train_by_hand on N processes started
    by torchrun (nccl and one GPU each when there are GPUs, else gloo), checked against one process."""
    from helpers.scale.workers import init_from_environment

    rank, world_size = init_from_environment()
    run = Run(model="gpt", batch_size=4 * world_size, device="cuda" if torch.cuda.is_available() else "cpu")
    weights = train_by_hand(rank, world_size, run)
    if rank == 0:
        gap = max_difference({k: v.cpu() for k, v in weights.items()},
                             {k: v.cpu() for k, v in train_single(run).items()})
        print(f"{world_size} processes ({dist.get_backend()}, {run.device}) vs 1 process: "
              f"max |diff| {'<' if gap < 1e-6 else '>='} 1e-6")
    dist.barrier()  # leave together: a rank that tears down while another still talks may abort
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # All work is done and checked. Skip the C++ destructors at interpreter exit: about one run in
    # thirty, torch 2.13's gloo aborts there ("terminate called without an active exception"),
    # and torchrun would report a run that succeeded as failed. (Here, not in main(): a test
    # runs main() in threads of its own process.)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
