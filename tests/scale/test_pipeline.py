"""Pipeline parallelism by hand on 2 real processes: GPipe and 1F1B give one process's gradients
(float64); the schedules, their timeline and bubble; sizes refused before any process starts."""

from __future__ import annotations

import re
import threading
import types

import pytest
import torch
import torch.nn.functional as F
from ranks_in_threads import ThreadRanks, ThreadWorkers
from shared_tools import full

from helpers.model.gpt import GPT, GPTConfig
from helpers.scale import pipeline as pp
from helpers.scale.parallelism import bubble_fraction
from helpers.scale.pipeline import (
    gpipe_order,
    measure_bubble,
    one_f_one_b_order,
    reference_gradients,
    run_pipeline,
    timeline,
    timeline_bubble,
)
from helpers.scale.workers import WorkerFailed, Workers


@pytest.fixture
def workers(scale_workers):
    return scale_workers  # one pool for the session (tests/conftest.py)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.processes
def test_pipeline_gradients_equal_one_process(workers, schedule):
    reference = reference_gradients(batch_size=8)
    results = run_pipeline(workers, schedule, micro_batches=4, batch_size=8)
    seen = set()
    for result in results:
        for name, grad in result["grads"].items():
            gap = (grad - reference[name]).abs().max().item()
            assert gap < 1e-12, (name, gap)
            seen.add(name)
    assert seen == set(reference)  # every parameter lives on some stage
    assert set(results[0]["grads"]) & set(results[1]["grads"]) == {"embed.token.weight"}  # tied, on both
    assert results[0]["grads"]["embed.token.weight"].abs().max() > 1e-3
    assert results[0]["loss"] == 0.0 and results[1]["loss"] > 1.0  # the last stage computes the loss


@pytest.mark.processes
def test_mismatched_micro_batches_are_refused_before_any_process_starts():
    pool = Workers(2)
    with pytest.raises(ValueError, match="batch_size=10 cannot be cut into micro_batches=4"):
        run_pipeline(pool, "gpipe", micro_batches=4, batch_size=10)
    with pytest.raises(ValueError, match="micro_batches"):
        run_pipeline(pool, "gpipe", micro_batches=0)
    with pytest.raises(ValueError, match="n_layers=3"):
        run_pipeline(pool, "gpipe", 2, 8, GPTConfig(vocab_size=8, context_length=4, n_layers=3,
                                                     n_heads=1, d_model=4))
    with pytest.raises(ValueError, match="schedule"):
        run_pipeline(pool, "zigzag", 2)
    with pytest.raises(TypeError, match="workers"):
        run_pipeline(None, "gpipe", 2)
    with pytest.raises(ValueError, match="micro_batches"):
        measure_bubble(pool, "gpipe", [])
    with pytest.raises(ValueError, match="batch_size=16 cannot be cut into micro_batches=3"):
        measure_bubble(pool, "1f1b", [1, 3])
    assert pool.processes == []


def test_orders_run_every_op_once_and_1f1b_keeps_fewer_activations():
    assert gpipe_order(2, 3)[0] == [("F", 0), ("F", 1), ("F", 2), ("B", 0), ("B", 1), ("B", 2)]
    assert one_f_one_b_order(2, 3) == [[("F", 0), ("F", 1), ("B", 0), ("F", 2), ("B", 1), ("B", 2)],
                                       [("F", 0), ("B", 0), ("F", 1), ("B", 1), ("F", 2), ("B", 2)]]

    def most_in_flight(ops):
        alive = peak = 0
        for kind, _ in ops:
            alive += 1 if kind == "F" else -1
            peak = max(peak, alive)
        return peak

    for p, m in ((2, 8), (4, 8), (4, 2)):
        assert [most_in_flight(ops) for ops in one_f_one_b_order(p, m)] == [min(p - r, m) for r in range(p)]
        assert all(most_in_flight(ops) == m for ops in gpipe_order(p, m))


