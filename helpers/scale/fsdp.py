"""Notebook 11, part two: FSDP (ZeRO-3) by hand, with the ZeRO paper's memory accounting.

ZeRO-1 splits AdamW's state; FSDP splits everything. Each *unit* (one block of the GPT; the
embeddings, the final LayerNorm and the tied output matrix together form the root unit) keeps its
parameters as one flat vector cut into world_size equal pieces, and a rank stores only its piece:

    forward   all-gather a unit's pieces -> the full weights; run the unit; free them at once
    backward  all-gather again, run the unit's backward, reduce-scatter its gradient (each rank
              receives the *mean* over ranks of its own piece only), free the full weights
    step      AdamW on the piece: weights, gradient, m and v all one world_size-th of the model

Here a unit's backward reruns its forward on the input saved by the forward pass (activation
recomputation), so that no full weight stays alive between the two passes; torch's FSDP instead
keeps the autograd graph and refills the freed storage before the backward. Both all-gather
twice and reduce-scatter once per unit and step: 3 (p - 1) / p of the model's bytes per rank.

    FlatShard                       one unit's parameters as a flat shard: gather, free, reduce-scatter
    reduce_scatter_mean(flat, p)    this rank's piece of the mean of a flat (P,) gradient over ranks
    ShardAdamW                      AdamW (notebook 7's equations) on flat shards, decay on matrices only
    gpt_units(model, rank, p)       the course GPT cut into units: [root, block 0, ..., block L-1]
    fsdp_step(model, units, ids, targets)    one forward + backward, units gathered one at a time
    train_fsdp_by_hand              worker: `steps` AdamW steps of FSDP; full weights + bytes held
    train_reference                 one process, whole batches, torch.optim.AdamW (the reference)
    memory_table(world_size)        GPT-2 small and GPT-3 per rank under ZeRO 1/2/3 (2 + 2 + 12 bytes)

Shapes: B rows of N tokens (ids, targets (B, N)), P values in a unit's flat vector, S = P / p
(rounded up) in a shard.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from helpers import checks
from helpers.model.gpt import GPT, GPTConfig, exact_parameters
from helpers.scale.data_parallel import Run, make_batch, make_model, shard_rows
from helpers.scale.parallelism import memory_per_rank

BETAS, EPS, WEIGHT_DECAY = (0.9, 0.99), 1e-8, 0.1
GPT3 = GPTConfig(vocab_size=50257, context_length=2048, n_layers=96, n_heads=96, d_model=12288)


def _check_flat(name: str, tensor: object) -> Tensor:
    if not isinstance(tensor, Tensor) or tensor.dim() != 1 or not tensor.is_floating_point():
        got = f"shape {tuple(tensor.shape)}, {tensor.dtype}" if isinstance(tensor, Tensor) else type(tensor).__name__
        raise ValueError(f"{name} is {got}, expected a flat (P,) floating-point tensor")
    return tensor


def reduce_scatter_mean(flat: Tensor, world_size: int) -> Tensor:
    """flat: this rank's (P,) gradient, P divisible by world_size -> (P / world_size,): piece
    `rank` of the mean over all ranks of their flat gradients. One reduce-scatter (sum), then / p."""
    _check_flat("flat", flat)
    checks.positive_int("world_size", world_size)
    if flat.numel() % world_size:
        raise ValueError(f"flat has {flat.numel()} values, expected a multiple of world_size = "
                         f"{world_size} (pad the flat vector with zeros)")
    pieces = list(flat.chunk(world_size))
    mine = torch.empty_like(pieces[0])
    dist.reduce_scatter(mine, pieces)  # piece r of the sum, on rank r only
    return mine / world_size


def gradient_piece(rank: int, world_size: int, grads: list[Tensor]) -> Tensor:
    """Run on every rank: grads[rank] (P,) is this rank's flat gradient -> (P / world_size,) its
    piece of the mean over ranks (notebook 11's exercise; the workers pass rank and world_size)."""
    checks.rank_in_world(rank, world_size)
    if not isinstance(grads, (list, tuple)) or len(grads) != world_size:
        got = len(grads) if isinstance(grads, (list, tuple)) else type(grads).__name__
        raise ValueError(f"grads has {got} entries, expected one per rank ({world_size})")
    return reduce_scatter_mean(grads[rank], world_size)


class FlatShard:
    """The parameters of one unit, flattened, padded to a multiple of world_size, cut in pieces.

    `shard` (S,) is this rank's piece, `grad` (S,) its gradient, `decay` (S,) 1.0 where the value
    belongs to a matrix (decayed by AdamW) and 0.0 for vectors. Between uses the parameters hold
    no values (`free`); `gather` gives them the full weights again.
    """

    def __init__(self, params: list[nn.Parameter], rank: int, world_size: int) -> None:
        checks.rank_in_world(rank, world_size)
        unique = list({id(p): p for p in params}.values())  # a tied matrix once
        if not unique or not all(isinstance(p, nn.Parameter) for p in unique):
            raise ValueError("params is empty or holds something other than parameters, expected "
                             "a unit's parameters (list(module.parameters()))")
        self.params, self.rank, self.world_size = unique, rank, world_size
        self.shapes = [p.shape for p in unique]
        self.numels = [p.numel() for p in unique]
        self.total = sum(self.numels)
        self.size = math.ceil(self.total / world_size)
        with torch.no_grad():
            flat = self._padded(torch.cat([p.detach().flatten() for p in unique]))
            decay = self._padded(torch.cat([torch.full((p.numel(),), float(p.dim() >= 2), dtype=flat.dtype)
                                            for p in unique]))
        self.shard = flat[rank * self.size:(rank + 1) * self.size].clone()
        self.decay = decay[rank * self.size:(rank + 1) * self.size].clone()
        self.grad = torch.zeros_like(self.shard)
        self.gathered = False
        self.free()

    def _padded(self, flat: Tensor) -> Tensor:
        return torch.cat([flat, flat.new_zeros(self.size * self.world_size - flat.numel())])

    def gather(self) -> None:
        """All-gather the pieces; the parameters become views of the full (P,) vector."""
        pieces = [torch.empty_like(self.shard) for _ in range(self.world_size)]
        dist.all_gather(pieces, self.shard)
        full = torch.cat(pieces)[:self.total]
        for p, values, shape in zip(self.params, full.split(self.numels), self.shapes, strict=True):
            p.data = values.view(shape)
            p.grad = None
        self.gathered = True

    def free(self) -> None:
        """Drop the full weights and gradients: each parameter holds an empty tensor."""
        for p in self.params:
            p.data = torch.empty(0, dtype=self.shard.dtype)
            p.grad = None
        self.gathered = False

    def reduce_scatter_grads(self) -> None:
        """grad <- this rank's piece of the mean over ranks of the unit's full gradient."""
        if not self.gathered:
            raise RuntimeError("reduce_scatter_grads before gather: the unit holds no gradients")
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).flatten()
                          for p in self.params])
        self.grad = reduce_scatter_mean(self._padded(flat), self.world_size)

    def bytes_held(self) -> int:
        """Bytes this rank keeps between steps for the unit: its piece and the piece's gradient."""
        return 2 * self.shard.numel() * self.shard.element_size()

    def full_bytes(self) -> int:
        return self.total * self.shard.element_size()


