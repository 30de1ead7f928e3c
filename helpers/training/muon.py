"""Muon by hand: orthogonalised momentum for a network's hidden matrices, AdamW for the rest.

AdamW scales each entry of the gradient on its own. Muon treats a weight matrix as a matrix: it
keeps a momentum of the gradient, then replaces that matrix M = U S V^T by (roughly) U V^T, the
nearest matrix whose singular values are all 1, and steps along it. Every direction the gradient
spans then moves the same amount, the rare ones as much as the dominant one (Keller Jordan's
Muon post, 2024; at scale: Moonshot AI's "Muon is scalable for LLM training", 2025).

    newton_schulz(m, steps, coefficients)   U V^T, approximately, from matrix products only
    newton_schulz_batched(ms, ...)          the same on a stack of matrices of one shape, at once
    muon_lr_scale(shape, rule)              the learning rate's factor for a matrix's shape
    muon_update(p, g, buf, lr, ...)         one Muon step on one matrix: the new (p, buf)
    Muon                                    the optimiser: muon_update on every matrix it holds
    split_for_muon(model)                   hidden matrices for Muon; embeddings, head, vectors apart
    MuonWithAdamW                           the pair as one optimiser (step, zero_grad, state_dict)

Each step of Muon is the one `torch.optim.Muon` takes, bit for bit (tests/training/test_muon.py),
Newton-Schulz in bfloat16 as there. `ns_dtype=torch.float32` iterates in float32 instead: on a CPU
without native bfloat16 (most laptops) bf16 products are emulated, measured over 20x slower.

The fast path: Muon.step hands all matrices of one shape to `newton_schulz_batched` at once (the
same result bit for bit); in float32 a matrix at least twice as wide as tall iterates on its small
Gram matrix (< 1e-5 apart). benchmarks/bench_muon_step.py measures the step against AdamW's.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from helpers import checks
from helpers.training.speed import make_optimizer

NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)  # the quintic of the Muon post: steepest at 0
NS_STEPS = 5
NS_EPS = 1e-7
LR_RULES = ("original", "match_rms_adamw")


# --- the idea: orthogonalise with matrix products ------------------------------------------

def newton_schulz(m: Tensor, steps: int = NS_STEPS, coefficients: Sequence[float] = NS_COEFFICIENTS,
                  eps: float = NS_EPS, dtype: torch.dtype = torch.bfloat16) -> Tensor:
    """m (A, B) -> a matrix of the same shape with m's singular vectors and singular values near 1.

    With m = U S V^T, the odd polynomial f(X) = a X + b (X X^T) X + c (X X^T)^2 X is
    U f(S) V^T: it acts on each singular value alone. Scaled so that every singular value is at
    most 1 (divide by the Frobenius norm, which is >= the largest), `steps` applications of f
    push them all towards 1. The coefficients (a, b, c) make f as steep at 0 as possible, so
    even tiny singular values grow fast; the price is that they end anywhere in about
    [0.7, 1.2] rather than at 1, which does not hurt training. A tall matrix (A > B) is
    transposed first, so X X^T is the smaller (B, B) Gram matrix. Runs in and returns `dtype`
    (bfloat16, as torch.optim.Muon; the iteration is robust to its rounding).
    """
    _check_matrix("m", m)
    if not bool(torch.isfinite(m).all()):
        raise ValueError("m holds NaN or inf, expected finite values")
    a, b, c = _check_ns_settings(steps, coefficients, eps)
    return _newton_schulz(m, steps, (a, b, c), eps, _check_dtype(dtype))


def _newton_schulz(m: Tensor, steps: int, coefficients: tuple[float, float, float], eps: float,
                   dtype: torch.dtype) -> Tensor:
    a, b, c = coefficients
    x = _below_one(m, dims=(0, 1)).to(dtype)
    tall = m.shape[0] > m.shape[1]
    if tall:
        x = x.T                                        # (B, A): the Gram matrix below is (B, B)
    x = x / x.norm().clamp(min=eps)                    # every singular value now <= 1
    for _ in range(steps):
        gram = x @ x.T                                 # X X^T, (rows, rows)
        poly = torch.addmm(gram, gram, gram, beta=b, alpha=c)  # b G + c G^2, rounded once
        x = torch.addmm(x, poly, x, beta=a)            # a X + (b G + c G^2) X
    return x.T if tall else x


def _below_one(m: Tensor, dims: tuple[int, int]) -> Tensor:
    """m over the power of two just above its largest entry, if that is >= 1: the same result bit
    for bit (only exponents move), but the norm cannot overflow (1e20 squared is inf in float32,
    and m / inf is all zeros). Smaller entries are left alone, so the norm's eps clamp holds."""
    _, exponent = torch.frexp(m.detach().abs().amax(dim=dims, keepdim=True))
    return m * torch.ldexp(torch.ones_like(m[..., :1, :1]), -exponent.clamp(min=0))


