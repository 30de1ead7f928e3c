"""benchmarks/bench_race.py, issue 42's race: its schedule, its bookkeeping and its summary, on
stand-in contestants (no training: a real race is minutes of a quiet machine)."""

from __future__ import annotations

import importlib.util
import math
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SPEC = importlib.util.spec_from_file_location("bench_race", ROOT / "benchmarks" / "bench_race.py")
bench = importlib.util.module_from_spec(SPEC)
sys.modules[SPEC.name] = bench  # dataclasses look their module up there
SPEC.loader.exec_module(bench)


def test_nanogpt_schedule_warms_up_decays_to_its_floor_and_stays_there():
    assert bench.nanogpt_lr(0) == pytest.approx(1e-3 / 101)
    assert bench.nanogpt_lr(100) == pytest.approx(1e-3)
    assert bench.nanogpt_lr(1050) == pytest.approx((1e-3 + 1e-4) / 2)
    assert bench.nanogpt_lr(2000) == pytest.approx(1e-4) and bench.nanogpt_lr(5000) == 1e-4
    rates = [bench.nanogpt_lr(step) for step in range(2001)]
    assert all(a <= b for a, b in zip(rates[:100], rates[1:101], strict=True))
    assert all(a >= b for a, b in zip(rates[100:-1], rates[101:], strict=True))


def test_fitted_schedule_is_nanogpts_stretched_to_end_with_the_budget():
    warmup = bench.NANO_WARMUP / bench.NANO_HORIZON
    assert bench.fitted_nanogpt_lr(0.0, 1.0, warmup) == 0.0
    assert bench.fitted_nanogpt_lr(warmup, 1.0, warmup) == pytest.approx(1e-3)
    assert bench.fitted_nanogpt_lr(1.0, 1.0, warmup) == pytest.approx(1e-4)
    assert bench.fitted_nanogpt_lr(1.3, 1.0, warmup) == 1e-4
    for step in range(bench.NANO_WARMUP, bench.NANO_HORIZON + 1, 50):  # past the warm-up: the same curve
        assert bench.fitted_nanogpt_lr(step / bench.NANO_HORIZON, 1.0, warmup) == pytest.approx(bench.nanogpt_lr(step))
    # the same schedule in seconds: 60 s with a 3 s warm-up is the fractions' one at elapsed / 60
    assert bench.fitted_nanogpt_lr(33.0, 60.0, 3.0) == pytest.approx(bench.fitted_nanogpt_lr(0.55, 1.0, warmup))
    rates = [bench.fitted_nanogpt_lr(t / 1000, 1.0, warmup) for t in range(1001)]
    assert all(a <= b for a, b in zip(rates[:50], rates[1:51], strict=True))
    assert all(a >= b for a, b in zip(rates[50:-1], rates[51:], strict=True))


def test_fitted_schedule_without_warm_up_starts_at_the_peak():
    assert bench.fitted_nanogpt_lr(0.0, 60.0, 0.0) == pytest.approx(1e-3)
    assert bench.fitted_nanogpt_lr(30.0, 60.0, 0.0) == pytest.approx((1e-3 + 1e-4) / 2)


@pytest.mark.parametrize(("args", "name"), [
    ((1.0, 0.0, 0.0), "budget"), ((1.0, -60.0, 0.0), "budget"), ((1.0, math.nan, 0.0), "budget"),
    ((1.0, math.inf, 0.0), "budget"), ((1.0, "60", 0.0), "budget"),
    ((1.0, 60.0, 60.0), "warmup"), ((1.0, 60.0, 90.0), "warmup"), ((1.0, 60.0, -1.0), "warmup"),
    ((-0.5, 60.0, 3.0), "elapsed"), ((math.nan, 60.0, 3.0), "elapsed"), ((None, 60.0, 3.0), "elapsed"),
])
def test_fitted_schedule_refuses_bad_input_by_name(args, name):
    with pytest.raises((TypeError, ValueError), match=rf"^{name} is "):
        bench.fitted_nanogpt_lr(*args)