class ShardAdamW:
    """AdamW on flat shards, torch.optim.AdamW's update: decoupled decay (matrices only), then
    lr m_hat / (sqrt(v_hat) + eps). m and v have the shards' size: one world_size-th each."""

    def __init__(self, shards: list[FlatShard], lr: float) -> None:
        if not shards or not all(isinstance(s, FlatShard) for s in shards):
            raise ValueError("shards is empty or holds something other than FlatShard, expected "
                             "the units of gpt_units()")
        self.shards, self.lr, self.t = shards, checks.positive_float("lr", lr), 0
        self.m = [torch.zeros_like(s.shard) for s in shards]
        self.v = [torch.zeros_like(s.shard) for s in shards]

    @torch.no_grad()
    def step(self) -> None:
        self.t += 1
        (beta1, beta2), lr = BETAS, self.lr
        for shard, m, v in zip(self.shards, self.m, self.v, strict=True):
            m.mul_(beta1).add_((1 - beta1) * shard.grad)
            v.mul_(beta2).add_((1 - beta2) * shard.grad * shard.grad)
            m_hat, v_hat = m / (1 - beta1 ** self.t), v / (1 - beta2 ** self.t)
            shard.shard.mul_(1 - lr * WEIGHT_DECAY * shard.decay)
            shard.shard.sub_(lr * m_hat / (v_hat.sqrt() + EPS))

    def state_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in [*self.m, *self.v])


def gpt_units(model: GPT, rank: int, world_size: int) -> list[FlatShard]:
    """[root, block 0, ..., block L-1]: the root holds the embeddings, ln_f and the (tied) output
    matrix, which the first and the last step of the forward pass both use."""
    if not isinstance(model, GPT):
        raise TypeError(f"model is a {type(model).__name__}, expected the course GPT")
    root = [*model.embed.parameters(), *model.ln_f.parameters(), *model.lm_head.parameters()]
    return [FlatShard(root, rank, world_size)] + [FlatShard(list(b.parameters()), rank, world_size)
                                                   for b in model.blocks]


