"""Notebook 11, part two: two ways to fit a step in less activation memory on one device.

The backward pass needs tensors the forward pass saved (inputs of every matmul, softmax outputs,
...). Their bytes grow with the batch and the depth, and often outgrow the weights.

    gradient accumulation   run the batch in k pieces, add their gradients, step once: the saved
                            tensors of one piece at a time (about 1/k), k smaller steps' time
    recomputation           save only each block's input (torch.utils.checkpoint); in the backward
                            rerun the block's forward to get the rest: about one more forward

    SavedTensorMeter             counts the bytes autograd keeps for the backward, and their peak
    gradient_step(model, ids, targets, accumulation, recompute)
                                 one forward + backward of the course GPT: gradients by name, peak
                                 saved bytes, loss
    compare_memory_and_time      the four combinations' peak saved bytes and best time

Peak bytes come from autograd's saved-tensor hooks (the same on every machine), never from the
allocator. Shapes: ids, targets (B, N) token ids; k accumulation steps of B / k rows.
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from helpers import checks
from helpers.model.embeddings import check_token_ids
from helpers.model.gpt import GPT


class _Held:
    """One saved tensor; counted while autograd keeps it (until its graph is freed)."""

    def __init__(self, meter: SavedTensorMeter, tensor: Tensor) -> None:
        self.meter, self.tensor, self.key = meter, tensor, tensor.untyped_storage().data_ptr()
        meter._add(self.key, tensor.untyped_storage().nbytes())

    def __del__(self) -> None:
        self.meter._remove(self.key)


class SavedTensorMeter:
    """with SavedTensorMeter(model) as meter: ... -> meter.peak, the largest number of bytes of
    saved tensors alive at once (a storage counted once however many tensors view it; the
    model's own weights left out: they are held anyway)."""

    def __init__(self, model: torch.nn.Module) -> None:
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"model is a {type(model).__name__}, expected a torch.nn.Module")
        self.weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
        self.alive: dict[int, list[int]] = {}  # storage -> [count, bytes]
        self.now = self.peak = 0
        self.hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

    def _pack(self, tensor: Tensor) -> Any:
        if tensor.untyped_storage().data_ptr() in self.weights:
            return tensor
        return _Held(self, tensor)

    @staticmethod
    def _unpack(packed: Any) -> Tensor:
        return packed.tensor if isinstance(packed, _Held) else packed

    def _add(self, key: int, nbytes: int) -> None:
        entry = self.alive.setdefault(key, [0, nbytes])
        if entry[0] == 0:
            self.now += nbytes
            self.peak = max(self.peak, self.now)
        entry[0] += 1

    def _remove(self, key: int) -> None:
        entry = self.alive[key]
        entry[0] -= 1
        if entry[0] == 0:
            self.now -= entry[1]
            del self.alive[key]

    def __enter__(self) -> SavedTensorMeter:
        self.hooks.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.hooks.__exit__(*exc)


def _loss(model: GPT, ids: Tensor, targets: Tensor, recompute: bool) -> Tensor:
    x = model.drop(model.embed(ids))
    for block in model.blocks:
        # use_reentrant=True reruns the block inside the backward, under the meter's hooks
        x = checkpoint(block, x, use_reentrant=True) if recompute else block(x)
    return F.cross_entropy(model.lm_head(model.ln_f(x)).flatten(0, 1), targets.flatten())


def gradient_step(model: GPT, ids: Tensor, targets: Tensor, accumulation: int = 1,
                  recompute: bool = False) -> dict[str, Any]:
    """Forward and backward of the whole batch (B, N) in `accumulation` pieces (losses scaled by
    1 / k, gradients added), each block checkpointed if `recompute`. Returns the gradients by
    name, the peak saved bytes, and the loss."""
    if not isinstance(model, GPT):
        raise TypeError(f"model is a {type(model).__name__}, expected the course GPT")
    k = checks.positive_int("accumulation", accumulation)
    checks.boolean("recompute", recompute)
    if not isinstance(ids, Tensor) or ids.dim() != 2 or ids.shape != getattr(targets, "shape", None):
        raise ValueError("ids and targets must be two (B, N) tensors of the same shape")
    if ids.numel() == 0:
        raise ValueError(f"ids has shape {tuple(ids.shape)}, expected at least one row of at least "
                         "one token (an empty batch has no loss to take the gradient of)")
    check_token_ids(ids, model.config.vocab_size, "ids")
    check_token_ids(targets, model.config.vocab_size, "targets")
    if ids.shape[0] % k:
        raise ValueError(f"batch of {ids.shape[0]} rows cannot be cut into accumulation={k} equal "
                         f"pieces: expected B divisible by {k}")
    model.zero_grad(set_to_none=True)
    total = 0.0
    with SavedTensorMeter(model) as meter:
        for piece_ids, piece_targets in zip(ids.chunk(k), targets.chunk(k), strict=True):
            loss = _loss(model, piece_ids, piece_targets, recompute) / k
            loss.backward()
            total += loss.item()
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    return {"grads": grads, "peak_bytes": meter.peak, "loss": total}


def compare_memory_and_time(model: GPT, ids: Tensor, targets: Tensor, accumulation: int = 4,
                            repeats: int = 3) -> dict[str, dict[str, float]]:
    """Peak saved bytes and the fastest of `repeats` forward + backward passes: plain,
    accumulating over `accumulation` pieces, recomputing, and both. Print times only through
    helpers.timing.format_duration (they differ between machines)."""
    checks.positive_int("repeats", repeats)
    out = {}
    for name, k, recompute in (("plain", 1, False), (f"accumulate x{accumulation}", accumulation, False),
                               ("recompute", 1, True), ("both", accumulation, True)):
        times, peak = [], 0
        for _ in range(repeats):
            start = time.perf_counter()
            peak = gradient_step(model, ids, targets, k, recompute)["peak_bytes"]
            times.append(time.perf_counter() - start)
        out[name] = {"peak_bytes": peak, "seconds": min(times)}
    return out
