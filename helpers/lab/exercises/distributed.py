"""Exercises of notebook 11 (beyond one machine): the ring all-reduce on worker processes and
its bytes, the gradient all-reduce of data parallelism, an MLP's weights split for tensor
parallelism, FSDP's gradient piece, the 1F1B order and one ring-attention merge.

Each checker raises `ExerciseFailed(what is wrong, fix=how to fix it in words)`."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from helpers.lab.exercises import (
    ExerciseFailed,
    exercise,
    expect_close,
    hidden_round,
    reseed,
    seeded,
)
from helpers.lab.exercises._ranks import ThreadRing, is_stub, run_on_three, run_two_ranks
from helpers.model.gpt import GPT, GPTConfig
from helpers.scale.workers import ring_all_reduce_bytes


@exercise(hint="Count the steps of the two phases of the ring and the size of the one chunk a rank "
               "sends at each step, then multiply.",
          task="Write ring_bytes(n_bytes, world_size): the bytes one rank sends in a ring "
               "all-reduce of n_bytes. The check tries 1 to 8 ranks, one rank included.")
def ring_bytes(student: Callable[[float, int], float]) -> str:
    cases = ((1000.0, 2), (497_758_208.0, 8), (12.0, 3), (5e9, 1))
    if hidden_round():  # a size and a number of ranks drawn from the hidden seed
        n_bytes = float(torch.randint(3, 10**9, (1,), generator=seeded(30)))
        cases = ((n_bytes, int(torch.randint(3, 65, (1,), generator=seeded(31)))),) + cases
    for n_bytes, world_size in cases:
        got = student(n_bytes, world_size)
        expected = ring_all_reduce_bytes(n_bytes, world_size)
        if not isinstance(got, int | float) or not math.isclose(float(got), expected, rel_tol=1e-9, abs_tol=1e-9):
            if isinstance(got, int | float) and math.isclose(float(got), expected / 2, rel_tol=1e-9):
                raise ExerciseFailed(f"ring_bytes({n_bytes:g}, {world_size}) gave {got}, half the answer.",
                                     fix="you counted the reduce-scatter only; the all-gather phase "
                                         "sends as much again.")
            if isinstance(got, int | float) and world_size > 1 and math.isclose(float(got), 2 * n_bytes):
                raise ExerciseFailed(f"ring_bytes({n_bytes:g}, {world_size}) gave 2 x n_bytes, as if "
                                     "each step sent the whole tensor.",
                                     fix="in each phase a rank sends p - 1 pieces of one p-th of the "
                                         "tensor each, not the whole tensor.")
            raise ExerciseFailed(f"ring_bytes({n_bytes:g}, {world_size}) gave {got!r}, expected {expected:g}.")
    return "Right: almost 2 x the gradient's bytes per rank, however many ranks share the work."


def _two_replicas() -> tuple[GPT, GPT, GPT]:
    """A tiny tied GPT, its twin, and a copy with the whole batch's gradient for reference."""
    config = GPTConfig(vocab_size=16, context_length=8, n_layers=1, n_heads=2, d_model=16)
    reseed(0)
    models = [GPT(config) for _ in range(3)]
    for other in models[1:]:
        other.load_state_dict(models[0].state_dict())
    ids = torch.randint(0, config.vocab_size, (4, config.context_length + 1), generator=seeded(1))
    for model, rows in zip(models, (ids[:2], ids[2:], ids), strict=True):
        logits = model(rows[:, :-1])
        F.cross_entropy(logits.flatten(0, 1), rows[:, 1:].flatten()).backward()
    return models[0], models[1], models[2]


@exercise(hint="Go through the model's parameters (a tied matrix is listed once): sum each "
               "gradient over the ranks with the all_reduce you are given, then divide it by the "
               "number of ranks.",
          task="Write average_gradients(model, all_reduce, world_size): afterwards every rank's "
               "p.grad must be the mean over the ranks. The check runs two ranks at once on a "
               "tiny GPT with a tied embedding and compares with the whole batch's gradient.")