@pytest.mark.parametrize("order", [gpipe_order, one_f_one_b_order])
def test_timeline_bubble_is_the_formula(order):
    for p, m in ((2, 1), (2, 4), (4, 8), (3, 5)):
        events = timeline(order(p, m))
        assert len(events) == 2 * p * m
        assert abs(timeline_bubble(events) - bubble_fraction(p, m)) < 1e-12, (p, m)
    events = timeline(order(2, 2))
    assert (1, 0, "F", 0) not in events and (0, 0, "F", 0) in events  # rank 1 waits for rank 0


def test_timeline_refuses_bad_orders():
    with pytest.raises(ValueError, match="exactly once"):
        timeline([[("F", 0)], [("F", 0), ("B", 0)]])
    with pytest.raises(ValueError, match="before its forward"):
        timeline([[("B", 0), ("F", 0)]])
    with pytest.raises(ValueError, match="deadlock"):
        timeline([[("F", 0), ("B", 0), ("F", 1), ("B", 1)], [("F", 1), ("F", 0), ("B", 0), ("B", 1)]])
    with pytest.raises(ValueError, match="events"):
        timeline_bubble([])
    with pytest.raises(ValueError, match="stages"):
        gpipe_order(0, 2)
    with pytest.raises(TypeError, match="micro_batches"):
        one_f_one_b_order(2, 1.5)
    with pytest.raises(ValueError, match="batch_size"):
        reference_gradients(0)


@pytest.mark.processes
def test_the_bubble_shrinks_with_more_micro_batches(workers):
    # The schedule's counted bubble, not wall time: a loaded machine stretches any timing (the
    # measured shrinking lives in notebook 11 and benchmarks). measure_bubble runs the real
    # schedule; what it reports is checked for its form, and the idle slots are counted.
    measured = measure_bubble(workers, "1f1b", [1, 8], repeats=1)
    counted = {m: timeline_bubble(timeline(one_f_one_b_order(2, m))) for m in (1, 8)}
    assert counted == pytest.approx({1: 0.5, 8: 1 / 9}, abs=1e-12) and counted[8] < counted[1]
    for m, result in measured.items():
        assert result["formula"] == pytest.approx(counted[m], abs=1e-12)
        assert result["wall"] > 0 and 0 <= result["measured"] < 1  # busy time is within the step


@pytest.mark.processes
def test_a_worker_failing_mid_schedule_stops_every_rank_and_names_itself(workers):
    # last in the module: it stops the module's workers
    with pytest.raises(WorkerFailed, match="micro-batch 2") as failure:
        run_pipeline(workers, "1f1b", micro_batches=4, batch_size=8, fail_at=(1, 2))
    assert failure.value.rank == 1
    assert workers.processes == []  # rank 0, waiting in a recv, was stopped too


def test_the_1f1b_exercise_checker_refuses_gpipe_and_accepts_the_order():
    from helpers.lab.exercises import evaluate

    assert evaluate("distributed.one_f_one_b", one_f_one_b_order, watched=False)[0]  # right, but
    passed, message = evaluate("distributed.one_f_one_b", one_f_one_b_order)  # the course's: no grade
    assert not passed and "helpers.scale.pipeline.one_f_one_b_order" in message
    passed, message = evaluate("distributed.one_f_one_b", gpipe_order, watched=False)
    assert not passed and "GPipe" in message


# Pipeline parallelism by hand (helpers.scale.pipeline) with its ranks as threads of this process
# (tests/ranks_in_threads.py), where mutmut sees the workers' code run: GPipe and 1F1B on 2 and 4 stages
# give one process's gradients (float64), each rank sends and receives exactly what its schedule
# says, the orders and the timeline slot by slot, every check read in full.

SMALL = GPTConfig(vocab_size=16, context_length=4, n_layers=4, n_heads=1, d_model=8)


def thread_workers(monkeypatch, world_size: int) -> ThreadWorkers:
    return ThreadWorkers(ThreadRanks(world_size).patch(monkeypatch, pp))


