"""data/muon_step_cost.json (benchmarks/bench_muon_step.py): its ratios are what its rounds say,
and the batched Muon step it records is the cheaper one, in float32 and bf16."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

STORED = Path(__file__).resolve().parents[2] / "data" / "muon_step_cost.json"


@pytest.fixture(scope="module")
def stored() -> dict:
    return json.loads(STORED.read_text(encoding="utf-8"))


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_stored_ratios_are_the_medians_of_the_per_round_ratios(stored, precision):
    result = stored["results"][precision]
    rounds = result["rounds"]
    assert set(rounds) == {"adamw", "muon-loop", "muon"} and len({len(r) for r in rounds.values()}) == 1
    for kind, values in rounds.items():  # rounds are stored to 10 microseconds
        per_round = [s / a for s, a in zip(values, rounds["adamw"], strict=True)]
        assert result["ratio_to_adamw"][kind] == pytest.approx(statistics.median(per_round), rel=1e-3)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_batched_muon_step_measured_cheaper_than_the_per_matrix_one(stored, precision):
    ratios = stored["results"][precision]["ratio_to_adamw"]
    assert 1.0 < ratios["muon"] < ratios["muon-loop"], ratios