def average_gradients(student: Callable[[nn.Module, Callable[[Tensor], None], int], None]) -> str:
    rank0, rank1, whole = _two_replicas()
    ring = ThreadRing((rank0, rank1))
    run_two_ranks(student, (rank0, rank1), ring)
    for rank in (0, 1):
        calls = ring.calls[rank]
        twice = sorted({name for name in calls if calls.count(name) > 1})
        if twice:
            raise ExerciseFailed(f"{twice[0]}'s gradient was all-reduced {calls.count(twice[0])} times "
                                 "(a tied matrix reached twice?).",
                                 fix="reduce each tensor of model.parameters() exactly once; that "
                                     "list holds a tied matrix once.")
    for (name, p), q in zip(rank0.named_parameters(), whole.parameters(), strict=True):
        if name not in ring.calls[0]:
            raise ExerciseFailed(f"the gradient of {name} was never all-reduced.",
                                 fix="go through every parameter of the model, not only some.")
        if not torch.allclose(p.grad, q.grad, atol=1e-6):
            if torch.allclose(p.grad, 2 * q.grad, atol=1e-6):
                raise ExerciseFailed(f"{name}.grad is the sum over the ranks, not the mean.",
                                     fix="divide by world_size for the mean.")
            if torch.allclose(p.grad, q.grad / 2, atol=1e-6):
                raise ExerciseFailed(f"{name}.grad is divided by world_size twice (before and "
                                     "after the sum).", fix="divide once, before or after the sum.")
        expect_close(p.grad, q.grad, f"{name}.grad after averaging")
    return "Every rank now holds the whole batch's gradient: the same step everywhere."


def _hidden_units(got: Tensor, full: Tensor, what: str) -> list[int]:
    """Which rows of `full` (hidden, D) the rows of `got` are; fails if some row is none of them."""
    distance = torch.cdist(got.double(), full.double())  # (k, hidden)
    best = distance.min(dim=1)
    if (best.values > 1e-6).any():
        raise ExerciseFailed(f"{what} holds a row that is no row of up_weight.",
                             fix="each rank keeps whole hidden units: their rows of up_weight as "
                                 "they are, not slices of rows or sums.")
    return best.indices.tolist()


@exercise(hint="Each rank takes an equal block of the hidden units: their rows of the up "
               "projection and entries of its bias, and the same units' columns of the down "
               "projection (any fair split works if all three use the same units).",
          task="Write split_mlp(up_weight, up_bias, down_weight, rank, world_size) returning the "
               "rank's (up_weight, up_bias, down_weight). The check adds the ranks' partial "
               "outputs for 2 and 3 ranks and compares with the whole MLP.")
def split_mlp(student: Callable[[Tensor, Tensor, Tensor, int, int], tuple[Tensor, Tensor, Tensor]]) -> str:
    reseed(0)
    mlp = nn.Sequential(nn.Linear(6, 12), nn.GELU(), nn.Linear(12, 6))
    up, bias, down = mlp[0].weight.detach(), mlp[0].bias.detach(), mlp[2].weight.detach()
    x = torch.randn(3, 6)
    for world_size in (2, 3):
        total, seen, k = torch.zeros(3, 6), [], 12 // world_size
        for rank in range(world_size):
            got = student(up.clone(), bias.clone(), down.clone(), rank, world_size)
            if not isinstance(got, tuple | list) or len(got) != 3 \
                    or not all(isinstance(t, Tensor) for t in got):
                raise ExerciseFailed(f"split_mlp gave {type(got).__name__}, not three tensors.",
                                     fix="return the tuple (up_weight, up_bias, down_weight) of this "
                                         "rank.")
            up_w, up_b, down_w = got
            where = f"rank {rank} of {world_size}"
            if tuple(up_w.shape) != (k, 6) or tuple(up_b.shape) != (k,):
                raise ExerciseFailed(f"{where}: up_weight has shape {tuple(up_w.shape)} and up_bias "
                                     f"{tuple(up_b.shape)}, expected ({k}, 6) and ({k},).",
                                     fix=f"give each rank {k} of the 12 hidden units: whole rows of "
                                         "up_weight, the matching entries of up_bias.")
            if down_w.dim() == 2 and down_w.shape[1] == 12 and down_w.shape[0] < 6:
                raise ExerciseFailed(f"{where}: down_weight has shape {tuple(down_w.shape)}: you split "
                                     "its rows (the outputs).",
                                     fix="split the columns of down_weight, the hidden units, and "
                                         "keep all its rows.")
            if tuple(down_w.shape) != (6, k):
                raise ExerciseFailed(f"{where}: down_weight has shape {tuple(down_w.shape)}, expected (6, {k}).",
                                     fix="keep all of down_weight's rows and the columns of this "
                                         "rank's hidden units.")
            units = _hidden_units(up_w, up, f"{where}'s up_weight")
            expect_close(up_b, bias[units], f"{where}'s up_bias (the entries of its hidden units)")
            if not torch.allclose(down_w, down[:, units], atol=1e-6):
                raise ExerciseFailed(f"{where}: down_weight's columns are not the hidden units of its "
                                     f"up_weight rows ({units}).",
                                     fix="up and down must use the same units: take the same range "
                                         "of indices from both.")
            seen += units
            total += F.gelu(x @ up_w.T + up_b) @ down_w.T
        if sorted(seen) != list(range(12)):
            twice = sorted({u for u in seen if seen.count(u) > 1})
            raise ExerciseFailed(f"with {world_size} ranks, hidden units {twice} go to more than one "
                                 "rank (and others to none).",
                                 fix="let the rank number decide which block of units it takes, so "
                                     "that the ranks share the units out.")
        with torch.no_grad():
            expect_close(total + mlp[2].bias.detach(), mlp(x), f"the sum of the {world_size} ranks' outputs")
    return "The ranks' partial outputs add up to the MLP's output: one all-reduce per MLP."


