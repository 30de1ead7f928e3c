"""Exercises of notebook 11 (beyond one machine): a ring all-reduce's bytes, the gradient
all-reduce of data parallelism, and an MLP's weights split for tensor parallelism."""

from __future__ import annotations

import math
import threading
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from helpers.lab.exercises import ExerciseFailed, exercise, expect_close
from helpers.model.gpt import GPT, GPTConfig
from helpers.scale.workers import ring_all_reduce_bytes


@exercise(hint="Reduce-scatter and all-gather each take p - 1 steps; in each step a rank sends one "
               "p-th of the tensor. Total: 2 (p - 1) / p x n_bytes.",
          task="Write ring_bytes(n_bytes, world_size): the bytes one rank sends in a ring "
               "all-reduce of n_bytes. The check tries 1 to 8 ranks, one rank included.")
def ring_bytes(student: Callable[[float, int], float]) -> str:
    for n_bytes, world_size in ((1000.0, 2), (497_758_208.0, 8), (12.0, 3), (5e9, 1)):
        got = student(n_bytes, world_size)
        expected = ring_all_reduce_bytes(n_bytes, world_size)
        if not isinstance(got, int | float) or not math.isclose(float(got), expected, rel_tol=1e-9, abs_tol=1e-9):
            if isinstance(got, int | float) and math.isclose(float(got), expected / 2, rel_tol=1e-9):
                raise ExerciseFailed(f"ring_bytes({n_bytes:g}, {world_size}) gave {got}, half the answer: "
                                     "you counted the reduce-scatter; the all-gather sends as much again.")
            if isinstance(got, int | float) and world_size > 1 and math.isclose(float(got), 2 * n_bytes):
                raise ExerciseFailed(f"ring_bytes({n_bytes:g}, {world_size}) gave 2 x n_bytes: in each "
                                     "phase a rank sends p - 1 pieces of n_bytes / p, not the whole tensor.")
            raise ExerciseFailed(f"ring_bytes({n_bytes:g}, {world_size}) gave {got!r}, expected {expected:g}.")
    return "Right: almost 2 x the gradient's bytes per rank, however many ranks share the work."


def _two_replicas() -> tuple[GPT, GPT, GPT]:
    """A tiny tied GPT, its twin, and a copy with the whole batch's gradient for reference."""
    config = GPTConfig(vocab_size=16, context_length=8, n_layers=1, n_heads=2, d_model=16)
    torch.manual_seed(0)
    models = [GPT(config) for _ in range(3)]
    for other in models[1:]:
        other.load_state_dict(models[0].state_dict())
    ids = torch.randint(0, config.vocab_size, (4, config.context_length + 1), generator=torch.Generator().manual_seed(1))
    for model, rows in zip(models, (ids[:2], ids[2:], ids), strict=True):
        logits = model(rows[:, :-1])
        F.cross_entropy(logits.flatten(0, 1), rows[:, 1:].flatten()).backward()
    return models[0], models[1], models[2]


class _Ring:
    """Two ranks in two threads and an in-place sum between them, as `dist.all_reduce` does: each
    rank blocks in all_reduce until the other rank has called it too."""

    def __init__(self, models: tuple[nn.Module, nn.Module]) -> None:
        self.grads = [{id(p.grad): name for name, p in m.named_parameters()} for m in models]
        self.barrier = threading.Barrier(2, timeout=5.0)
        self.slots: list[Tensor | None] = [None, None]
        self.calls: list[list[str]] = [[], []]

    def all_reduce(self, rank: int) -> Callable[[Tensor], None]:
        def all_reduce(tensor: Tensor) -> None:
            if not isinstance(tensor, Tensor) or id(tensor) not in self.grads[rank]:
                raise ExerciseFailed("all_reduce was called on something that is not a parameter's "
                                     ".grad (all-reduce p.grad, not p).")
            self.calls[rank].append(self.grads[rank][id(tensor)])
            self.slots[rank] = tensor.detach().clone()
            try:
                self.barrier.wait()  # both ranks have put in their tensor
                total = self.slots[0] + self.slots[1]
                self.barrier.wait()  # both have read: the slots may be reused
            except threading.BrokenBarrierError:
                raise ExerciseFailed("the two ranks called all_reduce a different number of times: "
                                     "every rank must reduce the same tensors in the same order.") from None
            tensor.copy_(total)
        return all_reduce


