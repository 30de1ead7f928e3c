"""The recurrent seq2seq translators (notebook 10, section 2: the bottleneck, and what attention fixed).

`GRUSeq2Seq` (Sutskever et al., 2014, with a GRU in place of their LSTM): the encoder GRU reads
the source one token after another and keeps only its last hidden state, one vector of `hidden`
numbers, for the whole sentence. The decoder GRU starts from that vector and writes the
translation one token after another. Nothing else passes from source to target: that single
vector is the bottleneck of the CS 4804 notes, and the token-by-token loop is their "lack of
parallelism" (step t needs step t - 1).

`AttentionGRUSeq2Seq` (Bahdanau, Cho and Bengio, 2014): the same encoder and decoder GRUs, plus
additive attention. Before writing word t the decoder scores every encoder state h_j against
its own previous state s_{t-1},  e_tj = v . tanh(W_s s_{t-1} + W_h h_j),  turns the scores into
weights a_t = softmax(e_t) over the real source tokens, and reads the context c_t = sum_j a_tj h_j;
c_t enters the GRU beside the previous word and the output layer beside s_t. The source no longer
has to fit in one vector; the recurrence stays. (Bahdanau's encoder also read the source both
ways; here it is the plain GRU's encoder, so that attention is the only difference.)

Both share a step interface, `start(source) -> carry` and `step(token, carry) -> (logits,
carry)`, which `gru_greedy_decode` runs. Sources must be right-padded: a GRU reads left to
right, and padding in front would run through the state before the sentence.

Shapes: B batch, M source tokens, N target tokens, D hidden width, V target vocabulary.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from helpers import checks
from helpers.families.translation import check_special_ids
from helpers.model.embeddings import check_token_ids


def source_lengths(source: Tensor, vocab_size: int, pad_id: int) -> Tensor:
    """(B, M) right-padded ids -> (B,) lengths; raise on padding-only rows or padding in front."""
    if not isinstance(source, Tensor) or source.dim() != 2 or source.shape[1] == 0:
        got = tuple(source.shape) if isinstance(source, Tensor) else type(source).__name__
        raise ValueError(f"source has shape {got}, expected (B, M) ids with M >= 1")
    check_token_ids(source, vocab_size, "source")
    real = source != pad_id
    lengths = real.sum(dim=1)
    empty = (lengths == 0).nonzero().flatten().tolist()
    if empty:
        raise ValueError(f"source rows {empty} hold padding only (empty sentences): expected at "
                         "least one real token in each")
    left = (real.int().diff(dim=1) > 0).any(dim=1).nonzero().flatten().tolist()
    if left:
        raise ValueError(f"source rows {left} have padding before a real token: expected "
                         "right-padded rows (the GRU reads left to right, so padding in front "
                         "would run through its state)")
    return lengths


class GRUSeq2Seq(nn.Module):
    """Embed -> GRU encoder -> last state (B, D) -> GRU decoder (teacher-forced) -> logits."""

    def __init__(self, source_vocab_size: int, target_vocab_size: int, hidden: int = 128,
                 pad_id: int = 0, bos_id: int = 1, eos_id: int = 2) -> None:
        super().__init__()
        for name, value in (("source_vocab_size", source_vocab_size),
                            ("target_vocab_size", target_vocab_size), ("hidden", hidden)):
            checks.positive_int(name, value)
        check_special_ids(pad_id, bos_id, eos_id, {"target_vocab_size": target_vocab_size})
        if pad_id >= source_vocab_size:
            raise ValueError(f"pad_id is {pad_id}, outside source_vocab_size {source_vocab_size}")
        self.source_vocab_size, self.target_vocab_size = source_vocab_size, target_vocab_size
        self.pad_id, self.bos_id, self.eos_id = pad_id, bos_id, eos_id
        self.source_embed = nn.Embedding(source_vocab_size, hidden)
        self.target_embed = nn.Embedding(target_vocab_size, hidden)
        self.encoder = nn.GRU(hidden, hidden, batch_first=True)
        self.decoder = nn.GRU(hidden, hidden, batch_first=True)
        self.head = nn.Linear(hidden, target_vocab_size)

    def encode_all(self, source: Tensor) -> tuple[Tensor, Tensor]:
        """source: (B, M) right-padded ids -> every state (B, M, D) (zero on padding), last state (1, B, D)."""
        lengths = source_lengths(source, self.source_vocab_size, self.pad_id)
        packed = nn.utils.rnn.pack_padded_sequence(self.source_embed(source), lengths.cpu(),
                                                   batch_first=True, enforce_sorted=False)
        states, last = self.encoder(packed)  # padding never enters the state
        states, _ = nn.utils.rnn.pad_packed_sequence(states, batch_first=True, total_length=source.shape[1])
        return states, last

    def encode(self, source: Tensor) -> Tensor:
        """source: (B, M) ids, right-padded -> the state after each sentence's last real token (1, B, D)."""
        return self.encode_all(source)[1]

    def decode(self, target_in: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
        """target_in: (B, N) ids, state: (1, B, D) -> logits (B, N, V) and the new state."""
        check_token_ids(target_in, self.target_vocab_size, "target_in")
        if target_in.dim() != 2 or target_in.shape[0] != state.shape[1]:
            raise ValueError(f"target_in has shape {tuple(target_in.shape)} and the source "
                             f"{state.shape[1]} sentences: expected (B, N), the batch sizes must match")
        out, state = self.decoder(self.target_embed(target_in), state)
        return self.head(out), state

    def forward(self, source: Tensor, target_in: Tensor) -> Tensor:
        """Teacher forcing: source (B, M), target_in (B, N) -> logits (B, N, V_target)."""
        return self.decode(target_in, self.encode(source))[0]

    def start(self, source: Tensor) -> Tensor:
        return self.encode(source)

    def step(self, token: Tensor, carry: Tensor) -> tuple[Tensor, Tensor]:
        """token (B, 1), carry: the state (1, B, D) -> logits (B, V), the next state."""
        logits, state = self.decode(token, carry)
        return logits[:, -1], state


class AttentionGRUSeq2Seq(GRUSeq2Seq):
    """GRUSeq2Seq plus Bahdanau's additive attention over every encoder state."""

    def __init__(self, source_vocab_size: int, target_vocab_size: int, hidden: int = 128,
                 pad_id: int = 0, bos_id: int = 1, eos_id: int = 2) -> None:
        super().__init__(source_vocab_size, target_vocab_size, hidden, pad_id, bos_id, eos_id)
        del self.decoder
        self.cell = nn.GRUCell(2 * hidden, hidden)            # input: [previous word; context]
        self.w_s = nn.Linear(hidden, hidden, bias=False)      # W_s s_{t-1}
        self.w_h = nn.Linear(hidden, hidden)                  # W_h h_j (+ the bias)
        self.v = nn.Linear(hidden, 1, bias=False)             # v . tanh(...)
        self.head = nn.Linear(2 * hidden, target_vocab_size)  # from [s_t; c_t]
        self.last_weights: Tensor | None = None

    def start(self, source: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """-> (state (B, D), encoder states (B, M, D), their keys W_h h (B, M, D), mask (B, M))."""
        states, last = self.encode_all(source)
        return last[0], states, self.w_h(states), source != self.pad_id

    def step(self, token: Tensor, carry: tuple) -> tuple[Tensor, tuple]:
        """token (B, 1) -> logits (B, V); the carry's state advances by one word."""
        state, states, keys, mask = carry
        check_token_ids(token, self.target_vocab_size, "token")
        e = self.v(torch.tanh(keys + self.w_s(state)[:, None])).squeeze(-1)  # (B, M) scores e_tj
        a = e.masked_fill(~mask, float("-inf")).softmax(dim=-1)             # (B, M) weights a_tj
        context = (a[:, :, None] * states).sum(dim=1)                         # (B, D) c_t
        state = self.cell(torch.cat([self.target_embed(token[:, 0]), context], dim=-1), state)
        self.last_weights = a
        return self.head(torch.cat([state, context], dim=-1)), (state, states, keys, mask)

    def forward(self, source: Tensor, target_in: Tensor) -> Tensor:
        """Teacher forcing, one step per target word: (B, M), (B, N) -> logits (B, N, V_target)."""
        check_token_ids(target_in, self.target_vocab_size, "target_in")
        if target_in.dim() != 2 or target_in.shape[0] != source.shape[0]:
            raise ValueError(f"target_in has shape {tuple(target_in.shape)}, expected (B, N) with "
                             f"B = {source.shape[0]} like the source: the batch sizes must match")
        carry, out, weights = self.start(source), [], []
        for t in range(target_in.shape[1]):
            logits, carry = self.step(target_in[:, t:t + 1], carry)
            out.append(logits)
            weights.append(self.last_weights)
        self.last_weights = torch.stack(weights, dim=1)  # (B, N, M)
        return torch.stack(out, dim=1)


@torch.no_grad()
def gru_greedy_decode(model: GRUSeq2Seq, source: Tensor, max_length: int) -> Tensor:
    """source: (B, M) -> (B, <= max_length) ids, one step at a time (either GRU translator)."""
    checks.positive_int("max_length", max_length)
    if max_length > 10_000:
        raise ValueError(f"max_length is {max_length}, expected at most 10,000 steps")
    carry = model.start(source)
    token = torch.full((source.shape[0], 1), model.bos_id, dtype=torch.long, device=source.device)
    done = torch.zeros_like(token[:, 0], dtype=torch.bool)  # on the source's device, as token is
    out = []
    for _ in range(max_length):
        logits, carry = model.step(token, carry)
        token = logits.argmax(dim=-1).masked_fill(done, model.pad_id)[:, None]
        out.append(token)
        done |= token[:, 0] == model.eos_id
        if done.all():
            break
    return torch.cat(out, dim=1)