# --- part two: the 1F1B order, one ring-attention merge ---------------------------------------


def _warm_up(ops: list) -> int:
    """How many forwards a rank runs before its first backward."""
    kinds = [kind for kind, _ in ops]
    return kinds.index("B") if "B" in kinds else len(kinds)


def _in_flight(ops: list) -> int:
    """The most micro-batches whose activations a rank holds at once (forwards not yet backed)."""
    alive = peak = 0
    for kind, _ in ops:
        alive += 1 if kind == "F" else -1
        peak = max(peak, alive)
    return peak


@exercise(hint="A rank first fills the pipe with as many forwards as there are stages after it "
               "(never more than the micro-batches), then alternates the next forward with the "
               "oldest backward, and ends with the backwards that are left.",
          task="Write one_f_one_b(stages, micro_batches): for each rank, the list of ('F', i) and "
               "('B', i) it runs in a 1F1B step. The check compares sizes from 1 to 4 stages.",
          points=3)
def one_f_one_b(student: Callable[[int, int], list]) -> str:
    from helpers.scale.pipeline import gpipe_order, one_f_one_b_order, timeline, timeline_bubble

    cases = ((2, 4), (4, 8), (4, 2), (3, 1), (1, 3))
    if hidden_round():  # more micro-batches than the visible check tries, drawn from the hidden seed
        cases = (tuple(torch.randint(2, 5, (1,), generator=seeded(32)).tolist()
                       + torch.randint(5, 13, (1,), generator=seeded(33)).tolist()),) + cases
    for stages, m in cases:
        got = student(stages, m)
        expected = one_f_one_b_order(stages, m)
        if not isinstance(got, list) or len(got) != stages or not all(isinstance(ops, list) for ops in got):
            raise ExerciseFailed(f"one_f_one_b({stages}, {m}) gave {got!r:.80}, expected a list of "
                                 f"{stages} lists, one per rank.",
                                 fix="build one list of operations for each rank and return the list "
                                     "of those lists.")
        got = [[(str(kind), int(i)) for kind, i in ops] for ops in got]
        if got == expected:
            continue
        if got == gpipe_order(stages, m):
            raise ExerciseFailed(f"one_f_one_b({stages}, {m}) is GPipe's order (all forwards, then "
                                 "all backwards).", fix="1F1B starts the backwards as soon as the "
                                                        "warm-up forwards are done.")
        try:
            events = timeline(got)
        except ValueError as error:
            raise ExerciseFailed(f"one_f_one_b({stages}, {m}): {error}",
                                 fix="every rank runs each forward and each backward once, a "
                                     "micro-batch's forward before its backward.") from None
        wrong = next(r for r in range(stages) if got[r] != expected[r])
        warm, want = _warm_up(got[wrong]), _warm_up(expected[wrong])
        idle, best = timeline_bubble(events), timeline_bubble(timeline(expected))
        if idle > best + 1e-9:
            raise ExerciseFailed(f"one_f_one_b({stages}, {m}): the ranks idle {idle:.0%} of the step, "
                                 f"1F1B only {best:.0%}; rank {wrong} runs {got[wrong]}, expected "
                                 f"{expected[wrong]}: without a warm-up, forwards wait for backwards.",
                                 fix="before its first backward, rank r runs one forward for each "
                                     "stage after it, so that the last stage always has work.")
        if warm != want:
            raise ExerciseFailed(f"one_f_one_b({stages}, {m}): rank {wrong} runs {warm} forwards before "
                                 f"its first backward, 1F1B {want}: its warm-up is off, so it holds "
                                 f"{_in_flight(got[wrong])} micro-batches at once instead of at most "
                                 f"{_in_flight(expected[wrong])}.",
                                 fix="the warm-up of a rank is one forward for each stage after "
                                     "it (never more than the micro-batches); its first backward "
                                     "comes right after the next forward.")
        raise ExerciseFailed(f"one_f_one_b({stages}, {m}) rank {wrong} runs {got[wrong]}, expected "
                             f"{expected[wrong]} (it holds {_in_flight(got[wrong])} micro-batches at "
                             f"once; 1F1B holds at most {_in_flight(expected[wrong])}).",
                             fix="after the warm-up, alternate the next forward with the oldest "
                                 "backward, then run the backwards left in order.")
    return "Right: the same bubble as GPipe, but rank r keeps at most p - r micro-batches, not m."