def expected_calls(schedule: str, rank: int, p: int, m: int, tied: bool = True) -> list[str]:
    """The messages rank r's schedule implies: F i receives from r - 1 and sends to r + 1, B i
    receives the gradient from r + 1 and sends one to r - 1; then the tied matrix's all-reduce."""
    calls = ["barrier"]
    for kind, _ in pp.ORDERS[schedule](p, m)[rank]:
        if kind == "F":
            calls += ([f"recv from {rank - 1}"] if rank > 0 else []) + ([f"send to {rank + 1}"] if rank < p - 1 else [])
        else:
            calls += ([f"recv from {rank + 1}"] if rank < p - 1 else []) + ([f"send to {rank - 1}"] if rank > 0 else [])
    return calls + (["all_reduce"] if tied and p > 1 else [])


@pytest.mark.parametrize(("schedule", "p", "m"), [("gpipe", 2, 2), ("1f1b", 2, 4), ("1f1b", 4, 4)])
def test_the_pipeline_on_thread_ranks_gives_one_processs_gradients(monkeypatch, schedule, p, m):
    workers = thread_workers(monkeypatch, p)
    results = pp.run_pipeline(workers, schedule, m, batch_size=8, config=SMALL, seed=3)
    reference = pp.reference_gradients(8, SMALL, seed=3)
    seen = {}
    for result in results:
        for name, grad in result["grads"].items():
            assert grad.dtype == torch.float64
            torch.testing.assert_close(grad, reference[name], rtol=0, atol=1e-12)
            seen[name] = seen.get(name, 0) + 1
    assert set(seen) == set(reference)
    assert {n for n, count in seen.items() if count > 1} == {"embed.token.weight"}
    assert reference["embed.token.weight"].abs().max() > 1e-3
    # the loss: the last stage's sum of the micro-batches' shares, the whole batch's loss
    torch.manual_seed(3)
    model = GPT(SMALL).double()
    ids, targets = pp._batch(SMALL, 8, 3)
    loss = F.cross_entropy(model(ids).flatten(0, 1), targets.flatten()).item()
    assert [r["loss"] for r in results[:-1]] == [0.0] * (p - 1)
    assert abs(results[-1]["loss"] - loss) < 1e-12
    assert all(0 < r["busy"] <= r["wall"] for r in results)
    for rank in range(p):
        assert [c for r, c in workers.ranks.calls if r == rank] == expected_calls(schedule, rank, p, m)


def test_a_stage_holds_its_blocks_and_names_its_parameters():
    torch.manual_seed(0)
    model = GPT(SMALL)
    stages = [pp.Stage(model, rank, 2) for rank in range(2)]
    assert (stages[0].first, stages[0].last, stages[1].first, stages[1].last) == (True, False, False, True)
    assert stages[0].embed is model.embed and stages[1].embed is None
    assert stages[1].ln_f is model.ln_f and stages[1].lm_head is model.lm_head and stages[0].ln_f is None
    assert list(stages[0].blocks) == list(model.blocks[:2]) and list(stages[1].blocks) == list(model.blocks[2:])
    names = dict(model.named_parameters())
    for stage in stages:
        assert all(names[name] is p for p, name in stage.names.items())
    assert set(stages[0].names.values()) | set(stages[1].names.values()) == set(names)
    ids = torch.randint(0, 16, (2, 4))
    with torch.no_grad():
        torch.testing.assert_close(stages[1](stages[0](ids)), model(ids), rtol=0, atol=0)
    middle = pp.Stage(model, 1, 4)
    assert not middle.first and not middle.last and list(middle.blocks) == [model.blocks[1]]


def test_float32_when_not_double_and_an_untied_model_adds_nothing(monkeypatch):
    untied = GPTConfig(vocab_size=16, context_length=4, n_layers=2, n_heads=1, d_model=8, tie_weights=False)
    workers = thread_workers(monkeypatch, 2)
    results = pp.run_pipeline(workers, "gpipe", 2, batch_size=4, config=untied, double=False)
    assert all(g.dtype == torch.float32 for r in results for g in r["grads"].values())
    assert "all_reduce" not in [c for _, c in workers.ranks.calls]
    assert set(results[0]["grads"]).isdisjoint(results[1]["grads"])
    reference = pp.reference_gradients(4, untied)
    for result in results:
        for name, grad in result["grads"].items():
            torch.testing.assert_close(grad.double(), reference[name], rtol=0, atol=1e-5)