def _run_ranks(student: Callable, models: tuple[nn.Module, nn.Module], ring: _Ring) -> None:
    """student(model_r, all_reduce_r, 2) on both ranks at once; re-raises the first error."""
    errors: list[BaseException] = []

    def rank_main(rank: int) -> None:
        try:
            student(models[rank], ring.all_reduce(rank), 2)
        except BaseException as error:  # noqa: BLE001 - handed to the checking thread
            errors.append(error)
            ring.barrier.abort()

    threads = [threading.Thread(target=rank_main, args=(r,), daemon=True) for r in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20.0)
    real = [e for e in errors if not isinstance(e, ExerciseFailed)] or errors
    if real:
        raise real[0]


@exercise(hint="Every rank calls all_reduce(p.grad) once for each p in model.parameters() (which "
               "lists a tied matrix once) and divides by world_size, before or after the sum.",
          task="Write average_gradients(model, all_reduce, world_size): afterwards every rank's "
               "p.grad must be the mean over the ranks. The check runs two ranks at once on a "
               "tiny GPT with a tied embedding and compares with the whole batch's gradient.")
def average_gradients(student: Callable[[nn.Module, Callable[[Tensor], None], int], None]) -> str:
    rank0, rank1, whole = _two_replicas()
    ring = _Ring((rank0, rank1))
    _run_ranks(student, (rank0, rank1), ring)
    for rank in (0, 1):
        calls = ring.calls[rank]
        twice = sorted({name for name in calls if calls.count(name) > 1})
        if twice:
            raise ExerciseFailed(f"{twice[0]}'s gradient was all-reduced {calls.count(twice[0])} times "
                                 "(a tied matrix reached twice?): reduce each tensor of "
                                 "model.parameters() exactly once.")
    for (name, p), q in zip(rank0.named_parameters(), whole.parameters(), strict=True):
        if name not in ring.calls[0]:
            raise ExerciseFailed(f"the gradient of {name} was never all-reduced.")
        if not torch.allclose(p.grad, q.grad, atol=1e-6):
            if torch.allclose(p.grad, 2 * q.grad, atol=1e-6):
                raise ExerciseFailed(f"{name}.grad is the sum over the ranks: divide by world_size "
                                     "for the mean.")
            if torch.allclose(p.grad, q.grad / 2, atol=1e-6):
                raise ExerciseFailed(f"{name}.grad is divided by world_size twice (before and "
                                     "after the sum): once is the mean.")
        expect_close(p.grad, q.grad, f"{name}.grad after averaging")
    return "Every rank now holds the whole batch's gradient: the same step everywhere."


def _hidden_units(got: Tensor, full: Tensor, what: str) -> list[int]:
    """Which rows of `full` (hidden, D) the rows of `got` are; fails if some row is none of them."""
    distance = torch.cdist(got.double(), full.double())  # (k, hidden)
    best = distance.min(dim=1)
    if (best.values > 1e-6).any():
        raise ExerciseFailed(f"{what} holds a row that is no row of up_weight: each rank keeps whole "
                             "hidden units, their rows of up_weight as they are.")
    return best.indices.tolist()


@exercise(hint="Rank r takes k = hidden / world_size hidden units: those rows of up_weight and "
               "entries of up_bias, and the same units' columns of down_weight (any split of the "
               "units works, if all three use the same units).",
          task="Write split_mlp(up_weight, up_bias, down_weight, rank, world_size) returning the "
               "rank's (up_weight, up_bias, down_weight). The check adds the ranks' partial "
               "outputs for 2 and 3 ranks and compares with the whole MLP.")
