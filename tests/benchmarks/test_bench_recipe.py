"""benchmarks/bench_recipe.py, issue 42's recipe ablation: its bookkeeping on stand-in curves, and
the stored data/recipe_ablation.json recomputed from its own curves (no training here: the
ablation is half an hour of CPU)."""

from __future__ import annotations

import importlib.util
import json
import statistics
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SPEC = importlib.util.spec_from_file_location("bench_recipe", ROOT / "benchmarks" / "bench_recipe.py")
bench = importlib.util.module_from_spec(SPEC)
sys.modules[SPEC.name] = bench  # dataclasses look their module up there
SPEC.loader.exec_module(bench)
STORED = ROOT / "data" / "recipe_ablation.json"


def test_step_to_reach_interpolates_between_evaluations():
    curve = {"steps": [0, 100, 200], "val_loss": [4.0, 3.0, 2.0]}
    assert bench.step_to_reach(curve, 2.5) == pytest.approx(150.0)
    assert bench.step_to_reach(curve, 3.0) == pytest.approx(100.0)
    assert bench.step_to_reach(curve, 4.5) == 0.0
    assert bench.step_to_reach(curve, 1.0) is None


def test_eval_steps_start_at_zero_and_end_at_the_budget():
    assert bench.eval_steps(100, 4) == [0, 25, 50, 75, 100]
    assert bench.eval_steps(3, 10) == [0, 1, 2, 3]  # no step twice


def test_summary_gives_each_seed_its_own_target_and_counts_the_seeds_that_beat_it():
    runs = [{"variant": "a", "seed": seed, "steps": 200,
             "curve": {"steps": [0, 100, 200], "val_loss": [4.0, 3.0, 2.0 + seed]}} for seed in (0, 1, 2)]
    table = bench.summarise(runs, {0: 2.5, 1: 2.5, 2: 3.5}, ["a"])["a"]
    assert [row["reaches_target_at_step"] for row in table["per_seed"]] == pytest.approx([150.0, None, 50.0])
    assert table["per_seed"][2]["share_of_budget"] == pytest.approx(0.25)
    assert table["median_final_val_loss"] == 3.0 and table["seeds_beating_target"] == 2


def test_variants_that_differ_in_rates_share_a_step_cost_and_model_changes_do_not():
    base = bench.MUON_RATES[0]
    assert {v.cost_key for v in bench.MUON_RATES} == {base.cost_key}
    assert len({v.cost_key for v in bench.model_stage(base)} | {base.cost_key}) == len(bench.MODEL_CHANGES) + 1
    assert bench.ADAMW_RATES[0].cost_key != base.cost_key


def test_relu_squared_model_uses_it_in_every_block():
    model = bench.build_model(bench.Variant("x", activation="relu2"), vocab_size=11, seed=0)
    assert all(isinstance(block.mlp.activation, bench.ReLUSquared) for block in model.blocks)


# --- the stored ablation ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def stored() -> dict:
    return json.loads(STORED.read_text(encoding="utf-8"))


def test_stored_ablation_covers_every_stage_on_at_least_three_seeds(stored):
    seeds = stored["settings"]["seeds"]
    assert len(seeds) >= 3 and not stored["settings"]["quick"]
    names = [v["name"] for v in stored["variants"]]
    assert {v.name for v in bench.ADAMW_RATES + bench.MUON_RATES} <= set(names)
    assert sum(v["stage"] == "model" for v in stored["variants"]) == len(bench.MODEL_CHANGES)
    assert stored["best_muon"] in names
    for name in names:
        assert sorted(run["seed"] for run in stored["runs"] if run["variant"] == name) == sorted(seeds)


def test_stored_summary_is_what_its_curves_say(stored):
    targets = {int(seed): value for seed, value in stored["targets"].items()}
    names = [v["name"] for v in stored["variants"]]
    assert stored["summary"] == bench.summarise(stored["runs"], targets, names)  # JSON keeps floats exactly


def test_stored_best_muon_row_has_the_lowest_median_loss_of_the_muon_recipes(stored):
    muon = [v["name"] for v in stored["variants"] if v["optimizer"] == "muon" and v["stage"] == "recipe"]
    losses = {name: stored["summary"][name]["median_final_val_loss"] for name in muon}
    assert stored["best_muon"] == min(losses, key=losses.get)


