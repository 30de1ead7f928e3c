"""The training step by hand (notebook 7, section 4): its two core pieces in plain code.

    next_token_loss(model, ids)   the mean next-token cross-entropy of windows ids (B, N + 1)
    adamw_update(p, g, m, v, t, lr, betas, eps, weight_decay)
                                  one AdamW step on one weight tensor: the new (p, m, v)
    HandAdamW(update, matrices, vectors)
                                  AdamW on every weight of a model, one `update` per tensor;
                                  state_dict() / load_state_dict() resume it exactly

Notebook 7 asks the student to write all three, then trains a small GPT with them; until an answer
passes its check, the notebook runs on these (`helpers.lab.exercises.yours_or`). The Trainer
does the same work with `F.cross_entropy` and `torch.optim.AdamW`; tests/training/test_by_hand.py holds
these to PyTorch's.

Shapes (the legend of `helpers`): B batch, N tokens, V vocabulary.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

from helpers import checks


def next_token_loss(model: nn.Module, ids: Tensor) -> Tensor:
    """ids (B, N + 1) -> the mean cross-entropy of predicting ids[:, 1:] from ids[:, :-1], a scalar.

    The model reads the first N tokens of each window and returns logits (B, N, V); position i
    is scored on the token at i + 1. log-softmax is written out: z minus logsumexp(z).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model is a {type(model).__name__}, expected a language model "
                        "(an nn.Module mapping ids (B, N) to logits (B, N, V))")
    if not isinstance(ids, Tensor):
        raise TypeError(f"ids is a {type(ids).__name__}, expected a tensor of token ids (B, N + 1)")
    if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
        raise TypeError(f"ids has dtype {ids.dtype}, expected integer token ids (torch.long)")
    if ids.dim() != 2 or ids.shape[1] < 2:
        raise ValueError(f"ids has shape {tuple(ids.shape)}, expected windows (B, N + 1) of at least "
                         "2 tokens: N inputs and, one step later, N targets")
    logits = model(ids[:, :-1])                                   # (B, N, V)
    log_probs = logits - logits.logsumexp(dim=-1, keepdim=True)   # (B, N, V)
    return -log_probs.gather(-1, ids[:, 1:, None]).mean()         # (B, N, 1) picked, then a scalar


def _check_betas(betas: Any) -> tuple[float, float]:
    if not (isinstance(betas, tuple | list) and len(betas) == 2):
        raise ValueError(f"betas is {betas!r}, expected two numbers (beta1, beta2)")
    return tuple(checks.number_in(name, beta, 0.0, 1.0, high_open=True, expected="a number in [0, 1)")
                 for name, beta in zip(("betas[0]", "betas[1]"), betas, strict=True))


def adamw_update(p: Tensor, g: Tensor, m: Tensor, v: Tensor, t: int, lr: float,
                 betas: tuple[float, float], eps: float,
                 weight_decay: float) -> tuple[Tensor, Tensor, Tensor]:
    """One AdamW step on a weight p with gradient g; returns the new (p, m, v), inputs unchanged.

    p, g, m, v: tensors of one shape, m and v the running averages (zeros before step 1);
    t: the step number, from 1; lr >= 0; betas in [0, 1); eps > 0; weight_decay >= 0
    (decoupled: p shrinks by lr x weight_decay, outside the adaptive step).
    """
    for name, tensor in (("p", p), ("g", g), ("m", m), ("v", v)):
        if not isinstance(tensor, Tensor):
            raise TypeError(f"{name} is a {type(tensor).__name__}, expected a tensor")
        if not tensor.is_floating_point():
            raise TypeError(f"{name} has dtype {tensor.dtype}, expected a floating-point tensor")
        if tensor.shape != p.shape:
            raise ValueError(f"{name} has shape {tuple(tensor.shape)}, expected p's shape {tuple(p.shape)}")
    checks.positive_int("t", t)
    checks.number_in("lr", lr, 0.0, math.inf, high_open=True, expected="a finite number >= 0")
    beta1, beta2 = _check_betas(betas)
    checks.positive_float("eps", eps)
    checks.number_in("weight_decay", weight_decay, 0.0, math.inf, high_open=True,
                     expected="a finite number >= 0 (0 = no decay)")
    m = beta1 * m + (1 - beta1) * g                           # the running average of g
    v = beta2 * v + (1 - beta2) * g * g                       # ... and of g squared
    m_hat, v_hat = m / (1 - beta1 ** t), v / (1 - beta2 ** t)  # bias correction: both start at 0
    p = p * (1 - lr * weight_decay)                           # decoupled weight decay
    return p - lr * m_hat / (v_hat.sqrt() + eps), m, v