def split_mlp(student: Callable[[Tensor, Tensor, Tensor, int, int], tuple[Tensor, Tensor, Tensor]]) -> str:
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(6, 12), nn.GELU(), nn.Linear(12, 6))
    up, bias, down = mlp[0].weight.detach(), mlp[0].bias.detach(), mlp[2].weight.detach()
    x = torch.randn(3, 6)
    for world_size in (2, 3):
        total, seen, k = torch.zeros(3, 6), [], 12 // world_size
        for rank in range(world_size):
            got = student(up.clone(), bias.clone(), down.clone(), rank, world_size)
            if not isinstance(got, tuple | list) or len(got) != 3 \
                    or not all(isinstance(t, Tensor) for t in got):
                raise ExerciseFailed("split_mlp should return three tensors (up_weight, up_bias, down_weight).")
            up_w, up_b, down_w = got
            where = f"rank {rank} of {world_size}"
            if tuple(up_w.shape) != (k, 6) or tuple(up_b.shape) != (k,):
                raise ExerciseFailed(f"{where}: up_weight has shape {tuple(up_w.shape)} and up_bias "
                                     f"{tuple(up_b.shape)}, expected ({k}, 6) and ({k},): "
                                     f"{k} of the 12 hidden units each.")
            if down_w.dim() == 2 and down_w.shape[1] == 12 and down_w.shape[0] < 6:
                raise ExerciseFailed(f"{where}: down_weight has shape {tuple(down_w.shape)}: you split "
                                     "its rows (the outputs). Split its columns, the hidden units.")
            if tuple(down_w.shape) != (6, k):
                raise ExerciseFailed(f"{where}: down_weight has shape {tuple(down_w.shape)}, expected (6, {k}).")
            units = _hidden_units(up_w, up, f"{where}'s up_weight")
            expect_close(up_b, bias[units], f"{where}'s up_bias (the entries of its hidden units)")
            if not torch.allclose(down_w, down[:, units], atol=1e-6):
                raise ExerciseFailed(f"{where}: down_weight's columns are not the hidden units of its "
                                     f"up_weight rows ({units}): up and down must use the same units.")
            seen += units
            total += F.gelu(x @ up_w.T + up_b) @ down_w.T
        if sorted(seen) != list(range(12)):
            twice = sorted({u for u in seen if seen.count(u) > 1})
            raise ExerciseFailed(f"with {world_size} ranks, hidden units {twice} go to more than one "
                                 "rank (and others to none): the ranks must share the units out.")
        with torch.no_grad():
            expect_close(total + mlp[2].bias.detach(), mlp(x), f"the sum of the {world_size} ranks' outputs")
    return "The ranks' partial outputs add up to the MLP's output: one all-reduce per MLP."


# --- part two: the 1F1B order, one ring-attention merge ---------------------------------------


def _in_flight(ops: list) -> int:
    """The most micro-batches whose activations a rank holds at once (forwards not yet backed)."""
    alive = peak = 0
    for kind, _ in ops:
        alive += 1 if kind == "F" else -1
        peak = max(peak, alive)
    return peak


@exercise(hint="Rank r first runs p - 1 - r forwards (no more than m), then alternates one forward "
               "and one backward (F of the next micro-batch, B of the oldest), then runs the "
               "backwards that are left.",
          task="Write one_f_one_b(stages, micro_batches): for each rank, the list of ('F', i) and "
               "('B', i) it runs in a 1F1B step. The check compares sizes from 1 to 4 stages.")
def one_f_one_b(student: Callable[[int, int], list]) -> str:
    from helpers.scale.pipeline import gpipe_order, one_f_one_b_order, timeline, timeline_bubble

    for stages, m in ((2, 4), (4, 8), (4, 2), (3, 1), (1, 3)):
        got = student(stages, m)
        expected = one_f_one_b_order(stages, m)
        if not isinstance(got, list) or len(got) != stages:
            raise ExerciseFailed(f"one_f_one_b({stages}, {m}) gave {got!r:.80}, expected a list of "
                                 f"{stages} lists, one per rank")
        got = [[(str(kind), int(i)) for kind, i in ops] for ops in got]
        if got == expected:
            continue
        if got == gpipe_order(stages, m):
            raise ExerciseFailed(f"one_f_one_b({stages}, {m}) is GPipe's order (all forwards, then "
                                 "all backwards): 1F1B starts backwards as soon as the warm-up is done.")
        try:
            events = timeline(got)
        except ValueError as error:
            raise ExerciseFailed(f"one_f_one_b({stages}, {m}): {error}") from None
        wrong = next(r for r in range(stages) if got[r] != expected[r])
        idle, best = timeline_bubble(events), timeline_bubble(timeline(expected))
        if idle > best + 1e-9:
            raise ExerciseFailed(f"one_f_one_b({stages}, {m}): the ranks idle {idle:.0%} of the step, "
                                 f"1F1B only {best:.0%}; rank {wrong} runs {got[wrong]}, expected "
                                 f"{expected[wrong]}: without a warm-up, forwards wait for backwards.")
        raise ExerciseFailed(f"one_f_one_b({stages}, {m}) rank {wrong} runs {got[wrong]}, expected "
                             f"{expected[wrong]} (it holds {_in_flight(got[wrong])} micro-batches at "
                             f"once; 1F1B holds at most {_in_flight(expected[wrong])}).")
    return "Right: the same bubble as GPipe, but rank r keeps at most p - r micro-batches, not m."


