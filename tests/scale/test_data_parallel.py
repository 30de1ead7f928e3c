"""helpers.scale.data_parallel in the pytest process: two ranks as two threads (tests/ranks_in_threads.py),
the hand-written all-reduce, buckets and broadcast against one process and against torch's DDP;
the run's settings at non-default values; every refusal's message.

The tests marked `processes` run the same workers in two spawned processes (gloo).
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from ranks_in_threads import locked, run_ranks
from torch import nn

from helpers import checks
from helpers.model.gpt import GPT
from helpers.scale import data_parallel as dp
from helpers.scale.data_parallel import (
    TINY_GPT,
    GradientBuckets,
    Run,
    average_gradients,
    broadcast_parameters,
    check_divides,
    check_same_shapes,
    data_parallel,
    device_of,
    loss_of,
    make_batch,
    make_model,
    make_optimizer,
    max_difference,
    shard_rows,
    train_single,
)
from helpers.scale.tensor_parallel import column_shard, row_shard
from helpers.scale.workers import Workers


@pytest.fixture(autouse=True)
def _one_seeding_rank_at_a_time(monkeypatch):
    """The ranks are threads of one process and share its random generator: make_model seeds it
    and draws the weights, one rank at a time."""
    monkeypatch.setattr(dp, "make_model", locked(dp.make_model))


@pytest.fixture
def one_rank():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


# --- the run's settings ----------------------------------------------------------------------

def test_the_runs_defaults_and_the_tiny_gpt():
    assert Run() == Run(model="mlp", batch_size=8, steps=4, lr=0.1, seed=0, device="cpu")
    assert (TINY_GPT.vocab_size, TINY_GPT.context_length, TINY_GPT.n_layers, TINY_GPT.n_heads,
            TINY_GPT.d_model) == (32, 16, 2, 2, 32)


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(model="cnn"), ValueError, "^model is 'cnn', expected one of 'mlp', 'gpt'$"),
    (dict(device="tpu"), ValueError, "^device is 'tpu', expected one of 'cpu', 'cuda'$"),
    (dict(batch_size=0), ValueError, "^batch_size is 0, expected a positive int$"),
    (dict(steps=0), ValueError, "^steps is 0, expected a positive int$"),
    (dict(lr=0.0), ValueError, "^lr is 0.0, expected a finite number > 0$"),
])
def test_a_bad_run_setting_is_named(kwargs, error, message):
    with pytest.raises(error, match=message):
        Run(**kwargs)


def test_the_device_is_the_cpu_or_this_processs_gpu(monkeypatch):
    assert device_of(Run()) == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    assert device_of(Run(device="cuda")) == torch.device("cuda", 3)


def test_the_models_come_from_the_seed_asked_for():
    run = Run(seed=5)
    torch.manual_seed(5)
    expected = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 16))
    assert max_difference(make_model(run).state_dict(), expected.state_dict()) == 0.0
    torch.manual_seed(7)
    expected = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 16))
    assert max_difference(make_model(run, seed=7).state_dict(), expected.state_dict()) == 0.0
    torch.manual_seed(5)
    expected = GPT(TINY_GPT)
    gpt = make_model(Run(model="gpt", seed=5))
    assert isinstance(gpt, GPT) and gpt.config == TINY_GPT
    assert max_difference(gpt.state_dict(), expected.state_dict()) == 0.0


@pytest.mark.parametrize("model", ["mlp", "gpt"])
def test_a_batch_is_drawn_from_the_seed_and_the_step(model):
    run = Run(model=model, batch_size=3, seed=2)
    generator = torch.Generator().manual_seed(2003)
    inputs, targets = make_batch(run, 3)
    if model == "gpt":
        ids = torch.randint(0, 32, (3, 17), generator=generator)
        expected = ids[:, :-1], ids[:, 1:]
    else:
        expected = torch.randn(3, 16, generator=generator), torch.randn(3, 16, generator=generator)
    assert torch.equal(inputs, expected[0]) and torch.equal(targets, expected[1])
    assert inputs.device == targets.device == torch.device("cpu")


@pytest.mark.parametrize("model", ["mlp", "gpt"])
def test_the_model_and_the_batches_are_put_on_the_runs_device(monkeypatch, model):
    """Seen through the meta device (no GPU needed): whatever device_of says, they go there."""
    monkeypatch.setattr(dp, "device_of", lambda run: torch.device("meta"))
    run = Run(model=model)
    assert {p.device.type for p in make_model(run).parameters()} == {"meta"}
    assert [t.device.type for t in make_batch(run, 0)] == ["meta", "meta"]


def test_the_loss_is_mse_for_the_mlp_and_next_token_cross_entropy_for_the_gpt():
    mlp = make_model(Run())
    x, y = make_batch(Run(), 0)
    assert loss_of(mlp, x, y) == F.mse_loss(mlp(x), y)
    gpt = make_model(Run(model="gpt"))
    ids, targets = make_batch(Run(model="gpt"), 0)
    expected = F.cross_entropy(gpt(ids).reshape(-1, 32), targets.reshape(-1))
    assert loss_of(gpt, ids, targets) == expected


def test_the_optimizer_is_sgd_with_momentum_at_the_runs_rate():
    model = make_model(Run())
    optimizer = make_optimizer(model, Run(lr=0.25))
    assert type(optimizer) is torch.optim.SGD
    group = optimizer.param_groups[0]
    assert group["lr"] == 0.25 and group["momentum"] == 0.9
    assert group["params"] == list(model.parameters())


def test_one_process_trains_on_whole_batches():
    run = Run(steps=3, lr=0.05, seed=1)
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 16))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for step in range(3):
        generator = torch.Generator().manual_seed(1000 + step)
        x, y = torch.randn(8, 16, generator=generator), torch.randn(8, 16, generator=generator)
        optimizer.zero_grad()
        F.mse_loss(model(x), y).backward()
        optimizer.step()
    assert max_difference(train_single(run), model.state_dict()) == 0.0


# --- splitting the batch -----------------------------------------------------------------------

def test_each_rank_takes_its_own_consecutive_rows():
    batch = torch.arange(12).reshape(6, 2)
    assert [shard_rows(batch, rank, 3).tolist() for rank in range(3)] == [
        [[0, 1], [2, 3]], [[4, 5], [6, 7]], [[8, 9], [10, 11]]]
    assert torch.equal(shard_rows(batch, 0, 1), batch)


@pytest.mark.parametrize("batch, rank, world_size, error, message", [
    (torch.zeros(4), 2, 2, ValueError, "^rank is 2, expected 0 <= rank < world_size = 2$"),
    (torch.zeros(4), 0, 0, ValueError, "^world_size is 0, expected a positive int$"),
    ([1, 2], 0, 2, ValueError, r"^batch is \[1, 2\], expected a tensor \(B, \.\.\.\) to split by rows$"),
    (torch.tensor(3.0), 0, 1, ValueError, r"^batch is tensor\(3\.\), expected a tensor"),
    (torch.zeros(5, 2), 1, 2, ValueError, "^batch_size=5 cannot be split over world_size=2 ranks"),
])
def test_shard_rows_names_what_is_wrong(batch, rank, world_size, error, message):
    with pytest.raises(error, match=message):
        shard_rows(batch, rank, world_size)


def test_an_uneven_batch_is_refused_with_the_reason():
    check_divides(6, 3)
    with pytest.raises(ValueError) as refused:
        check_divides(7, 3)
    assert str(refused.value) == (
        "batch_size=7 cannot be split over world_size=3 ranks: expected a batch_size divisible by 3 "
        "(each rank takes batch_size / world_size rows, and the average of the ranks' losses is the "
        "whole batch's loss only when the shares are equal)")


def test_data_parallel_checks_the_method_and_the_split_before_starting(monkeypatch):
    calls = []

    class FakeWorkers:
        world_size = 2

        def run(self, task, *args):
            calls.append((task, args))
            return ["rank 0", "rank 1"]

    with pytest.raises(ValueError, match="^method is 'ddp', expected one of 'by hand', 'bucketed', "
                                         "'torch DDP'$"):
        dp.data_parallel(FakeWorkers(), "ddp", Run())
    with pytest.raises(ValueError, match="^batch_size=7 cannot be split over world_size=2"):
        dp.data_parallel(FakeWorkers(), "by hand", Run(batch_size=7))
    assert calls == []
    run = Run(batch_size=6)
    for method, task in [("by hand", dp.train_by_hand), ("bucketed", dp.train_bucketed),
                         ("torch DDP", dp.train_torch_ddp)]:
        assert dp.data_parallel(FakeWorkers(), method, run) == ["rank 0", "rank 1"]
        assert calls.pop() == (task, (run,))


def test_max_difference_is_the_largest_gap_and_needs_the_same_names():
    a = {"w": torch.tensor([1.0, 2.0]), "b": torch.tensor([0.5])}
    b = {"w": torch.tensor([1.5, 1.0]), "b": torch.tensor([0.25])}
    assert max_difference(a, b) == 1.0
    assert max_difference(b, a) == 1.0
    with pytest.raises(ValueError, match=r"^the state dicts differ in names: \['b', 'c'\]$"):
        max_difference(a, {"w": a["w"], "c": a["b"]})


# --- the collectives by hand, on two threads ---------------------------------------------------

def test_ranks_with_different_shapes_are_named_before_any_collective():
    models = [nn.Linear(3, 2), nn.Linear(3, 4)]

    def task(rank, world_size):
        check_same_shapes(list(models[0].parameters()), "weights")  # the same on both: no error
        check_same_shapes(list(models[rank].parameters()), "weights")

    with pytest.raises(ValueError) as refused:
        run_ranks(2, task)
    assert str(refused.value) == (
        "the weights differ across ranks: rank 1 has 2 tensors, rank 0 2; the first difference is "
        "tensor 0 (((4, 3), 'torch.float32') on rank 1, ((2, 3), 'torch.float32') on rank 0): "
        "expected the same model on every rank")


@pytest.mark.parametrize("world_size", [2, 3])
def test_a_missing_tensor_and_another_dtype_are_named(world_size):
    def task(rank, _):
        tensors = [torch.zeros(2), torch.zeros(3)]
        if rank == world_size - 1:
            tensors = tensors[:1]
        if rank == 1 and world_size == 3:
            tensors = [torch.zeros(2), torch.zeros(3, dtype=torch.float64)]
        check_same_shapes(tensors, "buffers")

    with pytest.raises(ValueError) as refused:
        run_ranks(world_size, task)
    if world_size == 2:
        assert str(refused.value) == (
            "the buffers differ across ranks: rank 1 has 1 tensors, rank 0 2; the first difference is "
            "tensor 1 (missing on rank 1, ((3,), 'torch.float32') on rank 0): expected the same model "
            "on every rank")
    else:
        assert "rank 1 has 2 tensors, rank 0 2; the first difference is tensor 1 (((3,), " \
               "'torch.float64') on rank 1, ((3,), 'torch.float32') on rank 0)" in str(refused.value)


def test_rank_0_with_fewer_tensors_reads_missing_on_rank_0():
    def task(rank, _):
        check_same_shapes([torch.zeros(2)] * (1 + rank), "weights")

    with pytest.raises(ValueError, match=r"tensor 1 \(\(\(2,\), 'torch.float32'\) on rank 1, missing on "
                                         r"rank 0\)"):
        run_ranks(2, task)


def test_without_other_ranks_nothing_is_compared(monkeypatch, one_rank):
    monkeypatch.setattr(dist, "all_gather_object", lambda *args: pytest.fail("gathered"))
    check_same_shapes([torch.zeros(2)], "weights")


def test_without_a_group_nothing_is_compared(monkeypatch):
    monkeypatch.setattr(dist, "get_world_size", lambda: pytest.fail("asked the world size"))
    check_same_shapes([torch.zeros(2)], "weights")


@pytest.mark.parametrize("src", [0, 1])
def test_the_broadcast_copies_every_weight_and_buffer_from_the_source_rank(src):
    @locked
    def model_of(rank):
        torch.manual_seed(rank)
        model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
        model[1].running_mean.fill_(rank + 1.0)
        return model

    def task(rank, world_size):
        model = model_of(rank)
        broadcast_parameters(model, src=src)
        return max_difference(model.state_dict(), model_of(src).state_dict())

    assert run_ranks(2, task) == [0.0, 0.0]


def test_the_broadcast_source_is_rank_0_unless_told_and_must_be_a_rank():
    def task(rank, world_size):
        model = nn.Linear(2, 2)
        nn.init.constant_(model.weight, rank)
        broadcast_parameters(model)
        return model.weight.sum().item()

    assert run_ranks(2, task) == [0.0, 0.0]
    with pytest.raises(ValueError, match="^rank is 2, expected 0 <= rank < world_size = 2$"):
        run_ranks(2, lambda rank, world_size: broadcast_parameters(nn.Linear(2, 2), src=2))


def _gradients_of_rank(rank):
    """A model whose gradients say which rank made them; the bias of layer 1 is frozen."""
    model = nn.Sequential(nn.Linear(2, 3), nn.Linear(3, 1))
    model[1].bias.requires_grad_(False)
    for i, p in enumerate(model.parameters()):
        if p.requires_grad:
            p.grad = torch.full_like(p, 10.0 * i + rank)
    return model


@pytest.mark.parametrize("world_size", [2, 3])
def test_average_gradients_leaves_the_mean_over_ranks(world_size):
    def task(rank, world_size):
        model = _gradients_of_rank(rank)
        average_gradients(model)
        return [None if p.grad is None else p.grad.unique().tolist() for p in model.parameters()]

    mean = (world_size - 1) / 2
    expected = [[0.0 + mean], [10.0 + mean], [20.0 + mean], None]
    assert run_ranks(world_size, task) == [expected] * world_size


# --- buckets ------------------------------------------------------------------------------------

@locked
def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 16))  # 4 KiB, 256 B, 4 KiB, 64 B


@pytest.mark.parametrize("bucket_bytes, sizes", [
    (1, [[64], [4096], [256], [4096]]),      # a new bucket after every parameter
    (64, [[64], [4096], [256], [4096]]),     # full at exactly bucket_bytes
    (65, [[64, 4096], [256], [4096]]),
    (256, [[64, 4096], [256], [4096]]),
    (257, [[64, 4096], [256, 4096]]),
    (4160, [[64, 4096], [256, 4096]]),
    (4161, [[64, 4096, 256], [4096]]),
    (10_000, [[64, 4096, 256, 4096]]),
])
def test_buckets_take_parameters_last_layer_first_until_they_hold_bucket_bytes(bucket_bytes, sizes):
    model = _mlp()
    buckets = GradientBuckets(model, bucket_bytes)
    assert [[p.numel() * 4 for p in bucket] for bucket in buckets.buckets] == sizes
    params = list(model.parameters())[::-1]
    assert [p for bucket in buckets.buckets for p in bucket] == params
    assert buckets.n_params == 4
    assert buckets.bucket_of == {id(p): i for i, bucket in enumerate(buckets.buckets) for p in bucket}
    assert buckets.waiting == [len(bucket) for bucket in buckets.buckets]
    assert (buckets.in_flight, buckets.ready, buckets.log) == ([], 0, [])


def test_frozen_parameters_are_left_out_of_the_buckets():
    model = _mlp()
    model[2].bias.requires_grad_(False)
    buckets = GradientBuckets(model, 1)
    assert [[tuple(p.shape) for p in bucket] for bucket in buckets.buckets] == [[(16, 64)], [(64,)], [(64, 16)]]
    assert buckets.n_params == 3


def test_buckets_refuse_a_size_that_is_not_positive():
    with pytest.raises(ValueError, match="^bucket_bytes is 0, expected a positive int$"):
        GradientBuckets(_mlp(), 0)


@pytest.mark.parametrize("world_size", [2, 3])
def test_buckets_start_as_their_last_gradient_arrives_and_average_like_by_hand(world_size):
    def task(rank, world_size):
        model = _mlp()
        buckets = GradientBuckets(model, 4160)
        reference = _mlp()
        logs = []
        for step in range(2):
            x, y = make_batch(Run(seed=rank), step)
            for m in (model, reference):
                m.zero_grad()
                F.mse_loss(m(x), y).backward()
            logs.append(list(buckets.log))
            assert [i for i, _, _ in buckets.in_flight] == [0, 1] and buckets.ready == 4
            buckets.finish()
            assert (buckets.in_flight, buckets.ready, buckets.waiting) == ([], 0, [2, 2])
            average_gradients(reference)
            for p, q in zip(model.parameters(), reference.parameters(), strict=True):
                torch.testing.assert_close(p.grad, q.grad, rtol=0, atol=1e-7)
        return logs

    logs = run_ranks(world_size, task)
    assert logs == [[[(0, 2), (1, 4)], [(0, 2), (1, 4), (0, 2), (1, 4)]]] * world_size


# --- the three workers against one process --------------------------------------------------

@pytest.mark.parametrize("model", ["mlp", "gpt"])
@pytest.mark.parametrize("method", ["by hand", "bucketed", "torch DDP"])
def test_two_ranks_end_with_the_weights_of_one_process(model, method):
    run = Run(model=model, steps=2, batch_size=4, seed=3, lr=0.05)
    results = run_ranks(2, dp.WORKERS[method], run)
    weights = [result[0] if method == "bucketed" else result for result in results]
    assert max_difference(weights[0], weights[1]) == 0.0
    assert max_difference(weights[0], train_single(run)) < 1e-6
    assert weights[0].keys() == make_model(run).state_dict().keys()


def test_each_rank_starts_from_its_own_weights_until_the_broadcast(monkeypatch):
    """Without the broadcast the ranks would train different models: each starts from seed + rank."""
    seeds = []
    real = dp.make_model

    def recording(run, seed=None):
        seeds.append(seed)
        return real(run, seed)

    monkeypatch.setattr(dp, "make_model", recording)
    monkeypatch.setattr(dp, "broadcast_parameters", lambda model: None)
    run = Run(steps=1, seed=4)
    for worker in (dp.train_by_hand, dp.train_bucketed):
        results = run_ranks(2, worker, run)
        weights = [r[0] if isinstance(r, tuple) else r for r in results]
        assert max_difference(weights[0], weights[1]) > 0.01
        assert sorted(seeds) == [4, 5]
        seeds.clear()
    run_ranks(2, dp.train_torch_ddp, run)  # DDP's own broadcast makes them equal
    assert sorted(seeds) == [4, 5]


def test_the_bucketed_worker_reports_its_buckets_and_the_first_steps_launches():
    run = Run(steps=2, batch_size=4)
    (weights, names, log), _ = run_ranks(2, dp.train_bucketed, run)
    assert names == [["2.bias", "2.weight", "0.bias", "0.weight"]]
    assert log == [(0, 4)]
    (_, names, log), _ = run_ranks(2, dp.train_bucketed, run, 4160)
    assert names == [["2.bias", "2.weight"], ["0.bias", "0.weight"]] and log == [(0, 2), (1, 4)]


def _big_last_layers(run, seed=None):
    """Parameters, last first, of 16384 bytes (a whole default bucket), 16384 and 1024."""
    torch.manual_seed(run.seed if seed is None else seed)
    return nn.Sequential(nn.Linear(16, 16, bias=False), nn.Linear(16, 256, bias=False),
                         nn.Linear(256, 16, bias=False))


def test_a_default_bucket_holds_16384_bytes(monkeypatch):
    monkeypatch.setattr(dp, "make_model", locked(_big_last_layers))
    (_, names, log), _ = run_ranks(2, dp.train_bucketed, Run(steps=1, batch_size=2))
    assert names == [["2.weight"], ["1.weight"], ["0.weight"]] and log == [(0, 1), (1, 2), (2, 3)]


@pytest.mark.parametrize("cuda", [False, True])
@pytest.mark.parametrize("gap, verdict", [(0.0, "<"), (0.5e-6, "<"), (1e-6, ">="), (0.25, ">=")])
def test_the_script_trains_the_gpt_by_hand_and_rank_0_compares_it_with_one_process(
        monkeypatch, capsys, cuda, gap, verdict):
    """As torchrun would start it on 3 processes: rank r's weights are r, one process's are `gap`."""
    import helpers.scale.workers as workers

    runs, singles = [], []

    def by_hand(rank, world_size, run):
        runs.append((rank, world_size, run))
        return {"w": torch.tensor([float(rank)], dtype=torch.float64)}

    monkeypatch.setattr(workers, "init_from_environment", lambda: (dist.get_rank(), dist.get_world_size()))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(dp, "train_by_hand", by_hand)
    monkeypatch.setattr(dp, "train_single", lambda run: singles.append(run) or {"w": torch.tensor([gap], dtype=torch.float64)})
    run_ranks(3, lambda rank, world_size: dp.main())
    device = "cuda" if cuda else "cpu"
    assert capsys.readouterr().out == f"3 processes (threaded, {device}) vs 1 process: max |diff| {verdict} 1e-6\n"
    run = Run(model="gpt", batch_size=12, device=device)
    assert sorted(runs, key=lambda r: r[0]) == [(0, 3, run), (1, 3, run), (2, 3, run)] and singles == [run]


def test_the_script_checks_itself_against_one_process(monkeypatch, capsys):
    import helpers.scale.workers as workers

    monkeypatch.setattr(workers, "init_from_environment", lambda: (dist.get_rank(), dist.get_world_size()))
    run_ranks(2, lambda rank, world_size: dp.main())
    assert capsys.readouterr().out == "2 processes (threaded, cpu) vs 1 process: max |diff| < 1e-6\n"


def test_the_broadcast_refuses_models_that_differ_across_ranks():
    def task(rank, world_size):
        broadcast_parameters(nn.Linear(2, 2 + rank))

    with pytest.raises(ValueError, match="^the model's parameters and buffers differ across ranks: rank 1 "):
        run_ranks(2, task)


@pytest.mark.parametrize("call", [
    lambda: shard_rows(torch.zeros(4, 2), 2, 2), lambda: shard_rows(torch.zeros(4, 2), -1, 2),
    lambda: column_shard(torch.nn.Linear(4, 4), 3, 2), lambda: row_shard(torch.nn.Linear(4, 4), 2, 2),
    lambda: checks.rank_in_world(5, 4)])
def test_a_rank_outside_the_world_is_refused(call):
    with pytest.raises(ValueError, match=r"rank is -?\d, expected 0 <= rank < world_size"):
        call()


@pytest.mark.parametrize("model", ["mlp", "gpt"])
@pytest.mark.parametrize("method", ["by hand", "bucketed", "torch DDP"])
@pytest.mark.processes
@pytest.mark.slow
def test_data_parallel_ends_with_the_weights_of_one_process(scale_workers, model, method):
    run = Run(model=model, steps=3)
    results = data_parallel(scale_workers, method, run)
    weights = [r[0] if isinstance(r, tuple) else r for r in results]
    reference = train_single(run)
    assert max_difference(weights[0], weights[1]) == 0.0  # the ranks agree exactly
    assert max_difference(weights[0], reference) < 1e-6
    assert max_difference(reference, train_single(Run(model=model, steps=2))) > 1e-3  # the steps matter


@pytest.mark.processes
def test_buckets_start_before_backward_ends(scale_workers):
    _, buckets, log = data_parallel(scale_workers, "bucketed", Run(model="gpt", steps=1))[0]
    assert len(buckets) > 2
    n_gradients = sum(len(bucket) for bucket in buckets)
    assert [bucket for bucket, _ in log] == list(range(len(buckets)))
    assert log[0][1] < n_gradients  # the first all-reduce started while gradients were still coming


@pytest.mark.processes
def test_a_world_size_that_does_not_divide_the_batch_is_refused():
    pool = Workers(3)
    with pytest.raises(ValueError, match="batch_size=8 cannot be split over world_size=3"):
        data_parallel(pool, "by hand", Run(batch_size=8))
    assert pool.processes == []  # refused before any process started
    with pytest.raises(ValueError, match="divisible by 3"):
        shard_rows(torch.zeros(8, 2), 0, 3)


def test_buckets_refuse_a_non_positive_size():
    with pytest.raises(ValueError, match="bucket_bytes"):
        GradientBuckets(torch.nn.Linear(2, 2), 0)
