"""benchmarks/bench_moe.py in a short run (a subprocess, minutes on a loaded machine): moved out
of tests/model/test_moe.py so that file stays fast enough for the mutation runs (benchmarks/mutation.py),
where a subprocess could not be mapped to a function anyway. Also: the committed
data/bench_moe.json has the shape notebook 12 reads, and its equal-time run follows its timing."""

import importlib.util
import json
import statistics
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


def load_bench():
    spec = importlib.util.spec_from_file_location("bench_moe", ROOT / "benchmarks" / "bench_moe.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def check_speed_and_equal_time(result: dict) -> None:
    """The timing is one thread, one entry per turn for every model, and the equal-time dense
    model trained for the MoE's steps times the ratio of the median step times."""
    bench = load_bench()
    speed = result["speed"]
    assert speed["threads"] == 1 and set(speed["seconds_per_step"]) == set(bench.MODELS)
    turns = {len(times) for times in speed["seconds_per_step"].values()}
    assert len(turns) == 1 and turns.pop() >= 3  # every model timed in every turn
    assert all(t > 0 for times in speed["seconds_per_step"].values() for t in times)
    median = {name: statistics.median(t) for name, t in speed["seconds_per_step"].items()}
    ratio = median["MoE 8 experts, top-2"] / median["dense, equal active"]
    assert abs(speed["moe_over_dense_active"] - ratio) < 1e-12
    equal_time = result["models"][bench.EQUAL_TIME]
    assert equal_time["steps"] == [max(1, round(result["model_steps"] * ratio))] * len(result["seeds"])
    assert result["models"]["dense, equal active"]["steps"] == [result["model_steps"]] * len(result["seeds"])


@pytest.mark.slow
def test_bench_moe_short_run_writes_its_table(tmp_path):
    import subprocess
    import sys
    out = tmp_path / "moe.json"
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_moe.py"), "--steps", "3",
                           "--seeds", "1", "--out", str(out)], capture_output=True, text=True,
                          timeout=600, cwd=ROOT, env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    moe = result["models"]["MoE 8 experts, top-2"]
    dense = result["models"]["dense, equal active"]
    assert moe["total_params"][0] > 2.5 * dense["total_params"][0]
    assert abs(moe["active_params"][0] - dense["active_params"][0]) < 0.05 * dense["active_params"][0]
    assert len(result["balance"]["none"]["shares"][0]) == 3
    assert all(abs(sum(step) - 1) < 1e-3 for step in result["balance"]["bias"]["shares"][0])
    check_speed_and_equal_time(result)


def test_step_times_are_taken_on_one_thread_in_turns(monkeypatch):
    bench = load_bench()
    torch.set_num_threads(2)
    order, threads = [], []
    real_step = bench.Trainer.train_step

    def spy(trainer, lr):
        order.append(type(trainer.model.blocks[0].mlp).__name__ + str(id(trainer)))
        threads.append(torch.get_num_threads())
        return real_step(trainer, lr)

    monkeypatch.setattr(bench.Trainer, "train_step", spy)
    try:
        times = bench.step_seconds(turns=2, steps_per_turn=1, warmup=0)
    finally:
        torch.set_num_threads(1)
    assert set(times) == set(bench.MODELS) and all(len(t) == 2 for t in times.values())
    assert set(threads) == {1}
    assert order[:3] == order[3:] and len(set(order[:3])) == 3  # A, B, C, then A, B, C again


def test_committed_json_has_the_shape_notebook_12_reads():
    result = json.loads((ROOT / "data" / "bench_moe.json").read_text())
    bench = load_bench()
    n_seeds = len(result["seeds"])
    assert n_seeds >= 3 and result["seeds"] == list(range(n_seeds))
    assert set(result["models"]) == set(bench.MODELS) | {bench.EQUAL_TIME}
    for runs in result["models"].values():
        assert len(runs["val_loss"]) == n_seeds and all(0 < v < 5 for v in runs["val_loss"])
    check_speed_and_equal_time(result)
    assert set(result["balance"]) == set(bench.BALANCE)
    for runs in result["balance"].values():
        assert len(runs["val_loss"]) == n_seeds and len(runs["shares"]) == n_seeds
        for run in runs["shares"]:
            assert len(run) == result["balance_steps"] and all(len(step) == 8 for step in run)
            assert all(abs(sum(step) - 1) < 1e-3 for step in run)
