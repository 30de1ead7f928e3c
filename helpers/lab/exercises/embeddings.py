"""Exercises of notebook 2 (embeddings): a lookup as a product, the word vectors' training step,
nearest neighbours, sinusoids."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from helpers.lab.exercises import ExerciseFailed, exercise, expect_close
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
                                 "point is to get them with a matrix product only: "
                                 "one_hot(token_ids, vocab_size) @ weight.")
        return super().__torch_function__(func, types, args, kwargs or {})

    def __repr__(self, **kwargs: Any) -> str:  # printing reads rows by index: allow it
        return repr(self.as_subclass(Tensor))


def _random(*shape: int, seed: int) -> Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


@exercise(hint="one_hot(token_ids, weight.shape[0]) has shape (..., vocab_size); multiply it "
               "with weight (vocab_size, d) using @.",
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
                raise ExerciseFailed(f"for {what} the product failed ({str(error).splitlines()[0]}): "
                                     "the one-hot matrix needs as many columns as the table has rows "
                                     "(num_classes=weight.shape[0]) and the weight's dtype "
                                     "(.to(weight.dtype)).") from None
            raise
        if isinstance(got, Tensor):
            got = got.as_subclass(Tensor)
        expect_close(got, weight[token_ids], f"the result for {what}", atol=1e-6)
    return "A product with one-hot rows picks out exactly the rows a lookup reads."


@exercise(hint="divide every dot product by the two lengths: cos = q.w / (|q| |w|); "
               "torch.topk(..., k).indices gives the k largest, largest first.",
          task="Write most_similar(query, table, k) returning the indices of the k rows most similar "
               "to query, most similar first. The check includes a long row that points elsewhere.")
def most_similar(student: Callable[[Tensor, Tensor, int], Tensor]) -> str:
    """student(query (d,), table (V, d), k) -> indices (k,) of the rows most similar by cosine."""
    # Row 0 points almost the same way as the query but is short; row 2 is long but aslant:
    # ranking by dot product puts it first, ranking by cosine puts it fourth.
    table = torch.tensor([[0.9, 0.1], [6.0, 3.0], [8.0, -8.0], [0.0, 1.0], [-1.0, 0.0], [2.0, 1.5]])
    query = torch.tensor([1.0, 0.0])
    by_cosine = reference.cosine_similarity(query, table).topk(3).indices
    by_dot = (table @ query).topk(3).indices
    got = student(query, table, 3)
    if not isinstance(got, Tensor):
        raise ExerciseFailed(f"return a tensor of row indices, not a {type(got).__name__}.")
    got = got.flatten().long()
    if got.tolist() == by_dot.tolist():
        raise ExerciseFailed(f"you ranked by dot product and got rows {got.tolist()}: long vectors win "
                             "even when they point elsewhere. Divide by the lengths (cosine).")
    if sorted(got.tolist()) == sorted(by_cosine.tolist()) and got.tolist() != by_cosine.tolist():
        raise ExerciseFailed(f"you found the right rows but in the order {got.tolist()}; "
                             f"put the most similar first: {by_cosine.tolist()}.")
    if got.tolist() != by_cosine.tolist():
        raise ExerciseFailed(f"for the query {query.tolist()} the 3 most similar rows by cosine are "
                             f"{by_cosine.tolist()}, you returned {got.tolist()}.")
    wide = _random(50, 16, seed=7)
    query = _random(16, seed=8)
    expected = reference.cosine_similarity(query, wide).topk(5).indices
    got = student(query, wide, 5)
    if not isinstance(got, Tensor) or got.flatten().tolist() != expected.tolist():
        raise ExerciseFailed(f"on a (50, 16) table with k=5 the answer is {expected.tolist()}, you "
                             f"returned {got.flatten().tolist() if isinstance(got, Tensor) else got}.")
    return "Cosine ignores length, so a short vector pointing the right way beats a long one aslant."


def _diagnose_sinusoids(got: Tensor, n_positions: int, d_model: int, base: float) -> None:
    """Name the classic mistake when `got` equals a known wrong table."""
    positions = torch.arange(n_positions, dtype=torch.float64).unsqueeze(1)
    pair = torch.arange(d_model // 2, dtype=torch.float64)
    angles = positions / base ** (2 * pair / d_model)
    interleave = torch.stack
    mistakes = {
        "sines and cosines are swapped: even columns (2i) hold the sine, odd ones (2i+1) the cosine":
            interleave([torch.cos(angles), torch.sin(angles)], dim=-1).flatten(1),
        "you put all sines first and all cosines after; the formula interleaves them: column 2i is "
        "a sine, column 2i+1 the cosine of the same angle":
            torch.cat([torch.sin(angles), torch.cos(angles)], dim=-1),
        "the exponent should be 2i/d_model with i the pair index (i = column // 2); you used the "
        "column index where 2i belongs":
            interleave([torch.sin(positions / base ** (2 * (2 * pair) / d_model)),
                        torch.cos(positions / base ** (2 * (2 * pair + 1) / d_model))], dim=-1).flatten(1),
        "the cosine in column 2i+1 shares the angle of the sine before it: its exponent is "
        "2i/d_model too, not (2i+1)/d_model":
            interleave([torch.sin(angles),
                        torch.cos(positions / base ** ((2 * pair + 1) / d_model))], dim=-1).flatten(1),
        "the exponent is 2i/d_model, not i/d_model":
            interleave([torch.sin(positions / base ** (pair / d_model)),
                        torch.cos(positions / base ** (pair / d_model))], dim=-1).flatten(1),
        "positions start at 0, so the first row is [0, 1, 0, 1, ...]":
            reference.sinusoidal_positions(n_positions + 1, d_model, base)[1:].double(),
    }
    for message, wrong in mistakes.items():
        if got.shape == wrong.shape and torch.allclose(got.double(), wrong, atol=1e-5):
            raise ExerciseFailed(message + ".")
    if got.shape == (d_model, n_positions) and n_positions != d_model:
        raise ExerciseFailed(f"your table has shape {tuple(got.shape)}: put positions in the rows, "
                             f"(n_positions, d_model) = ({n_positions}, {d_model}).")


@exercise(hint="angle = pos / base ** (2 * i / d_model) for pair i = 0 .. d_model/2 - 1; "
               "column 2i gets sin(angle), column 2i+1 gets cos(angle). Slices table[:, 0::2] "
               "and table[:, 1::2] pick the even and the odd columns.",
          task="Write sinusoidal_table(n_positions, d_model, base) returning the (n_positions, "
               "d_model) table of notebook 2's formula. The check compares three sizes and bases.")
def sinusoidal_table(student: Callable[..., Tensor]) -> str:
    """student(n_positions, d_model, base) -> (n_positions, d_model), the sinusoidal table."""
    for n_positions, d_model, base in ((4, 4, 10000.0), (4, 4, 100.0), (50, 16, 10000.0)):
        got = student(n_positions, d_model, base)
        if not isinstance(got, Tensor):
            raise ExerciseFailed(f"return a torch.Tensor, not a {type(got).__name__}.")
        expected = reference.sinusoidal_positions(n_positions, d_model, base)
        _diagnose_sinusoids(got, n_positions, d_model, base)
        expect_close(got.float(), expected, f"the table for n_positions={n_positions}, "
                     f"d_model={d_model}, base={base:g}", atol=1e-5)
    return (f"Its slowest pair for d_model=16 has a wavelength of "
            f"2 pi 10000^(14/16) = {2 * math.pi * 10000 ** (14 / 16):,.0f} positions.")


# --- the core exercise: one training step of the word-vector model -----------------------------

def training_step_variant(embedding: torch.nn.Embedding, predict_neighbour: torch.nn.Linear,
                          optimizer: torch.optim.Optimizer, pair_share: Tensor, *, zero_grad: bool = True,
                          reduce: str = "sum", sign: float = -1.0, log: bool = True, dim: int = -1,
                          step: bool = True) -> float:
    """One step of the notebook's word-vector training, right by default, or with a usual slip."""
    every_word = torch.arange(pair_share.shape[0])
    logits = predict_neighbour(embedding(every_word))                              # (V, V)
    scores = torch.log_softmax(logits, dim=dim) if log else torch.softmax(logits, dim=dim)
    picked = pair_share * scores
    loss = sign * (picked.sum() if reduce == "sum" else picked.mean())
    if zero_grad:
        optimizer.zero_grad()
    loss.backward()
    if step:
        optimizer.step()
    return loss.item()