def test_fitted_schedule_names_the_budget_a_warm_up_must_fit_in():
    with pytest.raises(ValueError, match=r"warmup is 90.0, .*budget \(60\)"):
        bench.fitted_nanogpt_lr(1.0, 60.0, 90.0)


def test_the_two_nanogpt_contestants_differ_only_in_their_schedule():
    torch = pytest.importorskip("torch")
    train_ids = torch.randint(0, 11, (4000,), generator=torch.Generator().manual_seed(0))
    val_batches = [(train_ids[:64].view(1, 64), train_ids[1:65].view(1, 64))]
    nano, fitted = bench.make_contestants(["nanogpt", "nanogpt-fitted"], 11, train_ids, train_ids, val_batches,
                                          seed=3, precision="fp32", muon_lr=0.04)
    assert nano.val_loss() == fitted.val_loss()  # the same weights
    assert [nano.step(1e-3) for _ in range(3)] == [fitted.step(1e-3) for _ in range(3)]  # the same windows
    assert nano.val_loss() == fitted.val_loss()
    assert nano.budget == fitted.budget == 0.0  # both train the race's budget, not --course-seconds
    assert nano.schedule(1050, 0.3) == pytest.approx(bench.nanogpt_lr(1050))  # by steps, to step 2,000
    assert fitted.schedule(1050, 0.3) == pytest.approx(bench.nanogpt_lr(600))  # by time: 0.3 of 2,000 steps
    assert fitted.schedule(5, 1.0) == pytest.approx(1e-4)


def test_add_fitted_replays_nanogpts_steps_and_places_the_fitted_curve_at_its_seconds():
    torch = pytest.importorskip("torch")
    train_ids = torch.randint(0, 11, (4000,), generator=torch.Generator().manual_seed(0))
    val_batches = [(train_ids[:64].view(1, 64), train_ids[1:65].view(1, 64))]
    nano = bench.make_contestants(["nanogpt"], 11, train_ids, train_ids, val_batches, seed=1, precision="fp32",
                                  muon_lr=0.04)[0]
    losses = [nano.val_loss()]
    for step in range(4):
        nano.step(bench.nanogpt_lr(step))
        if step % 2 == 1:
            losses.append(nano.val_loss())
    stored = {"settings": {"seconds": 2.0, "precision": "fp32", "muon_lr": 0.04, "threads": 1},
              "runs": [{"seed": 1, "curves": {
                  "nanogpt": {"seconds": [0.0, 1.0, 2.0], "steps": [0, 2, 4], "val_loss": losses},
                  "course": {"seconds": [0.0, 1.0, 2.0], "steps": [0, 3, 6], "val_loss": [9.0, 0.5, 0.1]}}}]}
    extended = bench.add_fitted(stored, 11, train_ids, train_ids, val_batches)
    assert extended["settings"]["nanogpt_fitted"]["replay_error"] == {"1": 0.0}  # the replay is nanogpt's arithmetic
    fitted = extended["runs"][0]["curves"]["nanogpt-fitted"]
    assert fitted["seconds"] == [0.0, 1.0, 2.0] and fitted["steps"] == [0, 2, 4]
    assert fitted["val_loss"][0] == losses[0] and fitted["val_loss"][1:] != losses[1:]  # same start, own rates
    assert extended["summary"] == bench.summarise(extended["runs"], 2.0)
    assert extended["summary"]["per_seed"][0]["fitted_target"] == fitted["val_loss"][-1]
    assert stored["runs"][0]["curves"].keys() == {"nanogpt", "course"}  # the stored race is left as it was


def test_add_fitted_refuses_what_is_not_a_race():
    with pytest.raises(TypeError, match=r"^race_json is .*expected a race"):
        bench.add_fitted([], 11, None, None, [])