@exercise(hint="The merged log-sum-exp is the log of the sum of the two denominators; each partial "
               "output then counts with its own denominator's share of that sum.",
          task="Write ring_merge(out, lse, o_b, lse_b): two attentions of the same queries over "
               "disjoint blocks of keys -> (the attention over both, its log-sum-exp). The check "
               "compares with attention over all the keys at once.")
def ring_merge(student: Callable[..., tuple[Tensor, Tensor]]) -> str:
    from helpers.scale.ring_attention import block_attention

    generator = seeded(0)
    q, k, v = (torch.randn(1, 2, 4, 8, generator=generator, dtype=torch.float64) for _ in range(3))
    k[:, :, 2:] += 3.0  # the second block dominates: a merge that ignores the weights fails
    parts = [block_attention(q, k[:, :, s], v[:, :, s], diagonal=False) for s in (slice(0, 2), slice(2, 4))]
    got = student(*parts[0], *parts[1])
    if not (isinstance(got, tuple | list) and len(got) == 2):
        raise ExerciseFailed(f"ring_merge gave {type(got).__name__}, expected a pair (out, lse).",
                             fix="return the merged output and the merged log-sum-exp, in that order.")
    out, lse = got
    expected = F.scaled_dot_product_attention(q, k, v)
    true_lse = (q @ k.transpose(-2, -1) / 8 ** 0.5).logsumexp(-1)
    if isinstance(lse, Tensor) and lse.shape == true_lse.shape \
            and torch.allclose(lse, torch.maximum(parts[0][1], parts[1][1])):
        raise ExerciseFailed("lse has the right shape but it is the larger of the two log-sum-exps, "
                             "not the log of their summed denominators.",
                             fix="add the two denominators (each the exponential of its log-sum-exp) "
                                 "and take the log, in a way that cannot overflow.")
    expect_close(lse, true_lse, "lse", atol=1e-9)
    if torch.allclose(out, parts[0][0] + parts[1][0]):
        raise ExerciseFailed("out is the plain sum of the two partial outputs.",
                             fix="each part must be weighted by its share of the merged softmax "
                                 "denominator: the exponential of its log-sum-exp minus the merged one.")
    expect_close(out, expected, "out", atol=1e-9)
    return "Right: one step of the ring, and notebook 8's online softmax across processes."


@exercise(hint="Cut your tensor into one chunk per rank. In the reduce-scatter phase, at each step "
               "send one chunk to the next rank without waiting, receive the chunk one place further "
               "back from the previous rank and add it to yours; in the all-gather phase the same "
               "walk one place ahead, keeping what arrives. Join the chunks at the end.",
          task="Write my_ring_all_reduce(rank, world_size, tensors) with dist.isend and dist.recv only: "
               "every rank returns the sum of all ranks' tensors (rank r starts from tensors[r]). "
               "The check runs it on 3 worker processes with 7 values each (uneven chunks).",
          time_limit=240.0, points=3)
