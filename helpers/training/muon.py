"""Muon by hand: orthogonalised momentum for a network's hidden matrices, AdamW for the rest.

AdamW scales each entry of the gradient on its own. Muon treats a weight matrix as a matrix: it
keeps a momentum of the gradient, then replaces that matrix M = U S V^T by (roughly) U V^T, the
nearest matrix whose singular values are all 1, and steps along it. Every direction the gradient
spans then moves the same amount, the rare ones as much as the dominant one (Keller Jordan's
Muon post, 2024; at scale: Moonshot AI's "Muon is scalable for LLM training", 2025).

    newton_schulz(m, steps, coefficients)   U V^T, approximately, from matrix products only
    muon_lr_scale(shape, rule)              the learning rate's factor for a matrix's shape
    muon_update(p, g, buf, lr, ...)         one Muon step: the new (p, buf)
    Muon                                    the optimiser: muon_update on every matrix it holds
    split_for_muon(model)                   hidden matrices for Muon; embeddings, head, vectors apart
    muon_param_groups(...)                  split_for_muon's lists as groups: use_muon, lr, decay
    MuonWithAdamW                           one optimiser: Muon on the use_muon groups, AdamW on the rest

Every function takes one matrix (A, B) or a stack of matrices of one shape (..., A, B) and runs
the same lines on either, as Keller Jordan's `zeropower_via_newtonschulz5`: a single matrix is a
stack of one. `Muon.step` stacks the matrices of each shape and takes their steps at once.

Each step of Muon is the one `torch.optim.Muon` takes, bit for bit (tests/training/test_muon.py),
Newton-Schulz in bfloat16 as there. `ns_dtype=torch.float32` iterates in float32 instead: on a CPU
without native bfloat16 (most laptops) bf16 products are emulated, measured over 20x slower; in
float32 a matrix at least twice as wide as tall iterates on its small Gram matrix (< 1e-5 apart).
benchmarks/bench_muon_step.py measures the step against AdamW's.

The arguments are checked once, where they enter (the public functions, the optimisers'
constructors); the step and the bodies below trust them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from helpers import checks

NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)  # the quintic of the Muon post: steepest at 0
NS_STEPS = 5
NS_EPS = 1e-7
LR_RULES = ("original", "match_rms_adamw")


# --- the idea: orthogonalise with matrix products ------------------------------------------

def newton_schulz(m: Tensor, steps: int = NS_STEPS, coefficients: Sequence[float] = NS_COEFFICIENTS,
                  eps: float = NS_EPS, dtype: torch.dtype = torch.bfloat16) -> Tensor:
    """m (..., A, B), one matrix or a stack -> the same shape, each matrix with its singular
    vectors and singular values near 1.

    With m = U S V^T, the odd polynomial f(X) = a X + b (X X^T) X + c (X X^T)^2 X is
    U f(S) V^T: it acts on each singular value alone. Scaled so that every singular value is at
    most 1 (divide by the Frobenius norm, which is >= the largest), `steps` applications of f
    push them all towards 1. The coefficients (a, b, c) make f as steep at 0 as possible, so
    even tiny singular values grow fast; the price is that they end anywhere in about
    [0.7, 1.2] rather than at 1, which does not hurt training. A tall matrix (A > B) is
    transposed first, so X X^T is the smaller (B, B) Gram matrix. Runs in and returns `dtype`
    (bfloat16, as torch.optim.Muon; the iteration is robust to its rounding). Each matrix of a
    stack is scaled by its own norm: the result is that of each matrix alone, bit for bit.
    """
    _check_matrices("m", m)
    if not bool(torch.isfinite(m).all()):
        raise ValueError("m holds NaN or inf, expected finite values")
    coefficients = _check_ns_settings(steps, coefficients, eps)
    return _newton_schulz(m, steps, coefficients, eps, _check_dtype(dtype))


def _newton_schulz(m: Tensor, steps: int, coefficients: tuple[float, float, float], eps: float,
                   dtype: torch.dtype) -> Tensor:
    a, b, c = coefficients
    x = _below_one(m).to(dtype)
    tall = m.shape[-2] > m.shape[-1]
    if tall:
        x = x.mT                                       # (..., B, A), a view: the Gram matrix is (B, B)
    x = x / x.norm(dim=(-2, -1), keepdim=True).clamp(min=eps)  # every singular value now <= 1
    stack = x.reshape(-1, *x.shape[-2:])               # (K, rows, cols): one matrix is a stack of one
    if stack.shape[2] >= 2 * stack.shape[1] and dtype in (torch.float32, torch.float64):
        stack = _gram_newton_schulz(stack, steps, coefficients)
    else:
        for _ in range(steps):
            gram = torch.bmm(stack, stack.mT)          # X X^T, (K, rows, rows)
            poly = torch.baddbmm(gram, gram, gram, beta=b, alpha=c)  # b G + c G^2, rounded once
            stack = torch.baddbmm(stack, poly, stack, beta=a)        # a X + (b G + c G^2) X
    x = stack.reshape(x.shape)
    return x.mT if tall else x


def _below_one(m: Tensor) -> Tensor:
    """m over the power of two just above its largest entry (per matrix), if that is >= 1: the
    same result bit for bit (only exponents move), but the norm cannot overflow (1e20 squared is
    inf in float32, and m / inf is all zeros). Smaller entries are left alone, so the norm's eps
    clamp holds."""
    _, exponent = torch.frexp(m.detach().abs().amax(dim=(-2, -1), keepdim=True))
    return m * torch.ldexp(torch.ones_like(m[..., :1, :1]), -exponent.clamp(min=0))


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
    return _lr_scale(rows, cols, checks.one_of("rule", rule, LR_RULES))


def _lr_scale(rows: int, cols: int, rule: str) -> float:
    if rule == "original":
        return math.sqrt(max(1, rows / cols))
    return 0.2 * math.sqrt(max(rows, cols))


def muon_update(p: Tensor, g: Tensor, buf: Tensor, lr: float, momentum: float = 0.95,
                nesterov: bool = True, weight_decay: float = 0.1, rule: str = "original",
                ns_dtype: torch.dtype = torch.bfloat16) -> tuple[Tensor, Tensor]:
    """One Muon step on a weight matrix p (A, B), or a stack of them (..., A, B), with gradient g;
    returns the new (p, buf). buf (like p): the momentum, zeros before the first step; the inputs
    are left unchanged. Newton-Schulz runs NS_STEPS steps of NS_COEFFICIENTS in `ns_dtype`.
        buf <- momentum buf + (1 - momentum) g          a running average of g
        d   <- (1 - momentum) g + momentum buf          Nesterov: look one step ahead
               (or d <- buf without Nesterov)
        p   <- p (1 - lr weight_decay)                  decoupled weight decay, at the plain lr
        p   <- p - lr muon_lr_scale(p's shape) newton_schulz(d)
    The averages are written as lerps (one rounding each), as torch.optim.Muon writes them.
    """
    for name, tensor in (("p", p), ("g", g), ("buf", buf)):
        _check_matrices(name, tensor)
        if tensor.shape != p.shape:
            raise ValueError(f"{name} has shape {tuple(tensor.shape)}, expected p's shape {tuple(p.shape)}")
    settings = _check_group({"lr": lr, "momentum": momentum, "nesterov": nesterov, "weight_decay": weight_decay,
                             "rule": rule, "steps": NS_STEPS, "coefficients": NS_COEFFICIENTS, "eps": NS_EPS,
                             "ns_dtype": ns_dtype})
    return _muon_update(p, g, buf, settings)


def _muon_update(p: Tensor, g: Tensor, buf: Tensor, group: dict[str, Any]) -> tuple[Tensor, Tensor]:
    """The step of `muon_update`, p, g, buf (..., A, B), with the settings of a Muon param group."""
    momentum, lr = group["momentum"], group["lr"]
    buf = buf.lerp(g, 1 - momentum)                    # momentum buf + (1 - momentum) g
    direction = g.lerp(buf, momentum) if group["nesterov"] else buf
    orthogonal = _newton_schulz(direction, group["steps"], tuple(group["coefficients"]), group["eps"],
                                group["ns_dtype"])
    p = p.mul(1 - lr * group["weight_decay"])
    return p.add(orthogonal, alpha=-lr * _lr_scale(*p.shape[-2:], group["rule"])), buf


# --- the optimiser -------------------------------------------------------------------------

class Muon(torch.optim.Optimizer):
    """Muon on 2-D weight matrices: `muon_update` on each, in place, from its `.grad`.

    lr >= 0; momentum in [0, 1); nesterov; weight_decay >= 0 (decoupled, at the plain lr);
    rule: the learning-rate scale of `muon_lr_scale`; steps, coefficients, eps: `newton_schulz`'s;
    ns_dtype: the dtype Newton-Schulz runs in. The defaults are torch.optim.Muon's; a param group
    may set its own. A weight without a `.grad` is skipped, as there.
    """

    def __init__(self, params: Iterable[Tensor] | Iterable[dict[str, Any]], lr: float = 1e-3,
                 weight_decay: float = 0.1, momentum: float = 0.95, nesterov: bool = True,
                 rule: str = "original", steps: int = NS_STEPS,
                 coefficients: Sequence[float] = NS_COEFFICIENTS, eps: float = NS_EPS,
                 ns_dtype: torch.dtype = torch.bfloat16) -> None:
        if isinstance(params, Tensor):
            raise TypeError("params is a single tensor, expected a list of weight matrices")
        defaults = _check_group({"lr": lr, "weight_decay": weight_decay, "momentum": momentum,
                                 "nesterov": nesterov, "rule": rule, "steps": steps,
                                 "coefficients": coefficients, "eps": eps, "ns_dtype": ns_dtype})
        super().__init__(params, defaults)
        for i, group in enumerate(self.param_groups):
            group.update(_check_group(group))
            for j, p in enumerate(group["params"]):
                _check_matrices(f"params (group {i}, weight {j})", p, stack=False,
                                hint=": Muon is for hidden matrices; give embeddings, the head, "
                                     "biases and gains to AdamW (split_for_muon)")

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        """One Muon step of every weight that has a `.grad`: the weights of one shape as one stack."""
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
                for p in params:
                    if "momentum_buffer" not in self.state[p]:
                        self.state[p]["momentum_buffer"] = torch.zeros_like(p)
                buffers = [self.state[p]["momentum_buffer"] for p in params]
                new_p, new_buf = _muon_update(torch.stack(params), torch.stack([p.grad for p in params]),
                                              torch.stack(buffers), group)   # (K, A, B) each
                torch._foreach_copy_(params, list(new_p.unbind()))
                torch._foreach_copy_(buffers, list(new_buf.unbind()))
        return loss


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


def muon_param_groups(hidden: Sequence[Tensor], matrices: Sequence[Tensor], vectors: Sequence[Tensor],
                      muon_lr: float = 0.02, adamw_lr: float = 2e-3,
                      weight_decay: float = 0.1) -> list[dict[str, Any]]:
    """The lists of `split_for_muon` as `MuonWithAdamW`'s param groups, each with its own rate:
    hidden -> Muon at muon_lr; matrices -> AdamW with weight decay; vectors -> AdamW without.
    An empty list of matrices or vectors gives no group."""
    checks.positive_float("muon_lr", muon_lr)
    checks.positive_float("adamw_lr", adamw_lr)
    groups = [{"params": hidden, "use_muon": True, "lr": muon_lr, "weight_decay": weight_decay},
              {"params": matrices, "use_muon": False, "lr": adamw_lr, "weight_decay": weight_decay},
              {"params": vectors, "use_muon": False, "lr": adamw_lr, "weight_decay": 0.0}]
    for name, group in zip(("hidden", "matrices", "vectors"), groups, strict=True):
        params = group["params"]
        if not isinstance(params, list | tuple) or not all(isinstance(p, Tensor) for p in params):
            raise TypeError(f"{name} is {type(params).__name__}, expected a list of weight tensors")
        group["params"] = list(params)
    if not hidden:
        raise ValueError("hidden is empty, expected the hidden matrices for Muon (split_for_muon)")
    return [group for group in groups if group["params"]]


class MuonWithAdamW(torch.optim.Optimizer):
    """One optimiser for a whole model: Muon on the groups that say "use_muon": True, AdamW on the
    others (as Keller Jordan's MuonWithAuxAdam). Each group carries its own "lr" and
    "weight_decay" (`muon_param_groups` builds them from `split_for_muon`), so a schedule sets
    each group's rate; `state_dict` holds both parts.

    betas, fused: AdamW's (fused: torch's one-kernel step where it has one, else foreach);
    ns_dtype: the dtype Muon's Newton-Schulz runs in. `muon` and `adamw` are the two parts; they
    share this optimiser's param groups (the same dicts) and its state.
    """

    def __init__(self, param_groups: Sequence[dict[str, Any]], betas: tuple[float, float] = (0.9, 0.99),
                 fused: bool = False, ns_dtype: torch.dtype = torch.bfloat16) -> None:
        checks.boolean("fused", fused)
        if not (isinstance(param_groups, list | tuple) and param_groups
                and all(isinstance(g, dict) for g in param_groups)):
            raise TypeError(f"param_groups is a {type(param_groups).__name__} of {len(param_groups or ())}, "
                            "expected a non-empty list of dicts, such as muon_param_groups(...)")
        for i, group in enumerate(param_groups):
            if not isinstance(group.get("use_muon"), bool):
                raise TypeError(f"param_groups' group {i} has use_muon={group.get('use_muon')!r}, expected "
                                "True (Muon) or False (AdamW)")
        owner: dict[int, str] = {}  # each weight's first place, to refuse a second one
        for i, group in enumerate(param_groups):
            for j, p in enumerate(group.get("params", [])):
                if owner.setdefault(id(p), f"group {i}, weight {j}") != f"group {i}, weight {j}":
                    raise ValueError(f"param_groups' group {i}, weight {j} (shape {tuple(p.shape)}) is also "
                                     f"{owner[id(p)]}, expected each weight in one group: it would be "
                                     "stepped twice")
        if not any(group["use_muon"] for group in param_groups):
            raise ValueError("param_groups has no group with use_muon=True, expected the hidden matrices "
                             "for Muon (muon_param_groups)")
        self.muon = Muon([g for g in param_groups if g["use_muon"]], ns_dtype=ns_dtype)
        adamw_groups = [g for g in param_groups if not g["use_muon"]]
        self.adamw = _adamw(adamw_groups, betas, fused) if adamw_groups else None
        super().__init__(self.muon.param_groups + (self.adamw.param_groups if self.adamw else []), {})
        self._share()

    def _share(self) -> None:
        """Point both parts at this optimiser's groups and state (again after a load)."""
        self.muon.param_groups = [g for g in self.param_groups if g["use_muon"]]
        self.muon.state = self.state
        if self.adamw:
            self.adamw.param_groups = [g for g in self.param_groups if not g["use_muon"]]
            self.adamw.state = self.state

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        """One step of both parts: Muon, then AdamW."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.muon.step()
        if self.adamw:
            self.adamw.step()
        return loss

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        self._share()


def _adamw(groups: list[dict[str, Any]], betas: tuple[float, float], fused: bool) -> torch.optim.AdamW:
    """torch's AdamW on `groups` (which carry their own lr): fused where this PyTorch and device have
    the kernel, as `helpers.training.speed.make_optimizer` builds it."""
    if fused:
        try:
            return torch.optim.AdamW(groups, betas=betas, fused=True)
        except (RuntimeError, TypeError):  # no fused kernel for this device or PyTorch
            return torch.optim.AdamW(groups, betas=betas, foreach=True)
    return torch.optim.AdamW(groups, betas=betas, foreach=False)


# --- checks, once at the boundary ------------------------------------------------------------

def _check_matrices(name: str, value: Any, stack: bool = True, hint: str = "") -> None:
    """A floating-point matrix (A, B), or with `stack` a stack of them (..., A, B), none empty."""
    expected = "a matrix (A, B) or a stack of matrices (..., A, B)" if stack else "a 2-D matrix"
    if not (isinstance(value, Tensor) and value.is_floating_point()):
        got = f"has dtype {value.dtype}" if isinstance(value, Tensor) else f"is a {type(value).__name__}"
        raise TypeError(f"{name} {got}, expected {expected} of floating-point numbers")
    if value.dim() < 2 or (not stack and value.dim() != 2) or 0 in value.shape:
        raise ValueError(f"{name} has shape {tuple(value.shape)}, expected {expected}{hint}")


def _check_dtype(dtype: Any, name: str = "dtype") -> torch.dtype:
    if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise TypeError(f"{name} is {dtype!r}, expected a floating-point torch.dtype such as torch.float32")
    return dtype


def _check_group(group: dict[str, Any]) -> dict[str, Any]:
    """A Muon group's settings, checked: lr, momentum, nesterov, weight_decay, rule, the
    Newton-Schulz steps, coefficients (returned as a tuple) and eps, and ns_dtype."""
    return {"lr": checks.number_in("lr", group["lr"], 0.0, math.inf, high_open=True,
                                   expected="a finite number >= 0"),
            "momentum": checks.number_in("momentum", group["momentum"], 0.0, 1.0, high_open=True,
                                         expected="a number in [0, 1)"),
            "nesterov": checks.boolean("nesterov", group["nesterov"]),
            "weight_decay": checks.number_in("weight_decay", group["weight_decay"], 0.0, math.inf,
                                             high_open=True, expected="a finite number >= 0 (0 = no decay)"),
            "rule": checks.one_of("rule", group["rule"], LR_RULES),
            "steps": group["steps"],
            "coefficients": _check_ns_settings(group["steps"], group["coefficients"], group["eps"]),
            "eps": group["eps"],
            "ns_dtype": _check_dtype(group["ns_dtype"], "ns_dtype")}


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
