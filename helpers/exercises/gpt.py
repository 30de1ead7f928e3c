"""Exercises of notebook 7 (the full GPT): count its parameters exactly, write one greedy step."""

from __future__ import annotations

from collections.abc import Callable

import torch

from helpers import gpt
from helpers.exercises import ExerciseFailed, exercise, expect_count

CONFIGS = [  # (n_layer, n_embd, vocab_size, context_length)
    (12, 768, 50257, 1024),  # GPT-2 small
    (2, 128, 52, 64),        # the notebook's character model
    (1, 8, 12, 4),           # the Matrix Magic notes' toy
    (24, 1024, 50257, 1024),  # GPT-2 medium
]


def _diagnose(got: int, n_layer: int, d: int, vocab: int, context: int, expected: int) -> str:
    """A guess at what a wrong count left out or added, from the size of the gap."""
    gaps = {
        vocab * d: "the output matrix is tied to the token embedding: count it once",
        -context * d: "the position table (context_length x n_embd) is missing",
        -2 * d: "the final LayerNorm (a gain and a bias of n_embd each) is missing",
        -n_layer * 9 * d: "the biases are missing: 4 x n_embd in attention, 5 x n_embd in the MLP",
        -n_layer * 4 * d: "the two LayerNorms of each block (4 x n_embd) are missing",
        -(n_layer * 13 * d + context * d + 2 * d): "only 12 N d^2 + V d: add biases, norms and positions",
    }
    return gaps.get(got - expected, f"the gap is {got - expected:+,} parameters")


@exercise(hint="Per block: 4 d^2 + 4d (W_Q, W_K, W_V, W_O and biases), 8 d^2 + 5d (d -> 4d -> d "
               "and biases), 4d (two LayerNorms). Then V d (tied, once), context x d, and 2d.")
def exact_parameters(student: Callable[[int, int, int, int], int]) -> str:
    for n_layer, d, vocab, context in CONFIGS:
        config = gpt.GPTConfig(vocab_size=vocab, context_length=context, n_layer=n_layer,
                               n_head=1, n_embd=d)
        expected = gpt.exact_parameters(config)
        got = expect_count(student(n_layer, d, vocab, context),
                           f"the count for n_layer={n_layer}, n_embd={d}")
        if got != expected:
            raise ExerciseFailed(
                f"for n_layer={n_layer}, n_embd={d}, vocab_size={vocab}, context_length={context} "
                f"you counted {got:,}, expected {expected:,}: {_diagnose(got, n_layer, d, vocab, context, expected)}.")
    return "GPT-2 small: 124,439,808, to the last parameter."


def _small_model(seed: int) -> gpt.GPT:
    torch.manual_seed(seed)
    return gpt.GPT(gpt.GPTConfig(vocab_size=11, context_length=8, n_layer=1, n_head=2, n_embd=8)).eval()


@exercise(hint="Crop to the last model.config.context_length tokens, run the model, keep the "
               "logits of the last position ([:, -1]), argmax over the vocabulary with keepdim=True.")
def greedy_step(student: Callable[[gpt.GPT, torch.Tensor], torch.Tensor]) -> str:
    generator = torch.Generator().manual_seed(0)
    for seed, (batch, length) in enumerate([(1, 3), (4, 8), (2, 13)]):
        model = _small_model(seed)
        ids = torch.randint(0, 11, (batch, length), generator=generator)
        expected = model(ids[:, -8:])[:, -1].argmax(-1, keepdim=True)
        try:
            with torch.no_grad():
                got = student(model, ids)
        except ValueError as error:
            if "context_length" in str(error):
                raise ExerciseFailed(f"ids of shape {tuple(ids.shape)} are longer than the model's "
                                     "context of 8: keep only the last context_length tokens") from None
            raise
        if not isinstance(got, torch.Tensor):
            raise ExerciseFailed(f"return a tensor of ids, got {type(got).__name__}")
        if got.shape == (batch,):
            raise ExerciseFailed(f"the result has shape {tuple(got.shape)}: keep the token axis, "
                                 f"(B, 1) = {tuple(expected.shape)}, with keepdim=True")
        if got.shape != expected.shape:
            raise ExerciseFailed(f"for ids of shape {tuple(ids.shape)} the result has shape "
                                 f"{tuple(got.shape)}, expected {tuple(expected.shape)}")
        if not torch.equal(got.long(), expected):
            first = model(ids[:, -8:])[:, 0].argmax(-1, keepdim=True)
            if torch.equal(got.long(), first):
                raise ExerciseFailed("you picked the prediction of the first position: the next "
                                     "token comes from the last one, [:, -1]")
            raise ExerciseFailed(f"for ids {ids.tolist()} you chose {got.flatten().tolist()}, "
                                 f"expected {expected.flatten().tolist()}")
    return "That is one step of greedy decoding; generate() repeats it, appending each token."