def fsdp_step(model: GPT, units: list[FlatShard], ids: Tensor, targets: Tensor) -> tuple[float, int]:
    """One forward and backward on this rank's rows ids, targets (b, N); every unit's `grad`
    ends as its piece of the mean gradient over ranks. Returns (loss, peak bytes of full weights
    alive at once). The root stays gathered for the whole step, each block only while it runs."""
    if len(units) != len(model.blocks) + 1:
        raise ValueError(f"units has {len(units)} entries, expected {len(model.blocks) + 1} "
                         "(gpt_units(model, rank, world_size))")
    if ids.shape != targets.shape or ids.dim() != 2:
        raise ValueError(f"ids {tuple(ids.shape)} and targets {tuple(targets.shape)}, expected two (b, N)")
    root, blocks = units[0], units[1:]
    root.gather()
    peak = root.full_bytes() + max(u.full_bytes() for u in blocks)
    inputs = []
    with torch.no_grad():  # forward: keep only each block's input
        x = model.drop(model.embed(ids))
        for block, unit in zip(model.blocks, blocks, strict=True):
            unit.gather()
            inputs.append(x)
            x = block(x)
            unit.free()
    x.requires_grad_(True)
    loss = F.cross_entropy(model.lm_head(model.ln_f(x)).flatten(0, 1), targets.flatten())
    loss.backward()
    grad = x.grad
    for block, unit, x_in in zip(model.blocks[::-1], blocks[::-1], inputs[::-1], strict=True):
        unit.gather()  # the second all-gather of this unit
        x_in.requires_grad_(True)
        block(x_in).backward(grad)
        grad = x_in.grad
        unit.reduce_scatter_grads()
        unit.free()
    model.drop(model.embed(ids)).backward(grad)  # the embeddings' share of the root's gradient
    root.reduce_scatter_grads()
    root.free()
    return loss.item(), peak


def train_fsdp_by_hand(rank: int, world_size: int, run: Run) -> dict[str, object]:
    """Worker: run.steps of FSDP with AdamW in float64 on the course GPT (run.model must be "gpt").

    Returns the full weights at the end (gathered, by name), the bytes this rank holds between
    steps (weights + gradients + AdamW state of its shards), the same for one process holding
    everything, and the peak bytes of full weights alive during a step."""
    if run.model != "gpt":
        raise ValueError(f"run.model is {run.model!r}, expected 'gpt'")
    model = make_model(run).double()  # the same seed everywhere; each rank keeps its piece
    units = gpt_units(model, rank, world_size)
    optimizer = ShardAdamW(units, run.lr)
    peak = 0
    for step in range(run.steps):
        ids, targets = make_batch(run, step)
        _, peak = fsdp_step(model, units, shard_rows(ids, rank, world_size),
                            shard_rows(targets, rank, world_size))
        optimizer.step()
    held = sum(u.bytes_held() for u in units) + optimizer.state_bytes()
    single = 4 * sum(u.full_bytes() for u in units)  # weights, gradients, m, v
    for unit in units:
        unit.gather()
    weights = {name: t.detach().clone() for name, t in model.state_dict().items()}
    return {"weights": weights, "held_bytes": held, "single_bytes": single, "peak_full_bytes": peak}


def train_reference(run: Run) -> dict[str, Tensor]:
    """One process, whole batches, float64, torch.optim.AdamW with the same settings (decay on
    matrices only): the weights FSDP must end with."""
    model = make_model(run).double()
    params = list(model.parameters())
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": WEIGHT_DECAY},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=run.lr, betas=BETAS, eps=EPS, foreach=False)
    for step in range(run.steps):
        ids, targets = make_batch(run, step)
        optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(model(ids).flatten(0, 1), targets.flatten()).backward()
        optimizer.step()
    return {name: t.detach().clone() for name, t in model.state_dict().items()}


def memory_table(world_size: int = 64) -> dict[str, dict[str, float]]:
    """Bytes per rank for GPT-2 small and GPT-3 (175B) over `world_size` ranks, in the ZeRO
    paper's mixed precision (2 + 2 + 12 bytes a parameter, 16 Psi): data parallel 16 Psi,
    stage 1 4 Psi + 12 Psi / N, stage 2 2 Psi + 14 Psi / N, stage 3 (FSDP) 16 Psi / N."""
    checks.positive_int("world_size", world_size)
    return {name: memory_per_rank(exact_parameters(config), world_size, precision="mixed")
            for name, config in (("GPT-2 small", GPTConfig.gpt2_small()), ("GPT-3 175B", GPT3))}
