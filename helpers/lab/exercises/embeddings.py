"""Exercises of notebook 2 (embeddings): a lookup as a product, the word vectors' training loop,
nearest neighbours, sinusoids, the input layer (token + position).

A failure says what is wrong; its `fix` says, in words, how to put it right."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from helpers.lab.exercises import (
    ExerciseFailed,
    exercise,
    expect_close,
    hidden_round,
    reseed,
    seeded,
)
from helpers.lab.exercises.watch import TensorLog
from helpers.model import embeddings as reference

# Every way of reading rows of a tensor by their index: the first exercise must do without them.
_ROW_LOOKUPS = {
    Tensor.__getitem__, Tensor.index_select, torch.index_select, Tensor.gather, torch.gather,
    Tensor.take, torch.take, F.embedding, torch.embedding, Tensor.index_put_,
}


class _RowsUnreadable(Tensor):
    """A weight matrix that fails, with a message for the student, when rows are read by index."""

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func in _ROW_LOOKUPS:
            raise ExerciseFailed(f"you read rows of the weight by index (`{func.__name__}`); the "
                                 "point is to get them with a matrix product only.",
                                 fix="build the one-hot rows of the ids with one_hot, as many "
                                     "columns as the weight has rows, and multiply them by the weight.")
        return super().__torch_function__(func, types, args, kwargs or {})

    def __repr__(self, **kwargs: Any) -> str:  # printing reads rows by index: allow it
        return repr(self.as_subclass(Tensor))


def _random(*shape: int, seed: int) -> Tensor:
    return torch.randn(*shape, generator=seeded(seed))


@exercise(hint="Turn the ids into one-hot rows as long as the weight has rows, in the weight's "
               "dtype, and take their matrix product with the weight.",
          task="Write lookup_by_product(token_ids, weight) returning weight's rows for the ids, with "
               "a matrix product only. The check refuses indexing and tries a repeated id and a "
               "batch.")
def lookup_by_product(student: Callable[[Tensor, Tensor], Tensor]) -> str:
    """student(token_ids (...,), weight (V, d)) -> (..., d) must equal weight[token_ids], by a product."""
    cases = {
        "ids [0, 1, 2, 3] in a (12, 8) table": (torch.tensor([0, 1, 2, 3]), (12, 8)),
        "ids [5, 5, 0] (a repeated id) in a (7, 3) table": (torch.tensor([5, 5, 0]), (7, 3)),
        "a batch of ids of shape (2, 4) in a (10, 6) table": (torch.tensor([[9, 0, 3, 3], [1, 2, 8, 4]]), (10, 6)),
    }
    for seed, (what, (token_ids, weight_shape)) in enumerate(cases.items()):
        weight = _random(*weight_shape, seed=seed)
        try:
            got = student(token_ids, weight.as_subclass(_RowsUnreadable))
        except RuntimeError as error:
            if "dtype" in str(error) or "Long" in str(error) or "shapes cannot be multiplied" in str(error):
                raise ExerciseFailed(f"for {what} the product failed ({str(error).splitlines()[0]}).",
                                     fix="the one-hot matrix needs as many columns as the table has "
                                         "rows and the weight's dtype (one_hot gives integers: "
                                         "convert them).") from None
            raise
        if isinstance(got, Tensor):
            got = got.as_subclass(Tensor)
        expect_close(got, weight[token_ids], f"the result for {what}", atol=1e-6)
    return "A product with one-hot rows picks out exactly the rows a lookup reads."


def course_lookup_by_product(token_ids: Tensor, weight: Tensor) -> Tensor:
    """The course's lookup by product, standing in for the exercise until it passes its check."""
    return reference.one_hot(token_ids, weight.shape[0]).to(weight.dtype) @ weight


def course_most_similar(query: Tensor, table: Tensor, k: int) -> Tensor:
    """The course's nearest rows by cosine, standing in for the exercise until it passes its check."""
    return reference.cosine_similarity(query, table).topk(k).indices


