"""Sampling rules as transformations of the next-token distribution.

Defined in notebook 14, "Serving the model", section 1, after the plain versions written there.
Each rule takes logits (B, V) and returns logits of the same shape in which the tokens it rules
out are -inf; softmax of the result is the distribution the next token is drawn from:

    apply_temperature   logits / T: T < 1 sharpens, T > 1 flattens
    top_k_filter        keep the k highest logits (ties with the k-th are kept, as in transformers)
    top_p_filter        keep the smallest set of most likely tokens whose probability reaches p
    min_p_filter        keep the tokens at least min_p times as likely as the most likely one
    distribution        all four in transformers' order (temperature, top-k, top-p, min-p) -> (B, V)
    sample              one token per row, from `distribution`, with the caller's torch.Generator
    check_rule          the checks of those arguments alone, for loops that sample only after a
                        forward pass (batching, speculative decoding) to refuse them before it

Temperature, top-k and min-p keep the same tokens with the same probabilities as the
`transformers` logits processor of the same name. Top-p keeps the same number of tokens with the
same probabilities, and the same tokens unless several tokens tie (equal logits) at the edge of
the nucleus: then ours keeps the lowest ids among them and transformers may keep others, since it
orders ties differently (tests/serve/test_sampling.py). The rules work in float64, so probabilities are
exact to ~1e-15.

Shapes (the legend of `helpers`): B batch, V vocabulary.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from helpers import checks


def check_logits(logits: Tensor, name: str = "logits") -> Tensor:
    """Raise unless `logits` is a float (B, V) or (V,) tensor without NaN; return it as (B, V)."""
    if not isinstance(logits, Tensor):
        raise TypeError(f"{name} is a {type(logits).__name__}, expected a torch.Tensor (B, V)")
    if not logits.is_floating_point():
        raise TypeError(f"{name} has dtype {logits.dtype}, expected a floating-point tensor")
    if logits.dim() not in (1, 2) or logits.shape[-1] == 0:
        raise ValueError(f"{name} has shape {tuple(logits.shape)}, expected (B, V) or (V,) "
                         "with V >= 1")
    if logits.isnan().any():
        raise ValueError(f"{name} contains NaN: no distribution can be made from it")
    if logits.dim() == 1:
        logits = logits.unsqueeze(0)
    if not torch.isfinite(logits.amax(dim=-1)).all():
        raise ValueError(f"a row of {name} has no finite maximum (all -inf, or a +inf): "
                         "no distribution is defined")
    return logits


def apply_temperature(logits: Tensor, temperature: float) -> Tensor:
    """logits (B, V) / temperature, for a temperature > 0 (0, greedy, is `sample`'s business)."""
    logits = check_logits(logits)
    temperature = checks.positive_float("temperature", temperature,
                                        " (use temperature=0 in sample() for greedy)")
    return logits.double() / temperature


def top_k_filter(logits: Tensor, top_k: int) -> Tensor:
    """Keep the top_k highest logits of each row (B, V), and every logit equal to the k-th."""
    logits = check_logits(logits).double()
    top_k = checks.positive_int("top_k", top_k)
    if top_k >= logits.shape[-1]:
        return logits
    kth = logits.topk(top_k, dim=-1).values[:, -1:]  # (B, 1)
    return logits.masked_fill(logits < kth, -math.inf)


def top_p_filter(logits: Tensor, top_p: float) -> Tensor:
    """Keep the smallest set of most likely tokens whose probabilities sum to at least top_p.

    Tokens are ranked by probability, ties by id (lowest first); a token is kept when the tokens
    ranked above it hold less than top_p of the mass; the most likely token is always kept.
    top_p = 1 keeps everything. Where tokens tie at the edge of the nucleus, transformers'
    TopPLogitsWarper keeps as many of them with the same probabilities, not always the same ones.
    """
    logits = check_logits(logits).double()
    top_p = checks.number_in("top_p", top_p, 0.0, 1.0, low_open=True,
                             expected="a probability in (0, 1]")
    order = logits.argsort(dim=-1, descending=True, stable=True)  # (B, V)
    probs = F.softmax(logits, dim=-1).gather(-1, order)
    mass_before = probs.cumsum(dim=-1) - probs  # mass of the tokens ranked above each one
    drop_sorted = mass_before >= top_p
    drop_sorted[:, 0] = False
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, -math.inf)


def min_p_filter(logits: Tensor, min_p: float) -> Tensor:
    """Keep the tokens whose probability is at least min_p x the most likely token's."""
    logits = check_logits(logits).double()
    min_p = checks.number_in("min_p", min_p, 0.0, 1.0, expected="a fraction in [0, 1]")
    probs = F.softmax(logits, dim=-1)
    return logits.masked_fill(probs < min_p * probs.amax(dim=-1, keepdim=True), -math.inf)


def distribution(logits: Tensor, temperature: float = 1.0, top_k: int | None = None,
                 top_p: float | None = None, min_p: float | None = None) -> Tensor:
    """The next-token distribution (B, V) in float64 after the rules, in transformers' order.

    temperature 0 is greedy: all the mass on the highest logit (the lowest id among ties).
    """
    logits = check_logits(logits).double()
    temperature = checks.number_in("temperature", temperature, 0.0, math.inf, high_open=True,
                                   expected="a number >= 0 (0 = greedy)")
    if temperature == 0:
        return F.one_hot(logits.argmax(dim=-1), logits.shape[-1]).double()
    logits = apply_temperature(logits, temperature)
    if top_k is not None:
        logits = top_k_filter(logits, top_k)
    if top_p is not None:
        logits = top_p_filter(logits, top_p)
    if min_p is not None:
        logits = min_p_filter(logits, min_p)
    return F.softmax(logits, dim=-1)


def check_rule(temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
               min_p: float | None = None, generator: torch.Generator | None = None) -> None:
    """Raise, naming the argument, unless `sample` would accept these (a greedy call too: a bad
    top_k is refused even where temperature 0 would ignore it)."""
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator is a {type(generator).__name__}, expected a torch.Generator")
    checks.number_in("temperature", temperature, 0.0, math.inf, high_open=True,
                     expected="a number >= 0 (0 = greedy)")
    if top_k is not None:
        checks.positive_int("top_k", top_k)
    if top_p is not None:
        checks.number_in("top_p", top_p, 0.0, 1.0, low_open=True, expected="a probability in (0, 1]")
    if min_p is not None:
        checks.number_in("min_p", min_p, 0.0, 1.0, expected="a fraction in [0, 1]")


def sample(logits: Tensor, temperature: float = 1.0, top_k: int | None = None,
           top_p: float | None = None, min_p: float | None = None,
           generator: torch.Generator | None = None) -> Tensor:
    """One token per row of logits (B, V) -> ids (B,). The randomness comes only from
    `generator`, which the caller owns: the same generator state gives the same tokens."""
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator is a {type(generator).__name__}, expected a torch.Generator")
    probs = distribution(logits, temperature, top_k, top_p, min_p)
    if temperature == 0:
        return probs.argmax(dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)
