"""The KV cache: every layer's keys and values for the tokens seen so far, preallocated.

Defined in notebook 7, "GPT", section 6 (the KV cache), after the plain version written there
by hand. The cache owns its state: `store` writes a layer's new keys and values, `length`
moves on once per step, `check_fits` (and `check_cache`, which first checks it is a KVCache) says whether it fits a
model and a batch. Both
`helpers.model.gpt.GPT` and `helpers.model.modern.ModernGPT` feed it through
`forward_cached`; `helpers.model.generation` drives the loop.

Shapes (the legend of `helpers`): B batch, L = n_layers, H_KV key/value heads, D_H = head_dim.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor, nn

from helpers import checks
from helpers.model.multihead import KVStore


class KVCache:
    """The keys and values of every layer for the tokens seen so far.

    Two preallocated tensors of shape (L, B, H_KV, max_length, D_H), filled from the left:
    2 x L x H_KV x D_H numbers per token and sequence, whatever the model's vocabulary or MLP.
    """

    def __init__(self, n_layers: int, batch_size: int, n_kv_heads: int, max_length: int,
                 head_dim: int, dtype: torch.dtype = torch.float32,
                 device: torch.device | str | None = None) -> None:
        for name, value in (("n_layers", n_layers), ("batch_size", batch_size),
                            ("n_kv_heads", n_kv_heads), ("max_length", max_length),
                            ("head_dim", head_dim)):
            checks.positive_int(name, value)
        shape = (n_layers, batch_size, n_kv_heads, max_length, head_dim)
        self.keys = torch.zeros(shape, dtype=dtype, device=device)
        self.values = torch.zeros(shape, dtype=dtype, device=device)
        self.length = 0

    @classmethod
    def for_model(cls, model: nn.Module, batch_size: int) -> KVCache:
        """An empty cache with room for a full context of `model`, in its dtype and device."""
        weight = model.lm_head.weight
        attn = model.blocks[0].attn
        return cls(len(model.blocks), batch_size, attn.n_kv_heads, model.config.context_length,
                   attn.head_dim, dtype=weight.dtype, device=weight.device)

    @property
    def max_length(self) -> int:
        return self.keys.shape[3]

    def store(self, layer: int, keys: Tensor, values: Tensor) -> tuple[Tensor, Tensor]:
        """Write the new tokens' keys and values (B, H_KV, n, D_H) of `layer` after the
        `length` stored ones; return all of that layer's, (B, H_KV, length + n, D_H).

        `length` itself moves on once every layer has stored (GPT.forward_cached does it).
        """
        expected = (*self.keys.shape[1:3], self.keys.shape[4])
        if keys.dtype != self.keys.dtype or values.dtype != self.keys.dtype:
            raise TypeError(f"keys are {keys.dtype} and values {values.dtype}, expected "
                            f"{self.keys.dtype}, the dtype this cache was made with")
        if keys.shape != values.shape or (keys.shape[0], keys.shape[1], keys.shape[3]) != expected:
            raise ValueError(f"keys has shape {tuple(keys.shape)} and values {tuple(values.shape)}, "
                             f"expected both (B, H_KV, n, D_H) with (B, H_KV, D_H) = {expected}")
        end = self.length + keys.shape[2]
        if end > self.max_length:
            raise ValueError(f"the cache holds {self.length} tokens of at most {self.max_length}; "
                             f"{keys.shape[2]} more do not fit")
        self.keys[layer, :, :, self.length:end] = keys
        self.values[layer, :, :, self.length:end] = values
        return self.keys[layer, :, :, :end], self.values[layer, :, :, :end]

    def store_hook(self, layer: int) -> KVStore:
        """`store` for one layer: the `kv_store` that MultiHeadAttention.forward calls."""
        return functools.partial(self.store, layer)

    def nbytes(self) -> int:
        """Bytes the two tensors really occupy (all max_length slots)."""
        return self.keys.nbytes + self.values.nbytes

    def check_fits(self, model: nn.Module, batch_size: int) -> None:
        """Raise unless this cache fits `model` and a batch of `batch_size` sequences."""
        attn, weight = model.blocks[0].attn, model.lm_head.weight
        expected = {"layers": len(model.blocks), "batch size": batch_size,
                    "key/value heads": attn.n_kv_heads, "head size": attn.head_dim}
        got = dict(zip(expected, (self.keys.shape[i] for i in (0, 1, 2, 4)), strict=True))
        for what, value in expected.items():
            if got[what] != value:
                raise ValueError(f"cache has {what} {got[what]} (keys of shape "
                                 f"{tuple(self.keys.shape)}), expected {value} for this model and "
                                 f"token_ids: make it with KVCache.for_model(model, {batch_size})")
        if self.keys.dtype != weight.dtype or self.keys.device != weight.device:
            raise TypeError(f"cache holds {self.keys.dtype} on {self.keys.device}, expected "
                            f"{weight.dtype} on {weight.device} like the model's weights: make it "
                            f"with KVCache.for_model(model, {batch_size})")


def check_cache(cache: object, model: nn.Module, batch_size: int) -> None:
    """Raise unless `cache` is a KVCache that fits `model` and a batch of `batch_size` sequences."""
    if not isinstance(cache, KVCache):
        raise TypeError(f"cache is a {type(cache).__name__}, expected a KVCache "
                        f"(KVCache.for_model(model, {batch_size}))")
    cache.check_fits(model, batch_size)
