"""Classification finetuning: a head on the last token of a pretrained GPT (notebook 13, s. 2).

    last_hidden       the final LayerNorm's output at each row's last real token: (B, D)
    Classifier        a pretrained GPT and a linear head D -> n_classes on that vector
    freeze_for        which weights train: "all", "last" (the last block, ln_f, head), "head"
    encode_texts      texts -> right-padded ids (B, N) and lengths (B,)

The head reads the last token because in a causal model it is the only one that has seen the
whole text.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from helpers import checks
from helpers.model.gpt import GPT

WHICH = ("all", "last", "head")


def last_hidden(model: GPT, ids: Tensor, lengths: Tensor) -> Tensor:
    """ids (B, N) right-padded, lengths (B,) -> (B, D): the hidden state at position length - 1."""
    if ids.dim() != 2 or lengths.shape != (ids.shape[0],):
        raise ValueError(f"ids {tuple(ids.shape)} and lengths {tuple(lengths.shape)}, expected "
                         "(B, N) and (B,)")
    if (lengths < 1).any() or (lengths > ids.shape[1]).any():
        raise ValueError(f"lengths must lie in 1..{ids.shape[1]}, got {lengths.tolist()}")
    x = model.drop(model.embed(ids))
    for block in model.blocks:
        x = block(x)
    x = model.ln_f(x)  # (B, N, D)
    return x[torch.arange(len(ids)), lengths - 1]


class Classifier(nn.Module):
    """A pretrained GPT body and a new linear head on the last token: ids -> logits (B, C)."""

    def __init__(self, body: GPT, n_classes: int) -> None:
        super().__init__()
        checks.positive_int("n_classes", n_classes)
        self.body = body
        self.head = nn.Linear(body.config.d_model, n_classes)

    def forward(self, ids: Tensor, lengths: Tensor) -> Tensor:
        return self.head(last_hidden(self.body, ids, lengths))


def freeze_for(model: Classifier, which: str) -> int:
    """Set requires_grad for `which` of WHICH; returns the number of trainable parameters."""
    checks.one_of("which", which, WHICH)
    for p in model.parameters():
        p.requires_grad_(which == "all")
    if which == "last":
        for module in (model.body.blocks[-1], model.body.ln_f):
            for p in module.parameters():
                p.requires_grad_(True)
    for p in model.head.parameters():
        p.requires_grad_(True)
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def encode_texts(tokenizer, texts: list[str], pad_id: int) -> tuple[Tensor, Tensor]:
    """Right-padded ids (B, N) and the true lengths (B,) of `texts`."""
    if not texts:
        raise ValueError("texts is empty, expected at least one text")
    encoded = [tokenizer.encode(t) for t in texts]
    if any(len(e) == 0 for e in encoded):
        raise ValueError("texts holds an empty text, expected at least one token each")
    ids = torch.full((len(encoded), max(map(len, encoded))), pad_id, dtype=torch.long)
    for row, e in enumerate(encoded):
        ids[row, :len(e)] = torch.tensor(e)
    return ids, torch.tensor([len(e) for e in encoded])