@exercise(hint="L = logaddexp(lse, lse_b) is the log of the merged denominator; each partial "
               "output is reweighted by its share of it: out * exp(lse - L) + o_b * exp(lse_b - L).",
          task="Write ring_merge(out, lse, o_b, lse_b): two attentions of the same queries over "
               "disjoint blocks of keys -> (the attention over both, its log-sum-exp). The check "
               "compares with attention over all the keys at once.")
def ring_merge(student: Callable[..., tuple[Tensor, Tensor]]) -> str:
    from helpers.scale.ring_attention import block_attention

    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 4, 8, generator=generator, dtype=torch.float64) for _ in range(3))
    k[:, :, 2:] += 3.0  # the second block dominates: a merge that ignores the weights fails
    parts = [block_attention(q, k[:, :, s], v[:, :, s], diagonal=False) for s in (slice(0, 2), slice(2, 4))]
    got = student(*parts[0], *parts[1])
    if not (isinstance(got, tuple | list) and len(got) == 2):
        raise ExerciseFailed(f"ring_merge gave {type(got).__name__}, expected a pair (out, lse)")
    out, lse = got
    expected = F.scaled_dot_product_attention(q, k, v)
    expect_close(lse, (q @ k.transpose(-2, -1) / 8 ** 0.5).logsumexp(-1), "lse", atol=1e-9)
    if torch.allclose(out, parts[0][0] + parts[1][0]):
        raise ExerciseFailed("out is o_a + o_b: each part must be weighted by its share of the merged "
                             "softmax denominator, exp(lse_part - L).")
    expect_close(out, expected, "out", atol=1e-9)
    return "Right: one step of the ring, and notebook 8's online softmax across processes."


def _is_stub(fn: Callable) -> bool:
    """True when fn's body (after its docstring) is only `raise NotImplementedError`: the untouched
    stub, recognised without starting any process."""
    import ast
    import inspect
    import textwrap
    try:
        body = ast.parse(textwrap.dedent(inspect.getsource(fn))).body[0].body
    except (OSError, TypeError, SyntaxError, IndexError, AttributeError):
        return False
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    return len(body) == 1 and isinstance(body[0], ast.Raise) and "NotImplementedError" in ast.unparse(body[0])


_POOL: list = []  # three workers kept for the checks of one session (started on first use)


def _three_workers():
    import atexit

    from helpers.scale.workers import Workers, sleep_on_rank
    if not _POOL:
        _POOL.append(Workers(3, timeout=30.0))
        atexit.register(_POOL[0].close)
    if not _POOL[0].processes:  # start them with time to spare: a busy machine starts slowly
        _POOL[0].run(sleep_on_rank, 0.0, timeout=180.0)
    return _POOL[0]


def _run_on_three(student: Callable, tensors: list[Tensor], on_timeout: str) -> list:
    """The student's function run on three workers; a stub, a crash or a hang as the exercise's verdict."""
    from helpers.scale.workers import WorkerFailed
    try:
        return _three_workers().run(student, tensors)
    except TimeoutError:
        raise ExerciseFailed(f"the ranks did not finish within 30 s: {on_timeout}") from None
    except WorkerFailed as failure:
        last = failure.worker_traceback.strip().splitlines()[-1]
        if last.startswith("NotImplementedError"):
            raise NotImplementedError from None
        raise ExerciseFailed(f"rank {failure.rank} raised {last}") from None


@exercise(hint="Cut your tensor into p chunks (tensor_split). Reduce-scatter, p - 1 steps: at step s "
               "send chunk (rank - s) % p to rank + 1 with dist.isend, dist.recv chunk (rank - s - 1) "
               "% p from rank - 1 and add it to yours. All-gather, p - 1 steps: send chunk (rank + 1 "
               "- s) % p, receive chunk (rank - s) % p and keep it. Return torch.cat of the chunks.",
          task="Write my_ring_all_reduce(rank, world_size, tensors) with dist.isend and dist.recv only: "
               "every rank returns the sum of all ranks' tensors (rank r starts from tensors[r]). "
               "The check runs it on 3 worker processes with 7 values each (uneven chunks).",
          time_limit=240.0)
