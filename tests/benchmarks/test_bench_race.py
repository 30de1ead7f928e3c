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
    budgets = {"nanogpt": settings["seconds"]}
    for run in race["runs"]:
        for name, curve in run["curves"].items():
            budget = budgets.get(name, settings.get("course_seconds") or settings["seconds"])
            assert len(curve["seconds"]) == settings["points"] + 1
            assert budget <= curve["seconds"][-1] < budget * 1.1  # each trained its own budget


def test_the_races_on_record_cover_one_and_two_threads_and_bf16():
    assert {p.stem for p in RACES} >= {"race_fp32_1thread", "race_fp32_1thread_30s", "race_fp32_2threads_30s",
                                       "race_bf16_1thread_20s"}
