"""Notebook 11, section 3: shard the optimizer state (ZeRO-1) by hand, then PyTorch's own.

Data parallelism keeps a full copy of everything on every rank. AdamW's two running averages
are twice the weights, so they are the first thing to split: with ZeRO-1 each rank keeps m and v
only for the parameters it *owns*, updates only those, and broadcasts them to the others.

    assign_owners(sizes, world_size)  which rank owns which parameter (balanced by size)
    ShardedAdamW                      AdamW (notebook 7's equations) on the owned shard + broadcasts;
                                      state_dict() / load_state_dict(): this rank's part, resumed exactly
    train_zero_by_hand                worker: ShardedAdamW against an unsharded twin, same gradients
    train_zero_torch                  worker: torch's ZeroRedundancyOptimizer against torch.optim.AdamW
    train_fsdp                        worker: FSDP2's fully_shard (weights, gradients and state split)
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
import torch.distributed as dist
from torch import Tensor, nn

from helpers import checks
from helpers.scale.data_parallel import (
    Run,
    average_gradients,
    check_same_shapes,
    loss_of,
    make_batch,
    make_model,
    shard_rows,
)
from helpers.training.by_hand import _adam_state_dict, _load_adam_state, adamw_update


def assign_owners(sizes: Sequence[int], world_size: int) -> list[int]:
    """The owner rank of each parameter: largest first, each to the rank holding least so far."""
    checks.positive_int("world_size", world_size)
    if not isinstance(sizes, Sequence) or isinstance(sizes, str):
        raise TypeError(f"sizes is {sizes!r:.60}, expected a list of parameter sizes (ints >= 0)")
    for i, size in enumerate(sizes):
        checks.non_negative_int(f"sizes[{i}]", size)
    load = [0] * world_size
    owners = [0] * len(sizes)
    for i in sorted(range(len(sizes)), key=lambda i: -sizes[i]):
        owners[i] = min(range(world_size), key=lambda r: load[r])
        load[owners[i]] += sizes[i]
    return owners


class ShardedAdamW:
    """ZeRO-1 AdamW: m and v for this rank's parameters only; then every owner broadcasts its own.

    Matrices (two or more axes) are decayed, vectors are not, as in notebook 7. With world_size=1
    it is plain AdamW: every parameter is owned and there is nothing to broadcast.
    """

    def __init__(self, params: Iterable[Tensor], rank: int, world_size: int,
                 betas: tuple[float, float] = (0.9, 0.99), eps: float = 1e-8, weight_decay: float = 0.1) -> None:
        self.params = list(params)
        checks.rank_in_world(rank, world_size)
        if not self.params or not all(isinstance(p, Tensor) for p in self.params):
            raise ValueError("params is empty or holds something other than tensors, expected the "
                             "model's parameters (model.parameters())")
        first = {}
        repeated = next((j for j, p in enumerate(self.params) if first.setdefault(id(p), j) != j), None)
        if repeated is not None:  # it would be stepped twice, with two sets of moments
            raise ValueError(f"params lists weight {repeated} (shape {tuple(self.params[repeated].shape)}) "
                             "a second time, expected each weight once (model.parameters() lists a tied one once)")
        if not (isinstance(betas, tuple | list) and len(betas) == 2):
            raise ValueError(f"betas is {betas!r}, expected two numbers (beta1, beta2)")
        for name, beta in zip(("betas[0]", "betas[1]"), betas, strict=True):  # 1.0 never forgets
            checks.number_in(name, beta, 0.0, 1.0, high_open=True, expected="a number in [0, 1)")
        checks.positive_float("eps", eps)
        checks.number_in("weight_decay", weight_decay, 0.0, float("inf"), high_open=True)
        if world_size > 1:
            check_same_shapes(self.params, "params")
        self.rank, self.world_size = rank, world_size
        self.owner = assign_owners([p.numel() for p in self.params], world_size)
        self.mine = [i for i, owner in enumerate(self.owner) if owner == rank]
        self.m = {i: torch.zeros_like(self.params[i]) for i in self.mine}
        self.v = {i: torch.zeros_like(self.params[i]) for i in self.mine}
        self.betas, self.eps, self.weight_decay, self.t = betas, eps, weight_decay, 0

    @torch.no_grad()
    def step(self, lr: float) -> None:
        checks.number_in("lr", lr, 0.0, float("inf"), high_open=True, expected="a finite number >= 0")
        missing = [i for i in self.mine if self.params[i].grad is None][:3]
        if missing:
            raise ValueError(f"params {missing} of rank {self.rank} have no .grad, expected "
                             "backward() to have run before step()")
        self.t += 1
        for i in self.mine:  # notebook 7's update, on this rank's own parameters only
            p, decay = self.params[i], self.weight_decay if self.params[i].dim() >= 2 else 0.0
            new_p, self.m[i], self.v[i] = adamw_update(p, p.grad, self.m[i], self.v[i], self.t, lr,
                                                       self.betas, self.eps, decay)
            p.copy_(new_p)  # in place: the model keeps its tensor
        if self.world_size > 1:
            for p, owner in zip(self.params, self.owner, strict=True):
                dist.broadcast(p, src=owner)  # the owner's updated values, everywhere

    def state_bytes(self) -> int:
        """Bytes of optimizer state this rank holds (m and v of its own parameters)."""
        return sum(t.numel() * t.element_size() for t in [*self.m.values(), *self.v.values()])

    @property
    def param_groups(self) -> list[dict[str, object]]:
        """Every parameter in one group (the state's weight i is params[i]), as torch.optim lists them."""
        return [{"params": self.params, "weight_decay": self.weight_decay}]

    def state_dict(self) -> dict[str, object]:
        """This rank's state, laid out as torch.optim's: t, and m and v of the parameters it owns
        (a checkpoint per rank, as ZeRO writes one)."""
        return _adam_state_dict(self.t, {i: (self.m[i], self.v[i]) for i in self.mine},
                                self.param_groups, self.betas, self.eps)

    def load_state_dict(self, state: dict[str, object]) -> None:
        """Take t, the moments and the settings from the `state_dict()` this rank saved (the same
        world_size: the moments must be of the parameters this rank owns)."""
        t, moments, (betas, eps, decays) = _load_adam_state(state, self.param_groups, owned=self.mine)
        self.t, self.betas, self.eps, self.weight_decay = t, betas, eps, decays[0]
        self.m = {i: m for i, (m, _) in moments.items()}
        self.v = {i: v for i, (_, v) in moments.items()}


def _gradient_step(rank: int, world_size: int, run: Run, step: int, model: nn.Module,
                   twin: nn.Module) -> None:
    """Average model's gradient over the ranks (as in data parallelism) and give twin the same."""
    inputs, targets = make_batch(run, step)
    model.zero_grad(set_to_none=True)
    loss_of(model, shard_rows(inputs, rank, world_size), shard_rows(targets, rank, world_size)).backward()
    average_gradients(model)
    for mine, other in zip(model.parameters(), twin.parameters(), strict=True):
        other.grad = mine.grad.clone()


def _largest_gap(a: nn.Module, b: nn.Module) -> float:
    return max((p - q).abs().max().item() for p, q in zip(a.parameters(), b.parameters(), strict=True))


def train_zero_by_hand(rank: int, world_size: int, run: Run) -> dict[str, float | int]:
    """Worker: ShardedAdamW and an unsharded twin get the same gradients; how far apart do they end?"""
    model, twin = make_model(run), make_model(run)
    sharded = ShardedAdamW(model.parameters(), rank, world_size)
    full = ShardedAdamW(twin.parameters(), rank=0, world_size=1)
    gap = 0.0
    for step in range(run.steps):
        _gradient_step(rank, world_size, run, step, model, twin)
        sharded.step(run.lr)
        full.step(run.lr)
        gap = max(gap, _largest_gap(model, twin))
    return {"max_gap": gap, "state_bytes": sharded.state_bytes(), "full_state_bytes": full.state_bytes(),
            "owned": len(sharded.mine), "parameters": len(sharded.params)}


def _adam_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    return sum(state[key].numel() * state[key].element_size()
               for state in optimizer.state.values() for key in ("exp_avg", "exp_avg_sq"))


def train_zero_torch(rank: int, world_size: int, run: Run) -> dict[str, float | int]:
    """Worker: torch.distributed.optim.ZeroRedundancyOptimizer against torch.optim.AdamW."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    model, twin = make_model(run), make_model(run)
    settings = dict(lr=run.lr, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1, foreach=False)
    sharded = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, **settings)
    full = torch.optim.AdamW(twin.parameters(), **settings)
    gap = 0.0
    for step in range(run.steps):
        _gradient_step(rank, world_size, run, step, model, twin)
        sharded.step()
        full.step()
        gap = max(gap, _largest_gap(model, twin))
    return {"max_gap": gap, "state_bytes": _adam_state_bytes(sharded.optim),
            "full_state_bytes": _adam_state_bytes(full)}


def train_fsdp(rank: int, world_size: int, run: Run) -> dict[str, object]:
    """Worker: FSDP2 (`fully_shard`) splits weights, gradients and optimizer state across ranks.

    Each block is one unit (its weights are all-gathered just before it runs, freed after), the
    rest of the model the root unit. Gradients are reduce-scattered: each rank keeps the average
    of its own shard. Returns the full weights at the end and the bytes of weights this rank holds.
    """
    from torch.distributed.fsdp import fully_shard

    model = make_model(run)  # the same seed everywhere: fully_shard keeps this rank's slice
    full_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    units = model.blocks if run.model == "gpt" else [model[0], model[2]]
    for unit in units:
        fully_shard(unit)
    fully_shard(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=run.lr, momentum=0.9)
    for step in range(run.steps):
        inputs, targets = make_batch(run, step)
        optimizer.zero_grad(set_to_none=True)
        loss_of(model, shard_rows(inputs, rank, world_size), shard_rows(targets, rank, world_size)).backward()
        optimizer.step()
    local_bytes = sum(p.to_local().numel() * p.element_size() for p in model.parameters())
    weights = {name: t.full_tensor().detach().clone() if hasattr(t, "full_tensor") else t.detach().clone()
               for name, t in model.state_dict().items()}
    return {"weights": weights, "local_bytes": local_bytes, "full_bytes": full_bytes,
            "kind": type(next(model.parameters())).__name__}
