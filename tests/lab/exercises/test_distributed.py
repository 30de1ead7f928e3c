"""Notebook 11's checkers (helpers/lab/exercises/distributed.py): every correct formulation passes,
each usual slip fails with a message that names it, and a stub hears what to write."""

from __future__ import annotations

import linecache
import sys
import types

import pytest
import torch

from helpers.lab.exercises import evaluate
from helpers.scale.tensor_parallel import (
    split_mlp_weights,  # imported before the watch, as a notebook does
)

from .judging import (
    assert_cases_cover,
    assert_not_attempted_says_the_task,
    case_ids,
    exercise_names,
    judge,
)


def ring_rewritten(n_bytes, world_size):
    return 2 * n_bytes * (world_size - 1) / world_size


def ring_half(n_bytes, world_size):
    return n_bytes * (world_size - 1) / world_size


def ring_whole(n_bytes, world_size):
    return 2.0 * n_bytes if world_size > 1 else 0.0


def average_after(model, all_reduce, world_size):
    for p in model.parameters():
        all_reduce(p.grad)
        p.grad /= world_size


def average_before(model, all_reduce, world_size):
    """What DDP does: scale first, then sum."""
    for p in model.parameters():
        p.grad.div_(world_size)
        all_reduce(p.grad)


def average_sum_only(model, all_reduce, world_size):
    for p in model.parameters():
        all_reduce(p.grad)


def average_divide_twice(model, all_reduce, world_size):
    for p in model.parameters():
        p.grad /= world_size
        all_reduce(p.grad)
        p.grad /= world_size


def average_tied_twice(model, all_reduce, world_size):
    for module in model.modules():
        for p in module.parameters(recurse=False):
            all_reduce(p.grad)
            p.grad /= world_size
    all_reduce(model.lm_head.weight.grad)


def split_interleaved(up_weight, up_bias, down_weight, rank, world_size):
    units = slice(rank, None, world_size)
    return up_weight[units], up_bias[units], down_weight[:, units]


def split_down_rows(up_weight, up_bias, down_weight, rank, world_size):
    k, m = up_weight.shape[0] // world_size, down_weight.shape[0] // world_size
    return up_weight[rank * k:(rank + 1) * k], up_bias[rank * k:(rank + 1) * k], down_weight[rank * m:(rank + 1) * m]


def split_mismatched(up_weight, up_bias, down_weight, rank, world_size):
    k = up_weight.shape[0] // world_size
    return up_weight[rank * k:(rank + 1) * k], up_bias[rank * k:(rank + 1) * k], down_weight[:, rank::world_size]


def split_helper(up_weight, up_bias, down_weight, rank, world_size):  # the notebook's fallback: refused
    return split_mlp_weights(up_weight, up_bias, down_weight, rank, world_size)


def split_all_units(up_weight, up_bias, down_weight, rank, world_size):  # every rank keeps everything
    return up_weight, up_bias, down_weight


# Notebook 11, part two: the 1F1B order and one ring-attention merge.
def f1b_loops(stages, micro_batches):
    orders = []
    for rank in range(stages):
        ahead = [("F", i) for i in range(min(stages - 1 - rank, micro_batches))]
        rest = [op for i in range(len(ahead), micro_batches) for op in (("F", i), ("B", i - len(ahead)))]
        orders.append(ahead + rest + [("B", i) for i in range(micro_batches - len(ahead), micro_batches)])
    return orders


def f1b_gpipe(stages, micro_batches):
    return [[("F", i) for i in range(micro_batches)] + [("B", i) for i in range(micro_batches)]
            for _ in range(stages)]


def f1b_no_warmup(stages, micro_batches):
    return [[op for i in range(micro_batches) for op in (("F", i), ("B", i))] for _ in range(stages)]


def f1b_long_warmup(stages, micro_batches):  # one forward too many before the first backward
    orders = []
    for rank in range(stages):
        warmup = min(stages - rank, micro_batches)
        steady = [op for i in range(micro_batches - warmup) for op in (("F", warmup + i), ("B", i))]
        orders.append([("F", i) for i in range(warmup)] + steady
                      + [("B", i) for i in range(micro_batches - warmup, micro_batches)])
    return orders


def f1b_one_list(stages, micro_batches):  # the order of rank 0 only, not one list per rank
    return f1b_loops(stages, micro_batches)[0]


def f1b_course(stages, micro_batches):  # the course's own schedule: refused by name
    from helpers.scale.pipeline import one_f_one_b_order
    return one_f_one_b_order(stages, micro_batches)


def merge_logaddexp(out, lse, o_b, lse_b):
    new = torch.logaddexp(lse, lse_b)
    return out * torch.exp(lse - new)[..., None] + o_b * torch.exp(lse_b - new)[..., None], new


def merge_unweighted(out, lse, o_b, lse_b):
    return out + o_b, torch.logaddexp(lse, lse_b)


def merge_max_lse(out, lse, o_b, lse_b):
    return merge_logaddexp(out, lse, o_b, lse_b)[0], torch.maximum(lse, lse_b)


