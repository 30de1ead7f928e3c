"""Encoder-only, the lifecycle in small: masked-language-model pretraining, then finetuning
(notebook 10, section 7).

    mask_tokens     BERT's corruption: pick 15 % of the real tokens; of those, 80 % become <mask>,
                    10 % a random word, 10 % stay; the loss is taken on the picked ones only
    MaskedLM        Encoder + a linear head over the vocabulary at every position
    Classifier      Encoder + a linear head on the mean of the real tokens' vectors
    swap_neighbours an ill-formed sentence made by swapping two neighbouring words, checked
                    against the course grammar (`helpers.text.corpus.is_well_formed`)

Shapes: B batch, M tokens, D = d_model, V vocabulary.
"""

from __future__ import annotations

import random
import re

import torch
from torch import Tensor, nn

from helpers import checks
from helpers.families.seq2seq import Encoder
from helpers.model.embeddings import check_token_ids
from helpers.text.corpus import is_well_formed

IGNORE = -100  # the label of a position the loss skips (torch's cross_entropy default)


def mask_tokens(ids: Tensor, mask_id: int, vocab_size: int, first_word_id: int,
                generator: torch.Generator, rate: float = 0.15,
                pad_id: int = 0) -> tuple[Tensor, Tensor]:
    """ids: (B, M) -> (corrupted inputs (B, M), labels (B, M)): labels are IGNORE where not picked.

    first_word_id: ids below it are special tokens, never picked and never drawn as random words.
    """
    checks.number_in("rate", rate, 0.0, 1.0, low_open=True)
    checks.positive_int("vocab_size", vocab_size)
    checks.number_in("first_word_id", first_word_id, 1, vocab_size - 1)
    for name, value in (("mask_id", mask_id), ("pad_id", pad_id)):
        checks.non_negative_int(name, value)
        if value >= first_word_id:
            raise ValueError(f"{name} is {value}, expected a special token's id below "
                             f"first_word_id = {first_word_id} (inside the vocabulary of {vocab_size})")
    if mask_id == pad_id:
        raise ValueError(f"mask_id and pad_id are both {mask_id}: expected two different ids, or "
                         "hidden words would read as padding")
    check_token_ids(ids, vocab_size, "ids")
    if ids.dim() != 2:
        raise ValueError(f"ids has shape {tuple(ids.shape)}, expected (B, M)")
    if not isinstance(generator, torch.Generator):
        raise TypeError(f"generator is {type(generator).__name__}, expected a torch.Generator")
    real = ids != pad_id
    picked = (torch.rand(ids.shape, generator=generator) < rate) & real
    labels = ids.masked_fill(~picked, IGNORE)
    roll = torch.rand(ids.shape, generator=generator)
    to_mask = picked & (roll < 0.8)
    to_random = picked & (roll >= 0.8) & (roll < 0.9)  # the last 10 % keep their word
    randoms = torch.randint(first_word_id, vocab_size, ids.shape, generator=generator)
    inputs = ids.masked_fill(to_mask, mask_id)
    inputs = torch.where(to_random, randoms, inputs)
    return inputs, labels


class MaskedLM(nn.Module):
    """An Encoder with a vocabulary head on every position: (B, M) -> logits (B, M, V)."""

    def __init__(self, encoder: Encoder, vocab_size: int, pad_id: int = 0) -> None:
        super().__init__()
        self.encoder, self.pad_id = encoder, pad_id
        self.head = nn.Linear(encoder.ln_f.d_model, vocab_size)

    def forward(self, ids: Tensor) -> Tensor:
        return self.head(self.encoder(ids, ids != self.pad_id))


class Classifier(nn.Module):
    """An Encoder, the mean of its real tokens' vectors, a linear layer: (B, M) -> logits (B, classes)."""

    def __init__(self, encoder: Encoder, n_classes: int, pad_id: int = 0) -> None:
        super().__init__()
        checks.positive_int("n_classes", n_classes)
        self.encoder, self.pad_id = encoder, pad_id
        self.head = nn.Linear(encoder.ln_f.d_model, n_classes)

    def forward(self, ids: Tensor) -> Tensor:
        real = ids != self.pad_id                           # (B, M)
        h = self.encoder(ids, real)                         # (B, M, D)
        pooled = (h * real[..., None]).sum(1) / real.sum(1, keepdim=True)  # (B, D)
        return self.head(pooled)


def swap_neighbours(sentence: str, rng: random.Random, tries: int = 20) -> str | None:
    """`sentence` with two neighbouring words swapped so that the course grammar rejects it.

    Returns None when no swap tried (up to `tries`) breaks the sentence (e.g. "Tom and Mia").
    """
    if not isinstance(sentence, str):
        raise TypeError(f"sentence is a {type(sentence).__name__}, expected a str")
    checks.positive_int("tries", tries)
    # words: "o'clock" and "twenty-five" are one word each; neighbours: one space apart
    words = list(re.finditer(r"[A-Za-z]+(?:['-][A-Za-z]+)*", sentence))
    spots = [i for i in range(len(words) - 1) if sentence[words[i].end():words[i + 1].start()] == " "
             and words[i].group() != words[i + 1].group()]
    for _ in range(tries if spots else 0):
        i = rng.choice(spots)
        a, b = words[i], words[i + 1]
        swapped = sentence[:a.start()] + b.group() + " " + a.group() + sentence[b.end():]
        if not is_well_formed(swapped):
            return swapped
    return None
