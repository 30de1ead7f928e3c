"""Exercises of notebook 12 (the decoder of 2025-2026): the router's top-k, the Switch loss,
the MLA absorption and the ring buffer's index."""

from __future__ import annotations

from collections.abc import Callable

import torch

from helpers.lab.exercises import ExerciseFailed, exercise, expect_close
from helpers.model import moe, sliding


def _sorted_by_expert(weights: torch.Tensor, experts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The same routing with each token's k choices in expert order, so any order is accepted."""
    experts, order = experts.sort(dim=-1)
    return weights.gather(-1, order), experts


@exercise(hint="Choose the k experts first, then share the weight among the chosen ones only.")
def top_k_router(student: Callable[[torch.Tensor, int], tuple[torch.Tensor, torch.Tensor]]) -> str:
    generator = torch.Generator().manual_seed(0)
    for tokens, n_experts, k in ((5, 4, 2), (7, 8, 3), (3, 6, 1)):
        logits = torch.randn(tokens, n_experts, generator=generator)
        got = student(logits, k)
        if not isinstance(got, tuple | list) or len(got) != 2:
            raise ExerciseFailed(f"top_k_router should return (weights, experts), got {type(got).__name__}.")
        weights, experts = got
        if not isinstance(experts, torch.Tensor) or experts.shape != (tokens, k):
            shape = tuple(experts.shape) if isinstance(experts, torch.Tensor) else type(experts).__name__
            raise ExerciseFailed(f"experts should have shape ({tokens}, {k}), one row of k indices per "
                                 f"token, got {shape}.")
        want_w, want_e = moe.route(logits, k, "topk_softmax")
        got_w, got_e = _sorted_by_expert(torch.as_tensor(weights).float(), experts.long())
        want_w, want_e = _sorted_by_expert(want_w, want_e)
        if not torch.equal(got_e, want_e):
            raise ExerciseFailed(f"for {n_experts} experts and k = {k} you chose {got_e.tolist()}, "
                                 f"expected {want_e.tolist()}: the k experts with the largest logits.")
        full = torch.softmax(logits, -1).gather(-1, want_e)
        if got_w.shape == full.shape and torch.allclose(got_w, full, atol=1e-6) and k < n_experts:
            raise ExerciseFailed("your weights are the softmax over all experts, kept for the top k "
                                 "(Qwen3-MoE's form): this exercise asks for Mixtral's, a softmax "
                                 "over the k chosen logits, so they sum to 1.")
        expect_close(got_w, want_w, f"the weights for k = {k}", atol=1e-6)
    return "That is Mixtral's router; MoELayer(mode='topk_softmax') computes the same."


@exercise(hint="Two vectors of length E: how often each expert was chosen, and how much "
               "probability the router gave it on average.")
def switch_loss(student: Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]) -> str:
    generator = torch.Generator().manual_seed(1)
    for tokens, n_experts, k in ((12, 4, 1), (20, 6, 2)):
        logits = torch.randn(tokens, n_experts, generator=generator) * 2
        _, experts = moe.route(logits, k)
        got = student(logits, experts, n_experts)
        want = moe.switch_aux_loss(logits, experts, n_experts)
        if isinstance(got, torch.Tensor) and got.numel() == 1:
            if abs(float(got) - float(want) / n_experts) < 1e-5:
                raise ExerciseFailed("off by a factor n_experts: the loss is scaled by E so that a "
                                     "uniform router scores k, whatever the number of experts.")
            if abs(float(got) - float(want) / k) < 1e-5 and k > 1:
                raise ExerciseFailed("off by a factor k: f_i counts every assignment, so sum_i f_i = k.")
        expect_close(got, want, f"the Switch loss for {n_experts} experts, k = {k}", atol=1e-5)
        logits.requires_grad_(True)
        value = student(logits, experts, n_experts)
        if not (isinstance(value, torch.Tensor) and value.requires_grad):
            raise ExerciseFailed("the loss has no gradient to the logits: compute P from the logits "
                                 "with torch operations (f, the counts, carries none, and that is fine).")
    return "That is the Switch Transformer's auxiliary loss, equal to transformers' load_balancing_loss_func."


@exercise(hint="q . (W c) = (W^T q) . c: move the up-projection from the key to the query, head by head.")
def absorb_query(student: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> str:
    generator = torch.Generator().manual_seed(2)
    q_nope = torch.randn(2, 3, 5, 4, generator=generator)         # (B, H, N, d_nope)
    w_uk = torch.randn(3, 4, 6, generator=generator)               # (H, d_nope, r)
    got = student(q_nope, w_uk)
    want = torch.einsum("bhnd,hdr->bhnr", q_nope, w_uk)
    if isinstance(got, torch.Tensor) and got.shape == (2, 3, 5, 4):
        raise ExerciseFailed("the result still has d_nope features: it should live in the latent "
                             "space, (B, H, N, r), so it can meet the cached c directly.")
    expect_close(got, want, "the absorbed query (B, H, N, r)", atol=1e-5)
    c = torch.randn(2, 7, 6, generator=generator)                  # (B, M, r)
    keys = torch.einsum("hdr,bmr->bhmd", w_uk, c)                  # the per-head keys, built
    naive = q_nope @ keys.transpose(-2, -1)
    expect_close(got @ c[:, None].transpose(-2, -1), naive, "its scores against the latents", atol=1e-4)
    return "Same scores, and the cache never held a per-head key."


@exercise(hint="Only the last `window` tokens are visible; each sits at its position modulo the window.")
def ring_order(student: Callable[[int, int], list[int]]) -> str:
    for length, window in ((1, 4), (3, 4), (4, 4), (6, 4), (11, 4), (5, 1), (9, 3)):
        got = student(length, window)
        n = min(length, window)
        want = [sliding.ring_slot(t, window) for t in range(length - n, length)]
        if got is None or [int(x) for x in got] != want:
            raise ExerciseFailed(f"ring_order(length={length}, window={window}) gave {got!r}, expected "
                                 f"{want}: the slots of the last {n} tokens, oldest first.")
    return "That is RingKVCache.append's read order: memory bounded by the window."
