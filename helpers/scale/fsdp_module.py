"""Notebook 11: FSDP by hand for any nn.Module, with an optional compute dtype.

`helpers.scale.fsdp` derives ZeRO-3 on the course GPT, step by step. This is the same idea as a
wrapper a student can put around a model the course did not write, the way PyTorch's
`fully_shard` (FSDP2) is used:

    model = FSDP(model, compute_dtype=torch.bfloat16, units=[nn.TransformerEncoderLayer])
    optimizer = torch.optim.AdamW(model.parameters())   # steps this rank's shards only

Each parameter is flattened, padded to a multiple of world_size and cut into world_size equal
pieces; a rank keeps only its piece, as an nn.Parameter in float32 (the "master" copy that any
torch.optim optimizer steps). A *unit* is a set of parameters gathered together: each submodule
the `units` policy picks is one, and everything else (with any parameter shared between two
units, such as tied embeddings) forms the root unit.

    forward   all-gather a unit's pieces -> its full weights, cast to compute_dtype; run it
    backward  gather again (the unit's forward is recomputed, so no full weight stays alive
              between the passes), then reduce-scatter each weight's gradient in float32: each
              rank receives the mean over ranks of its own piece
    step      the optimizer, on the pieces

Shapes: P values in a parameter, S = ceil(P / W) in its piece, W = world_size.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from helpers.scale.workers import world

COMPUTE_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


class _GatherPiece(torch.autograd.Function):
    """piece (S,) -> the full parameter (shape), in `dtype`; backward: reduce-scatter (mean)."""

    @staticmethod
    def forward(ctx: Any, piece: Tensor, shape: torch.Size, dtype: torch.dtype) -> Tensor:
        _, world_size = world()
        ctx.world_size, ctx.numel = world_size, math.prod(shape)
        pieces = [torch.empty_like(piece) for _ in range(world_size)]
        if world_size > 1:
            dist.all_gather(pieces, piece.contiguous())
        else:
            pieces = [piece]
        return torch.cat(pieces)[:ctx.numel].view(shape).to(dtype)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:
        flat = grad.float().flatten()  # gradients are reduced in float32, whatever the compute dtype
        size = math.ceil(ctx.numel / ctx.world_size)
        padded = torch.cat([flat, flat.new_zeros(size * ctx.world_size - ctx.numel)])
        if ctx.world_size == 1:
            return padded, None, None
        mine = torch.empty(size, dtype=padded.dtype)
        dist.reduce_scatter(mine, list(padded.chunk(ctx.world_size)))
        return mine / ctx.world_size, None, None


def _check_module(module: Any) -> list[tuple[str, nn.Parameter]]:
    if not isinstance(module, nn.Module):
        raise TypeError(f"module is a {type(module).__name__}, expected a torch.nn.Module")
    named = list(module.named_parameters())
    if not named:
        raise ValueError(f"module ({type(module).__name__}) has no parameters, expected at least "
                         "one to shard")
    return named


def _check_dtypes(named: list[tuple[str, nn.Parameter]], compute_dtype: torch.dtype | None) -> None:
    if compute_dtype is not None and compute_dtype not in COMPUTE_DTYPES:
        raise ValueError(f"compute_dtype is {compute_dtype}, expected one of "
                         f"{', '.join(map(str, COMPUTE_DTYPES))} or None")
    for name, p in named:
        if not p.is_floating_point():
            raise TypeError(f"parameter {name} has dtype {p.dtype}, expected a floating-point "
                            "parameter (the shards are stepped by an optimizer)")
        if compute_dtype is not None and p.numel():
            largest = float(p.detach().abs().max())
            if largest > torch.finfo(compute_dtype).max:
                raise ValueError(f"parameter {name} holds {largest:.4g}, more than compute_dtype "
                                 f"{compute_dtype} can hold ({torch.finfo(compute_dtype).max:.4g})")


def _picked_units(module: nn.Module, units: Any) -> list[nn.Module]:
    """The submodules the policy picks, outermost first (a picked module's children are not)."""
    if units is None:
        return []
    if isinstance(units, type):
        units = [units]
    if isinstance(units, (list, tuple)) and all(isinstance(u, type) for u in units):
        kinds = tuple(units)
        picks: Callable[[nn.Module], bool] = lambda m: isinstance(m, kinds)  # noqa: E731
    elif callable(units):
        picks = units
    else:
        raise TypeError(f"units is {units!r}, expected None, a module class, a list of them, or "
                        "a function module -> bool")
    found: list[nn.Module] = []

    def visit(parent: nn.Module) -> None:
        for child in parent.children():
            if picks(child):
                found.append(child)
            else:
                visit(child)

    visit(module)
    return found


class FSDP(nn.Module):
    """`module` with its parameters sharded across the ranks; see the module docstring.

    units: None (the whole module is one unit), a module class or a list of them, or a function
    module -> bool: each submodule it picks is gathered on its own.
    compute_dtype: the dtype of the gathered weights and of the floating inputs of each unit
    (None: the parameters' own); the shards and the gradient reduction stay float32.
    """

    def __init__(self, module: nn.Module, compute_dtype: torch.dtype | None = None,
                 units: Any = None) -> None:
        named = _check_module(module)
        _check_dtypes(named, compute_dtype)
        picked = _picked_units(module, units)
        super().__init__()
        self.rank, self.world_size = world()
        self.module, self.compute_dtype = module, compute_dtype
        self.names = [name for name, _ in named]  # each parameter once, tied ones by first name
        where = self._locations(module)
        owner = self._owners(picked, where)
        self.pieces = nn.ParameterList()
        self.shapes: list[torch.Size] = []
        self._places: list[list[tuple[nn.Module, str]]] = []
        self._unit_params: list[list[int]] = [[] for _ in range(len(picked) + 1)]  # [root, units...]
        for index, (_, p) in enumerate(named):
            self.pieces.append(nn.Parameter(self._piece_of(p.detach()), requires_grad=p.requires_grad))
            self.shapes.append(p.shape)
            self._places.append(where[id(p)])
            self._unit_params[owner[id(p)]].append(index)
            for place, attr in where[id(p)]:
                del place._parameters[attr]  # the full weight lives only while gathered
        for number, unit in enumerate(picked, start=1):
            unit.forward = functools.partial(self._unit_forward, number, unit.forward)

    @staticmethod
    def _locations(module: nn.Module) -> dict[int, list[tuple[nn.Module, str]]]:
        """Every (submodule, attribute name) holding each parameter, tied ones in several places."""
        where: dict[int, list[tuple[nn.Module, str]]] = {}
        for sub in module.modules():
            for attr, p in sub._parameters.items():
                if p is not None:
                    where.setdefault(id(p), []).append((sub, attr))
        return where

    @staticmethod
    def _owners(picked: list[nn.Module], where: dict[int, list[tuple[nn.Module, str]]]) -> dict[int, int]:
        """Which unit gathers each parameter: the one picked unit (1, 2, ...) holding all its
        places, else the root (0): a weight shared between two units must be alive for both."""
        unit_of = {id(sub): number for number, unit in enumerate(picked, start=1) for sub in unit.modules()}
        owner = {}
        for key, places in where.items():
            units = {unit_of.get(id(sub), 0) for sub, _ in places}
            owner[key] = units.pop() if len(units) == 1 else 0
        return owner

    def _piece_of(self, full: Tensor) -> Tensor:
        """This rank's (S,) piece of a parameter, in float32, padded with zeros at the end."""
        flat = full.float().flatten()
        size = math.ceil(flat.numel() / self.world_size)
        flat = torch.cat([flat, flat.new_zeros(size * self.world_size - flat.numel())])
        return flat[self.rank * size:(self.rank + 1) * size].clone()

    def _gather_unit(self, number: int) -> None:
        """All-gather the unit's parameters and put each full weight where the module reads it."""
        for index in self._unit_params[number]:
            full = _GatherPiece.apply(self.pieces[index], self.shapes[index],
                                      self.compute_dtype or torch.float32)
            for place, attr in self._places[index]:
                setattr(place, attr, full)

    def _cast(self, value: Any) -> Any:
        if self.compute_dtype is not None and isinstance(value, Tensor) and value.is_floating_point():
            return value.to(self.compute_dtype)
        return value

    def _run_unit(self, number: int, forward: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        self._gather_unit(number)
        return forward(*(self._cast(a) for a in args), **{k: self._cast(v) for k, v in kwargs.items()})

    def _unit_forward(self, number: int, forward: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        # Recomputed in the backward: the unit's weights are gathered again there, not kept.
        return checkpoint(self._run_unit, number, forward, *args, use_reentrant=False, **kwargs)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        self._gather_unit(0)
        return self.module(*(self._cast(a) for a in args), **{k: self._cast(v) for k, v in kwargs.items()})

    @torch.no_grad()
    def full_parameters(self) -> dict[str, Tensor]:
        """Every parameter gathered in full (float32), by its name in the wrapped module."""
        return {name: _GatherPiece.apply(piece, shape, torch.float32).clone()
                for name, piece, shape in zip(self.names, self.pieces, self.shapes, strict=True)}

    def piece_bytes(self) -> int:
        """Bytes of parameters this rank keeps between steps (its pieces)."""
        return sum(p.numel() * p.element_size() for p in self.pieces)

