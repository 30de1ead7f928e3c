"""The training step's speed machinery: bfloat16 where the CPU has it, one buffer for every weight.

Nothing here is a new idea; each piece computes what the plain training step of notebook 7
(section 4, "The training step by hand") computes, and tests/training/test_trainer.py checks each against
it. `helpers.training.trainer.Trainer` uses:

    cpu_has_native_bf16, pick_dtype            bfloat16 where the hardware has it, else float32;
                                               COURSE_PRECISION=fp32|bf16|auto decides "auto"
    flatten_into_one_buffer, FlatWeights       every weight and gradient in one buffer each,
                                               with the bf16 working copy
    make_optimizer                             AdamW (decay on matrices only), its fused kernel
    compile_loss                               torch.compile on top (TrainConfig(compile=True))

The model's own fused forward (`GPT.forward(fast=True)`) is in `helpers.model.fused`.
What each buys is measured in benchmarks/bench_train.py against a plain loop:

- bfloat16 mixed precision, on CPUs with native bf16: forward and backward run on a bf16
  working copy of the model, while the optimiser updates the float32 weights and the copy is
  refreshed from them after every step. This is what `torch.autocast` does op by op, done once
  per step;
- one buffer for all the weights and one for all the gradients: copying the gradients to
  float32, clipping them, the AdamW update and refreshing the bf16 copy are then a few
  operations on long vectors, not a few hundred on small tensors;
- optionally, `torch.compile` fuses the forward and backward passes further. Compiling takes
  tens of seconds on a laptop CPU and needs a C++ compiler, so it is off by default.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn

from helpers import checks

# --- bfloat16 and one buffer for every weight ----------------------------------------------

def cpu_has_native_bf16() -> bool:
    """True on x86 CPUs with AVX512-BF16 or AMX, where bfloat16 matrix products run natively."""
    cpu = getattr(torch, "cpu", None)
    probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(getattr(cpu, name, lambda: False)() for name in probes)


PRECISION_VARIABLE = "COURSE_PRECISION"
PRECISIONS = ("auto", "bf16", "fp32")


def precision_from_environment() -> str:
    """What "auto" means in this run: the environment variable COURSE_PRECISION (fp32, bf16 or
    auto; unset or empty means auto). `COURSE_PRECISION=fp32` runs the course as a laptop
    without native bf16 does, on any machine."""
    value = os.environ.get(PRECISION_VARIABLE, "").strip().lower() or "auto"
    if value not in PRECISIONS:
        raise ValueError(f"the environment variable {PRECISION_VARIABLE} is "
                         f"{os.environ[PRECISION_VARIABLE]!r}, expected one of fp32, bf16, auto "
                         "(or unset)")
    return value


def pick_dtype(device: torch.device, precision: str = "auto") -> torch.dtype:
    """The dtype to compute in: "bf16", "fp32", or "auto".

    "auto" follows the environment variable COURSE_PRECISION=fp32|bf16|auto when it is set
    (for a whole run: `COURSE_PRECISION=fp32 jupyter lab` trains every notebook in float32, as
    on a laptop without native bf16); otherwise, or with COURSE_PRECISION=auto, it is bf16 where
    the hardware has it natively, else float32. An explicit "bf16" or "fp32" wins over the
    variable. Without native support, bf16 products still run but slowly (each one is
    emulated), so "auto" then falls back to float32.
    """
    checks.one_of("precision", precision, PRECISIONS)
    if precision == "auto":
        precision = precision_from_environment()
    if precision != "auto":
        return torch.bfloat16 if precision == "bf16" else torch.float32
    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    if device.type == "cpu" and cpu_has_native_bf16():
        return torch.bfloat16
    return torch.float32


def flatten_into_one_buffer(params: Sequence[Tensor], dtype: torch.dtype) -> Tensor:
    """Move `params` into one new 1-D buffer of `dtype`, in order; each becomes a view of it.

    Writing the buffer writes the parameters and the other way round, so one operation on the
    buffer reaches every parameter. Returns the buffer, (total number of entries,).
    """
    buffer = torch.cat([p.detach().reshape(-1).to(dtype) for p in params])
    for param, view in zip(params, buffer.split([p.numel() for p in params]), strict=True):
        param.data = view.view_as(param)
    return buffer


class FlatWeights:
    """A model's float32 weights in one buffer, their gradients in another, and the model that
    runs forward and backward (the working model) in the compute dtype.

    In float32 the working model is the model itself. In bfloat16 it is a copy whose weights
    and gradients are again one buffer each: backward accumulates into the bf16 gradient
    buffer, `gather_gradients` copies it into the float32 one in a single operation, the
    optimiser updates the float32 weights, and `refresh_working_copy` rounds them back into
    the copy, again in one operation.

    The weights are laid out matrices first, so that `matrices_and_vectors()` can hand AdamW
    two slices: the matrices, which get weight decay, and the biases and LayerNorm gains,
    which do not.
    """

    def __init__(self, model: nn.Module, dtype: torch.dtype) -> None:
        if not all(p.requires_grad for p in model.parameters()):
            raise ValueError("FlatWeights trains every parameter, and this model has frozen ones "
                             "(requires_grad=False): use TrainConfig(fast=False)")
        self.params = _matrices_first(model)  # a tied matrix appears once
        self.n_matrix_entries = sum(p.numel() for p in self.params if p.dim() >= 2)
        self.weights = flatten_into_one_buffer(self.params, torch.float32)
        self.gradients = torch.zeros_like(self.weights)
        if dtype == torch.float32:
            self.working, self.working_params = model, self.params
            self.working_weights, self.working_gradients = self.weights, self.gradients
        else:
            self.working = copy.deepcopy(model).to(dtype)  # tied weights stay tied; buffers too
            self.working_params = _matrices_first(self.working)  # the same order
            self.working_weights = flatten_into_one_buffer(self.working_params, dtype)
            self.working_gradients = torch.zeros_like(self.working_weights)
        self._weight_addresses = [p.data_ptr() for p in self.params]
        self.zero_gradients()  # attaches the gradient views

    def matrices_and_vectors(self) -> tuple[list[Tensor], list[Tensor]]:
        """Two slices of the float32 weights, each with its slice of the gradients as .grad:
        every matrix entry (weight decay applies), then every vector entry (it does not)."""
        cut = self.n_matrix_entries
        matrices, vectors = self.weights[:cut], self.weights[cut:]
        matrices.grad, vectors.grad = self.gradients[:cut], self.gradients[cut:]
        return [matrices] if cut else [], [vectors] if vectors.numel() else []

    def attach_weight_gradients(self) -> None:
        """Give each float32 weight its slice of the float32 gradients as .grad, for an optimiser
        that steps weight by weight (Muon needs each matrix whole). In float32 these are the
        slices `zero_gradients` attaches already."""
        sizes = [p.numel() for p in self.params]
        for param, view in zip(self.params, self.gradients.split(sizes), strict=True):
            param.grad = view.view_as(param)

    def zero_gradients(self) -> None:
        """Zero the working gradients, and (re)attach them as each parameter's .grad, in case
        something set those to None (as `model.zero_grad()` does)."""
        if self._weight_addresses != [p.data_ptr() for p in self.params]:
            raise RuntimeError("the model's parameters were moved or replaced after the Trainer "
                               "was made (by .to(), .float() or similar): make a new Trainer")
        self.working_gradients.zero_()
        sizes = [p.numel() for p in self.working_params]
        for param, view in zip(self.working_params, self.working_gradients.split(sizes), strict=True):
            if param.grad is None or param.grad.data_ptr() != view.data_ptr():
                param.grad = view.view_as(param)

    @torch.no_grad()
    def gather_gradients(self) -> None:
        """The working gradients, in float32, into the gradients of the weights."""
        if self.working_gradients is not self.gradients:
            self.gradients.copy_(self.working_gradients)

    @torch.no_grad()
    def clip_gradients(self, max_norm: float) -> Tensor:
        """Scale the float32 gradients down so that their norm (over every parameter at once)
        is at most `max_norm`, as torch.nn.utils.clip_grad_norm_ does; returns the norm before.

        On one buffer this is two operations; clip_grad_norm_, even given just the two slices,
        measured several times slower here.
        """
        norm = torch.linalg.vector_norm(self.gradients)
        self.gradients.mul_(torch.clamp(max_norm / (norm + 1e-6), max=1.0))
        return norm

    def gather_and_clip_gradients(self, max_norm: float) -> Tensor:
        """`gather_gradients`, then `clip_gradients`: the gradient norm before clipping."""
        self.gather_gradients()
        return self.clip_gradients(max_norm)

    @torch.no_grad()
    def refresh_working_copy(self) -> None:
        """The float32 weights, rounded to the working dtype, into the working copy."""
        if self.working_weights is not self.weights:
            self.working_weights.copy_(self.weights)


def make_optimizer(matrices: Sequence[Tensor], vectors: Sequence[Tensor], lr: float,
                   weight_decay: float, betas: tuple[float, float] = (0.9, 0.99),
                   fused: bool = True) -> torch.optim.AdamW:
    """AdamW that decays `matrices` and leaves `vectors` (biases, LayerNorm gains) alone.

    fused=True asks for PyTorch's single-kernel AdamW step (where this PyTorch has one);
    fused=False is the textbook per-parameter loop.
    """
    groups = [{"params": list(params), "weight_decay": decay}
              for params, decay in ((matrices, weight_decay), (vectors, 0.0)) if len(params)]
    if fused:
        try:
            return torch.optim.AdamW(groups, lr=lr, betas=betas, fused=True)
        except (RuntimeError, TypeError):  # no fused kernel for this device or PyTorch
            return torch.optim.AdamW(groups, lr=lr, betas=betas, foreach=True)
    return torch.optim.AdamW(groups, lr=lr, betas=betas, foreach=False)


def compile_loss(loss: Callable[[Tensor, Tensor], Tensor]) -> Callable[[Tensor, Tensor], Tensor]:
    """torch.compile(loss): the forward and backward passes fused further, for
    TrainConfig(compile=True). The first call compiles (tens of seconds on a laptop CPU, and it
    needs a C++ compiler); later ones run faster."""
    return torch.compile(loss)


def _matrices_first(model: nn.Module) -> list[Tensor]:
    """The parameters, matrices (dim >= 2, weight decay) before vectors, as in
    `helpers.training.trainer.matrices_and_vectors`; the sort is stable, so each group keeps its order."""
    return sorted(model.parameters(), key=lambda p: p.dim() < 2)