def test_one_stage_runs_the_whole_model_without_messages(monkeypatch):
    workers = thread_workers(monkeypatch, 1)
    (result,) = pp.run_pipeline(workers, "1f1b", 2, batch_size=4, config=SMALL)
    reference = pp.reference_gradients(4, SMALL)
    assert set(result["grads"]) == set(reference)
    for name, grad in result["grads"].items():
        torch.testing.assert_close(grad, reference[name], rtol=0, atol=1e-12)
    assert workers.ranks.calls == [(0, "barrier")]


def test_fail_at_fails_that_rank_at_that_forward_only(monkeypatch):
    ranks = ThreadRanks(2).patch(monkeypatch, pp)
    with pytest.raises(RuntimeError, match="^rank 1 fails on purpose at the forward of micro-batch 0$"):
        pp.run_pipeline(ThreadWorkers(ranks), "gpipe", 2, batch_size=4, config=SMALL, fail_at=(1, 0))
    assert [c for r, c in ranks.calls if r == 1] == ["barrier"]  # before it receives anything
    with pytest.raises(RuntimeError, match="^rank 0 fails on purpose at the forward of micro-batch 1$"):
        pp.run_pipeline(thread_workers(monkeypatch, 1), "gpipe", 2, batch_size=4, config=SMALL, fail_at=(0, 1))
    # another rank's or a missing micro-batch's fail_at changes nothing
    for fail_at in ((1, 0), (0, 5)):
        (result,) = pp.run_pipeline(thread_workers(monkeypatch, 1), "gpipe", 2, batch_size=4,
                                    config=SMALL, fail_at=fail_at)
        assert result["loss"] > 0


def test_the_defaults_are_the_notebooks_model_and_batch():
    assert (pp.PIPE_GPT.vocab_size, pp.PIPE_GPT.context_length, pp.PIPE_GPT.n_layers,
            pp.PIPE_GPT.n_heads, pp.PIPE_GPT.d_model) == (32, 16, 4, 2, 32)
    assert (pp.TIMING_GPT.vocab_size, pp.TIMING_GPT.context_length, pp.TIMING_GPT.n_layers,
            pp.TIMING_GPT.n_heads, pp.TIMING_GPT.d_model) == (64, 64, 4, 4, 128)
    default = pp.reference_gradients()
    explicit = pp.reference_gradients(8, pp.PIPE_GPT, 0)
    assert default.keys() == explicit.keys()
    assert all(torch.equal(default[n], explicit[n]) for n in default)
    other = pp.reference_gradients(8, pp.PIPE_GPT, 1)
    assert not torch.equal(other["embed.token.weight"], default["embed.token.weight"])
    ids, targets = pp._batch(pp.PIPE_GPT, 3, 0)
    assert ids.shape == targets.shape == (3, 16) and torch.equal(ids[:, 1:], targets[:, :-1])
    assert int(ids.max()) < 32 and int(ids.max()) > 16  # drawn from the whole vocabulary


def test_measure_bubble_takes_the_fastest_of_its_repeats(monkeypatch):
    workers = thread_workers(monkeypatch, 2)
    measured = pp.measure_bubble(workers, "gpipe", [1, 2], batch_size=4, config=SMALL, repeats=2)
    assert list(measured) == [1, 2] and workers.runs == 4
    for m, row in measured.items():
        assert row["formula"] == 1 / (m + 1)
        assert 0 < row["wall"] and 0 <= row["measured"] < 1
    with pytest.raises(ValueError, match="repeats"):
        pp.measure_bubble(workers, "gpipe", [1], repeats=0)
    with pytest.raises(ValueError, match=r"^micro_batches is 2, expected a non-empty list of ints$"):
        pp.measure_bubble(workers, "gpipe", 2)
    assert workers.runs == 4