def ring_all_reduce(student: Callable[[int, int, list[Tensor]], Tensor]) -> str:
    from helpers.scale.cell_functions import _names_read
    if _is_stub(student):
        raise NotImplementedError
    if "all_reduce" in _names_read(getattr(student, "__code__", compile("", "", "exec"))):
        raise ExerciseFailed("your function calls an all_reduce: the exercise is to build it from "
                             "point-to-point sends and receives.")
    tensors = [torch.arange(7.0) * (rank + 1) + rank for rank in range(3)]
    total = sum(tensors)
    results = _run_on_three(student, tensors, "some rank waits for a message that never comes (every "
                            "send needs its receive on the neighbour, in the same order; send with "
                            "dist.isend so that no rank blocks before receiving).")
    for rank, got in enumerate(results):
        if not isinstance(got, Tensor) or got.shape != total.shape:
            raise ExerciseFailed(f"rank {rank} returned {getattr(got, 'shape', type(got).__name__)}, "
                                 f"expected a tensor of shape {tuple(total.shape)}.")
        if torch.allclose(got, total):
            continue
        if torch.allclose(got, tensors[rank]):
            raise ExerciseFailed(f"rank {rank} returned its own tensor unchanged: nothing was added.")
        if torch.allclose(got, total / 3):
            raise ExerciseFailed(f"rank {rank} returned the mean: an all-reduce sums (data parallelism "
                                 "divides by world_size afterwards).")
        owned = (rank + 1) % 3
        if torch.allclose(got.tensor_split(3)[owned], total.tensor_split(3)[owned]):
            raise ExerciseFailed(f"rank {rank} holds the full sum only in chunk {owned}, the one the "
                                 "reduce-scatter finishes on it: the all-gather phase is missing, or "
                                 "it adds the chunks it receives instead of keeping them.")
        raise ExerciseFailed(f"rank {rank} returned {got.tolist()}, expected {total.tolist()}.")
    return "Every rank holds the sum, and each sent 2 (p - 1) / p of the tensor: the ring all-reduce."


@exercise(hint="Cut your flat gradient into p equal pieces (list(flat.chunk(p))), make an empty "
               "tensor like one piece, call dist.reduce_scatter(that, pieces): it receives piece "
               "`rank` summed over all ranks. Divide by world_size.",
          task="Write my_grad_piece(rank, world_size, grads): rank r's flat gradient is grads[r] (P,); "
               "return (P / world_size,), this rank's piece of the mean over ranks, with one "
               "collective. The check runs it on 3 worker processes with 9 values each.",
          time_limit=240.0)
def fsdp_grad_piece(student: Callable[[int, int, list[Tensor]], Tensor]) -> str:
    if _is_stub(student):
        raise NotImplementedError
    grads = [torch.arange(9.0) * (rank + 1) + 10 * rank for rank in range(3)]
    mean = sum(grads) / 3
    results = _run_on_three(student, grads, "every rank must call the same collective, with "
                            "pieces of the same size.")
    for rank, got in enumerate(results):
        want = mean.chunk(3)[rank]
        if not isinstance(got, Tensor):
            raise ExerciseFailed(f"rank {rank} returned {type(got).__name__}, expected a tensor.")
        if got.shape == mean.shape and torch.allclose(got, mean):
            raise ExerciseFailed(f"rank {rank} returned the whole mean (9 values): FSDP keeps only "
                                 "its own piece, that is what saves the memory.")
        if got.shape != want.shape:
            raise ExerciseFailed(f"rank {rank} returned shape {tuple(got.shape)}, expected "
                                 f"{tuple(want.shape)}: one of the 3 pieces.")
        if torch.allclose(got, want):
            continue
        if torch.allclose(got, want * 3):
            raise ExerciseFailed(f"rank {rank} returned the sum of its piece: divide by world_size "
                                 "(the loss is the mean over all ranks' batches).")
        if torch.allclose(got, grads[rank].chunk(3)[rank]) or torch.allclose(got, grads[rank].chunk(3)[rank] / 3):
            raise ExerciseFailed(f"rank {rank} returned its own gradient's piece: the other ranks' "
                                 "gradients never arrived (a collective is needed).")
        other = next((r for r in range(3) if r != rank and torch.allclose(got, mean.chunk(3)[r])), None)
        if other is not None:
            raise ExerciseFailed(f"rank {rank} returned piece {other}: rank r keeps piece r.")
        raise ExerciseFailed(f"rank {rank} returned {got.tolist()}, expected {want.tolist()}.")
    return "Each rank holds its piece of the mean gradient: FSDP's reduce-scatter, 1 / p of an all-reduce's result."
