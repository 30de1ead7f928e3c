"""Exercises of notebook 10 (encoders): the cross-attention shapes, a source padding mask, one
beam-search step."""

from __future__ import annotations

from collections.abc import Callable

import torch

from helpers.lab.exercises import ExerciseFailed, exercise, expect_close


@exercise(hint="Queries come from the N target tokens, keys and values from the M source tokens: "
               "Q is (B, H, N, D_H), K and V are (B, H, M, D_H), the weights (B, H, N, M), and "
               "the output, after W_O, is (B, N, D) with D_H = D // H.")
def cross_attention_shapes(student: Callable[[int, int, int, int, int], dict]) -> str:
    for b, n, m, d, h in ((2, 5, 7, 16, 4), (1, 9, 3, 12, 3)):
        got = student(b, n, m, d, h)
        expected = {"q": (b, h, n, d // h), "k": (b, h, m, d // h), "v": (b, h, m, d // h),
                    "weights": (b, h, n, m), "output": (b, n, d)}
        if not isinstance(got, dict) or set(got) != set(expected):
            raise ExerciseFailed(f"return a dict with the keys {sorted(expected)}, got {got!r}.")
        for name, shape in expected.items():
            if tuple(got[name]) != shape:
                extra = " Keys and values come from the source (M tokens)." if name in "kv" else ""
                raise ExerciseFailed(f"with B={b}, N={n}, M={m}, D={d}, H={h}, {name} should be "
                                     f"{shape}, got {tuple(got[name])}.{extra}")
    return "Those are the USF notes' shapes, with a batch and a head axis in front."


@exercise(hint="source != pad_id gives (B, M) True on real tokens; add two axes in the middle, "
               "[:, None, None, :], so that it broadcasts over heads and queries.")
def source_key_mask(student: Callable[[torch.Tensor, int], torch.Tensor]) -> str:
    source = torch.tensor([[5, 6, 7, 0, 0], [8, 0, 0, 0, 0], [3, 4, 5, 6, 9]])
    got = student(source, 0)
    expected = (source != 0)[:, None, None, :]
    if not isinstance(got, torch.Tensor):
        raise ExerciseFailed(f"return a tensor, got {type(got).__name__}.")
    if got.dtype != torch.bool:
        raise ExerciseFailed(f"the mask should be torch.bool (True = may attend), got {got.dtype}.")
    if got.shape != expected.shape:
        raise ExerciseFailed(f"the mask should have shape (B, 1, 1, M) = {tuple(expected.shape)}, "
                             f"got {tuple(got.shape)}.")
    if torch.equal(got, ~expected):
        raise ExerciseFailed("True and False are swapped: True marks the real tokens, which may be attended.")
    if not torch.equal(got, expected):
        raise ExerciseFailed("some positions are wrong: only the padding id should be False.")
    return "Every head and every query of the decoder now skips the padding."


@exercise(hint="total = scores[:, None] + log_probs is (k, V); total.flatten().topk(width) gives "
               "the best values and flat indices; row = index // V, token = index % V.")
def beam_step(student: Callable[[torch.Tensor, torch.Tensor, int], tuple]) -> str:
    generator = torch.Generator().manual_seed(0)
    scores = torch.tensor([-0.5, -1.0, -2.5])
    log_probs = torch.randn(3, 6, generator=generator).log_softmax(dim=-1)
    for width in (1, 3, 4):
        got = student(scores, log_probs, width)
        if not isinstance(got, tuple) or len(got) != 3:
            raise ExerciseFailed(f"return (new_scores, rows, tokens), got {got!r}.")
        total = scores[:, None] + log_probs
        best, flat = total.flatten().topk(width)
        new_scores, rows, tokens = got
        alone = log_probs.flatten().topk(width).values
        if isinstance(new_scores, torch.Tensor) and new_scores.shape == alone.shape and \
                torch.allclose(new_scores, alone):
            raise ExerciseFailed("add each prefix's score to its row of log_probs before choosing: "
                                 "a child's score is its prefix's score plus the new word's log-probability.")
        expect_close(new_scores, best, f"the new scores with width {width}")
        rows, tokens = torch.as_tensor(rows), torch.as_tensor(tokens)
        if torch.equal(rows, flat // 6) and torch.equal(tokens, flat % 6):
            continue
        if torch.equal(rows, flat % 6) and torch.equal(tokens, flat // 6):
            raise ExerciseFailed("rows and tokens are swapped: the row is index // V, the token index % V.")
        raise ExerciseFailed(f"with width {width} the rows should be {(flat // 6).tolist()} and the "
                             f"tokens {(flat % 6).tolist()}, got {rows.tolist()} and {tokens.tolist()}.")
    return "That is one step of helpers.families.seq2seq.beam_search."
