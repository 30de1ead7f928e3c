"""Many prompts of different lengths in one batch: padding side, attention mask, position ids.

Defined in notebook 14, "Serving the model", section 2:

    left_pad          prompts of different lengths -> ids (B, N), attention mask (B, N)
    position_ids      each token's position within its own prompt, pads skipped
    forward_rows      a GPT's forward where each row has its own positions and mask, feeding a
                      KV cache through the blocks' `kv_store` hook (the engine every serving
                      module here runs: batched, paged, speculative)
    generate_batch    greedy or sampled generation of a whole batch with the contiguous KVCache

Pads go on the left, so every row's next token lands in the same column; the mask hides the
pads from the real tokens and the position ids restart at 0 where each prompt starts. Then a
row's logits equal those of its prompt alone (tests/serve/test_sampling.py checks greedy tokens).

Shapes (the legend of `helpers`): B batch, N tokens, M keys (cached ones first), V vocabulary,
D = d_model, L = n_layers.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from helpers import checks
from helpers.model.kv_cache import KVCache
from helpers.model.multihead import KVStore
from helpers.serve import sampling


def check_prompts(prompts: Sequence[Sequence[int]], vocab_size: int) -> list[list[int]]:
    """Raise unless `prompts` is a non-empty list of non-empty lists of ids in [0, vocab_size)."""
    if isinstance(prompts, Tensor) or not isinstance(prompts, Sequence) or len(prompts) == 0:
        raise ValueError(f"prompts is {type(prompts).__name__} of length "
                         f"{len(prompts) if hasattr(prompts, '__len__') else '?'}, expected a "
                         "non-empty list of prompts, each a list of token ids")
    rows = []
    for i, prompt in enumerate(prompts):
        row = prompt.tolist() if isinstance(prompt, Tensor) else list(prompt)
        if not row:
            raise ValueError(f"prompts[{i}] is empty, expected at least one token id")
        if not all(isinstance(t, int) and 0 <= t < vocab_size for t in row):
            raise ValueError(f"prompts[{i}] = {row[:8]}... holds a value that is not a token id "
                             f"in [0, {vocab_size})")
        rows.append(row)
    return rows


def left_pad(prompts: Sequence[Sequence[int]], pad_id: int = 0) -> tuple[Tensor, Tensor]:
    """Prompts of different lengths -> ids (B, N) padded on the left with pad_id, and the
    attention mask (B, N), True at real tokens. N is the longest prompt's length."""
    checks.non_negative_int("pad_id", pad_id)
    rows = check_prompts(prompts, vocab_size=2**62)
    width = max(len(row) for row in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.bool)
    for b, row in enumerate(rows):
        ids[b, width - len(row):] = torch.tensor(row)
        mask[b, width - len(row):] = True
    return ids, mask


def position_ids(attention_mask: Tensor) -> Tensor:
    """(B, N) bool -> (B, N) long: 0, 1, 2 ... counted over the real tokens only (pads get 0)."""
    if not isinstance(attention_mask, Tensor) or attention_mask.dtype != torch.bool \
            or attention_mask.dim() != 2:
        raise ValueError(f"attention_mask is {getattr(attention_mask, 'shape', attention_mask)!r}, "
                         "expected a (B, N) torch.bool tensor, True at real tokens")
    return (attention_mask.long().cumsum(dim=-1) - 1).clamp(min=0)


def forward_rows(model: nn.Module, token_ids: Tensor, positions: Tensor, mask: Tensor,
                 kv_stores: Sequence[KVStore] | None = None) -> Tensor:
    """A GPT's forward pass with per-row positions and mask: logits (B, n, V).

    token_ids, positions: (B, n); mask: (B, n, M) bool, True where query i of row b may see key j,
    with M = the keys the cache returns (cached ones first) or n without a cache.
    kv_stores: one `kv_store` hook per layer (a cache's), or None for a plain forward.
    Runs the model's own embedding tables and `Block.forward`: nothing is reimplemented.
    """
    if token_ids.shape != positions.shape or token_ids.dim() != 2:
        raise ValueError(f"token_ids has shape {tuple(token_ids.shape)} and positions "
                         f"{tuple(positions.shape)}, expected the same (B, n)")
    if int(positions.max()) >= model.config.context_length or int(positions.min()) < 0:
        raise ValueError(f"positions reach {int(positions.max())}, expected positions in "
                         f"[0, context_length = {model.config.context_length})")
    if mask.dtype != torch.bool or mask.dim() != 3 or mask.shape[:2] != token_ids.shape:
        raise ValueError(f"mask has shape {tuple(mask.shape)} and dtype {mask.dtype}, expected "
                         f"bool (B, n, M) with (B, n) = {tuple(token_ids.shape)}")
    x = model.embed.token(token_ids) + model.embed.position(positions)  # (B, n, D)
    for layer, block in enumerate(model.blocks):
        store = None if kv_stores is None else kv_stores[layer]
        x = block(x, causal=False, mask=mask, kv_store=store)
    return model.lm_head(model.ln_f(x))  # (B, n, V)


@torch.no_grad()
def generate_batch(model: nn.Module, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                   temperature: float = 0.0, top_k: int | None = None,
                   top_p: float | None = None, min_p: float | None = None,
                   generator: torch.Generator | None = None) -> list[list[int]]:
    """Generate `max_new_tokens` for every prompt at once (left padding, one contiguous KVCache).

    Returns the new tokens of each prompt. temperature 0 (the default) is greedy.
    """
    rows = check_prompts(prompts, model.config.vocab_size)
    checks.positive_int("max_new_tokens", max_new_tokens)
    sampling.check_rule(temperature, top_k, top_p, min_p, generator)
    longest = max(len(row) for row in rows) + max_new_tokens
    if longest > model.config.context_length:
        raise ValueError(f"the longest prompt plus max_new_tokens is {longest} tokens, expected "
                         f"at most context_length = {model.config.context_length}")
    model.eval()
    ids, real = left_pad(rows)
    positions = position_ids(real)
    cache = KVCache.for_model(model, len(rows))
    stores = [cache.store_hook(layer) for layer in range(len(model.blocks))]
    new: list[list[int]] = [[] for _ in rows]
    for _ in range(max_new_tokens):
        start, n = cache.length, ids.shape[1]
        query = torch.arange(start, start + n).view(1, n, 1)          # absolute column of each query
        key = torch.arange(start + n).view(1, 1, -1)                  # (1, 1, M)
        mask = (key <= query) & real.unsqueeze(1) | (key == query)    # (B, n, M); a pad sees itself
        logits = forward_rows(model, ids, positions, mask, stores)[:, -1]
        cache.length = start + n
        token = sampling.sample(logits, temperature, top_k, top_p, min_p, generator)  # (B,)
        for b, t in enumerate(token.tolist()):
            new[b].append(t)
        ids, positions = token.unsqueeze(1), positions[:, -1:] + 1
        real = torch.cat([real, torch.ones(len(rows), 1, dtype=torch.bool)], dim=1)
    return new