def course_training_step(embedding: torch.nn.Embedding, predict_neighbour: torch.nn.Linear,
                         optimizer: torch.optim.Optimizer, pair_share: Tensor) -> float:
    """The course's training step, standing in for the exercise until it passes its check."""
    return training_step_variant(embedding, predict_neighbour, optimizer, pair_share)


STEP_SLIPS = {
    "never clears the gradients: call optimizer.zero_grad() before loss.backward(), or each "
    "step adds the old gradients to the new": {"zero_grad": False},
    "averages over all V x V entries: the pair shares already sum to 1, so the loss is their "
    "weighted sum": {"reduce": "mean"},
    "has the sign flipped: the loss is minus the log-probability, so that lowering it raises "
    "the probability of real neighbours": {"sign": 1.0},
    "weights the probabilities, not their logarithm: the cross-entropy uses log_softmax": {"log": False},
    "normalises over dim=0: each word's row (dim=-1) is a distribution over its neighbours": {"dim": 0},
    "never changes the parameters: call optimizer.step() after loss.backward()": {"step": False},
}


def _word_model(seed: int, vocab_size: int, d_model: int) -> tuple[Any, Any, Any, Tensor]:
    """A small embedding, its neighbour predictor, their Adam and a (V, V) table of pair shares."""
    with torch.random.fork_rng():  # leave the notebook's random numbers as they were
        torch.manual_seed(seed)
        embedding = torch.nn.Embedding(vocab_size, d_model, dtype=torch.float64)
        predict = torch.nn.Linear(d_model, vocab_size, dtype=torch.float64)
        counts = torch.randint(0, 5, (vocab_size, vocab_size)).double()
    counts = counts + counts.T + torch.eye(vocab_size)  # symmetric, and no word without a neighbour
    optimizer = torch.optim.Adam([*embedding.parameters(), *predict.parameters()], lr=0.05)
    return embedding, predict, optimizer, counts / counts.sum()