def ring_all_reduce(student: Callable[[int, int, list[Tensor]], Tensor]) -> str:
    from helpers.scale.cell_functions import names_read
    if is_stub(student):
        raise NotImplementedError
    answer = getattr(student, "__wrapped__", student)  # check hands the answer wrapped (watch.py)
    if "all_reduce" in names_read(getattr(answer, "__code__", compile("", "", "exec"))):
        raise ExerciseFailed("your function calls an all_reduce, the collective this exercise builds.",
                             fix="build it from point-to-point sends and receives with your "
                                 "neighbours only.")
    tensors = [torch.arange(7.0) * (rank + 1) + rank for rank in range(3)]
    if hidden_round():  # other values, drawn from the hidden seed
        tensors = [torch.randint(-50, 50, (7,), generator=seeded(34 + rank)).float() for rank in range(3)]
    total = sum(tensors)
    results = run_on_three(student, tensors, "some rank waits for a message that never comes: every "
                            "send needs its receive on the neighbour, in the same order, and a send "
                            "that does not wait (isend) lets every rank go on to its receive.")
    for rank, got in enumerate(results):
        if not isinstance(got, Tensor) or got.shape != total.shape:
            raise ExerciseFailed(f"rank {rank} returned {getattr(got, 'shape', type(got).__name__)}, "
                                 f"expected a tensor of shape {tuple(total.shape)}.",
                                 fix="join the chunks again and give the result the input's shape.")
        if torch.allclose(got, total):
            continue
        if torch.allclose(got, tensors[rank]):
            raise ExerciseFailed(f"rank {rank} returned its own tensor unchanged: nothing was added.",
                                 fix="add each chunk that arrives in the reduce-scatter phase to "
                                     "your own chunk of the same index.")
        if torch.allclose(got, total / 3):
            raise ExerciseFailed(f"rank {rank} returned the mean: an all-reduce sums.",
                                 fix="do not divide; data parallelism divides by world_size "
                                     "afterwards, outside the all-reduce.")
        owned = (rank + 1) % 3
        if torch.allclose(got.tensor_split(3)[owned], total.tensor_split(3)[owned]):
            raise ExerciseFailed(f"rank {rank} holds the full sum only in chunk {owned}, the one the "
                                 "reduce-scatter finishes on it: the all-gather phase is missing, or "
                                 "it adds the chunks it receives instead of keeping them.",
                                 fix="after the reduce-scatter, pass the finished chunks once more "
                                     "round the ring, replacing yours with what arrives.")
        raise ExerciseFailed(f"rank {rank} returned {got.tolist()}, expected {total.tolist()}.")
    return "Every rank holds the sum, and each sent 2 (p - 1) / p of the tensor: the ring all-reduce."


@exercise(hint="Cut your gradient into one equal piece per rank and hand the pieces to the "
               "collective that gives each rank the sum of its own piece only, into an empty "
               "tensor of one piece's size; then divide by the number of ranks.",
          task="Write my_grad_piece(rank, world_size, grads): rank r's flat gradient is grads[r] (P,); "
               "return (P / world_size,), this rank's piece of the mean over ranks, with one "
               "collective. The check runs it on 3 worker processes with 9 values each.",
          time_limit=240.0)
def fsdp_grad_piece(student: Callable[[int, int, list[Tensor]], Tensor]) -> str:
    if is_stub(student):
        raise NotImplementedError
    grads = [torch.arange(9.0) * (rank + 1) + 10 * rank for rank in range(3)]
    if hidden_round():  # other values, drawn from the hidden seed
        grads = [torch.randint(-50, 50, (9,), generator=seeded(37 + rank)).float() for rank in range(3)]
    mean = sum(grads) / 3
    results = run_on_three(student, grads, "every rank must call the same collective, with "
                            "pieces of the same size.")
    for rank, got in enumerate(results):
        want = mean.chunk(3)[rank]
        if not isinstance(got, Tensor):
            raise ExerciseFailed(f"rank {rank} returned {type(got).__name__}, expected a tensor.")
        if got.shape == mean.shape and torch.allclose(got, mean):
            raise ExerciseFailed(f"rank {rank} returned the whole mean (9 values), not its piece.",
                                 fix="FSDP keeps only its own piece, that is what saves the memory: "
                                     "use the collective that delivers one piece to each rank.")
        if got.shape != want.shape:
            raise ExerciseFailed(f"rank {rank} returned shape {tuple(got.shape)}, expected "
                                 f"{tuple(want.shape)}: one of the 3 pieces.",
                                 fix="cut the gradient into as many equal pieces as there are ranks.")
        if torch.allclose(got, want):
            continue
        if torch.allclose(got, want * 3):
            raise ExerciseFailed(f"rank {rank} returned the sum of its piece, not the mean.",
                                 fix="divide by world_size (the loss is the mean over all ranks' "
                                     "batches).")
        if torch.allclose(got, grads[rank].chunk(3)[rank]) or torch.allclose(got, grads[rank].chunk(3)[rank] / 3):
            raise ExerciseFailed(f"rank {rank} returned its own gradient's piece: the other ranks' "
                                 "gradients never arrived.", fix="a collective is needed, called by "
                                                                 "every rank with its pieces.")
        other = next((r for r in range(3) if r != rank and torch.allclose(got, mean.chunk(3)[r])), None)
        if other is not None:
            raise ExerciseFailed(f"rank {rank} returned piece {other}, another rank's.",
                                 fix="rank r keeps piece r: hand the pieces to the collective in "
                                     "rank order.")
        raise ExerciseFailed(f"rank {rank} returned {got.tolist()}, expected {want.tolist()}.")
    return "Each rank holds its piece of the mean gradient: FSDP's reduce-scatter, 1 / p of an all-reduce's result."
