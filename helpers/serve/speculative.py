"""Speculative decoding: a small draft proposes k tokens, the target checks them in one pass.

Defined in notebook 14, "Serving the model", section 6 (Leviathan et al. 2023; Chen et al. 2023):

    acceptance_probability   min(1, p(x) / q(x)) for a drafted token x
    residual                 norm(max(0, p - q)): where to draw from after a rejection
    accept_or_reject         one drafted token: kept, or replaced by a draw from the residual
    verify_round             one round's k drafted tokens: the kept ones, then a residual draw
                             or the bonus token
    speculative_generate     the loop over two GPTs with KV caches; counts the passes
    round_distribution       one round's outputs and their probabilities, every draft path
                             enumerated (for tiny vocabularies)
    exact_distribution       the output distribution of speculative decoding, round after round,
                             to prove it equals the target's
    sample_outputs           draw outputs of speculative decoding on made-up conditionals, through
                             any round check `verify` (a student's, or a wrong one)
    chi_square               Pearson's statistic of those counts against a distribution, and its
                             p-value: the sampled test that fails a wrong `verify`

Accepting x with probability min(1, p/q) and otherwise drawing from the residual gives x with
probability q(x) min(1, p(x)/q(x)) + (1 - sum_y min(q(y), p(y))) r(x) = min(q, p)(x) +
max(0, p - q)(x) = p(x): the target's distribution, whatever the draft. tests/serve/test_speculative.py
checks it by enumeration. Shapes: V vocabulary, k drafted tokens.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from helpers import checks
from helpers.model.kv_cache import KVCache
from helpers.serve import sampling
from helpers.serve.batching import check_prompts


def _check_probs(name: str, probs: Tensor, rows: bool = False) -> None:
    """A float probability vector (V,), or with `rows` a matrix (R, V) of them: one check for all."""
    shape = "(R, V) matrix of probability vectors" if rows else "(V,) probability vector"
    if not isinstance(probs, Tensor) or probs.dim() != 1 + rows or not probs.is_floating_point():
        raise ValueError(f"{name} is {getattr(probs, 'shape', type(probs).__name__)}, expected a "
                         f"float {shape}")
    gap = (probs.sum(dim=-1) - 1).abs().max() if probs.numel() else probs.new_zeros(())
    if (probs < 0).any() or float(gap) > 1e-6:
        raise ValueError(f"{name} has a row summing to 1 {'+-'} {float(gap):.6f} or negative entries, "
                         "expected probability distributions" if rows else
                         f"{name} sums to {float(probs.sum()):.6f} or has negative entries, "
                         "expected a probability distribution")


def acceptance_probability(target: Tensor, draft: Tensor, token: int) -> float:
    """min(1, p(token) / q(token)) for target p (V,) and draft q (V,); q(token) > 0 (drafted)."""
    _check_probs("target", target)
    _check_probs("draft", draft)
    if target.shape != draft.shape:
        raise ValueError(f"target has {target.shape[0]} tokens and draft {draft.shape[0]}: the "
                         "draft must share the target's vocabulary")
    return _acceptance(target, draft, token)


def _acceptance(target: Tensor, draft: Tensor, token: int) -> float:
    q = float(draft[token])
    if q <= 0:
        raise ValueError(f"token {token} has draft probability 0, so the draft cannot propose it")
    return min(1.0, float(target[token]) / q)


def residual(target: Tensor, draft: Tensor) -> Tensor:
    """norm(max(0, p - q)) (V,): the target's mass the draft under-proposed. When p == q (then
    nothing is ever rejected) it returns p."""
    _check_probs("target", target)
    _check_probs("draft", draft)
    return _residual(target, draft)


def _residual(target: Tensor, draft: Tensor) -> Tensor:
    left = (target - draft).clamp(min=0)
    total = left.sum()
    return target.clone() if total <= 0 else left / total


def accept_or_reject(target: Tensor, draft: Tensor, token: int, u: float) -> tuple[bool, Tensor]:
    """The rule for one drafted token, given a uniform u in [0, 1).

    Returns (True, _) if the token is kept (u < min(1, p/q)), else (False, the residual
    distribution to draw the replacement from). The second item is always the residual.
    """
    u = checks.number_in("u", u, 0.0, 1.0, high_open=True, expected="a uniform draw in [0, 1)")
    acceptance = acceptance_probability(target, draft, token)  # checks both vectors, once
    return u < acceptance, _residual(target, draft)


def verify_round(p: Tensor, q: Tensor, drafted: Sequence[int],
                 generator: torch.Generator | None = None) -> list[int]:
    """One round's check of k drafted tokens: p (k + 1, V) the target's probabilities at each
    drafted position and one after, q (k, V) the draft's. Keeps drafted tokens while
    `accept_or_reject` does; the first rejected one is replaced by a draw from the residual and
    ends the round; if all k are kept, a bonus token is drawn from p[k]. Returns 1 to k + 1 tokens.
    """
    drafted = [int(t) for t in drafted]
    if not isinstance(p, Tensor) or not isinstance(q, Tensor) or p.dim() != 2 or q.dim() != 2:
        raise ValueError(f"p and q have shapes {getattr(p, 'shape', p)} and {getattr(q, 'shape', q)}, "
                         "expected (k + 1, V) and (k, V)")
    if tuple(p.shape) != (len(drafted) + 1, q.shape[1]) or q.shape[0] != len(drafted):
        raise ValueError(f"p is {tuple(p.shape)} and q {tuple(q.shape)} for {len(drafted)} drafted "
                         f"tokens, expected ({len(drafted) + 1}, V) and ({len(drafted)}, V)")
    _check_probs("p", p, rows=True)  # every row, once: the loop below trusts them
    _check_probs("q", q, rows=True)
    if not all(0 <= token < q.shape[1] for token in drafted):
        raise ValueError(f"drafted is {drafted}, expected token ids in 0 .. {q.shape[1] - 1}")
    for i, token in enumerate(drafted):  # accept_or_reject's rule, on the rows checked above
        u = float(torch.rand((), generator=generator, dtype=torch.float64))
        if not u < _acceptance(p[i], q[i], token):
            residual_i = _residual(p[i], q[i])
            return drafted[:i] + [int(torch.multinomial(residual_i, 1, generator=generator))]
    return drafted + [int(torch.multinomial(p[len(drafted)], 1, generator=generator))]


def _kept(out: list[int], drafted: list[int], k: int) -> int:
    """How many drafted tokens a round kept, from its output (1 to k + 1 tokens)."""
    if not 1 <= len(out) <= k + 1 or out[:len(out) - 1] != drafted[:len(out) - 1]:
        raise ValueError(f"verify returned {out} for drafted {drafted}: expected the kept drafted "
                         "tokens then one more, 1 to k + 1 tokens")
    return len(out) - 1


# --- the exact output distribution, by enumeration ------------------------------------------

Conditional = Callable[[tuple[int, ...]], Tensor]  # prefix -> next-token probabilities (V,)


def exact_distribution(target: Conditional, draft: Conditional, prefix: tuple[int, ...],
                       k: int, n_tokens: int) -> dict[tuple[int, ...], float]:
    """P(the first n_tokens speculative decoding outputs after `prefix`), every path enumerated.

    target, draft: prefix -> probabilities (V,). Rounds repeat until n_tokens are out, each one
    enumerated by `round_distribution`; the same loop as `autoregressive_distribution`, with a
    round in place of a token. Exponential in k and n_tokens: for tiny vocabularies only.
    """
    checks.positive_int("k", k)
    checks.positive_int("n_tokens", n_tokens)
    prefix = tuple(prefix)
    paths, finished = {(): 1.0}, {}        # output so far -> its probability
    while paths:
        longer = {}
        for made, weight in paths.items():
            if len(made) >= n_tokens:
                _add(finished, made[:n_tokens], weight)
                continue
            for tokens, chance in round_distribution(target, draft, prefix + made, k).items():
                _add(longer, made + tokens, weight * chance)
        paths = longer
    return finished


def round_distribution(target: Conditional, draft: Conditional, context: tuple[int, ...],
                       k: int) -> dict[tuple[int, ...], float]:
    """P(one round's output tokens | context), every draft path enumerated.

    Drafted token i is x with probability q(x) and is kept with acceptance_probability; if it is
    rejected (whichever x it was), y drawn from the residual replaces it and ends the round;
    when all k are kept, a bonus token comes from the target. Outputs have 1 to k + 1 tokens.
    """
    for name, conditional in (("target", target), ("draft", draft)):
        if not callable(conditional):
            raise TypeError(f"{name} is {type(conditional).__name__}, expected a function of a "
                            "context (tuple of ids) returning a probability vector (V,)")
    checks.instance("context", context, tuple, "a tuple of token ids")
    checks.positive_int("k", k)
    out: dict[tuple[int, ...], float] = {}
    kept = {(): 1.0}                    # drafted tokens kept so far -> probability
    for _ in range(k):
        still_kept = {}
        for drafted, weight in kept.items():
            p = target(context + drafted).double()
            q = draft(context + drafted).double()
            acceptance_probability(p, q, int(q.argmax()))  # checks both vectors, once per prefix
            rejected = 0.0              # P(the token drafted here is rejected)
            for x, qx in enumerate(q.tolist()):
                if qx > 0:
                    keep = _acceptance(p, q, x)
                    if keep > 0:
                        _add(still_kept, drafted + (x,), weight * qx * keep)
                    rejected += qx * (1 - keep)
            for y, ry in enumerate(_residual(p, q).tolist()):
                if rejected > 0 and ry > 0:
                    _add(out, drafted + (y,), weight * rejected * ry)
        kept = still_kept
    for drafted, weight in kept.items():  # all k kept: a bonus token from the target
        for x, px in enumerate(target(context + drafted).double().tolist()):
            if px > 0:
                _add(out, drafted + (x,), weight * px)
    return out


def _add(paths: dict[tuple[int, ...], float], path: tuple[int, ...], weight: float) -> None:
    paths[path] = paths.get(path, 0.0) + weight


def autoregressive_distribution(target: Conditional, prefix: tuple[int, ...],
                                n_tokens: int) -> dict[tuple[int, ...], float]:
    """P(the next n_tokens) sampling from `target` one token at a time: the reference."""
    checks.positive_int("n_tokens", n_tokens)
    paths = {(): 1.0}
    for _ in range(n_tokens):
        paths = {made + (x,): w * px for made, w in paths.items()
                 for x, px in enumerate(target(tuple(prefix) + made).double().tolist()) if px > 0}
    return paths


def sample_outputs(target: Conditional, draft: Conditional, prefix: tuple[int, ...], k: int,
                   n_tokens: int, n_samples: int, verify: Callable[..., list[int]],
                   generator: torch.Generator) -> dict[tuple[int, ...], int]:
    """Counts of the first n_tokens outputs over n_samples runs of speculative decoding.

    Each round the draft proposes k tokens from `draft` (one draw each from `generator`), then
    verify(p (k + 1, V), q (k, V), drafted, generator) returns the round's tokens, as in
    `speculative_generate`. For small vocabularies, to test `verify` against `exact_distribution`.
    """
    checks.positive_int("k", k)
    checks.positive_int("n_tokens", n_tokens)
    checks.positive_int("n_samples", n_samples)
    if not callable(verify):
        raise ValueError(f"verify is {type(verify).__name__}, expected a function (p, q, drafted, "
                         "generator) -> tokens, like verify_round")
    checks.instance("generator", generator, torch.Generator, "a torch.Generator")
    counts: dict[tuple[int, ...], int] = {}
    for _ in range(n_samples):
        made: list[int] = []
        while len(made) < n_tokens:
            drafted, q, p = [], [], []
            for _ in range(k):
                context = tuple(prefix) + tuple(made + drafted)
                q.append(draft(context).double())
                p.append(target(context).double())
                drafted.append(int(torch.multinomial(q[-1], 1, generator=generator)))
            p.append(target(tuple(prefix) + tuple(made + drafted)).double())
            out = [int(t) for t in verify(torch.stack(p), torch.stack(q), drafted, generator)]
            _kept(out, drafted, k)  # refuse an output that is not kept tokens + one more
            made += out
        key = tuple(made[:n_tokens])
        counts[key] = counts.get(key, 0) + 1
    return counts


def chi_square(counts: dict[tuple[int, ...], int], probs: dict[tuple[int, ...], float]
               ) -> tuple[float, float]:
    """Pearson's chi-square of observed `counts` against the distribution `probs` (every outcome
    with probability > 0 listed): (statistic, p-value), with len(probs) - 1 degrees of freedom.

    The p-value is the chance that counts drawn from `probs` stand at least this far from it;
    a small one says the counts were not drawn from `probs`. An outcome outside `probs` makes
    the statistic infinite (p-value 0). Reliable when every expected count is >= 5.
    """
    n = sum(counts.values())
    if n <= 0 or any(c < 0 for c in counts.values()):
        raise ValueError(f"counts hold {n} samples, expected non-negative counts summing to >= 1")
    if len(probs) < 2 or abs(sum(probs.values()) - 1) > 1e-9 or min(probs.values()) <= 0:
        raise ValueError(f"probs has {len(probs)} outcomes summing to {sum(probs.values()):.9f}, "
                         "expected >= 2 outcomes, each > 0, summing to 1")
    if any(c > 0 and key not in probs for key, c in counts.items()):
        return math.inf, 0.0
    statistic = sum((counts.get(key, 0) - n * px) ** 2 / (n * px) for key, px in probs.items())
    dof = len(probs) - 1
    p_value = float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64),
                                            torch.tensor(statistic / 2, dtype=torch.float64)))
    return statistic, p_value


# --- the loop on two GPTs -------------------------------------------------------------------

@dataclass
class SpeculativeStats:
    proposed: int = 0        # drafted tokens
    accepted: int = 0        # drafted tokens the target kept
    rejected: int = 0        # drafted tokens the target replaced (at most one a round; the
                             # drafted tokens after it are never checked)
    target_passes: int = 0   # forward passes of the target: one per round (the first round's
                             # pass also reads the prompt)
    draft_passes: int = 0
    full_rounds: int = 0     # rounds in which all k drafted tokens were kept (a bonus token too)

    @property
    def rounds(self) -> int:
        """Rounds run: one target pass each."""
        return self.target_passes

    @property
    def full_round_share(self) -> float:
        """The share of rounds in which all k drafted tokens were kept. It falls as k grows even
        when the per-token acceptance rate does not: k tokens must all pass."""
        return self.full_rounds / max(self.rounds, 1)

    @property
    def acceptance_rate(self) -> float:
        """Accepted / checked: the chance that a drafted token the target looks at is kept
        (Leviathan et al.'s alpha). vLLM's "draft acceptance rate" is accepted / proposed."""
        return self.accepted / max(self.accepted + self.rejected, 1)


def _feed(model: nn.Module, cache: KVCache, ids: Sequence[int]) -> Tensor:
    """Feed the tokens of `ids` the cache does not hold yet; logits of those tokens (n, V)."""
    return model.forward_cached(torch.tensor([list(ids[cache.length:])]), cache)[0]


@torch.no_grad()
def speculative_generate(target: nn.Module, draft: nn.Module, prompt: Sequence[int],
                         max_new_tokens: int, k: int, temperature: float = 1.0,
                         top_k: int | None = None, top_p: float | None = None,
                         generator: torch.Generator | None = None,
                         verify: Callable[..., list[int]] | None = None
                         ) -> tuple[list[int], SpeculativeStats]:
    """Generate max_new_tokens after `prompt` with `draft` proposing k tokens a round.

    The tokens follow the target's sampling distribution exactly (temperature 0: the target's
    greedy tokens). Each cache holds every token but the last; after a rejection it is rolled
    back by setting its length (the slots after it are simply overwritten later). verify(p (k + 1,
    V), q (k, V), drafted, generator) -> the round's tokens; default `verify_round` (notebook 14
    passes the student's own).
    """
    k = checks.positive_int("k", k)
    if verify is None:
        verify = verify_round
    elif not callable(verify):
        raise ValueError(f"verify is {type(verify).__name__}, expected a function (p, q, drafted, "
                         "generator) -> tokens, like verify_round")
    checks.positive_int("max_new_tokens", max_new_tokens)
    if draft.config.vocab_size != target.config.vocab_size:
        raise ValueError(f"draft has vocab_size {draft.config.vocab_size} and target "
                         f"{target.config.vocab_size}: the draft must use the target's tokenizer")
    prompt = check_prompts([prompt], target.config.vocab_size)[0]
    sampling.check_rule(temperature, top_k, top_p, None, generator)
    need = len(prompt) + max_new_tokens + k
    if need > min(target.config.context_length, draft.config.context_length):
        raise ValueError(f"prompt + max_new_tokens + k = {need} tokens, longer than the cache "
                         f"(context {min(target.config.context_length, draft.config.context_length)})")
    target.eval(), draft.eval()
    rule = lambda logits: sampling.distribution(logits, temperature, top_k, top_p)[0]  # noqa: E731
    t_cache, d_cache = KVCache.for_model(target, 1), KVCache.for_model(draft, 1)
    seq, stats = list(prompt), SpeculativeStats()
    while len(seq) - len(prompt) < max_new_tokens:
        proposed, q = [], []
        for _ in range(k):  # the draft proposes k tokens, one pass each
            q.append(rule(_feed(draft, d_cache, seq + proposed)[-1:]))
            proposed.append(int(torch.multinomial(q[-1], 1, generator=generator)))
        stats.draft_passes += k
        logits = _feed(target, t_cache, seq + proposed)[-(k + 1):]  # one pass checks all k
        stats.target_passes += 1
        p = torch.stack([rule(row.unsqueeze(0)) for row in logits])      # (k + 1, V)
        out = [int(t) for t in verify(p, torch.stack(q), list(proposed), generator)]
        kept = _kept(out, proposed, k)
        stats.proposed, stats.accepted = stats.proposed + k, stats.accepted + kept
        stats.rejected += kept < k
        stats.full_rounds += kept == k
        seq += out
        t_cache.length = min(t_cache.length, len(seq) - 1)  # roll back past the rejection
        d_cache.length = min(d_cache.length, len(seq) - 1)
    return seq[len(prompt):len(prompt) + max_new_tokens], stats