def test_time_to_reach_interpolates_between_evaluations():
    curve = {"seconds": [0.0, 10.0, 20.0], "val_loss": [4.0, 3.0, 2.0]}
    assert bench.time_to_reach(curve, 2.5) == pytest.approx(15.0)
    assert bench.time_to_reach(curve, 3.0) == pytest.approx(10.0)
    assert bench.time_to_reach(curve, 4.5) == 0.0
    assert bench.time_to_reach(curve, 1.0) is None


def test_summary_takes_nanogpts_final_loss_as_the_target():
    runs = [{"seed": seed, "curves": {
        "nanogpt": {"seconds": [0.0, 10.0], "val_loss": [4.0, 3.0]},
        "course": {"seconds": [0.0, 5.0, 10.0], "val_loss": [4.0, 3.0 - seed, 2.0]},
        "slow": {"seconds": [0.0, 10.0], "val_loss": [4.0, 3.5]}}} for seed in (0, 1, 2)]
    summary = bench.summarise(runs, 10.0)
    assert [row["course"]["speedup"] for row in summary["per_seed"]] == pytest.approx([2.0, 2.0 * 2, 2.0 * 3])
    assert summary["median_speedup"] == pytest.approx({"course": 4.0, "slow": 0.0})
    assert summary["per_seed"][0]["slow"]["reaches_target_at_s"] is None


def test_summary_measures_each_course_recipe_against_both_nanogpt_schedules():
    runs = [{"seed": seed, "curves": {
        "nanogpt": {"seconds": [0.0, 10.0], "val_loss": [4.0, 3.0]},
        "nanogpt-fitted": {"seconds": [0.0, 5.0, 10.0], "val_loss": [4.0, 3.0, 2.0 + 0.1 * seed]},
        "course": {"seconds": [0.0, 5.0, 10.0], "val_loss": [4.0, 2.0, 1.0]},
        "slow": {"seconds": [0.0, 10.0], "val_loss": [4.0, 2.5]}}} for seed in (0, 1, 2)]
    summary = bench.summarise(runs, 10.0)
    rows = summary["per_seed"]
    assert [row["target"] for row in rows] == [3.0, 3.0, 3.0]
    assert [row["fitted_target"] for row in rows] == pytest.approx([2.0, 2.1, 2.2])  # its own final loss
    assert rows[0]["nanogpt-fitted"]["speedup"] == pytest.approx(2.0)  # annealing alone, against nanogpt
    assert "speedup_vs_fitted" not in rows[0]["nanogpt-fitted"]
    # course: 3.0 at 2.5 s (4x); 2.0 at 5 s (2x), 2.1 at 4.75 s, 2.2 at 4.5 s; slow: 3.0 at 6.67 s
    assert [row["course"]["speedup"] for row in rows] == pytest.approx([4.0, 4.0, 4.0])
    assert [row["course"]["reaches_fitted_target_at_s"] for row in rows] == pytest.approx([5.0, 4.75, 4.5])
    assert [row["course"]["speedup_vs_fitted"] for row in rows] == pytest.approx([2.0, 10 / 4.75, 10 / 4.5])
    assert rows[0]["slow"]["speedup"] == pytest.approx(1.5) and rows[0]["slow"]["speedup_vs_fitted"] is None
    assert summary["median_speedup"] == pytest.approx({"nanogpt-fitted": 2.0, "course": 4.0, "slow": 1.5})
    assert summary["median_speedup_vs_fitted"] == pytest.approx({"course": 10 / 4.75, "slow": 0.0})


def test_summary_without_the_fitted_contestant_keeps_its_old_keys():
    runs = [{"seed": 0, "curves": {"nanogpt": {"seconds": [0.0, 10.0], "val_loss": [4.0, 3.0]},
                                   "course": {"seconds": [0.0, 10.0], "val_loss": [4.0, 2.0]}}}]
    summary = bench.summarise(runs, 10.0)
    assert set(summary) == {"per_seed", "median_speedup"}
    assert set(summary["per_seed"][0]) == {"seed", "target", "course"}
    assert set(summary["per_seed"][0]["course"]) == {"final_val_loss", "reaches_target_at_s", "speedup"}


