"""Notebook 11 on 2 real processes (gloo, CPU): the launcher, data parallelism, ZeRO, tensor
parallelism, each equal to one process; failures reported, never a hang; the cost formulas."""

from __future__ import annotations

import time

import pytest
import torch

from helpers.model.gpt import GPTConfig, exact_parameters
from helpers.model.layers import FeedForward
from helpers.scale.data_parallel import (
    GradientBuckets,
    Run,
    data_parallel,
    max_difference,
    shard_rows,
    train_single,
)
from helpers.scale.parallelism import communication_per_step, memory_per_rank
from helpers.scale.sharded import assign_owners, train_fsdp, train_zero_by_hand, train_zero_torch
from helpers.scale.tensor_parallel import (
    column_shard,
    demo_block,
    dtensor_mlp,
    row_shard,
    tensor_parallel_block,
)
from helpers.scale.workers import (
    WorkerFailed,
    Workers,
    collectives_demo,
    fail_on_rank,
    launch,
    ring_all_reduce_by_hand,
    ring_all_reduce_bytes,
    sleep_on_rank,
)


@pytest.fixture(scope="module")
def workers():
    """Two processes for the whole module: the start-up (import torch twice) is paid once."""
    pool = Workers(2, timeout=60.0)
    yield pool
    pool.close()


def test_collectives_give_the_textbook_results_on_every_rank(workers):
    results = workers.run(collectives_demo)
    for rank, result in enumerate(results):
        assert result["broadcast from rank 0"] == [10.0, 20.0]
        assert result["all_reduce (sum)"] == [3.0, 6.0]
        assert result["all_gather"] == [[1.0, 2.0], [2.0, 4.0]]
        # piece `rank` of the sum over ranks of 10 * r + piece
        assert result["reduce_scatter: result"] == [10.0 + 2 * rank] * 2


@pytest.mark.parametrize("model", ["mlp", "gpt"])
@pytest.mark.parametrize("method", ["by hand", "bucketed", "torch DDP"])
def test_data_parallel_ends_with_the_weights_of_one_process(workers, model, method):
    run = Run(model=model, steps=3)
    results = data_parallel(workers, method, run)
    weights = [r[0] if isinstance(r, tuple) else r for r in results]
    reference = train_single(run)
    assert max_difference(weights[0], weights[1]) == 0.0  # the ranks agree exactly
    assert max_difference(weights[0], reference) < 1e-6
    assert max_difference(reference, train_single(Run(model=model, steps=2))) > 1e-3  # the steps matter


def test_buckets_start_before_backward_ends(workers):
    _, buckets, log = data_parallel(workers, "bucketed", Run(model="gpt", steps=1))[0]
    assert len(buckets) > 2
    n_gradients = sum(len(bucket) for bucket in buckets)
    assert [bucket for bucket, _ in log] == list(range(len(buckets)))
    assert log[0][1] < n_gradients  # the first all-reduce started while gradients were still coming


def test_zero_by_hand_and_torch_match_unsharded_adamw_with_half_the_state(workers):
    for task in (train_zero_by_hand, train_zero_torch):
        results = workers.run(task, Run(model="gpt", steps=3, lr=0.01))
        assert all(r["max_gap"] < 1e-6 for r in results)
        assert sum(r["state_bytes"] for r in results) == results[0]["full_state_bytes"]
        assert all(r["state_bytes"] < 0.6 * r["full_state_bytes"] for r in results)


def test_fsdp_shards_the_weights_and_trains_like_one_process(workers):
    run = Run(model="gpt", steps=2)
    results = workers.run(train_fsdp, run)
    assert all(r["local_bytes"] * 2 == r["full_bytes"] for r in results)
    assert max_difference(results[0]["weights"], train_single(run)) < 1e-6


def test_tensor_parallel_block_equals_the_block_forward_and_backward(workers):
    results = workers.run(tensor_parallel_block)
    block, x, probe = demo_block()
    x.requires_grad_(True)
    out = block(x)
    (out * probe).sum().backward()
    k = block.mlp.up.out_features // 2
    for rank, result in enumerate(results):
        assert (result["out"] - out).abs().max() < 1e-5
        assert (result["x_grad"] - x.grad).abs().max() < 1e-5
        assert torch.allclose(result["up_grad"], block.mlp.up.weight.grad[rank * k:(rank + 1) * k], atol=1e-5)
    assert (results[0]["out"] - out).abs().max() < 1e-5
    assert not torch.allclose(results[0]["x_grad"], x.grad * 0.5, atol=1e-5)  # the backward all-reduce ran


def test_dtensor_mlp_equals_the_mlp(workers):
    results = workers.run(dtensor_mlp)
    block, x, _ = demo_block()
    with torch.no_grad():
        expected = block.mlp(x)
    for result in results:
        assert (result["out"] - expected).abs().max() < 1e-5
        assert result["up_local"] == (64, 32)


def test_a_slow_task_times_out_and_is_stopped():
    pool = Workers(2, timeout=60.0)
    with pytest.raises(TimeoutError, match="timeout=1 s"):
        pool.run(sleep_on_rank, 30.0, timeout=1.0)
    assert pool.processes == []


def test_lambdas_are_refused_before_spawning():
    with pytest.raises(ValueError, match="lambda"):
        launch(lambda rank, world_size: rank, 2)


