"""Pipeline parallelism by hand on 2 real processes: GPipe and 1F1B give one process's gradients
(float64); the schedules, their timeline and bubble; sizes refused before any process starts."""

from __future__ import annotations

import pytest

from helpers.model.gpt import GPTConfig
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


def test_measured_bubble_shrinks_with_more_micro_batches(workers):
    # timings on shared CPUs are noisy: only the coarse trend, m = 1 against m = 8
    measured = measure_bubble(workers, "1f1b", [1, 8], repeats=2)
    print({m: round(v["measured"], 3) for m, v in measured.items()})
    assert measured[1]["formula"] == 0.5 and measured[8]["formula"] == 1 / 9
    assert 0.2 < measured[1]["measured"] < 0.7
    assert measured[8]["measured"] < measured[1]["measured"]


def test_a_worker_failing_mid_schedule_stops_every_rank_and_names_itself(workers):
    # last in the module: it stops the module's workers
    with pytest.raises(WorkerFailed, match="micro-batch 2") as failure:
        run_pipeline(workers, "1f1b", micro_batches=4, batch_size=8, fail_at=(1, 2))
    assert failure.value.rank == 1
    assert workers.processes == []  # rank 0, waiting in a recv, was stopped too


def test_the_1f1b_exercise_checker_refuses_gpipe_and_accepts_the_order():
    from helpers.lab.exercises import evaluate

    assert evaluate("distributed.one_f_one_b", one_f_one_b_order)[0]
    passed, message = evaluate("distributed.one_f_one_b", gpipe_order)
    assert not passed and "GPipe" in message
