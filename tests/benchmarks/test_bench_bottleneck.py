"""benchmarks/bench_bottleneck.py: a short rerun, and the committed JSON (data/) has the shape notebook 10
reads. Apart from tests/families/test_bottleneck.py so that the module's mutation run, whose scratch
copy has no benchmarks/, runs all of its own file."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from helpers.families.bottleneck import MODELS
from helpers.text.corpus import data_dir

ROOT = Path(__file__).resolve().parents[2]

def test_a_short_rerun_of_the_benchmark(tmp_path):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import bench_bottleneck

    out = tmp_path / "b.json"
    report = bench_bottleneck.main(["--steps", "2", "--seeds", "0", "--hidden", "8", "--train-examples", "8", "--batch-size", "4",
                                    "--test-examples", "3", "--beam-examples", "1", "--out", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(report))
    (run,) = report["runs"]
    assert set(run["models"]) == set(MODELS)
    for result in run["models"].values():
        for when in ("half", "end"):
            assert len(result[when]["exact"]) == len(result[when]["tokens"]) == 3
    assert run["models"]["transformer"]["beam"]["n"] == 1

def test_the_committed_json_has_three_seeds_and_what_the_notebook_reads():
    report = json.loads((data_dir() / "bottleneck.json").read_text())
    assert len(report["runs"]) >= 3 and len({r["seed"] for r in report["runs"]}) == len(report["runs"])
    assert report["command"].startswith("python benchmarks/bench_bottleneck.py")
    for run in report["runs"]:
        assert set(run["models"]) == set(MODELS)
        assert {"n", "beam_more_likely", "beam_exact", "greedy_exact"} <= set(run["models"]["transformer"]["beam"])
        for result in run["models"].values():
            assert len(result["end"]["tokens"]) == report["settings"]["test_examples"]
            assert all(0 <= t <= 1 for t in result["end"]["tokens"])