def test_measure_bubble_repeats_three_times_on_the_timing_model_unless_told(monkeypatch):
    seen = []

    def fake_run(workers, schedule, m, batch_size, config, double):
        seen.append((schedule, m, batch_size, config, double))
        wall = 4.0 - len(seen)  # the third run is the fastest
        return [{"wall": wall, "busy": wall / 2}, {"wall": wall / 2, "busy": wall / 2}]

    monkeypatch.setattr(pp, "run_pipeline", fake_run)
    workers = Workers(2)
    measured = pp.measure_bubble(workers, "1f1b", [2])
    assert seen == [("1f1b", 2, 16, pp.TIMING_GPT, False)] * 3
    assert measured == {2: {"wall": 1.0, "measured": 0.25, "formula": 1 / 3}}


def test_the_orders_and_the_timeline_slot_by_slot():
    assert pp.gpipe_order(3, 2) == [[("F", 0), ("F", 1), ("B", 0), ("B", 1)]] * 3
    assert pp.one_f_one_b_order(3, 1) == [[("F", 0), ("B", 0)]] * 3  # the warm-up capped at m
    assert pp.one_f_one_b_order(3, 3)[0] == [("F", 0), ("F", 1), ("F", 2), ("B", 0), ("B", 1), ("B", 2)]
    assert pp.one_f_one_b_order(3, 3)[1] == [("F", 0), ("F", 1), ("B", 0), ("F", 2), ("B", 1), ("B", 2)]
    assert pp.timeline(pp.gpipe_order(2, 2)) == [
        (0, 0, "F", 0), (0, 1, "F", 1), (1, 1, "F", 0), (1, 2, "F", 1), (1, 3, "B", 0),
        (0, 4, "B", 0), (1, 4, "B", 1), (0, 5, "B", 1)]
    assert pp.timeline([[("F", 0), ("B", 0)]]) == [(0, 0, "F", 0), (0, 1, "B", 0)]
    events = pp.timeline(pp.one_f_one_b_order(3, 2))
    assert max(e[1] for e in events) + 1 == 2 * (2 + 3 - 1)
    assert pp.timeline_bubble([(0, 0, "F", 0), (0, 3, "B", 0), (1, 1, "F", 0)]) == 1 - 3 / 8