@exercise(hint="Take every row's dot product with the query and divide it by the two lengths; "
               "then keep the indices of the k largest cosines, largest first (topk does that).",
          task="Write most_similar(query, table, k) returning the indices of the k rows most similar "
               "to query, most similar first. The check includes a long row that points elsewhere.")
def most_similar(student: Callable[[Tensor, Tensor, int], Tensor]) -> str:
    """student(query (d,), table (V, d), k) -> indices (k,) of the rows most similar by cosine."""
    # Row 0 points almost the same way as the query but is short; row 2 is long but aslant:
    # ranking by dot product puts it first, ranking by cosine puts it fourth.
    table = torch.tensor([[0.9, 0.1], [6.0, 3.0], [8.0, -8.0], [0.0, 1.0], [-1.0, 0.0], [2.0, 1.5]])
    query = torch.tensor([1.0, 0.0])
    if hidden_round():  # the same trap, its rows shuffled and the query longer
        table, query = table[torch.randperm(6, generator=seeded(3))], query * 2.5
    by_cosine = reference.cosine_similarity(query, table).topk(3).indices
    by_dot = (table @ query).topk(3).indices
    got = student(query, table, 3)
    if not isinstance(got, Tensor):
        raise ExerciseFailed(f"you returned a {type(got).__name__}, expected a tensor of row indices.",
                             fix="return the indices part of topk's answer, a tensor.")
    got = got.flatten().long()
    if got.tolist() == by_dot.tolist():
        raise ExerciseFailed(f"you ranked by dot product and got rows {got.tolist()}: long vectors win "
                             "even when they point elsewhere.",
                             fix="divide each dot product by the length of the row and of the query "
                                 "(that is the cosine) before ranking.")
    if sorted(got.tolist()) == sorted(by_cosine.tolist()) and got.tolist() != by_cosine.tolist():
        raise ExerciseFailed(f"you found the right rows but in the order {got.tolist()}, expected "
                             f"{by_cosine.tolist()}.",
                             fix="put the most similar first: sort by cosine, largest first.")
    if got.tolist() != by_cosine.tolist():
        raise ExerciseFailed(f"for the query {query.tolist()} the 3 most similar rows by cosine are "
                             f"{by_cosine.tolist()}, you returned {got.tolist()}.")
    wide = _random(50, 16, seed=7)
    query = _random(16, seed=8)
    expected = reference.cosine_similarity(query, wide).topk(5).indices
    got = student(query, wide, 5)
    if not isinstance(got, Tensor) or got.flatten().tolist() != expected.tolist():
        raise ExerciseFailed(f"on a (50, 16) table with k=5 the answer is {expected.tolist()}, you "
                             f"returned {got.flatten().tolist() if isinstance(got, Tensor) else got}.",
                             fix="compare the query with every row, not a fixed number of them, and "
                                 "return exactly k indices.")
    return "Cosine ignores length, so a short vector pointing the right way beats a long one aslant."


SAME_ANGLE = ("columns 2i and 2i+1 share one angle, position divided by base to the power 2i over "
              "d_model, where i is the pair index (the column index halved, rounded down).")