@pytest.mark.parametrize(("runs", "budget", "message"), [
    ([{"seed": 0, "curves": {"nanogpt": {"seconds": [0.0], "val_loss": [1.0]}}}], 0.0, r"^budget is "),
    ([], 10.0, r"^runs is \[\], expected a non-empty list"),
    ([{"seed": 0, "curves": {"course": {"seconds": [0.0], "val_loss": [1.0]}}}], 10.0,
     r"^runs\[0\] has curves \['course'\], expected one named 'nanogpt'"),
])
def test_summary_refuses_bad_input_by_name(runs, budget, message):
    with pytest.raises((TypeError, ValueError), match=message):
        bench.summarise(runs, budget)


def sleeper(name: str, step_seconds: float) -> bench.Contestant:
    """A contestant whose step sleeps, and whose loss is the time it trained."""
    contestant = bench.Contestant(name, lambda lr: time.sleep(step_seconds) or lr,
                                  lambda steps, progress: 1.0 - min(progress, 1.0) + 1e-3,
                                  lambda: -1.0)
    contestant.val_loss = lambda: 10.0 - contestant.seconds
    return contestant


def test_race_gives_each_contestant_its_budget_and_evaluates_at_each_mark():
    fast, slow = sleeper("fast", 0.002), sleeper("slow", 0.01)
    bench.race([fast, slow], budget=0.2, points=4, slice_seconds=0.05)
    for contestant in (fast, slow):
        seconds = contestant.curve["seconds"]
        assert seconds[0] == 0.0 and len(seconds) == 5
        assert all(mark <= s for mark, s in zip([0.05, 0.1, 0.15, 0.2], seconds[1:], strict=True))
        assert 0.2 <= contestant.seconds < 0.2 + 0.5  # stops about a step past the budget
        assert contestant.curve["val_loss"] == pytest.approx([10.0 - s for s in seconds])
    assert fast.steps > slow.steps
    assert math.isclose(fast.curve["steps"][-1], fast.steps)


def test_a_contestant_with_its_own_budget_trains_that_long_and_spreads_its_schedule_over_it():
    progress_seen = []
    short, full = sleeper("short", 0.002), sleeper("full", 0.002)
    short.schedule = lambda steps, progress: progress_seen.append(progress) or 1.0
    short.budget = 0.1
    bench.race([short, full], budget=0.2, points=4, slice_seconds=0.05)
    assert 0.1 <= short.seconds < 0.1 + 0.3 and 0.2 <= full.seconds
    assert all(mark <= s for mark, s in zip([0.025, 0.05, 0.075, 0.1], short.curve["seconds"][1:], strict=True))
    assert len(short.curve["seconds"]) == 5 and 0.9 < max(progress_seen) <= 1.5  # its own budget, not 0.2


RACES = sorted((ROOT / "data").glob("race_*.json"))


@pytest.mark.parametrize("path", RACES, ids=lambda p: p.stem)
def test_a_stored_race_summary_is_what_its_curves_say(path):
    import json

    race = json.loads(path.read_text(encoding="utf-8"))
    settings = race["settings"]
    assert settings["seeds"] == [run["seed"] for run in race["runs"]] and len(settings["seeds"]) >= 3
    assert race["summary"] == bench.summarise(race["runs"], settings["seconds"])  # JSON keeps floats exactly
    budgets = {"nanogpt": settings["seconds"], "nanogpt-fitted": settings["seconds"]}
    for run in race["runs"]:
        for name, curve in run["curves"].items():
            budget = budgets.get(name, settings.get("course_seconds") or settings["seconds"])
            assert len(curve["seconds"]) == settings["points"] + 1
            assert budget <= curve["seconds"][-1] < budget * 1.1  # each trained its own budget


def test_the_races_on_record_cover_one_and_two_threads_and_bf16():
    assert {p.stem for p in RACES} >= {"race_fp32_1thread", "race_fp32_1thread_30s", "race_fp32_2threads_30s",
                                       "race_bf16_1thread_20s"}