class HandAdamW:
    """AdamW on every weight of a model: `update(p, g, m, v, t, lr, betas, eps, weight_decay)`
    (`adamw_update` or the student's) on each tensor, with its own running averages m and v.

    matrices: the weights that are decayed by `weight_decay`; vectors: biases and gains, not
    decayed (`helpers.training.trainer.matrices_and_vectors` splits a model's parameters so).
    `step(lr)` advances the step count t (from 1) and writes each new weight in place, so the
    model keeps its tensors; it reads each weight's `.grad`.
    """

    def __init__(self, update: Any, matrices: list[Tensor], vectors: list[Tensor],
                 betas: tuple[float, float] = (0.9, 0.99), eps: float = 1e-8,
                 weight_decay: float = 0.1) -> None:
        if not callable(update):
            raise TypeError(f"update is a {type(update).__name__}, expected a function like adamw_update")
        place: dict[int, str] = {}  # each weight's first place: a second one would step it twice
        for name, params in (("matrices", matrices), ("vectors", vectors)):
            if not isinstance(params, list | tuple) or not all(isinstance(p, Tensor) for p in params):
                raise TypeError(f"{name} is {type(params).__name__}, expected a list of weight tensors")
            for i, p in enumerate(params):
                if place.setdefault(id(p), f"{name}[{i}]") != f"{name}[{i}]":
                    raise ValueError(f"{name}[{i}] (shape {tuple(p.shape)}) is also {place[id(p)]}, "
                                     "expected each weight once (matrices_and_vectors splits them so)")
        _check_betas(betas)
        checks.positive_float("eps", eps)
        checks.number_in("weight_decay", weight_decay, 0.0, math.inf, high_open=True,
                         expected="a finite number >= 0 (0 = no decay)")
        self.update, self.betas, self.eps, self.t = update, tuple(betas), eps, 0
        # as torch.optim lists them: the state of weight i is the i-th over the groups, in order
        self.param_groups = [{"params": list(matrices), "weight_decay": weight_decay},
                             {"params": list(vectors), "weight_decay": 0.0}]
        self.slots = [[p, torch.zeros_like(p), torch.zeros_like(p), group["weight_decay"]]  # weight, m, v, decay
                      for group in self.param_groups for p in group["params"]]

    @torch.no_grad()
    def step(self, lr: float) -> None:
        """One AdamW step of every weight at learning rate lr, from each weight's .grad."""
        checks.number_in("lr", lr, 0.0, math.inf, high_open=True, expected="a finite number >= 0")
        missing = [i for i, slot in enumerate(self.slots) if slot[0].grad is None]
        if missing:
            raise ValueError(f"weights {missing} have no .grad: call loss.backward() before step()")
        self.t += 1
        for slot in self.slots:
            p, m, v, decay = slot
            new_p, slot[1], slot[2] = self.update(p, p.grad, m, v, self.t, lr, self.betas, self.eps, decay)
            p.copy_(new_p)  # in place: the model keeps its tensor

    def state_dict(self) -> dict[str, Any]:
        """What resumes the optimizer exactly, laid out as torch.optim's: the step count t, each
        weight's m and v by its position, and each group's settings (`save_run` saves it)."""
        return _adam_state_dict(self.t, {i: (m, v) for i, (_, m, v, _) in enumerate(self.slots)},
                                self.param_groups, self.betas, self.eps)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Take t, the moments and the settings from a `state_dict()` of the same weights."""
        t, moments, (betas, eps, decays) = _load_adam_state(state, self.param_groups)
        self.t, self.betas, self.eps = t, betas, eps
        for group, decay in zip(self.param_groups, decays, strict=True):
            group["weight_decay"] = decay
        decay_of = [decay for group, decay in zip(self.param_groups, decays, strict=True) for _ in group["params"]]
        for i, slot in enumerate(self.slots):
            slot[1], slot[2], slot[3] = *moments[i], decay_of[i]


def _adam_state_dict(t: int, moments: dict[int, tuple[Tensor, Tensor]], param_groups: list[dict[str, Any]],
                     betas: tuple[float, float], eps: float) -> dict[str, Any]:
    """A hand-written AdamW's state as torch.optim lays it out: {"t", "state": {i: {"m", "v"}},
    "param_groups": [{"params": [i, ...], "weight_decay", "betas", "eps"}]}; i counts the
    weights over the groups. `moments` holds the weights whose m and v this optimizer keeps."""
    groups, start = [], 0
    for group in param_groups:
        count = len(group["params"])
        groups.append({"params": list(range(start, start + count)), "weight_decay": group["weight_decay"],
                       "betas": tuple(betas), "eps": eps})
        start += count
    return {"t": t, "state": {i: {"m": m, "v": v} for i, (m, v) in moments.items()}, "param_groups": groups}


def _load_adam_state(state: Any, param_groups: list[dict[str, Any]], owned: list[int] | None = None
                     ) -> tuple[int, dict[int, tuple[Tensor, Tensor]], tuple[tuple[float, float], float, list[float]]]:
    """`_adam_state_dict`'s output checked against the weights it is loaded into (the moments of
    weights `owned`, else of all) -> (t, {i: (m, v)} copied to each weight, (betas, eps, decays))."""
    if not (isinstance(state, dict) and {"t", "state", "param_groups"} <= set(state)):
        found = f"has keys {sorted(map(str, state))}" if isinstance(state, dict) else f"is {state!r:.60}"
        raise ValueError(f"state {found}, expected a state_dict() with 't', 'state' and 'param_groups'")
    t = checks.non_negative_int("state['t']", state["t"])
    params = [p for group in param_groups for p in group["params"]]
    groups = state["param_groups"]
    sizes = [len(g["params"]) if isinstance(g, dict) and isinstance(g.get("params"), list) else -1
             for g in groups] if isinstance(groups, list) else groups
    if sizes != [len(group["params"]) for group in param_groups]:
        raise ValueError(f"state['param_groups'] has groups of sizes {sizes!r:.60}, expected "
                         f"{[len(group['params']) for group in param_groups]}: the state of other weights")
    betas = _check_betas(groups[0].get("betas")) if groups else (0.9, 0.99)
    eps = checks.positive_float("state['param_groups'][0]['eps']", groups[0].get("eps")) if groups else 1e-8
    decays = [checks.number_in(f"state['param_groups'][{i}]['weight_decay']", g.get("weight_decay"), 0.0,
                               math.inf, high_open=True, expected="a finite number >= 0")
              for i, g in enumerate(groups)]
    owned = list(range(len(params))) if owned is None else owned
    saved = state["state"]
    if not (isinstance(saved, dict) and sorted(saved, key=str) == sorted(owned, key=str)):
        found = sorted(saved, key=str)[:5] if isinstance(saved, dict) else type(saved).__name__
        raise ValueError(f"state['state'] holds the moments of weights {found}, expected those of "
                         f"weights {owned[:5]}{' ...' if len(owned) > 5 else ''}")
    moments = {}
    for i in owned:
        entry, weight = saved[i], params[i]
        pair = [entry.get(key) if isinstance(entry, dict) else None for key in ("m", "v")]
        for key, tensor in zip(("m", "v"), pair, strict=True):
            if not (isinstance(tensor, Tensor) and tensor.is_floating_point() and tensor.shape == weight.shape):
                got = f"of shape {tuple(tensor.shape)}" if isinstance(tensor, Tensor) else type(tensor).__name__
                raise ValueError(f"state['state'][{i}][{key!r}] is {got}, expected a floating-point "
                                 f"tensor of weight {i}'s shape {tuple(weight.shape)}")
        moments[i] = tuple(tensor.to(device=weight.device, dtype=weight.dtype, copy=True) for tensor in pair)
    return t, moments, (betas, eps, decays)
