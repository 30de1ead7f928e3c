"""The recurrent seq2seq translator without attention (notebook 10, section 2: the bottleneck).

The encoder GRU reads the source one token after another and keeps only its last hidden state,
one vector of `hidden` numbers, for the whole sentence. The decoder GRU starts from that vector
and writes the translation one token after another. Nothing else passes from source to target:
that single vector is the bottleneck of the CS 4804 notes, and the token-by-token loop is their
"lack of parallelism" (step t needs step t - 1).

Shapes: B batch, M source tokens, N target tokens, E embedding width, D hidden width.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from helpers import checks
from helpers.model.embeddings import check_token_ids


class GRUSeq2Seq(nn.Module):
    """Embed -> GRU encoder -> last state (B, D) -> GRU decoder (teacher-forced) -> logits."""

    def __init__(self, source_vocab_size: int, target_vocab_size: int, hidden: int = 128,
                 pad_id: int = 0, bos_id: int = 1, eos_id: int = 2) -> None:
        super().__init__()
        for name, value in (("source_vocab_size", source_vocab_size),
                            ("target_vocab_size", target_vocab_size), ("hidden", hidden)):
            checks.positive_int(name, value)
        self.source_vocab_size, self.target_vocab_size = source_vocab_size, target_vocab_size
        self.pad_id, self.bos_id, self.eos_id = pad_id, bos_id, eos_id
        self.source_embed = nn.Embedding(source_vocab_size, hidden)
        self.target_embed = nn.Embedding(target_vocab_size, hidden)
        self.encoder = nn.GRU(hidden, hidden, batch_first=True)
        self.decoder = nn.GRU(hidden, hidden, batch_first=True)
        self.head = nn.Linear(hidden, target_vocab_size)

    def encode(self, source: Tensor) -> Tensor:
        """source: (B, M) ids, right-padded -> the state after each sentence's last real token (1, B, D)."""
        if not isinstance(source, Tensor) or source.dim() != 2 or source.shape[1] == 0:
            got = tuple(source.shape) if isinstance(source, Tensor) else type(source).__name__
            raise ValueError(f"source has shape {got}, expected (B, M) ids with M >= 1")
        check_token_ids(source, self.source_vocab_size, "source")
        lengths = (source != self.pad_id).sum(dim=1)
        if (lengths == 0).any():
            raise ValueError("source holds an empty sentence (a row of padding only)")
        packed = nn.utils.rnn.pack_padded_sequence(self.source_embed(source), lengths.cpu(),
                                                   batch_first=True, enforce_sorted=False)
        _, state = self.encoder(packed)  # padding never enters the state
        return state

    def decode(self, target_in: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
        """target_in: (B, N) ids, state: (1, B, D) -> logits (B, N, V) and the new state."""
        check_token_ids(target_in, self.target_vocab_size, "target_in")
        if target_in.shape[0] != state.shape[1]:
            raise ValueError(f"target_in has {target_in.shape[0]} sentences and the source "
                             f"{state.shape[1]}: the batch sizes must match")
        out, state = self.decoder(self.target_embed(target_in), state)
        return self.head(out), state

    def forward(self, source: Tensor, target_in: Tensor) -> Tensor:
        """Teacher forcing: source (B, M), target_in (B, N) -> logits (B, N, V_target)."""
        return self.decode(target_in, self.encode(source))[0]


@torch.no_grad()
def gru_greedy_decode(model: GRUSeq2Seq, source: Tensor, max_length: int) -> Tensor:
    """source: (B, M) -> (B, <= max_length) ids, one step at a time from the encoder's last state."""
    checks.positive_int("max_length", max_length)
    state = model.encode(source)
    token = torch.full((source.shape[0], 1), model.bos_id, dtype=torch.long)
    done = torch.zeros(source.shape[0], dtype=torch.bool)
    out = []
    for _ in range(max_length):
        logits, state = model.decode(token, state)
        token = logits[:, -1].argmax(dim=-1).masked_fill(done, model.pad_id)[:, None]
        out.append(token)
        done |= token[:, 0] == model.eos_id
        if done.all():
            break
    return torch.cat(out, dim=1)