def ring_course(rank, world_size, tensors):
    from helpers.scale.workers import ring_all_reduce
    return ring_all_reduce(rank, world_size, tensors)


def ring_blocking_in_turn(rank, world_size, tensors):
    """A ring with blocking sends, even ranks sending first and odd ranks receiving first, the
    chunks kept as views of one flat tensor (the notebook's answer posts its sends without waiting)."""
    import torch
    import torch.distributed as dist

    flat = tensors[rank].flatten().clone()
    chunks = flat.tensor_split(world_size)
    right, left = (rank + 1) % world_size, (rank - 1) % world_size

    def pass_on(send_index, receive_index):
        incoming = torch.empty_like(chunks[receive_index])
        if rank % 2 == 0:
            dist.send(chunks[send_index].contiguous(), right)
            dist.recv(incoming, left)
        else:
            dist.recv(incoming, left)
            dist.send(chunks[send_index].contiguous(), right)
        return incoming

    for step in range(world_size - 1):
        chunks[(rank - step - 1) % world_size].add_(pass_on((rank - step) % world_size,
                                                            (rank - step - 1) % world_size))
    for step in range(world_size - 1):
        chunks[(rank - step) % world_size].copy_(pass_on((rank + 1 - step) % world_size,
                                                         (rank - step) % world_size))
    return flat.reshape(tensors[rank].shape)


def ring_own_tensor(rank, world_size, tensors):
    return tensors[rank].clone()


def ring_collective(rank, world_size, tensors):
    import torch.distributed as dist
    total = tensors[rank].clone()
    dist.all_reduce(total)
    return total


def piece_course(rank, world_size, grads):
    from helpers.scale.fsdp import gradient_piece
    return gradient_piece(rank, world_size, grads)


def piece_by_all_reduce(rank, world_size, grads):  # correct, if twice the traffic
    import torch.distributed as dist
    total = grads[rank].clone()
    dist.all_reduce(total)
    return (total / world_size).chunk(world_size)[rank]


def piece_summed(rank, world_size, grads):
    return piece_by_all_reduce(rank, world_size, grads) * world_size


def piece_own(rank, world_size, grads):
    return grads[rank].chunk(world_size)[rank]


def piece_whole(rank, world_size, grads):
    import torch.distributed as dist
    total = grads[rank].clone()
    dist.all_reduce(total)
    return total / world_size


def test_exercise_checkers_refuse_the_usual_mistakes():
    from helpers.lab.exercises import evaluate

    def summed_only(model, all_reduce, world_size):
        for p in model.parameters():
            all_reduce(p.grad)

    def tied_twice(model, all_reduce, world_size):
        for _, p in model.named_parameters(remove_duplicate=False):
            all_reduce(p.grad)
            p.grad /= world_size

    passed, message = evaluate("distributed.average_gradients", summed_only)
    assert not passed and "divide by world_size" in message
    passed, message = evaluate("distributed.average_gradients", tied_twice)
    assert not passed and "twice" in message
    passed, message = evaluate("distributed.ring_bytes", lambda n, p: (p - 1) / p * n)
    assert not passed and "all-gather" in message
    passed, message = evaluate("distributed.split_mlp", lambda up_w, up_b, down_w, r, p: (up_w, up_b, down_w))
    assert not passed and "shape" in message


CELL = '''
import torch
import torch.distributed as dist


def solution(rank, world_size, tensors):
    p = world_size
    chunks = list(tensors[rank].flatten().clone().tensor_split(p))

    def exchange(send, receive):  # a nested function travels inside its function's source
        incoming = torch.empty_like(chunks[receive])
        request = dist.isend(chunks[send].contiguous(), (rank + 1) % p)
        dist.recv(incoming, (rank - 1) % p)
        request.wait()
        return incoming

    for s in range(p - 1):
        chunks[(rank - s - 1) % p] = chunks[(rank - s - 1) % p] + exchange((rank - s) % p, (rank - s - 1) % p)
    for s in range(p - 1):
        chunks[(rank - s) % p] = exchange((rank + 1 - s) % p, (rank - s) % p)
    return torch.cat(chunks).reshape(tensors[rank].shape)


def own(rank, world_size, tensors):
    return tensors[rank].clone()


def mean(rank, world_size, tensors):
    return solution(rank, world_size, tensors) / world_size


def scatter_only(rank, world_size, tensors):
    p = world_size
    chunks = list(tensors[rank].flatten().clone().tensor_split(p))
    for s in range(p - 1):
        incoming = torch.empty_like(chunks[(rank - s - 1) % p])
        request = dist.isend(chunks[(rank - s) % p].contiguous(), (rank + 1) % p)
        dist.recv(incoming, (rank - 1) % p)
        request.wait()
        chunks[(rank - s - 1) % p] += incoming
    return torch.cat(chunks)


def collective(rank, world_size, tensors):
    total = tensors[rank].clone()
    dist.all_reduce(total)
    return total


def stub(rank, world_size, tensors):
    """Not written yet."""
    raise NotImplementedError
'''


