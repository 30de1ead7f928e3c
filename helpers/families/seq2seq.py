"""The encoder-decoder Transformer, greedy decoding and beam search (notebook 10, sections 3 and 5).

Built only from the parts of notebooks 2-6: `TokenAndPositionEmbedding`, `LayerNorm`,
`FeedForward` and `MultiHeadAttention`, whose `context` argument turns it into cross-attention.

    EncoderLayer    x + self_attn(ln(x)) with a padding mask, bidirectional; then x + mlp(ln(x))
    DecoderLayer    y + self_attn(ln(y)), causal; y + cross_attn(ln(y), context=memory) with the
                    source padding mask; then y + mlp(ln(y))
    Encoder         embeddings -> EncoderLayer x L -> LayerNorm (also the MLM encoder of section 6)
    EncoderDecoder  Encoder + embeddings -> DecoderLayer x L -> LayerNorm -> linear to V_target
    greedy_decode, beam_search, sequence_log_prob, exhaustive_search

Shapes: B batch, M source tokens, N target tokens, D = d_model, H heads, V vocabulary.
A source mask is bool (B, M), True on real tokens and False on padding.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from helpers import checks
from helpers.families.translation import check_special_ids
from helpers.model.embeddings import TokenAndPositionEmbedding, check_token_ids
from helpers.model.layers import FeedForward, LayerNorm
from helpers.model.multihead import MultiHeadAttention


def check_source_mask(source_mask: Tensor, source: Tensor) -> None:
    """Raise unless source_mask is bool (B, M) like source, with at least one real token a row."""
    if not isinstance(source_mask, Tensor) or source_mask.dtype != torch.bool:
        got = source_mask.dtype if isinstance(source_mask, Tensor) else type(source_mask).__name__
        raise TypeError(f"source_mask is {got}, expected a torch.bool tensor (True = real token)")
    if source_mask.shape != source.shape:
        raise ValueError(f"source_mask has shape {tuple(source_mask.shape)}, expected "
                         f"{tuple(source.shape)}, the (B, M) shape of the source ids")
    empty = (~source_mask.any(dim=1)).nonzero().flatten().tolist()
    if empty:
        raise ValueError(f"source rows {empty} are empty sentences (every token is padding), "
                         "expected at least one real token in each")


def _as_key_mask(source_mask: Tensor) -> Tensor:
    """(B, M) -> (B, 1, 1, M): broadcasts over heads and queries inside attention."""
    return source_mask[:, None, None, :]


class EncoderLayer(nn.Module):
    """A Pre-LN encoder block: every token sees every real token of its sentence (no causal mask)."""

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.ln1, self.ln2 = LayerNorm(d_model), LayerNorm(d_model)
        self.self_attn = MultiHeadAttention(d_model, n_heads, dropout=dropout)
        self.mlp = FeedForward(d_model, dropout=dropout)

    def forward(self, x: Tensor, key_mask: Tensor | None = None) -> Tensor:
        """x: (B, M, D), key_mask: (B, 1, 1, M) or None -> (B, M, D)."""
        x = x + self.self_attn(self.ln1(x), mask=key_mask)
        return x + self.mlp(self.ln2(x))


class DecoderLayer(nn.Module):
    """A Pre-LN decoder block: causal self-attention, cross-attention to the encoder, MLP."""

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.ln1, self.ln2, self.ln3 = LayerNorm(d_model), LayerNorm(d_model), LayerNorm(d_model)
        self.self_attn = MultiHeadAttention(d_model, n_heads, dropout=dropout)
        self.cross_attn = MultiHeadAttention(d_model, n_heads, dropout=dropout)
        self.mlp = FeedForward(d_model, dropout=dropout)

    def forward(self, y: Tensor, memory: Tensor, key_mask: Tensor | None = None) -> Tensor:
        """y: (B, N, D) targets so far, memory: (B, M, D) encoder output -> (B, N, D).

        Cross-attention: queries from y (B, H, N, D_H), keys and values from memory
        (B, H, M, D_H), weights (B, H, N, M): each target token reads the whole source.
        """
        y = y + self.self_attn(self.ln1(y), causal=True)
        y = y + self.cross_attn(self.ln2(y), context=memory, mask=key_mask)
        return y + self.mlp(self.ln3(y))


class Encoder(nn.Module):
    """Token + position embeddings, `n_layers` EncoderLayers, a final LayerNorm: (B, M) -> (B, M, D)."""

    def __init__(self, vocab_size: int, context_length: int, n_layers: int, n_heads: int,
                 d_model: int, dropout: float = 0.0) -> None:
        super().__init__()
        checks.positive_int("n_layers", n_layers)
        self.embed = TokenAndPositionEmbedding(vocab_size, context_length, d_model)
        self.layers = nn.ModuleList(EncoderLayer(d_model, n_heads, dropout) for _ in range(n_layers))
        self.ln_f = LayerNorm(d_model)

    def forward(self, source: Tensor, source_mask: Tensor) -> Tensor:
        """source: (B, M) ids, source_mask: (B, M) bool -> (B, M, D)."""
        check_source_mask(source_mask, source)  # a padding-only row would attend to nothing: NaN
        x = self.embed(source)
        for layer in self.layers:
            x = layer(x, _as_key_mask(source_mask))
        return self.ln_f(x)


@dataclass(frozen=True)
class Seq2SeqConfig:
    source_vocab_size: int
    target_vocab_size: int
    context_length: int = 32
    n_layers: int = 2
    n_heads: int = 4
    d_model: int = 64
    dropout: float = 0.0
    pad_id: int = 0
    bos_id: int = 1
    eos_id: int = 2

    def __post_init__(self) -> None:
        for name in ("source_vocab_size", "target_vocab_size", "context_length", "n_layers",
                     "n_heads", "d_model"):
            checks.positive_int(name, getattr(self, name))
        check_special_ids(self.pad_id, self.bos_id, self.eos_id,
                          {"target_vocab_size": self.target_vocab_size})
        if self.pad_id >= self.source_vocab_size:
            raise ValueError(f"pad_id is {self.pad_id}, outside source_vocab_size "
                             f"{self.source_vocab_size}: the source is padded with it too")


class EncoderDecoder(nn.Module):
    """The 2017 Transformer's shape, Pre-LN: encode the source once, decode with cross-attention."""

    def __init__(self, config: Seq2SeqConfig) -> None:
        super().__init__()
        c = self.config = config
        self.encoder = Encoder(c.source_vocab_size, c.context_length, c.n_layers, c.n_heads,
                               c.d_model, c.dropout)
        self.target_embed = TokenAndPositionEmbedding(c.target_vocab_size, c.context_length, c.d_model)
        self.decoder = nn.ModuleList(DecoderLayer(c.d_model, c.n_heads, c.dropout)
                                     for _ in range(c.n_layers))
        self.ln_f = LayerNorm(c.d_model)
        self.head = nn.Linear(c.d_model, c.target_vocab_size)

    def source_mask(self, source: Tensor) -> Tensor:
        """(B, M) ids -> (B, M) bool: True where the id is not the padding id."""
        return source != self.config.pad_id

    def encode(self, source: Tensor, source_mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """source: (B, M) ids -> memory (B, M, D) and the source mask (B, M) it was made with."""
        if not isinstance(source, Tensor) or source.dim() != 2 or source.shape[1] == 0:
            got = tuple(source.shape) if isinstance(source, Tensor) else type(source).__name__
            raise ValueError(f"source has shape {got}, expected (B, M) ids with M >= 1")
        check_token_ids(source, self.config.source_vocab_size, "source")
        source_mask = self.source_mask(source) if source_mask is None else source_mask
        check_source_mask(source_mask, source)
        padding_as_real = (source_mask & (source == self.config.pad_id)).nonzero().tolist()
        if padding_as_real:
            raise ValueError(f"source_mask marks the padding id {self.config.pad_id} as a real token "
                             f"at (row, position) {padding_as_real[:3]}, expected False wherever "
                             "source is padding (the encoder would attend to the padding)")
        return self.encoder(source, source_mask), source_mask

    def decode(self, target_in: Tensor, memory: Tensor, source_mask: Tensor) -> Tensor:
        """target_in: (B, N) ids starting with <bos>, memory: (B, M, D) -> logits (B, N, V)."""
        if not isinstance(target_in, Tensor) or target_in.dim() != 2 or target_in.shape[1] == 0:
            got = tuple(target_in.shape) if isinstance(target_in, Tensor) else type(target_in).__name__
            raise ValueError(f"target_in has shape {got}, expected (B, N) ids with N >= 1")
        if target_in.shape[0] != memory.shape[0]:
            raise ValueError(f"target_in has {target_in.shape[0]} sentences and the source "
                             f"{memory.shape[0]}: the batch sizes must match (one target per source)")
        check_token_ids(target_in, self.config.target_vocab_size, "target_in")
        y = self.target_embed(target_in)
        for layer in self.decoder:
            y = layer(y, memory, _as_key_mask(source_mask))
        return self.head(self.ln_f(y))

    def forward(self, source: Tensor, target_in: Tensor, source_mask: Tensor | None = None) -> Tensor:
        """Teacher forcing: source (B, M), target_in (B, N) -> logits (B, N, V_target)."""
        memory, source_mask = self.encode(source, source_mask)
        return self.decode(target_in, memory, source_mask)

    def cross_attention_weights(self) -> Tensor:
        """The last forward's cross-attention weights, (L, B, H, N, M)."""
        return torch.stack([layer.cross_attn.last_weights for layer in self.decoder])


# --- decoding -----------------------------------------------------------------------------

def _never_emitted(model: EncoderDecoder, log_probs: Tensor) -> Tensor:
    """(..., V) with <pad> and <bos> set to -inf: a decoder only ever writes words and <eos>."""
    c = model.config
    return log_probs.index_fill(-1, torch.tensor([c.pad_id, c.bos_id], device=log_probs.device),
                                float("-inf"))


def _check_max_length(model: EncoderDecoder, max_length: int) -> None:
    """The decoder reads <bos> plus max_length - 1 tokens: all must have a position."""
    checks.positive_int("max_length", max_length)
    if max_length > model.config.context_length:
        raise ValueError(f"max_length is {max_length}, past the model's context_length "
                         f"{model.config.context_length}: expected at most {model.config.context_length} "
                         "(the decoder has no position beyond it)")


def _check_sentence(source: Tensor) -> Tensor:
    if not isinstance(source, Tensor) or source.dim() != 1 or source.numel() == 0:
        got = tuple(source.shape) if isinstance(source, Tensor) else type(source).__name__
        raise ValueError(f"source has shape {got}, expected one sentence: a 1-D tensor of ids, "
                         "not empty")
    return source[None]


@torch.no_grad()
def greedy_decode(model: EncoderDecoder, source: Tensor, max_length: int) -> Tensor:
    """source: (B, M) -> (B, <= max_length) ids: the most likely next token, step after step.

    A sentence that has produced <eos> is padded from then on; decoding stops when all have.
    <pad> and <bos> are never chosen (as in beam search).
    """
    _check_max_length(model, max_length)
    c = model.config
    memory, mask = model.encode(source)
    out = torch.full((source.shape[0], 1), c.bos_id, dtype=torch.long, device=source.device)
    done = torch.zeros_like(out[:, 0], dtype=torch.bool)  # on the source's device, as out is
    for _ in range(max_length):
        next_id = _never_emitted(model, model.decode(out, memory, mask)[:, -1]).argmax(dim=-1)  # (B,)
        next_id = next_id.masked_fill(done, c.pad_id)
        out = torch.cat([out, next_id[:, None]], dim=1)
        done |= next_id == c.eos_id
        if done.all():
            break
    return out[:, 1:]


@torch.no_grad()
def sequence_log_prob(model: EncoderDecoder, source: Tensor, output: Tensor) -> float:
    """log p(output | source) for one sentence: source (M,), output (K,) ids (ending in <eos> or not)."""
    source = _check_sentence(source)
    if not isinstance(output, Tensor) or output.dim() != 1 or output.numel() == 0:
        got = tuple(output.shape) if isinstance(output, Tensor) else type(output).__name__
        raise ValueError(f"output has shape {got}, expected a non-empty 1-D tensor of target ids")
    _check_max_length(model, output.numel())
    check_token_ids(output, model.config.target_vocab_size, "output")
    memory, mask = model.encode(source)
    target_in = torch.cat([output.new_tensor([model.config.bos_id]), output[:-1]])  # output's device
    logits = model.decode(target_in[None], memory, mask)[0]  # (K, V)
    return logits.log_softmax(dim=-1).gather(1, output[:, None]).sum().item()


@torch.no_grad()
def beam_search(model: EncoderDecoder, source: Tensor, beam_width: int,
                max_length: int) -> tuple[Tensor, float]:
    """The most likely output beam search finds for one sentence: source (M,) -> (ids (K,), log p).

    Keeps the `beam_width` most likely unfinished prefixes at every step; a prefix that emits
    <eos> (or reaches max_length tokens) is finished. Returns the most likely finished sequence.
    Scores are plain sums of log-probabilities (no length normalisation); <pad> and <bos> are
    never chosen.
    """
    c = model.config
    _check_max_length(model, max_length)
    checks.positive_int("beam_width", beam_width)
    if beam_width > c.target_vocab_size:
        raise ValueError(f"beam_width is {beam_width}, expected at most the target vocabulary "
                         f"size {c.target_vocab_size}: a step cannot keep more prefixes than it has tokens")
    memory, mask = model.encode(_check_sentence(source))
    prefixes = torch.full((1, 1), c.bos_id, dtype=torch.long, device=source.device)  # (k, t)
    scores = torch.zeros(1, device=source.device)                                   # (k,)
    finished: list[tuple[float, Tensor]] = []
    for step in range(max_length):
        k = prefixes.shape[0]
        logits = model.decode(prefixes, memory.expand(k, -1, -1), mask.expand(k, -1))[:, -1]
        total = scores[:, None] + _never_emitted(model, logits.log_softmax(dim=-1))  # (k, V)
        best, flat = total.flatten().topk(beam_width)               # the beam_width best children
        best, flat = best[best > float("-inf")], flat[best > float("-inf")]  # never a forbidden one
        rows, tokens = flat // total.shape[1], flat % total.shape[1]
        children = torch.cat([prefixes[rows], tokens[:, None]], dim=1)
        ends = (tokens == c.eos_id) | (step == max_length - 1)
        finished += [(s.item(), seq[1:]) for s, seq, e in zip(best, children, ends, strict=True) if e]
        prefixes, scores = children[~ends], best[~ends]
        if prefixes.shape[0] == 0 or (finished and scores.max().item() <= max(f[0] for f in finished)):
            break  # log-probabilities only fall: no unfinished prefix can overtake the best
    score, ids = max(finished, key=lambda f: f[0])
    return ids, score


@torch.no_grad()
def exhaustive_search(model: EncoderDecoder, source: Tensor, max_length: int) -> tuple[Tensor, float]:
    """Score every output of at most max_length tokens (stopping at <eos>, never <pad> or <bos>):
    the true most likely output, found with V^max_length work."""
    c = model.config
    _check_max_length(model, max_length)
    if (c.target_vocab_size - 2) ** max_length > 100_000:
        raise ValueError(f"max_length {max_length} with {c.target_vocab_size} target words means "
                         f"{c.target_vocab_size - 2}^{max_length} outputs: expected at most 100,000 "
                         "(exhaustive search is for tiny test vocabularies)")
    best: tuple[float, Tensor] | None = None
    vocab = [i for i in range(c.target_vocab_size) if i not in (c.pad_id, c.bos_id)]
    for length in range(1, max_length + 1):
        for seq in itertools.product(vocab, repeat=length):
            if c.eos_id in seq[:-1] or (length < max_length and seq[-1] != c.eos_id):
                continue  # stops at its first <eos>; shorter than max_length only by ending in it
            ids = source.new_tensor(seq, dtype=torch.long)  # on the source's device
            score = sequence_log_prob(model, source, ids)
            if best is None or score > best[0]:
                best = (score, ids)
    assert best is not None
    return best[1], best[0]