def test_a_world_size_that_does_not_divide_the_batch_is_refused():
    pool = Workers(3)
    with pytest.raises(ValueError, match="batch_size=8 cannot be split over world_size=3"):
        data_parallel(pool, "by hand", Run(batch_size=8))
    assert pool.processes == []  # refused before any process started
    with pytest.raises(ValueError, match="divisible by 3"):
        shard_rows(torch.zeros(8, 2), 0, 3)


def test_ring_all_reduce_by_hand_sums_and_sends_the_formula():
    for p in (2, 3, 4):
        tensors = [torch.randn(12) for _ in range(p)]
        results, sent = ring_all_reduce_by_hand(tensors)
        for result in results:
            assert torch.allclose(result, sum(tensors), atol=1e-6)
        assert sent * 4 == ring_all_reduce_bytes(12 * 4, p)
    assert ring_all_reduce_bytes(1000, 2) == 1000
    assert ring_all_reduce_bytes(1000, 1) == 0


def test_shards_refuse_sizes_the_world_does_not_divide():
    mlp = FeedForward(6, 12)
    assert column_shard(mlp.up, 1, 3).weight.shape == (4, 6)
    assert row_shard(mlp.down, 1, 3).weight.shape == (6, 4)
    with pytest.raises(ValueError, match="out_features=12 cannot be split over world_size=5"):
        column_shard(mlp.up, 0, 5)


def test_owners_balance_the_values():
    owners = assign_owners([100, 10, 60, 50], 2)
    load = [sum(s for s, o in zip([100, 10, 60, 50], owners, strict=True) if o == r) for r in range(2)]
    assert sorted(load) == [110, 110]  # 100 + 10 and 60 + 50


def test_communication_table_for_gpt2_small():
    config = GPTConfig.gpt2_small()
    rows = {row.name: row for row in communication_per_step(config, batch_size=8, world_size=8)}
    assert rows["data (DDP)"].bytes_per_rank == 2 * 7 / 8 * exact_parameters(config) * 2
    assert rows["tensor (Megatron)"].bytes_per_rank == 4 * 12 * 2 * 7 / 8 * 8 * 1024 * 768 * 2
    assert communication_per_step(config, 8, 1)[0].bytes_per_rank == 0
    memory = memory_per_rank(1000, 4)
    assert memory["data parallel"] == 16_000 and memory["ZeRO-3 / FSDP (+ weights)"] == 4000


def test_buckets_refuse_a_non_positive_size():
    with pytest.raises(ValueError, match="bucket_bytes"):
        GradientBuckets(torch.nn.Linear(2, 2), 0)


def test_a_failing_worker_is_reported_with_its_traceback_and_nothing_hangs(workers):
    # After every other test that uses the module's workers: it stops them (a later run would restart).
    workers.run(collectives_demo)  # started and healthy
    start = time.monotonic()
    with pytest.raises(WorkerFailed, match="rank 1 fails on purpose") as failure:
        workers.run(fail_on_rank, 1, timeout=30.0)
    assert failure.value.rank == 1 and "Traceback" in failure.value.worker_traceback
    assert time.monotonic() - start < 30.0
    assert workers.processes == []  # all stopped, including rank 0 stuck in its all-reduce


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


def test_bad_arguments_name_themselves():
    with pytest.raises(ValueError, match="model"):
        Run(model="cnn")
    with pytest.raises(ValueError, match="world_size"):
        Workers(0)
    with pytest.raises(TypeError, match="timeout"):
        Workers(2, timeout="soon")


# --- issue 22: mixed-precision ZeRO memory, the pipeline bubble, the latency + bandwidth fit ---

def test_zero_memory_in_mixed_precision_follows_the_paper():
    from helpers.scale.parallelism import memory_per_rank
    fp32, mixed = memory_per_rank(1000, 8), memory_per_rank(1000, 8, precision="mixed")
    assert fp32["data parallel"] == mixed["data parallel"] == 16_000
    assert mixed["ZeRO-1 (optimizer state)"] == 2000 + 2000 + 12_000 / 8  # 2 + 2 + 12/p bytes a parameter
    assert round(16 / 5.5, 1) == round(mixed["data parallel"] / mixed["ZeRO-1 (optimizer state)"], 1) == 2.9
    with pytest.raises(ValueError, match="precision"):
        memory_per_rank(1000, 8, precision="bf16")
    with pytest.raises(ValueError, match="n_params"):
        memory_per_rank(0, 8)


def test_bubble_fraction_counts_fill_and_drain_slots():
    from helpers.scale.parallelism import bubble_fraction
    assert bubble_fraction(1, 4) == 0.0 and bubble_fraction(4, 1) == 3 / 4
    assert bubble_fraction(4, 12) == 3 / 15
    with pytest.raises(ValueError, match="micro_batches"):
        bubble_fraction(4, 0)


def test_latency_bandwidth_fit_recovers_a_known_link():
    from helpers.scale.parallelism import fit_latency_bandwidth
    sizes = [1e3, 1e4, 1e5, 1e6, 1e7]
    latency, bandwidth = fit_latency_bandwidth(sizes, [20e-6 + n / 2e9 for n in sizes])
    assert abs(latency - 20e-6) < 1e-9 and abs(bandwidth / 2e9 - 1) < 1e-6
    with pytest.raises(ValueError, match="seconds"):
        fit_latency_bandwidth(sizes, [1.0, 2.0, 3.0, 4.0, -1.0])
    with pytest.raises(ValueError, match="at least 2"):
        fit_latency_bandwidth([1.0], [1.0])