def test_the_order_and_size_checks_read_in_full():
    with pytest.raises(ValueError, match=re.escape("orders is [], expected one list of ('F' or 'B', i) per rank")):
        pp.timeline([])
    with pytest.raises(ValueError, match=re.escape("orders is 'FB', expected")):
        pp.timeline("FB")
    bad = [[("F", 0), ("B", 0)], [("F", 0), ("F", 0)]]
    with pytest.raises(ValueError, match=re.escape(f"orders[1] is {bad[1]}, expected each of ('F', i) and "
                                                   "('B', i) for i < 1 exactly once")):
        pp.timeline(bad)
    backwards = [[("F", 0), ("B", 0), ("F", 1), ("B", 1)], [("F", 0), ("B", 1), ("F", 1), ("B", 0)]]
    with pytest.raises(ValueError, match=re.escape(f"orders[1] runs a backward before its forward: {backwards[1]}")):
        pp.timeline(backwards)
    with pytest.raises(ValueError, match="^orders deadlock: every rank waits for an op no rank can run$"):
        pp.timeline([[("F", 0), ("B", 0), ("F", 1), ("B", 1)], [("F", 1), ("F", 0), ("B", 0), ("B", 1)]])
    with pytest.raises(ValueError, match=full('events is empty, expected the output of timeline()')):
        pp.timeline_bubble([])
    with pytest.raises(ValueError, match="^micro_batches is 0"):
        pp.gpipe_order(2, 0)
    with pytest.raises(ValueError, match="^stages is 0"):
        pp.one_f_one_b_order(0, 2)
    with pytest.raises(ValueError, match=re.escape("orders[0] is [('F', 0)], expected each of ('F', i) and "
                                                   "('B', i) for i < 1 exactly once")):
        pp.timeline([[("F", 0)]])  # m counts the forwards of rank 0
    message = ("batch_size=6 cannot be cut into micro_batches=4: expected a batch_size divisible by 4 "
               "(equal micro-batches, so that the mean of their losses is the batch's loss)")
    with pytest.raises(ValueError, match=full(message)):
        pp.check_pipeline(2, "gpipe", 4, 6)
    message = "config.n_layers=4 cannot be split over world_size=3 stages: expected a multiple of 3"
    with pytest.raises(ValueError, match=full(message)):
        pp.check_pipeline(3, "1f1b", 2, 8)
    pp.check_pipeline(4, "1f1b", 2, 8)  # fits: no error
    for args, name in (((0, "gpipe", 2, 8), "world_size"), ((2, "gpipe", 2, 0), "batch_size"),
                       ((2, "gpipe", 0, 8), "micro_batches"), ((2, "GPipe", 2, 8), "schedule")):
        with pytest.raises(ValueError, match=f"^{name} is "):
            pp.check_pipeline(*args)
    with pytest.raises(TypeError, match="^workers is a NoneType, expected a Workers$"):
        pp.run_pipeline(None, "gpipe", 2)
    with pytest.raises(TypeError, match="^workers is a str, expected a Workers$"):
        pp.run_pipeline("pool", "gpipe", 2)
    with pytest.raises(TypeError, match="^double is "):
        pp.run_pipeline(Workers(2), "gpipe", 2, double=1)
    with pytest.raises(ValueError, match="^batch_size is 0"):
        pp.reference_gradients(0)


def test_run_pipeline_checks_the_config_it_is_given(monkeypatch):
    workers = thread_workers(monkeypatch, 2)
    odd = GPTConfig(vocab_size=16, context_length=4, n_layers=3, n_heads=1, d_model=8)
    with pytest.raises(ValueError, match="^config.n_layers=3 cannot be split over world_size=2"):
        pp.run_pipeline(workers, "gpipe", 2, 8, odd)
    with pytest.raises(ValueError, match="^repeats is 0"):
        pp.measure_bubble(workers, "gpipe", [1], repeats=0)
    assert workers.runs == 0


def test_the_worker_defaults_are_the_notebooks(monkeypatch):
    """pipeline_worker called with its defaults: PIPE_GPT, seed 0, float64, one process's gradients."""
    (result,) = ThreadRanks(1).patch(monkeypatch, pp).run(pp.pipeline_worker, "gpipe", 1, 2)
    reference = pp.reference_gradients(2)
    for name, grad in result["grads"].items():
        assert grad.dtype == torch.float64
        torch.testing.assert_close(grad, reference[name], rtol=0, atol=1e-12)


def test_a_batch_is_drawn_from_its_own_seeded_generator():
    config = GPTConfig(vocab_size=4, context_length=8, n_layers=1, n_heads=1, d_model=4)
    first, again = pp._batch(config, 16, 5), pp._batch(config, 16, 5)
    assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])  # no global generator
    assert not torch.equal(first[0], pp._batch(config, 16, 6)[0])
    assert set(first[0].flatten().tolist()) == {0, 1, 2, 3}  # every id, 0 included


def test_busy_counts_the_compute_and_wall_the_whole_step(monkeypatch):
    """A clock that ticks one second per reading, per rank: each op is read twice around its
    compute (one second busy), the step once before and once after (the wall)."""
    clock = threading.local()

    def perf_counter():
        clock.now = getattr(clock, "now", 0.0) + 1.0
        return clock.now

    monkeypatch.setattr(pp, "time", types.SimpleNamespace(perf_counter=perf_counter))
    results = pp.run_pipeline(thread_workers(monkeypatch, 2), "1f1b", 3, batch_size=6, config=SMALL)
    for result in results:
        assert (result["busy"], result["wall"]) == (2 * 3, 4 * 3 + 1)