def newton_schulz_batched(ms: Tensor, steps: int = NS_STEPS, coefficients: Sequence[float] = NS_COEFFICIENTS,
                          eps: float = NS_EPS, dtype: torch.dtype = torch.bfloat16) -> Tensor:
    """ms (K, A, B), K matrices of one shape -> `newton_schulz` of each, stacked (K, A, B).

    The same operations as `newton_schulz` on each matrix, as batched products (torch.bmm,
    torch.baddbmm): one call per product for all K. Each matrix keeps its own norm, and a tall
    stack is transposed as a view, so every product sees the same layout: the result equals the
    per-matrix one bit for bit (float32 matrices with a side under 8 may differ by < 1e-5).
    One exception, in float32 or float64 only: a matrix at least twice as wide as tall (n >= 2m)
    iterates on its small Gram matrix (`_gram_newton_schulz`), the same polynomial with fewer
    multiplications, equal to `newton_schulz` to float32 rounding (< 1e-5 per entry).
    """
    if not (isinstance(ms, Tensor) and ms.is_floating_point()):
        got = f"has dtype {ms.dtype}" if isinstance(ms, Tensor) else f"is a {type(ms).__name__}"
        raise TypeError(f"ms {got}, expected a (K, A, B) floating-point tensor")
    if ms.dim() != 3 or 0 in ms.shape:
        raise ValueError(f"ms has shape {tuple(ms.shape)}, expected a stack of matrices (K, A, B), none empty")
    if not bool(torch.isfinite(ms).all()):
        raise ValueError("ms holds NaN or inf, expected finite values")
    a, b, c = _check_ns_settings(steps, coefficients, eps)
    return _newton_schulz_batched(ms, steps, (a, b, c), eps, _check_dtype(dtype))


def _newton_schulz_batched(ms: Tensor, steps: int, coefficients: tuple[float, float, float], eps: float,
                           dtype: torch.dtype) -> Tensor:
    a, b, c = coefficients
    x = _below_one(ms, dims=(1, 2)).to(dtype)
    tall = ms.shape[1] > ms.shape[2]
    if tall:
        x = x.mT                                       # (K, B, A), a view as in _newton_schulz
    x = x / x.norm(dim=(1, 2), keepdim=True).clamp(min=eps)
    if x.shape[2] >= 2 * x.shape[1] and dtype in (torch.float32, torch.float64):
        x = _gram_newton_schulz(x, steps, coefficients)
        return x.mT if tall else x
    for _ in range(steps):
        gram = torch.bmm(x, x.mT)
        poly = torch.baddbmm(gram, gram, gram, beta=b, alpha=c)
        x = torch.baddbmm(x, poly, x, beta=a)
    return x.mT if tall else x