def _run_steps(step: Callable[..., Any], seed: int, n_steps: int = 3) -> tuple[list[float], Tensor]:
    embedding, predict, optimizer, share = _word_model(seed, 6, 3)
    losses = []
    for _ in range(n_steps):
        loss = step(embedding, predict, optimizer, share)
        losses.append(float(loss.detach() if isinstance(loss, Tensor) else loss))
    return losses, embedding.weight.detach().clone()


@exercise(hint="Score every word's neighbours with log_softmax over each row, weight each (word, "
               "neighbour) entry by its share and sum, negate; then zero_grad, backward, step.",
          task="Write training_step(embedding, predict_neighbour, optimizer, pair_share) that runs "
               "one step of training and returns the loss as a float. The check runs three steps "
               "from the same start as the course's step and compares the losses and the vectors.")
def training_step(student: Callable[..., Any]) -> str:
    for seed in (0,):
        got = _run_steps(student, seed)
        want_losses, want_weight = _run_steps(training_step_variant, seed)
        same_losses = torch.allclose(torch.tensor(got[0]), torch.tensor(want_losses), rtol=1e-9, atol=1e-12)
        if not (same_losses and torch.allclose(got[1], want_weight, atol=1e-9)):
            for slip, knobs in STEP_SLIPS.items():
                losses, weight = _run_steps(lambda *a, knobs=knobs: training_step_variant(*a, **knobs), seed)
                if torch.allclose(torch.tensor(got[0]), torch.tensor(losses)) and torch.allclose(got[1], weight):
                    raise ExerciseFailed(f"your step {slip}.")
        if not same_losses:
            raise ExerciseFailed(f"over three steps your losses are {[round(g, 6) for g in got[0]]}, expected "
                                 f"{[round(w, 6) for w in want_losses]}.")
        expect_close(got[1], want_weight, "the word vectors after three steps", atol=1e-9)
    return "The notebook's training now runs on your step."