def test_stored_budgets_follow_the_measured_step_cost_ratios(stored):
    settings, costs = stored["settings"], stored["step_costs"]
    assert costs["nanogpt"]["ratio_to_nanogpt"] == 1.0
    for cost in costs.values():  # rounds are stored to 10 microseconds
        assert len(cost["rounds"]) == settings["rounds"]
        assert cost["median_seconds"] == pytest.approx(statistics.median(cost["rounds"]), abs=1e-5)
        per_round = [s / n for s, n in zip(cost["rounds"], costs["nanogpt"]["rounds"], strict=True)]
        assert cost["ratio_to_nanogpt"] == pytest.approx(statistics.median(per_round), rel=1e-3)
    for variant in stored["variants"]:
        steps = {run["steps"] for run in stored["runs"] if run["variant"] == variant["name"]}
        assert len(steps) == 1
        if variant["stage"] != "equal steps":
            ratio = costs[variant["cost_key"]]["ratio_to_nanogpt"]
            steps_60 = settings["budget_scale"] * settings["nanogpt_steps_60s"]
            assert steps == {max(1, round(steps_60 * settings["budget_share"] / ratio))}


def test_stored_curves_are_evaluated_at_their_marks_and_train_every_step(stored):
    points = stored["settings"]["points"]
    for run in stored["runs"]:
        assert run["curve"]["steps"] == bench.eval_steps(run["steps"], points)
        assert len(run["curve"]["val_loss"]) == len(run["curve"]["steps"])
        assert len(run["train_losses"]) == run["steps"]


def test_stored_targets_are_nanogpts_60_s_losses_in_the_committed_race(stored):
    race = json.loads((ROOT / stored["settings"]["nanogpt_steps_60s_from"]).read_text(encoding="utf-8"))
    finals = {str(run["seed"]): run["curves"]["nanogpt"]["val_loss"][-1] for run in race["runs"]}
    assert stored["targets"] == {seed: finals[seed] for seed in stored["targets"]}
    steps = statistics.median(run["curves"]["nanogpt"]["steps"][-1] for run in race["runs"])
    assert stored["settings"]["nanogpt_steps_60s"] == round(steps)


def test_beats_needs_a_lower_median_and_most_seeds():
    def row(*losses):
        per_seed = [{"seed": seed, "final_val_loss": loss} for seed, loss in enumerate(losses)]
        return {"per_seed": per_seed, "median_final_val_loss": statistics.median(losses)}
    summary = {"base": row(1.0, 1.0, 1.0), "better": row(0.9, 0.9, 1.1), "tie": row(1.0, 0.9, 1.1),
               "lucky": row(1.2, 1.1, 0.1)}
    assert bench.beats(summary, "better", "base") and not bench.beats(summary, "base", "better")
    assert not bench.beats(summary, "tie", "base")      # one win, one tie, one loss
    assert not bench.beats(summary, "lucky", "base")    # a lower mean, but one seed only
    assert bench.course_best(summary, "base", ["tie", "better"]) == "better"
    assert bench.course_best(summary, "base", ["tie"]) == "base"


def test_stored_course_best_is_the_best_muon_row_or_a_change_that_beats_it(stored):
    model_rows = [v["name"] for v in stored["variants"] if v["stage"] == "model"]
    assert stored["course_best"] == bench.course_best(stored["summary"], stored["best_muon"], model_rows)


def test_bench_race_course_best_is_the_stored_course_best(stored):
    race = sys.modules["bench_race"]  # imported by bench_recipe
    best = next(v for v in stored["variants"] if v["name"] == stored["course_best"])
    assert race.COURSE_BEST["name"] == best["name"]
    train = bench.TrainConfig(**race.COURSE_BEST["train"])
    assert (train.optimizer, train.learning_rate, train.warmup, train.muon_learning_rate) == (
        best["optimizer"], best["learning_rate"], best["warmup"], best["muon_learning_rate"])
    model = bench.GPTConfig(**race.COURSE_BEST["model"])
    assert (bench.GPTConfig().n_layers, bench.GPTConfig().d_model) == (race.N_LAYER, race.N_EMBD)  # the race's
    assert (model.activation, model.bias, model.n_layers, model.d_model) == (
        best["activation"], best["bias"], best["n_layers"], best["d_model"])
    assert getattr(train, "muon_ns_steps", 5) == best["ns_steps"]