def _gram_newton_schulz(x: Tensor, steps: int, coefficients: tuple[float, float, float]) -> Tensor:
    """x (K, m, n), n >= 2m, norms <= 1 -> `steps` Newton-Schulz iterations, on the Gram matrix.

    Each iteration multiplies X by P = a I + b G + c G^2, a polynomial in G = X X^T, so after
    k of them X_k = Q_k X_0 with Q_k = P_k ... P_1, and G_{k+1} = P_k G_k P_k = P_k^2 G_k (P_k
    commutes with G_k). Everything but the first Gram matrix and the last product Q X_0 is an
    (m, m) product: 4 m^3 multiply-adds per iteration where the plain one spends 2 m^2 n + m^3.
    (0.58x on the race GPT's 128 x 512.) Float32 and wider only: bf16's errors in Q stay uncorrected.
    """
    a, b, c = coefficients
    gram = torch.bmm(x, x.mT)                                   # (K, m, m)
    identity = torch.eye(gram.shape[-1], dtype=gram.dtype, device=gram.device)
    q = None
    for i in range(steps):
        poly = torch.baddbmm(gram, gram, gram, beta=b, alpha=c).add_(identity, alpha=a)  # a I + b G + c G^2
        q = poly if q is None else torch.bmm(poly, q)
        if i < steps - 1:
            gram = torch.bmm(poly, torch.bmm(poly, gram))
    return torch.bmm(q, x)


def muon_lr_scale(shape: Sequence[int], rule: str = "original") -> float:
    """The factor Muon multiplies the learning rate by for a matrix of shape (A, B) (A outputs).

    "original" (the Muon post): sqrt(max(1, A / B)), larger steps for matrices that widen their
    input. "match_rms_adamw" (Moonshot AI): 0.2 sqrt(max(A, B)), so that an update's RMS is about
    AdamW's, which lets Muon reuse AdamW's learning rate and weight decay.
    """
    if not (isinstance(shape, Sequence | torch.Size) and len(shape) == 2):
        raise ValueError(f"shape is {shape!r}, expected a matrix's shape (A, B)")
    rows, cols = (checks.positive_int(f"shape[{i}]", n) for i, n in enumerate(shape))
    checks.one_of("rule", rule, LR_RULES)
    if rule == "original":
        return math.sqrt(max(1, rows / cols))
    return 0.2 * math.sqrt(max(rows, cols))


def muon_update(p: Tensor, g: Tensor, buf: Tensor, lr: float, momentum: float = 0.95,
                nesterov: bool = True, weight_decay: float = 0.1, rule: str = "original",
                steps: int = NS_STEPS, coefficients: Sequence[float] = NS_COEFFICIENTS,
                eps: float = NS_EPS, ns_dtype: torch.dtype = torch.bfloat16) -> tuple[Tensor, Tensor]:
    """One Muon step on a weight matrix p (A, B) with gradient g; returns the new (p, buf).

    buf (A, B): the momentum, zeros before the first step; inputs are left unchanged.
        buf <- momentum buf + (1 - momentum) g          a running average of g
        d   <- (1 - momentum) g + momentum buf          Nesterov: look one step ahead
               (or d <- buf without Nesterov)
        p   <- p (1 - lr weight_decay)                  decoupled weight decay, at the plain lr
        p   <- p - lr muon_lr_scale(p's shape) newton_schulz(d)    (in ns_dtype)
    The averages are written as lerps (one rounding each), as torch.optim.Muon writes them.
    """
    for name, tensor in (("p", p), ("g", g), ("buf", buf)):
        _check_matrix(name, tensor)
        if tensor.shape != p.shape:
            raise ValueError(f"{name} has shape {tuple(tensor.shape)}, expected p's shape {tuple(p.shape)}")
    lr, momentum, nesterov, weight_decay, rule = _check_hyperparameters(lr, momentum, nesterov, weight_decay, rule)
    coefficients, ns_dtype = _check_ns_settings(steps, coefficients, eps), _check_dtype(ns_dtype, "ns_dtype")
    buf = buf.lerp(g, 1 - momentum)                    # momentum buf + (1 - momentum) g
    direction = g.lerp(buf, momentum) if nesterov else buf
    orthogonal = _newton_schulz(direction, steps, coefficients, eps, ns_dtype)
    p = p.mul(1 - lr * weight_decay)
    return p.add(orthogonal, alpha=-lr * muon_lr_scale(p.shape, rule)), buf


