"""From token ids to vectors: one-hot vectors, lookup tables, and where each token stands.

    one_hot                      ids (...,) -> (..., vocab_size), a single 1 per vector
    cosine_similarity            how closely two vectors point the same way, in [-1, 1]
    sinusoidal_positions         the fixed sine/cosine position table of "Attention Is All You Need"
    sinusoid_frequencies         how fast each sine/cosine pair of that table turns, per position
    sinusoid_wavelengths         the period, in positions, of each pair
    TokenAndPositionEmbedding    a learned token table plus a learned position table, summed

Model code: it imports torch only, never plots, widgets or exercises.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from helpers import checks

ID_DTYPES = (torch.int64, torch.int32)  # what nn.Embedding accepts as indices


def check_token_ids(token_ids: torch.Tensor, vocab_size: int, name: str = "token_ids") -> None:
    """Raise unless `token_ids` is an int64 or int32 tensor whose entries all lie in [0, vocab_size).

    Smaller integer dtypes (uint8, int16) are refused: an embedding cannot index with them, and
    uint8 would silently wrap ids above 255. Ids on the meta device (shapes, no values) too.
    """
    if not isinstance(token_ids, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of integer ids, got {type(token_ids).__name__}")
    if token_ids.is_floating_point() or token_ids.is_complex() or token_ids.dtype == torch.bool:
        raise TypeError(f"{name} has dtype {token_ids.dtype}, expected an integer dtype (torch.long)")
    if token_ids.dtype not in ID_DTYPES:
        raise TypeError(f"{name} has dtype {token_ids.dtype}, expected an integer dtype that can "
                        f"index a table, torch.long (or torch.int32): use {name}.long()")
    if token_ids.is_meta:
        raise ValueError(f"{name} is on the meta device, which holds shapes but no values: "
                         "expected real ids (on the CPU or a GPU)")
    if token_ids.numel() == 0 or torch.compiler.is_compiling():
        # Under torch.compile reading values would split the compiled graph; whoever compiles
        # checks the ids once beforehand (helpers.training.trainer.Trainer checks all of its data).
        return
    smallest, largest = token_ids.min().item(), token_ids.max().item()
    if smallest < 0 or largest >= vocab_size:
        bad = smallest if smallest < 0 else largest
        raise ValueError(f"{name} contains the id {bad}, expected ids in [0, {vocab_size - 1}] "
                         f"for a vocabulary of {vocab_size} tokens")


def one_hot(token_ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """The one-hot vector of every id: a 1 in the id's column, 0 everywhere else.

    token_ids: (...,) integers in [0, vocab_size).
    Returns (..., vocab_size) float32, so that it can be multiplied with a weight matrix.
    """
    checks.positive_int("vocab_size", vocab_size)
    check_token_ids(token_ids, vocab_size)
    vectors = torch.zeros(*token_ids.shape, vocab_size, device=token_ids.device)
    return vectors.scatter_(-1, token_ids.unsqueeze(-1).long(), 1.0)


def cosine_similarity(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """cos of the angle between a and b along the last dimension: a.b / (|a| |b|).

    a: (..., d), b: (..., d); leading dimensions broadcast. Returns (...,), values in [-1, 1].
    A zero vector has no direction, so it raises instead of returning a made-up number.
    """
    for name, vectors in (("a", a), ("b", b)):
        if not (isinstance(vectors, torch.Tensor) and vectors.is_floating_point() and vectors.dim() >= 1):
            got = (f"of dtype {vectors.dtype} and shape {tuple(vectors.shape)}" if isinstance(vectors, torch.Tensor)
                   else f"a {type(vectors).__name__}")
            raise TypeError(f"{name} is {got}, expected a floating-point tensor of vectors (..., d)"
                            + (f": convert it with {name}.float()" if isinstance(vectors, torch.Tensor)
                               and not vectors.is_floating_point() else ""))
    if a.shape[-1:] != b.shape[-1:]:
        raise ValueError(f"a has shape {tuple(a.shape)} and b has shape {tuple(b.shape)}, "
                         f"expected the same last dimension (the vector size)")
    for name, vectors in (("a", a), ("b", b)):
        if (vectors.norm(dim=-1) == 0).any():
            raise ValueError(f"{name} contains a zero vector, which has no direction: "
                             "cosine similarity is undefined for it")
    return (a * b).sum(-1) / (a.norm(dim=-1) * b.norm(dim=-1))


def _check_base(base: float) -> None:
    checks.number_in("base", base, 1.0, math.inf, low_open=True, high_open=True,
                     expected="a number > 1 (10000.0 in the paper): with base <= 1 the "
                              "wavelengths would not grow along the dimensions")


def sinusoid_frequencies(d_model: int, base: float = 10000.0) -> torch.Tensor:
    """How fast each sine/cosine pair i turns, in radians per position: base^(-2i / d_model).

    Returns (ceil(d_model / 2),) float64: pair i fills columns 2i (sine) and 2i + 1 (cosine).
    """
    checks.positive_int("d_model", d_model)
    _check_base(base)
    pair = torch.arange((d_model + 1) // 2, dtype=torch.float64)
    return base ** (-2 * pair / d_model)


def sinusoid_wavelengths(d_model: int, base: float = 10000.0) -> torch.Tensor:
    """The wavelength, in positions, of each sine/cosine pair i: 2 pi base^(2i / d_model).

    Returns (ceil(d_model / 2),) float64.
    """
    return 2 * math.pi / sinusoid_frequencies(d_model, base)


def sinusoidal_positions(n_positions: int, d_model: int, base: float = 10000.0) -> torch.Tensor:
    """The sinusoidal position table: PE[pos, 2i] = sin(pos / base^(2i/d)), PE[pos, 2i+1] = cos(...).

    Sines sit in the even columns and cosines in the odd ones, interleaved as in the formula.
    An odd d_model is allowed: the formula then ends with one unpaired sine column.
    Returns (n_positions, d_model) float32, every entry in [-1, 1].
    """
    checks.positive_int("n_positions", n_positions)
    frequencies = sinusoid_frequencies(d_model, base)  # (ceil(d/2),)
    positions = torch.arange(n_positions, dtype=torch.float64).unsqueeze(1)  # (n_positions, 1)
    angles = positions * frequencies  # (n_positions, ceil(d/2))
    table = torch.empty(n_positions, d_model, dtype=torch.float64)
    table[:, 0::2] = torch.sin(angles)
    table[:, 1::2] = torch.cos(angles[:, : d_model // 2])
    return table.float()  # computed in float64 so that large positions keep their precision


class TokenAndPositionEmbedding(nn.Module):
    """A token's vector plus its position's vector, both looked up in learned tables (as in GPT-2).

    vocab_size: rows of the token table; context_length: rows of the position table, the longest
    sequence the model can read; d_model: the length of every vector.
    """

    def __init__(self, vocab_size: int, context_length: int, d_model: int) -> None:
        super().__init__()
        for name, value in (("vocab_size", vocab_size), ("context_length", context_length),
                            ("d_model", d_model)):
            checks.positive_int(name, value)
        self.token = nn.Embedding(vocab_size, d_model)
        self.position = nn.Embedding(context_length, d_model)

    @property
    def context_length(self) -> int:
        return self.position.num_embeddings

    def forward(self, token_ids: torch.Tensor, start: int = 0) -> torch.Tensor:
        """token_ids: (batch, seq_len) or (seq_len,) -> (batch, seq_len, d_model) or (seq_len, d_model).

        start: the position of the first token (a KV cache feeds a sequence in pieces).
        """
        check_token_ids(token_ids, self.token.num_embeddings)
        if token_ids.dim() not in (1, 2):
            raise ValueError(f"token_ids has shape {tuple(token_ids.shape)}, "
                             "expected (batch, seq_len) or (seq_len,)")
        if isinstance(start, bool) or not isinstance(start, int) or start < 0:
            raise ValueError(f"start is {start!r}, expected an int >= 0")
        end = start + token_ids.shape[-1]
        if end > self.context_length:
            after = f" after {start} earlier ones" if start else ""
            raise ValueError(f"token_ids has {token_ids.shape[-1]} positions (shape "
                             f"{tuple(token_ids.shape)}){after}, expected at most context_length = "
                             f"{self.context_length}: the position table has no row for the "
                             "later positions")
        positions = torch.arange(start, end, device=token_ids.device)  # (seq_len,)
        return self.token(token_ids) + self.position(positions)  # (..., seq_len, d) + (seq_len, d)
