"""Exercises of notebook 12 (the decoder of 2025-2026): the MoE forward (route, dispatch,
combine), the Switch loss, the MLA absorption, the ring buffer's read order and decoding through
a sliding-window ring buffer.

Each checker raises `ExerciseFailed(what is wrong, fix=how to fix it in words)`."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from helpers.lab.exercises import ExerciseFailed, exercise, expect_close, hidden_round, seeded
from helpers.model import moe, sliding


def helper_moe_forward(x: torch.Tensor, logits: torch.Tensor, k: int,
                       experts: Sequence[Callable[[torch.Tensor], torch.Tensor]]) -> torch.Tensor:
    """Mixtral's MoE forward from the helpers: `moe.route`, then a loop over the experts.
    x (T, D), logits (T, E), experts: E functions (n, D) -> (n, D). Returns (T, D)."""
    weights, chosen = moe.route(logits, k, "topk_softmax")
    out = torch.zeros_like(x)
    for e, expert in enumerate(experts):
        token, slot = torch.where(chosen == e)
        out.index_add_(0, token, expert(x[token]) * weights[token, slot, None])
    return out


def _with_weights(x, logits, k, experts, weights_of) -> torch.Tensor:
    """The forward with the k chosen experts of each token weighted by weights_of(logits, chosen)."""
    chosen = logits.topk(k, dim=-1).indices
    weights = weights_of(logits, chosen)
    outs = torch.stack([torch.stack([experts[int(e)](x[t:t + 1])[0] for e in row]) for t, row in enumerate(chosen)])
    return (outs * weights[..., None]).sum(1)


# The usual slips, each computed on the checker's inputs and named when the answer matches it:
# (what is wrong, how to fix it) -> the weights that slip gives.
MOE_SLIPS = {
    ("your weights are the softmax over all E experts, kept for the top k but not renormalised "
     "(Qwen3-MoE's form with norm_topk_prob=False)",
     "this exercise asks for Mixtral's weights, whose k weights sum to 1: a softmax over the k "
     "kept logits only"): lambda lg, ch: lg.softmax(-1).gather(-1, ch),
    ("you summed the k experts' outputs without their weights",
     "multiply each expert's output by that token's router weight for it"):
        lambda lg, ch: torch.ones(ch.shape, dtype=lg.dtype),
    ("your softmax runs over the tokens (dim=0), not over each token's experts (dim=-1)",
     "take the softmax along the last axis, the k experts of one token"):
        lambda lg, ch: lg.softmax(0).gather(-1, ch) / lg.softmax(0).gather(-1, ch).sum(-1, keepdim=True),
    ("each token's weights went to the wrong experts",
     "weight j belongs to the j-th chosen expert: keep the top-k values and indices together"):
        lambda lg, ch: lg.gather(-1, ch).softmax(-1).flip(-1),
}


def _experts(n: int, d: int, generator: torch.Generator) -> tuple[list[Callable], list[int]]:
    """n different linear experts (n, d) -> (n, d), and a list counting the rows each one saw."""
    mats = [torch.randn(d, d, generator=generator, dtype=torch.float64) for _ in range(n)]
    seen = [0]

    def make(m: torch.Tensor) -> Callable:
        def expert(rows: torch.Tensor) -> torch.Tensor:
            seen[0] += rows.shape[0]
            return rows @ m
        return expert
    return [make(m) for m in mats], seen


@exercise(hint="Route first (the k largest logits of each token, a softmax over those k), then "
               "dispatch: each expert runs on the tokens that chose it, and its output is added to "
               "them times their weight for it.", points=3,
          task="Write moe_forward(x, logits, k, experts) -> (T, D): Mixtral's routing and the "
               "weighted sum of each token's k experts. The check compares it with the helpers' "
               "MoE on random tokens, for k = 1, 2 and 3 and with experts no token chose.")
def moe_forward(student: Callable) -> str:
    generator = seeded(0)
    ran_all = False
    for tokens, n_experts, k, skew in ((6, 4, 2, 0.0), (9, 6, 3, 0.0), (5, 5, 1, 0.0), (8, 6, 2, 4.0)):
        x = torch.randn(tokens, 3, generator=generator, dtype=torch.float64)
        logits = torch.randn(tokens, n_experts, generator=generator, dtype=torch.float64)
        logits[:, :2] += skew                    # the last case: experts 0 and 1 take every token
        experts, seen = _experts(n_experts, 3, generator)
        got = student(x.clone(), logits.clone(), k, experts)
        want = helper_moe_forward(x, logits, k, experts)
        if isinstance(got, torch.Tensor) and got.shape == want.shape and not torch.allclose(got.double(), want, atol=1e-6):
            for (slip, fix), weights_of in MOE_SLIPS.items():
                if torch.allclose(got.double(), _with_weights(x, logits, k, experts, weights_of), atol=1e-6):
                    raise ExerciseFailed(f"{slip} (T = {tokens}, E = {n_experts}, k = {k}).", fix=fix + ".")
            for wrong_k in {1, n_experts} - {k}:
                if torch.allclose(got.double(), helper_moe_forward(x, logits, wrong_k, experts), atol=1e-6):
                    raise ExerciseFailed(f"with k = {k} your output is the MoE with k = {wrong_k}.",
                                         fix="each token goes to exactly its k best experts: use the "
                                             "k you are given.")
        expect_close(got, want, f"the output for T = {tokens}, E = {n_experts}, k = {k}", atol=1e-6)
        seen[0] = 0
        student(x, logits, k, experts)
        ran_all = ran_all or seen[0] > tokens * k
    if ran_all:
        return ("Right outputs, but every expert ran on more rows than chose it: a MoE's saving is "
                "that each token visits only its k experts (select the rows with torch.where).")
    return "That is Mixtral's MoE layer: each token paid for k experts of E."


@exercise(hint="Two vectors of length E: how often each expert was chosen, and how much "
               "probability the router gave it on average; their dot product, times E.",
          task="Write switch_loss(logits, experts, n_experts) -> a scalar tensor. The check "
               "compares it with the helpers' Switch loss for k = 1 and 2 and checks that it "
               "has a gradient to the logits.")
def switch_loss(student: Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]) -> str:
    generator = seeded(1)
    for tokens, n_experts, k in ((12, 4, 1), (20, 6, 2)):
        logits = torch.randn(tokens, n_experts, generator=generator) * 2
        _, experts = moe.route(logits, k)
        got = student(logits, experts, n_experts)
        want = moe.switch_aux_loss(logits, experts, n_experts)
        if isinstance(got, torch.Tensor) and got.numel() == 1:
            if abs(float(got) - float(want) / n_experts) < 1e-5:
                raise ExerciseFailed("off by a factor n_experts.",
                                     fix="the loss is scaled by E so that a uniform router scores k, "
                                         "whatever the number of experts.")
            if abs(float(got) - float(want) / k) < 1e-5 and k > 1:
                raise ExerciseFailed("off by a factor k.",
                                     fix="f_i counts every assignment and divides by the number of "
                                         "tokens only, so the f_i add up to k.")
        expect_close(got, want, f"the Switch loss for {n_experts} experts, k = {k}", atol=1e-5)
        logits.requires_grad_(True)
        value = student(logits, experts, n_experts)
        if not (isinstance(value, torch.Tensor) and value.requires_grad):
            raise ExerciseFailed("the loss has no gradient to the logits.",
                                 fix="compute P from the logits with torch operations (f, the counts, "
                                     "carries none, and that is fine).")
    return "That is the Switch Transformer's auxiliary loss, equal to transformers' load_balancing_loss_func."


@exercise(hint="Move the up-projection from the key to the query, head by head: each head's query "
               "is multiplied by its own matrix, summing over the key features.",
          task="Write absorb_query(q_nope, w_uk) -> (B, H, N, r). The check compares it with the "
               "helpers' absorbed query and its scores against the latents with the scores "
               "against the keys built in full.")
def absorb_query(student: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> str:
    generator = seeded(2)
    q_nope = torch.randn(2, 3, 5, 4, generator=generator)         # (B, H, N, d_nope)
    w_uk = torch.randn(3, 4, 6, generator=generator)               # (H, d_nope, r)
    got = student(q_nope, w_uk)
    want = torch.einsum("bhnd,hdr->bhnr", q_nope, w_uk)
    if isinstance(got, torch.Tensor) and got.shape == (2, 3, 5, 4):
        raise ExerciseFailed("the result still has d_nope features.",
                             fix="it should live in the latent space, (B, H, N, r), so that it can "
                                 "meet the cached latents directly: sum over d_nope.")
    expect_close(got, want, "the absorbed query (B, H, N, r)", atol=1e-5)
    c = torch.randn(2, 7, 6, generator=generator)                  # (B, M, r)
    keys = torch.einsum("hdr,bmr->bhmd", w_uk, c)                  # the per-head keys, built
    naive = q_nope @ keys.transpose(-2, -1)
    expect_close(got @ c[:, None].transpose(-2, -1), naive, "its scores against the latents", atol=1e-4)
    return "Same scores, and the cache never held a per-head key."


@exercise(hint="Only the last window tokens are visible, oldest first; each sits in the slot given by "
               "its position modulo the window.",
          task="Write ring_order(length, window) -> the list of buffer slots to read, oldest "
               "first. The check compares it with RingKVCache's order for caches shorter than, "
               "equal to and longer than the window.")
def ring_order(student: Callable[[int, int], list[int]]) -> str:
    cases = ((1, 4), (3, 4), (4, 4), (6, 4), (11, 4), (5, 1), (9, 3))
    if hidden_round():  # a length and a window drawn from the hidden seed
        cases = (tuple(torch.randint(2, 30, (1,), generator=seeded(40)).tolist()
                       + torch.randint(2, 10, (1,), generator=seeded(41)).tolist()),) + cases
    for length, window in cases:
        got = student(length, window)
        n = min(length, window)
        want = [sliding.ring_slot(t, window) for t in range(length - n, length)]
        if not isinstance(got, list | tuple | torch.Tensor) or [int(x) for x in got] != want:
            raise ExerciseFailed(f"ring_order(length={length}, window={window}) gave {got!r}, expected "
                                 f"{want}.", fix=f"list the slots of the last {n} tokens (never more "
                                                 "than the window), oldest first.")
    return "That is RingKVCache.append's read order: memory bounded by the window."


def helper_sliding_decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int) -> torch.Tensor:
    """Sliding-window attention decoded token by token through `sliding.RingKVCache`, the
    notebook's fallback for sliding_decode. q, k, v (B, H, T, D_H) -> (B, H, T, D_H): query t
    attends to tokens max(0, t - window + 1) ... t, and the cache never holds more than `window`."""
    if not all(isinstance(t, torch.Tensor) and t.dim() == 4 for t in (q, k, v)) \
            or not q.shape == k.shape == v.shape:
        shapes = [getattr(t, "shape", type(t).__name__) for t in (q, k, v)]
        raise ValueError(f"q, k, v are {shapes}, expected three tensors of the same shape (B, H, T, D_H)")
    batch, heads, steps, head_dim = q.shape
    cache = sliding.RingKVCache(batch, heads, window, head_dim, dtype=q.dtype)
    outs = []
    for t in range(steps):
        keys, values = cache.append(k[:, :, t:t + 1], v[:, :, t:t + 1])
        outs.append(torch.softmax(q[:, :, t:t + 1] @ keys.transpose(-2, -1) / head_dim ** 0.5, -1) @ values)
    return torch.cat(outs, dim=2)


def _banded(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int, scale: bool = True,
            itself: bool = True) -> torch.Tensor:
    """Attention with query t seeing `window` tokens ending at t (itself=True) or at t - 1; a row
    that sees nothing is zero. window=None: every earlier token (causal, no window)."""
    steps = q.shape[-2]
    t = torch.arange(steps)
    gap = t[:, None] - t[None, :]                              # query - key
    low = 0 if itself else 1
    visible = (gap >= low) & (gap < low + (steps if window is None else window))
    scores = q @ k.transpose(-2, -1) / (q.shape[-1] ** 0.5 if scale else 1.0)
    weights = torch.softmax(scores.masked_fill(~visible, float("-inf")), -1).nan_to_num(0.0)
    return weights @ v


@exercise(hint="Keep two buffers of window slots for the keys and the values; token t goes into slot t "
               "modulo the window, overwriting the one that fell out of the window, and its query "
               "attends to the slots written so far (their order does not change attention).",
          task="Write sliding_decode(q, k, v, window) -> (B, H, T, D_H): decode token by token, "
               "keeping the keys and values in a ring buffer of window slots; query t attends "
               "to the last window tokens, itself included. The check compares with banded "
               "attention for windows shorter than, equal to and longer than the sequence.",
          points=3)
def sliding_decode(student: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, int], torch.Tensor]) -> str:
    generator = seeded(3)
    for batch, steps, window in ((1, 12, 4), (2, 3, 5), (1, 6, 6), (1, 7, 1)):
        q, k, v = (torch.randn(batch, 2, steps, 8, generator=generator, dtype=torch.float64) for _ in range(3))
        got = student(q.clone(), k.clone(), v.clone(), window)
        want = _banded(q, k, v, window)
        where = f"T = {steps}, window = {window}"
        if not isinstance(got, torch.Tensor) or got.shape != want.shape:
            raise ExerciseFailed(f"for {where} your function gave {getattr(got, 'shape', type(got).__name__)}, "
                                 f"expected a tensor of shape {tuple(want.shape)}.",
                                 fix="collect one output row per step and join them along the token "
                                     "axis, dim=2.")
        if torch.allclose(got.double(), want, atol=1e-6):
            continue
        slips = [(_banded(q, k, v, None), "every query sees all the earlier tokens: the window is missing",
                  "keep only window slots, and let each new token overwrite the slot of the token "
                  "that left the window"),
                 (_banded(q, k, v, window + 1), "each query sees window + 1 tokens, one too many",
                  "the window counts the query's own token: at most window slots, all of them read"),
                 (_banded(q, k, v, window, itself=False), "each query sees the window tokens before it, "
                  "but not its own", "write the new token into its slot before reading the ring"),
                 (_banded(q, k, v, window, scale=False), "the scores are not scaled",
                  "divide the scores by the square root of the head dimension")]
        for wrong, what, fix in slips:
            if not torch.allclose(want, wrong, atol=1e-6) and torch.allclose(got.double(), wrong, atol=1e-6):
                raise ExerciseFailed(f"for {where}: {what}.", fix=fix + ".")
        expect_close(got, want, f"the output for {where}", atol=1e-6)
    return "Same outputs as the banded mask, from a cache of window slots whatever the length."