# --- the optimiser -------------------------------------------------------------------------

class Muon(torch.optim.Optimizer):
    """Muon on 2-D weight matrices: `muon_update` on each, in place, from its `.grad`.

    lr >= 0; momentum in [0, 1); nesterov; weight_decay >= 0 (decoupled, at the plain lr);
    rule: the learning-rate scale of `muon_lr_scale`; steps, coefficients, eps: `newton_schulz`'s;
    ns_dtype: the dtype Newton-Schulz runs in. The defaults are torch.optim.Muon's. A weight without a `.grad` is skipped, as there.
    """

    def __init__(self, params: Iterable[Tensor] | Iterable[dict[str, Any]], lr: float = 1e-3,
                 weight_decay: float = 0.1, momentum: float = 0.95, nesterov: bool = True,
                 rule: str = "original", steps: int = NS_STEPS,
                 coefficients: Sequence[float] = NS_COEFFICIENTS, eps: float = NS_EPS,
                 ns_dtype: torch.dtype = torch.bfloat16) -> None:
        lr, momentum, nesterov, weight_decay, rule = _check_hyperparameters(
            lr, momentum, nesterov, weight_decay, rule)
        coefficients = _check_ns_settings(steps, coefficients, eps)
        _check_dtype(ns_dtype, "ns_dtype")
        if isinstance(params, Tensor):
            raise TypeError("params is a single tensor, expected a list of weight matrices")
        defaults = {"lr": lr, "weight_decay": weight_decay, "momentum": momentum, "nesterov": nesterov,
                    "rule": rule, "steps": steps, "coefficients": coefficients, "eps": eps,
                    "ns_dtype": ns_dtype}
        super().__init__(params, defaults)
        for i, group in enumerate(self.param_groups):
            for j, p in enumerate(group["params"]):
                _check_matrix(f"params (group {i}, weight {j})", p,
                              hint=": Muon is for hidden matrices; give embeddings, the head, "
                                   "biases and gains to AdamW (split_for_muon)")

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        """One Muon step of every weight that has a `.grad`."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            same_shape: dict[tuple, list[Tensor]] = {}
            for p in group["params"]:
                if p.grad is not None:
                    same_shape.setdefault((p.shape, p.dtype, p.device), []).append(p)
            for params in same_shape.values():
                self._step_same_shape(params, group)
        return loss

    def _step_same_shape(self, params: list[Tensor], group: dict[str, Any]) -> None:
        """`muon_update` on every weight in `params` (one shape), in place, Newton-Schulz batched."""
        momentum, lr = group["momentum"], group["lr"]
        grads = [p.grad for p in params]
        buffers = []
        for p in params:
            state = self.state[p]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(p.grad)
            buffers.append(state["momentum_buffer"])
        torch._foreach_lerp_(buffers, grads, 1 - momentum)          # buf <- lerp(buf, g, 1 - momentum)
        directions = ([g.lerp(buf, momentum) for g, buf in zip(grads, buffers, strict=True)]
                      if group["nesterov"] else buffers)
        orthogonal = _newton_schulz_batched(torch.stack(directions), group["steps"],
                                            tuple(group["coefficients"]), group["eps"], group["ns_dtype"])
        torch._foreach_mul_(params, 1 - lr * group["weight_decay"])
        torch._foreach_add_(params, list(orthogonal.unbind()), alpha=-lr * muon_lr_scale(params[0].shape, group["rule"]))


# --- who gets which optimiser --------------------------------------------------------------

def split_for_muon(model: nn.Module, head_names: Sequence[str] = ("lm_head",)
                   ) -> tuple[list[Tensor], list[Tensor], list[Tensor]]:
    """A model's trainable parameters in three lists: (hidden, matrices, vectors).

    hidden: the weights of every nn.Linear inside the network (attention and MLP projections):
        Muon. Each maps one hidden vector to another, where all directions matter alike.
    matrices: the other matrices, AdamW with weight decay: the embedding tables (nn.Embedding)
        and the output head (the modules named in `head_names`; a name matching none is refused).
        A table's row is looked up, not multiplied: only the batch's tokens' rows get a gradient,
        and orthogonalising would spread that step over every row. The head's rows are tokens too.
    vectors: biases and norm gains (dim < 2), AdamW without weight decay: Muon needs a matrix.
    A tied tensor is listed once, as its embedding.
    """
    checks.instance("model", model, nn.Module, "an nn.Module")
    if not (isinstance(head_names, Sequence) and not isinstance(head_names, str)
            and all(isinstance(name, str) for name in head_names)):
        raise TypeError(f"head_names is {head_names!r}, expected a list of module names such as ('lm_head',)")
    heads = [(name, module) for name, module in model.named_modules() if name.rsplit(".", 1)[-1] in head_names]
    unmatched = sorted(set(head_names) - {name.rsplit(".", 1)[-1] for name, _ in heads})
    if unmatched:  # a misspelt head would silently go to Muon
        raise ValueError(f"head_names has {unmatched[0]!r}, which names no module of the model, expected "
                         "the output head's name (its last part, such as 'lm_head'), or () for none")
    apart = {id(module.weight) for module in model.modules() if isinstance(module, nn.Embedding)}
    apart |= {id(module.weight) for _, module in heads if hasattr(module, "weight")}
    linear = {id(module.weight) for module in model.modules() if isinstance(module, nn.Linear)}
    hidden, matrices, vectors = [], [], []
    for p in model.parameters():
        if not p.requires_grad:
            continue
        if p.dim() < 2:
            vectors.append(p)
        elif p.dim() == 2 and id(p) in linear and id(p) not in apart:
            hidden.append(p)
        else:
            matrices.append(p)
    return hidden, matrices, vectors


class MuonWithAdamW:
    """Muon for the hidden matrices, AdamW for the rest, stepped as one optimiser.

    hidden, matrices, vectors: the lists of `split_for_muon`. muon_lr and adamw_lr: each part's
    learning rate (Muon's steps are larger, see `muon_lr_scale`); weight_decay applies to the
    hidden matrices and the other matrices, not to the vectors. `param_groups` lists every group
    of both (each with its "lr", so a schedule can set them); `lr_ratio` on Muon's groups is
    muon_lr / adamw_lr, for a schedule that sets one rate and scales Muon's by it. ns_dtype: Muon's.
    """

    def __init__(self, hidden: Sequence[Tensor], matrices: Sequence[Tensor], vectors: Sequence[Tensor],
                 muon_lr: float = 0.02, adamw_lr: float = 2e-3, weight_decay: float = 0.1,
                 momentum: float = 0.95, nesterov: bool = True, rule: str = "original",
                 betas: tuple[float, float] = (0.9, 0.99), fused: bool = False,
                 ns_dtype: torch.dtype = torch.bfloat16) -> None:
        checks.positive_float("muon_lr", muon_lr)
        checks.positive_float("adamw_lr", adamw_lr)
        checks.boolean("fused", fused)
        owner: dict[int, str] = {}  # each weight's first place, to refuse a second one
        for name, params in (("hidden", hidden), ("matrices", matrices), ("vectors", vectors)):
            if not isinstance(params, list | tuple) or not all(isinstance(p, Tensor) for p in params):
                raise TypeError(f"{name} is {type(params).__name__}, expected a list of weight tensors")
            for i, p in enumerate(params):
                if owner.setdefault(id(p), f"{name}[{i}]") != f"{name}[{i}]":
                    raise ValueError(f"{name}[{i}] (shape {tuple(p.shape)}) is also {owner[id(p)]}, expected "
                                     "each weight in one list (split_for_muon's): it would be stepped twice")
        if not hidden:
            raise ValueError("hidden is empty, expected the hidden matrices for Muon (split_for_muon)")
        self.muon = Muon(list(hidden), lr=muon_lr, weight_decay=weight_decay, momentum=momentum,
                         nesterov=nesterov, rule=rule, ns_dtype=ns_dtype)
        self.muon.param_groups[0]["lr_ratio"] = muon_lr / adamw_lr
        self.adamw = (make_optimizer(matrices, vectors, lr=adamw_lr, weight_decay=weight_decay,
                                     betas=betas, fused=fused) if len(matrices) or len(vectors) else None)

    @property
    def optimizers(self) -> list[torch.optim.Optimizer]:
        return [self.muon] + ([self.adamw] if self.adamw else [])

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return [group for optimizer in self.optimizers for group in optimizer.param_groups]

    def step(self) -> None:
        for optimizer in self.optimizers:
            optimizer.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for optimizer in self.optimizers:
            optimizer.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        return {"muon": self.muon.state_dict(), "adamw": self.adamw.state_dict() if self.adamw else None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not (isinstance(state, dict) and set(state) == {"muon", "adamw"}):
            raise ValueError(f"state is {state!r:.60}, expected a MuonWithAdamW.state_dict() with keys 'adamw' and 'muon'")
        self.muon.load_state_dict(state["muon"])
        if self.adamw:
            self.adamw.load_state_dict(state["adamw"])


# --- checks --------------------------------------------------------------------------------

def _check_matrix(name: str, value: Any, hint: str = "") -> None:
    if not (isinstance(value, Tensor) and value.is_floating_point()):
        got = f"has dtype {value.dtype}" if isinstance(value, Tensor) else f"is a {type(value).__name__}"
        raise TypeError(f"{name} {got}, expected a 2-D floating-point tensor")
    if value.dim() != 2:
        raise ValueError(f"{name} has shape {tuple(value.shape)}, expected a 2-D matrix{hint}")


def _check_dtype(dtype: Any, name: str = "dtype") -> torch.dtype:
    if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise TypeError(f"{name} is {dtype!r}, expected a floating-point torch.dtype such as torch.float32")
    return dtype


def _check_hyperparameters(lr: Any, momentum: Any, nesterov: Any, weight_decay: Any,
                           rule: Any) -> tuple[float, float, bool, float, str]:
    return (checks.number_in("lr", lr, 0.0, math.inf, high_open=True, expected="a finite number >= 0"),
            checks.number_in("momentum", momentum, 0.0, 1.0, high_open=True, expected="a number in [0, 1)"),
            checks.boolean("nesterov", nesterov),
            checks.number_in("weight_decay", weight_decay, 0.0, math.inf, high_open=True,
                             expected="a finite number >= 0 (0 = no decay)"),
            checks.one_of("rule", rule, LR_RULES))


def _check_ns_settings(steps: Any, coefficients: Any, eps: Any) -> tuple[float, float, float]:
    steps = checks.positive_int("steps", steps)
    if steps >= 100:
        raise ValueError(f"steps is {steps}, expected fewer than 100 (5 is the usual number)")
    if not (isinstance(coefficients, Sequence) and not isinstance(coefficients, str) and len(coefficients) == 3):
        raise ValueError(f"coefficients is {coefficients!r}, expected three numbers (a, b, c)")
    values = tuple(checks.number_in(f"coefficients[{i}]", c, -math.inf, math.inf, low_open=True,
                                    high_open=True, expected="a finite number")
                   for i, c in enumerate(coefficients))
    if values[0] <= 0:  # f'(0) = a: with a <= 0 small singular values never grow (all 0: no step)
        raise ValueError(f"coefficients is {coefficients!r}, expected a > 0 in (a, b, c), such as "
                         f"NS_COEFFICIENTS = {NS_COEFFICIENTS}: f(x) = a x + b x^3 + c x^5 must grow small x")
    checks.positive_float("eps", eps)
    return values
