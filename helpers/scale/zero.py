"""Notebook 11: ZeRO-1 around any optimizer, what `ShardedAdamW` grows into.

`helpers.scale.sharded.ShardedAdamW` writes AdamW's equations by hand on the parameters a rank
owns. The same split works for any optimizer without touching its equations: each rank builds
the optimizer the user asked for over the parameters it owns only (so only it holds their
state), steps it, and broadcasts the owned parameters to everyone, as DeepSpeed's ZeRO stage 1
and PyTorch's `ZeroRedundancyOptimizer` do:

    optimizer = ShardedOptimizer(model.parameters(), torch.optim.AdamW, lr=1e-3)
    loss.backward(); average_gradients(model)   # data parallelism gives every rank the mean
    optimizer.step()

Each parameter's update reads only its own gradient and state, so the result equals the
unsharded optimizer's bit for bit wherever the optimizer updates one tensor at a time (torch's
default on a CPU; tested with torch.equal).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from helpers.scale.sharded import assign_owners
from helpers.scale.workers import world


def _groups(params: Any) -> list[dict[str, Any]]:
    """params as torch.optim takes them (tensors, or dicts with "params") -> a list of groups,
    each parameter once (a tied weight is one tensor). A weight in two groups is refused, as
    torch.optim refuses it: which group's settings would it follow?"""
    if isinstance(params, Tensor):
        raise TypeError("params is a single tensor, expected an iterable of them "
                        "(model.parameters()) or of parameter groups")
    items = list(params)
    groups = items if items and all(isinstance(g, dict) for g in items) else [{"params": items}]
    seen: set[int] = set()
    out = []
    for number, group in enumerate(groups):
        if "params" not in group:
            raise ValueError(f"parameter group {number} has no 'params', expected a dict like "
                             "{'params': [...], 'lr': ...}")
        tensors = [group["params"]] if isinstance(group["params"], Tensor) else list(group["params"])
        for p in tensors:
            if not isinstance(p, Tensor) or not p.is_floating_point():
                got = p.dtype if isinstance(p, Tensor) else type(p).__name__
                raise ValueError(f"parameter group {number} holds {got}, expected floating-point "
                                 "tensors (the model's parameters)")
        unique = list({id(p): p for p in tensors}.values())
        repeated = next((j for j, p in enumerate(unique) if id(p) in seen), None)
        if repeated is not None:
            first = next(i for i, g in enumerate(out) if any(p is unique[repeated] for p in g["params"]))
            raise ValueError(f"parameter group {number} lists weight {repeated} (shape "
                             f"{tuple(unique[repeated].shape)}), which parameter group {first} lists "
                             "too: expected each weight in one group only")
        seen.update(id(p) for p in unique)
        out.append({**group, "params": unique})
    if not any(group["params"] for group in out):
        raise ValueError("params is empty, expected the model's parameters (model.parameters())")
    return out


class ShardedOptimizer:
    """ZeRO-1: `optimizer_class(**defaults)` over this rank's share of the parameters.

    Parameters are given to ranks largest first, each to the rank holding least so far. The
    gradients must already be the same on every rank (averaged by data parallelism) when
    `step` runs; after it every rank holds every updated parameter.
    """

    def __init__(self, params: Iterable[Tensor] | Iterable[dict[str, Any]],
                 optimizer_class: type[torch.optim.Optimizer], **defaults: Any) -> None:
        if not (isinstance(optimizer_class, type) and issubclass(optimizer_class, torch.optim.Optimizer)):
            raise TypeError(f"optimizer_class is {optimizer_class!r}, expected a torch.optim.Optimizer "
                            "subclass such as torch.optim.AdamW (the class, not an instance)")
        self.rank, self.world_size = world()
        self.groups = _groups(params)
        self.params = [p for group in self.groups for p in group["params"]]
        self.owner = assign_owners([p.numel() for p in self.params], self.world_size)
        mine = {id(p) for p, owner in zip(self.params, self.owner, strict=True) if owner == self.rank}
        local = [{**g, "params": [p for p in g["params"] if id(p) in mine]} for g in self.groups]
        local = [g for g in local if g["params"]]
        self.local = optimizer_class(local, **defaults) if local else None  # None: owns nothing

    @torch.no_grad()
    def step(self) -> None:
        """Step the owned parameters (one without a .grad is skipped, as torch.optim does), then
        every owner broadcasts its own to all ranks."""
        if self.local is not None:
            self.local.step()
        if self.world_size > 1:
            for p, owner in zip(self.params, self.owner, strict=True):
                dist.broadcast(p.data, src=owner)

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        """The groups of this rank's optimizer (its own parameters), whose state `state_dict` holds."""
        return [] if self.local is None else self.local.param_groups

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    def state_bytes(self) -> int:
        """Bytes of optimizer state this rank holds (only its own parameters')."""
        if self.local is None:
            return 0
        return sum(t.numel() * t.element_size() for state in self.local.state.values()
                   for t in state.values() if isinstance(t, Tensor))

    def state_dict(self) -> dict[str, Any]:
        """This rank's optimizer state (its own parameters'), for a checkpoint per rank."""
        return {} if self.local is None else self.local.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.local is None:
            if state:
                raise ValueError(f"rank {self.rank} owns no parameters but was given optimizer state")
            return
        self.local.load_state_dict(state)