@pytest.fixture(scope="module")
def cell():
    """CELL run as a notebook cell is: a module named __main__ without a file, its source kept in
    linecache (as IPython keeps it), so that the workers receive these functions as source."""
    filename = "<ipython-input-11-ring>"
    linecache.cache[filename] = (len(CELL), None, CELL.splitlines(True), filename)
    module = types.ModuleType("__main__")
    exec(compile(CELL, filename, "exec"), module.__dict__)
    saved = sys.modules["__main__"]
    sys.modules["__main__"] = module
    yield module
    sys.modules["__main__"] = saved
    from helpers.lab.exercises import _ranks
    for pool in _ranks._POOL:
        pool.close()


def test_the_ring_checker_runs_a_cell_function_on_three_workers_and_names_mistakes(cell):
    passed, said = evaluate("distributed.ring_all_reduce", cell.solution, time_limit=120)
    assert passed, said
    for name, words in [("own", "its own tensor unchanged"), ("mean", "returned the mean"),
                        ("scatter_only", "the all-gather phase is missing")]:
        passed, said = evaluate("distributed.ring_all_reduce", getattr(cell, name), time_limit=120)
        assert not passed and words in said, name


def test_the_ring_checker_refuses_a_collective_and_knows_a_stub_without_starting_processes(cell):
    passed, said = evaluate("distributed.ring_all_reduce", cell.collective)
    assert not passed and "build it from point-to-point sends" in said
    passed, said = evaluate("distributed.ring_all_reduce", cell.stub)
    assert not passed and "not attempted yet" in said


CASES = [
    ("distributed.ring_bytes", ring_rewritten, None),
    ("distributed.ring_bytes", ring_half, "half the answer"),
    ("distributed.ring_bytes", ring_whole, "not the whole tensor"),
    ("distributed.average_gradients", average_after, None),
    ("distributed.average_gradients", average_before, None),
    ("distributed.average_gradients", average_sum_only, "divide by world_size"),
    ("distributed.average_gradients", average_divide_twice, "divided by world_size twice"),
    ("distributed.average_gradients", average_tied_twice, "exactly once"),
    ("distributed.split_mlp", split_interleaved, None),
    ("distributed.split_mlp", split_down_rows, "you split its rows"),
    ("distributed.split_mlp", split_mismatched, "must use the same units"),
    ("distributed.split_mlp", split_helper, "helpers.scale.tensor_parallel.split_mlp_weights"),
    ("distributed.split_mlp", split_all_units, "expected (6, 6) and (6,)"),
    ("distributed.one_f_one_b", f1b_loops, None),
    ("distributed.one_f_one_b", f1b_gpipe, "GPipe"),
    ("distributed.one_f_one_b", f1b_no_warmup, "without a warm-up"),
    ("distributed.one_f_one_b", f1b_long_warmup, "its warm-up is off"),
    ("distributed.one_f_one_b", f1b_one_list, "one list of operations for each rank"),
    ("distributed.one_f_one_b", f1b_course, "helpers.scale.pipeline.one_f_one_b_order"),
    ("distributed.ring_merge", merge_logaddexp, None),
    ("distributed.ring_merge", merge_unweighted, "weighted"),
    ("distributed.ring_merge", merge_max_lse, "lse has the right shape"),
    ("distributed.ring_all_reduce", ring_course, "helpers.scale.workers.ring_all_reduce"),
    ("distributed.ring_all_reduce", ring_blocking_in_turn, None),
    ("distributed.ring_all_reduce", ring_own_tensor, "its own tensor unchanged"),
    ("distributed.ring_all_reduce", ring_collective, "point-to-point"),
    ("distributed.fsdp_grad_piece", piece_course, "helpers.scale.fsdp.gradient_piece"),
    ("distributed.fsdp_grad_piece", piece_by_all_reduce, None),
    ("distributed.fsdp_grad_piece", piece_summed, "divide by world_size"),
    ("distributed.fsdp_grad_piece", piece_own, "its own gradient's piece"),
    ("distributed.fsdp_grad_piece", piece_whole, "the whole mean"),
]


# These two checkers run the answer on worker processes: about 12 s a case on 2 cores (pytest
# --durations), so they are slow (left out of `course.py test --package`, run by `course.py test`).
ON_WORKERS = ("distributed.ring_all_reduce", "distributed.fsdp_grad_piece")


def slow_on_workers(cases: list) -> list:
    """`cases` (rows of CASES, or exercise names) with those that start worker processes marked slow."""
    return [pytest.param(*case, marks=pytest.mark.slow) if case[0] in ON_WORKERS
            else (pytest.param(case, marks=pytest.mark.slow) if case in ON_WORKERS else case) for case in cases]


@pytest.mark.parametrize("name, answer, message", slow_on_workers(CASES), ids=case_ids(CASES))
def test_checker_judges(name, answer, message):
    judge(name, answer, message)


def test_every_checker_has_a_right_and_two_wrong_cases():
    assert_cases_cover("distributed", CASES)


@pytest.mark.parametrize("name", slow_on_workers(exercise_names("distributed")))
def test_not_attempted_says_the_task_not_the_recipe(name):
    assert_not_attempted_says_the_task(name)
