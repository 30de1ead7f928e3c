"""LoRA: a frozen weight plus a trainable low-rank update (notebook 13, section 3).

    LoRALinear          y = base(x) + lora_B(lora_A(x)) * scaling, scaling = alpha / r
    add_lora            replace the named nn.Linear layers of a model by LoRALinear wrappers
    merge_lora          fold every adapter into its base weight: W <- W + scaling * B A
    trainable_count     parameters that receive gradients

The names follow peft's LoRA layer (`lora_A`, `lora_B`, `scaling`, `merge`), so that a student
who moves to peft recognises every piece; tests/post/test_lora.py loads the same A and B into peft
and gets the same outputs. lora_B starts at zero: at step 0 the adapted model IS the base model.
Shapes: x (..., in_features); lora_A.weight (r, in_features); lora_B.weight (out_features, r).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from helpers import checks


def _check_rank(base: nn.Linear, r: int, alpha: float) -> None:
    checks.positive_int("r", r)
    checks.positive_float("alpha", alpha)
    largest = min(base.in_features, base.out_features)
    if r > largest:
        raise ValueError(f"r is {r}, expected at most min(in_features, out_features) = "
                         f"{largest}: a rank-{r} update of a {base.out_features} x "
                         f"{base.in_features} matrix cannot exist")


class LoRALinear(nn.Module):
    """A frozen nn.Linear with a rank-r update B A, scaled by alpha / r."""

    def __init__(self, base: nn.Linear, r: int, alpha: float) -> None:
        super().__init__()
        if not isinstance(base, nn.Linear):
            raise TypeError(f"base is a {type(base).__name__}, expected an nn.Linear")
        _check_rank(base, r, alpha)
        self.base, self.r, self.alpha = base, r, float(alpha)
        self.scaling = alpha / r
        for p in base.parameters():
            p.requires_grad_(False)
        self.lora_A = nn.Linear(base.in_features, r, bias=False)   # weight (r, in)
        self.lora_B = nn.Linear(r, base.out_features, bias=False)  # weight (out, r)
        nn.init.kaiming_uniform_(self.lora_A.weight, a=math.sqrt(5))  # peft's default for A
        nn.init.zeros_(self.lora_B.weight)  # B = 0: the update B A is 0 at the start
        self.merged = False

    def forward(self, x: Tensor) -> Tensor:
        """x (..., in) -> (..., out)."""
        if self.merged:
            return self.base(x)
        return self.base(x) + self.lora_B(self.lora_A(x)) * self.scaling

    @property
    def weight(self) -> Tensor:
        """The effective weight W + scaling * B A (out, in): code that reads `.weight` directly
        (the model's fused path, dtype checks) sees the adapted layer, not the frozen one."""
        return self.base.weight if self.merged else self.base.weight + self.delta_weight()

    @property
    def bias(self) -> Tensor | None:
        return self.base.bias

    @property
    def in_features(self) -> int:
        return self.base.in_features

    @property
    def out_features(self) -> int:
        return self.base.out_features

    def delta_weight(self) -> Tensor:
        """scaling * B A: (out, in), the update the adapter adds to the base weight."""
        return (self.lora_B.weight @ self.lora_A.weight) * self.scaling

    @torch.no_grad()
    def merge(self) -> None:
        """Fold the update into the base weight; afterwards forward is one plain matmul."""
        if self.merged:
            raise ValueError("this adapter is already merged")
        self.base.weight += self.delta_weight()
        self.merged = True


def _parent_and_name(model: nn.Module, name: str) -> tuple[nn.Module, str]:
    parent_name, _, child = name.rpartition(".")
    return (model.get_submodule(parent_name) if parent_name else model), child


def add_lora(model: nn.Module, target_modules: list[str], r: int, alpha: float) -> list[str]:
    """Freeze `model` and wrap every nn.Linear whose name ends with one of `target_modules`
    (peft's rule, e.g. ["q_proj", "v_proj"]) in a LoRALinear; returns the wrapped names.
    Every argument and every layer's rank is checked before the model is touched."""
    if isinstance(target_modules, str) or not all(isinstance(t, str) for t in target_modules):
        raise TypeError(f"target_modules is {target_modules!r}, expected a list of layer names "
                        "such as ['q_proj', 'v_proj']")
    if not target_modules:
        raise ValueError("target_modules is empty, expected names such as ['q_proj', 'v_proj']")
    names = [name for name, module in model.named_modules() if isinstance(module, nn.Linear)
             and any(name == t or name.endswith("." + t) for t in target_modules)]
    if not names:
        raise ValueError(f"no nn.Linear of the model is named like {target_modules}")
    for name in names:
        _check_rank(model.get_submodule(name), r, alpha)
    for p in model.parameters():
        p.requires_grad_(False)
    for name in names:
        parent, child = _parent_and_name(model, name)
        setattr(parent, child, LoRALinear(getattr(parent, child), r, alpha))
    return names


def merge_lora(model: nn.Module) -> int:
    """Merge every LoRALinear of `model` in place; returns how many were merged."""
    adapters = [m for m in model.modules() if isinstance(m, LoRALinear)]
    if not adapters:
        raise ValueError("the model has no LoRALinear layer to merge")
    for adapter in adapters:
        adapter.merge()
    return len(adapters)


def trainable_count(model: nn.Module) -> int:
    """The number of parameters with requires_grad (each shared tensor counted once)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
