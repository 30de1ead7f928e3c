"""Generating text with a trained model: the KV cache, picking the next token, the loop.

Defined in notebook 7, "GPT": section 5 (sampling: temperature and top-k) and section 6 (the
KV cache), after the plain versions written there by hand:

    KVCache         (in `helpers.model.kv_cache`) every layer's keys and values, preallocated
    sample_next     one token from logits: greedy, temperature, top-k
    generate        autoregressive generation, with or without the cache

Works for any model with `config.vocab_size`, `config.context_length`, `blocks` (each with an
`attn` that has n_kv_heads and head_dim), `lm_head` and `forward_cached(ids, cache)`:
`helpers.model.gpt.GPT` and `helpers.model.modern.ModernGPT`.

Shapes (the legend of `helpers`): B batch, N tokens, V vocabulary, L = n_layers,
H_KV key/value heads, D_H = head_dim.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor

from helpers import checks
from helpers.model.embeddings import check_token_ids
from helpers.model.kv_cache import KVCache

if TYPE_CHECKING:
    from helpers.model.gpt import GPT


# --- sampling and generation ---------------------------------------------------------------

def sample_next(logits: Tensor, temperature: float = 1.0, top_k: int | None = None,
                generator: torch.Generator | None = None) -> Tensor:
    """Pick the next token of each row: logits (B, V) -> ids (B, 1).

    temperature 0 or top_k 1 is greedy (argmax). Otherwise the logits are divided by
    `temperature` (below 1 sharpens, above 1 flattens), every token outside the `top_k` highest
    is removed, and one token is drawn from the softmax. The division comes after subtracting
    each row's maximum, in float64, so a tiny temperature (1e-40) is simply greedy, never NaN.

    Ties: top_k keeps exactly k tokens; among equal logits the lower token id is kept first
    (top_k=2 over three equal best logits keeps the two lowest ids). Greedy picks the lowest id
    of the best logits too.

    Logits with a NaN (a model with a NaN weight) or a row that is all -inf (no token possible)
    are refused with a ValueError, instead of silently picking a token.
    """
    _check_logits(logits)
    temperature, top_k = _check_sampling(temperature, top_k, generator)
    if temperature == 0 or top_k == 1:
        return logits.argmax(dim=-1, keepdim=True)
    logits = logits.double()
    logits = (logits - logits.amax(dim=-1, keepdim=True)) / temperature  # best token: exactly 0
    if top_k is not None and top_k < logits.shape[-1]:
        # A stable sort keeps equal logits in id order, so exactly top_k tokens stay.
        order = logits.sort(dim=-1, descending=True, stable=True).indices[:, :top_k]  # (B, k)
        kept = torch.full_like(logits, float("-inf")).scatter(-1, order, logits.gather(-1, order))
        logits = kept
    return torch.multinomial(F.softmax(logits, dim=-1), num_samples=1, generator=generator)


def _check_sampling(temperature: float, top_k: int | None,
                    generator: torch.Generator | None) -> tuple[float, int | None]:
    """temperature as a float >= 0 and top_k as None or an int >= 1, else an error naming the
    argument (a generator other than None or a torch.Generator too)."""
    temperature = checks.number_in("temperature", temperature, 0.0, math.inf, high_open=True,
                                   expected="a number >= 0 (0 = greedy)")
    if top_k is not None:
        top_k = checks.positive_int("top_k", top_k)
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator is a {type(generator).__name__}, expected a torch.Generator")
    return temperature, top_k


def _check_logits(logits: Tensor) -> None:
    """Raise unless logits is a float (B, V) tensor with V >= 1, no NaN and a finite best logit."""
    if not isinstance(logits, Tensor):
        raise TypeError(f"logits is a {type(logits).__name__}, expected a torch.Tensor (B, V)")
    if not logits.is_floating_point():
        raise TypeError(f"logits has dtype {logits.dtype}, expected a floating-point tensor")
    if logits.dim() != 2 or logits.shape[1] == 0:
        raise ValueError(f"logits has shape {tuple(logits.shape)}, expected (B, V) with a "
                         "vocabulary of V >= 1 tokens")
    if logits.isnan().any():
        row = int(logits.isnan().any(dim=-1).nonzero()[0])
        raise ValueError(f"logits row {row} contains NaN: the model computed NaN (check its "
                         "weights with torch.isfinite); no token can be chosen from it")
    best = logits.amax(dim=-1)
    if not torch.isfinite(best).all():
        row = int((~torch.isfinite(best)).nonzero()[0])
        raise ValueError(f"logits row {row} has best value {best[row].item()}, expected a finite "
                         "maximum: with every logit -inf (or one +inf) no distribution is defined")


@torch.no_grad()
def generate(model: GPT, prompt: Tensor, max_new_tokens: int, temperature: float = 1.0,
             top_k: int | None = None, use_cache: bool = True,
             generator: torch.Generator | None = None) -> Tensor:
    """Extend `prompt` (B, N) by `max_new_tokens` tokens, one at a time: (B, N + max_new_tokens).

    Past the context length the model reads only the last context_length tokens (the sequence
    is cropped, as GPT-2 does; no error). With use_cache=True each step feeds one token through
    a KVCache; when the cache is full it is rebuilt from the cropped window, so the tokens are
    exactly those of recomputing the full window every step (use_cache=False).
    The model is put in eval mode (no dropout) for the call and restored afterwards.
    """
    checks.positive_int("max_new_tokens", max_new_tokens)
    checks.boolean("use_cache", use_cache)
    _check_sampling(temperature, top_k, generator)  # before the first forward pass, not after it
    if not isinstance(prompt, Tensor):
        raise TypeError(f"prompt is a {type(prompt).__name__}, expected a (B, N) tensor of token "
                        "ids, e.g. torch.tensor([ids])")
    if prompt.dim() != 2 or prompt.shape[1] == 0:
        raise ValueError(f"prompt has shape {tuple(prompt.shape)}, expected (B, N) with N >= 1")
    check_token_ids(prompt, model.config.vocab_size, "prompt")
    was_training = model.training
    model.eval()
    try:
        next_logits = _CachedSteps(model, prompt.shape[0]) if use_cache else _recompute(model)
        ids = prompt
        for _ in range(max_new_tokens):
            ids = torch.cat([ids, sample_next(next_logits(ids), temperature, top_k, generator)], dim=1)
        return ids
    finally:
        model.train(was_training)


def _recompute(model: GPT) -> Callable[[Tensor], Tensor]:
    """Next-token logits (B, V) of a sequence (B, S), from a full pass over its last window."""
    return lambda ids: model(ids[:, -model.config.context_length:])[:, -1]


class _CachedSteps:
    """Next-token logits for a growing sequence, feeding only the new token when it can."""

    def __init__(self, model: GPT, batch_size: int) -> None:
        self.model = model
        self.cache = KVCache.for_model(model, batch_size)
        self.seen = 0  # tokens of the sequence already in the cache (0: start afresh)

    def __call__(self, ids: Tensor) -> Tensor:
        """ids: (B, S), the whole sequence so far -> logits for the token after it, (B, V)."""
        fits = self.seen > 0 and ids.shape[1] - self.seen == 1 \
            and self.cache.length < self.cache.max_length
        if fits:
            logits = self.model.forward_cached(ids[:, -1:], self.cache)
        else:  # first call, or the window slid: refill the cache from the last window
            self.cache.length = 0
            logits = self.model.forward_cached(ids[:, -self.cache.max_length:], self.cache)
        self.seen = ids.shape[1]
        return logits[:, -1]