def _diagnose_sinusoids(got: Tensor, n_positions: int, d_model: int, base: float) -> None:
    """Name the classic mistake when `got` equals a known wrong table."""
    positions = torch.arange(n_positions, dtype=torch.float64).unsqueeze(1)
    pair = torch.arange(d_model // 2, dtype=torch.float64)
    angles = positions / base ** (2 * pair / d_model)
    interleave = torch.stack
    mistakes = {
        "sines and cosines are swapped":
            ("even columns (2i) hold the sine, odd ones (2i+1) the cosine.",
             interleave([torch.cos(angles), torch.sin(angles)], dim=-1).flatten(1)),
        "you put all sines first and all cosines after":
            ("the formula interleaves them: column 2i is a sine, column 2i+1 the cosine of the same "
             "angle; fill the even columns and the odd columns separately.",
             torch.cat([torch.sin(angles), torch.cos(angles)], dim=-1)),
        "you used the column index where the formula's 2i belongs":
            (SAME_ANGLE,
             interleave([torch.sin(positions / base ** (2 * (2 * pair) / d_model)),
                         torch.cos(positions / base ** (2 * (2 * pair + 1) / d_model))], dim=-1).flatten(1)),
        "the cosine in column 2i+1 has an angle of its own, with exponent (2i+1)/d_model":
            (SAME_ANGLE,
             interleave([torch.sin(angles),
                         torch.cos(positions / base ** ((2 * pair + 1) / d_model))], dim=-1).flatten(1)),
        "the exponent is 2i/d_model, not i/d_model, so your waves turn too slowly": (SAME_ANGLE,
                        interleave([torch.sin(positions / base ** (pair / d_model)),
                                    torch.cos(positions / base ** (pair / d_model))], dim=-1).flatten(1)),
        "your positions start at 1":
            ("positions start at 0, so the first row is 0, 1, 0, 1, ... (sine and cosine of 0).",
             reference.sinusoidal_positions(n_positions + 1, d_model, base)[1:].double()),
    }
    for message, (fix, wrong) in mistakes.items():
        if got.shape == wrong.shape and torch.allclose(got.double(), wrong, atol=1e-5):
            raise ExerciseFailed(message + ".", fix=fix)
    if got.shape == (d_model, n_positions) and n_positions != d_model:
        raise ExerciseFailed(f"your table has shape {tuple(got.shape)}, expected (n_positions, "
                             f"d_model) = ({n_positions}, {d_model}).",
                             fix="put the positions in the rows and the dimensions in the columns.")


@exercise(hint="Every angle at once: the positions against the pairs' frequencies (the formula "
               "above the exercise), broadcast into a table, no loop over positions. The even columns hold the sines of those angles, the odd ones the cosines.",
          task="Write sinusoidal_table(n_positions, d_model, base) returning the (n_positions, "
               "d_model) table of notebook 2's formula. The check compares three sizes and bases.")
def sinusoidal_table(student: Callable[..., Tensor]) -> str:
    """student(n_positions, d_model, base) -> (n_positions, d_model), the sinusoidal table."""
    cases = ((4, 4, 10000.0), (4, 4, 100.0), (50, 16, 10000.0))
    if hidden_round():  # one position only, and a size and base drawn from the hidden seed
        sizes = torch.randint(2, 40, (2,), generator=seeded(5)).tolist()
        cases = ((1, 6, 10000.0), (sizes[0], 2 * (sizes[1] // 4 + 1), 500.0)) + cases
    for n_positions, d_model, base in cases:
        got = student(n_positions, d_model, base)
        if not isinstance(got, Tensor):
            raise ExerciseFailed(f"you returned a {type(got).__name__}, expected a torch.Tensor.",
                                 fix="build the table as a tensor and return it.")
        expected = reference.sinusoidal_positions(n_positions, d_model, base)
        if got.shape != expected.shape or not torch.allclose(got.double(), expected.double(), atol=1e-5):
            _diagnose_sinusoids(got, n_positions, d_model, base)  # one position: every slip is right too
        expect_close(got.float(), expected, f"the table for n_positions={n_positions}, "
                     f"d_model={d_model}, base={base:g}", atol=1e-5)
    with TensorLog() as few:
        student(8, 16, 10000.0)
    with TensorLog() as many:
        student(64, 16, 10000.0)
    if many.operations > 2 * few.operations + 8:
        raise ExerciseFailed(f"your table runs {few.operations} tensor operations for 8 positions and "
                             f"{many.operations} for 64: it loops over the positions, where the exercise "
                             "asks for one broadcast over all of them.",
                             fix="make a column of all positions and a row of all pair indices and let "
                                 "one division broadcast them into every angle at once.")
    return (f"Its slowest pair for d_model=16 has a wavelength of "
            f"2 pi 10000^(14/16) = {2 * math.pi * 10000 ** (14 / 16):,.0f} positions.")


# --- a core exercise: the training loop of the word vectors --------------------------------------

def train_variant(embedding: torch.nn.Embedding, predict_neighbour: torch.nn.Linear, counts: Tensor,
                  steps: int, lr: float = 0.05, *, zero_grad: bool = True, reduce: str = "sum",
                  sign: float = -1.0, log: bool = True, dim: int = -1, step: bool = True,
                  normalise: bool = True, fresh_optimizer: bool = False,
                  predictor_trained: bool = True) -> list[float]:
    """The notebook's word-vector training, right by default, or with one of the usual slips."""
    def adam() -> torch.optim.Optimizer:
        trained = [*embedding.parameters(), *(predict_neighbour.parameters() if predictor_trained else ())]
        return torch.optim.Adam(trained, lr=lr)

    optimizer = adam()
    pair_share = counts / counts.sum() if normalise else counts  # (V, V)
    every_word = torch.arange(counts.shape[0])
    losses = []
    for _ in range(steps):
        if fresh_optimizer:
            optimizer = adam()
        logits = predict_neighbour(embedding(every_word))  # (V, V)
        scores = torch.log_softmax(logits, dim=dim) if log else torch.softmax(logits, dim=dim)
        picked = pair_share * scores
        loss = sign * (picked.sum() if reduce == "sum" else picked.mean())
        if zero_grad:
            optimizer.zero_grad()
        loss.backward()
        if step:
            optimizer.step()
        losses.append(loss.item())
    return losses


def course_train_word_vectors(embedding: torch.nn.Embedding, predict_neighbour: torch.nn.Linear,
                              counts: Tensor, steps: int, lr: float = 0.05) -> list[float]:
    """The course's training loop, standing in for the exercise until it passes its check."""
    return train_variant(embedding, predict_neighbour, counts, steps, lr)


TRAIN_SLIPS = {
    "never clears the gradients, so each step adds the old gradients to the new":
        ({"zero_grad": False}, "clear the optimizer's gradients before every backward pass."),
    "averages over all V x V entries":
        ({"reduce": "mean"}, "the pair shares already sum to 1, so the loss is their weighted sum, "
                             "not a mean."),
    "has the sign flipped, so it makes real neighbours less likely":
        ({"sign": 1.0}, "the loss is minus the weighted log-probabilities: lowering it raises the "
                        "probability of real neighbours."),
    "weights the probabilities, not their logarithm":
        ({"log": False}, "the cross-entropy uses log-probabilities: take log_softmax of the scores."),
    "normalises over dim=0, the words, not over each word's neighbours":
        ({"dim": 0}, "each word's row is a distribution over its neighbours: normalise along the "
                     "last dimension."),
    "never changes the parameters":
        ({"step": False}, "let the optimizer take its step after every backward pass."),
    "uses the raw counts as weights, so the loss is as large as the number of pairs":
        ({"normalise": False}, "divide the counts by their total once, before the loop, so that the "
                               "shares sum to 1."),
    "makes a new Adam at every step, which forgets its running averages":
        ({"fresh_optimizer": True}, "make the optimizer once, before the loop, and reuse it."),
    "trains the embedding only: the predictor's parameters are missing from the optimizer":
        ({"predictor_trained": False}, "give Adam the parameters of both modules."),
}


def _word_model(seed: int, vocab_size: int, d_model: int) -> tuple[Any, Any, Tensor]:
    """A small embedding, its neighbour predictor and a (V, V) table of neighbour counts."""
    with torch.random.fork_rng():  # leave the notebook's random numbers as they were
        reseed(seed)
        embedding = torch.nn.Embedding(vocab_size, d_model, dtype=torch.float64)
        predict = torch.nn.Linear(d_model, vocab_size, dtype=torch.float64)
        counts = torch.randint(0, 5, (vocab_size, vocab_size)).double()
    counts = counts + counts.T + torch.eye(vocab_size)  # symmetric, and no word without a neighbour
    return embedding, predict, counts


def _train(train: Callable[..., Any], seed: int = 0, steps: int = 4) -> tuple[Any, Tensor]:
    embedding, predict, counts = _word_model(seed, 6, 3)
    losses = train(embedding, predict, counts, steps, 0.05)
    return losses, embedding.weight.detach().clone()


def _as_floats(losses: Any) -> list[float] | None:
    """The losses as a list of floats (0-d tensors are fine), or None if they are not a list of numbers."""
    if not isinstance(losses, list | tuple):
        return None
    try:
        return [float(loss.detach() if isinstance(loss, Tensor) else loss) for loss in losses]
    except (TypeError, ValueError, RuntimeError):
        return None


@exercise(hint="Make Adam over both modules' parameters once and turn the counts into shares that "
               "sum to 1. Every step: the cross-entropy of the model's neighbour predictions for "
               "every word against those shares, then the usual update; keep each step's loss.",
          task="Write train_word_vectors(embedding, predict_neighbour, counts, steps, lr) that trains "
               "both modules with Adam and returns the loss of every step as a list of floats. The "
               "check trains a small model for four steps from the same start as the course's loop "
               "and compares the losses and the vectors.",
          points=3)
def train_word_vectors(student: Callable[..., Any]) -> str:
    got_losses, got_weight = _train(student)
    losses = _as_floats(got_losses)
    if losses is None or len(losses) != 4:
        raise ExerciseFailed(f"for 4 steps you returned {got_losses!r}, expected a list of 4 losses.",
                             fix="append the loss of every step, as a float, to a list and return it "
                                 "after the loop.")
    want_losses, want_weight = _train(train_variant)
    right = torch.allclose(torch.tensor(losses), torch.tensor(want_losses), rtol=1e-9, atol=1e-12) \
        and torch.allclose(got_weight, want_weight, atol=1e-9)
    if right:
        return "The notebook's word vectors now train with your loop."
    for slip, (knobs, fix) in TRAIN_SLIPS.items():
        slip_losses, slip_weight = _train(lambda *a, knobs=knobs: train_variant(*a, **knobs))
        if torch.allclose(torch.tensor(losses), torch.tensor(slip_losses)) and torch.allclose(got_weight, slip_weight):
            raise ExerciseFailed(f"your loop {slip}.", fix=fix)
    if not torch.allclose(torch.tensor(losses), torch.tensor(want_losses), rtol=1e-9, atol=1e-12):
        raise ExerciseFailed(f"over four steps your losses are {[round(g, 6) for g in losses]}, expected "
                             f"{[round(w, 6) for w in want_losses]}.",
                             fix="the loss is minus the sum of the pair shares times the log-softmax "
                                 "of each word's row of scores; record it before the step.")
    expect_close(got_weight, want_weight, "the word vectors after four steps", atol=1e-9)
    return "The notebook's word vectors now train with your loop."


# --- a core exercise: the Transformer's input layer, token + position -----------------------------

def _filled(cls: Callable[..., Any], vocab_size: int, context_length: int, d_model: int) -> Any:
    """An instance of the student's class whose two tables hold known numbers."""
    with torch.random.fork_rng():  # the tables' random start leaves the notebook's numbers alone
        module = cls(vocab_size, context_length, d_model)
    for name, rows in (("token", vocab_size), ("position", context_length)):
        table = getattr(module, name, None)
        if not isinstance(table, torch.nn.Embedding):
            raise ExerciseFailed(f"self.{name} is {type(table).__name__}, expected an nn.Embedding.",
                                 fix="in __init__, make self.token a table with a row per token and "
                                     "self.position one with a row per position, both nn.Embedding.")
        if tuple(table.weight.shape) != (rows, d_model):
            raise ExerciseFailed(f"self.{name} has shape {tuple(table.weight.shape)}, expected "
                                 f"({rows}, {d_model}).",
                                 fix="the token table has vocab_size rows, the position table "
                                     "context_length rows; both rows are d_model long.")
    with torch.no_grad():
        module.token.weight.copy_(_random(vocab_size, d_model, seed=11))
        module.position.weight.copy_(_random(context_length, d_model, seed=12))
    return module


def _refuses(module: Any, token_ids: Tensor, what: str) -> None:
    """Fail unless module(token_ids) raises a ValueError (a bare nn.Embedding raises IndexError,
    a sum of mismatched shapes RuntimeError)."""
    try:
        module(token_ids)
    except ValueError:
        return
    except Exception as error:  # noqa: BLE001 - any other failure is the mistake being named
        raise ExerciseFailed(f"for {what} your layer fails with {type(error).__name__} ({error}) "
                             "instead of saying what is wrong.",
                             fix="check the input first and raise a ValueError that names "
                                 "token_ids, what it holds and what was expected.") from None
    raise ExerciseFailed(f"for {what} your layer returned an output instead of refusing it.",
                         fix="check the input first and raise a ValueError that names token_ids, "
                             "what it holds and what was expected.")


@exercise(hint="One table gives each token's vector, another each position's; look the positions "
               "0, 1, 2 ... up for as many positions as the sequence is long and add the two, "
               "letting the positions broadcast over the batch. Refuse, with a ValueError, what the "
               "tables have no row for.",
          task="Write the class TokenAndPosition(vocab_size, context_length, d_model): token table "
               "self.token, position table self.position, and forward(token_ids) returning their "
               "sum for ids of shape (batch, seq_len) or (seq_len,). The check fills the tables "
               "with known numbers, compares the outputs and feeds a sequence that is too long and "
               "an id that is too large.",
          points=3)
def token_and_position(student: Callable[..., Any]) -> str:
    # more positions than tokens: looking positions up by id runs
    vocab_size, context_length, d_model = (9, 12, 4) if hidden_round() else (7, 8, 3)
    module = _filled(student, vocab_size, context_length, d_model)
    token, position = module.token.weight.detach(), module.position.weight.detach()
    cases = {"a batch of shape (2, 4)": torch.tensor([[6, 0, 3, 3], [1, 2, 4, 0]]),
             "one sequence of shape (5,)": torch.tensor([4, 4, 1, 0, 2])}
    if hidden_round():  # a full context, and a single token
        cases[f"a batch of shape (3, {context_length})"] = torch.randint(0, vocab_size, (3, context_length),
                                                                         generator=seeded(13))
        cases["one token of shape (1, 1)"] = torch.tensor([[vocab_size - 1]])
    for what, token_ids in cases.items():
        with torch.no_grad():
            got = module(token_ids)
        n = token_ids.shape[-1]
        expected = token[token_ids] + position[:n]
        if isinstance(got, Tensor) and got.shape == expected.shape[:-1] + (2 * expected.shape[-1],):
            raise ExerciseFailed(f"for {what} your output has shape {tuple(got.shape)}: you "
                                 "concatenated the two vectors.",
                                 fix="add them instead: the sum keeps d_model unchanged.")
        if isinstance(got, Tensor) and got.shape == expected.shape:
            if torch.allclose(got, token[token_ids]):
                raise ExerciseFailed(f"for {what} you returned the token vectors alone.",
                                     fix="add each position's vector to the token vector there.")
            if torch.allclose(got, token[token_ids] + position[token_ids]):
                raise ExerciseFailed(f"for {what} you looked the positions up by the token ids.",
                                     fix="the position of a token is where it stands, 0, 1, 2 ... "
                                         "along the sequence, whatever its id.")
        expect_close(got, expected, f"the output for {what}", atol=1e-6)
    _refuses(module, torch.zeros(1, context_length + 1, dtype=torch.long),
             f"a sequence of {context_length + 1} tokens with context_length {context_length}")
    _refuses(module, torch.tensor([[0, vocab_size]]), f"the id {vocab_size} with vocab_size {vocab_size}")
    return "That is the input of the Transformer: the sum goes into the first block."
