"""Notebook 10's bottleneck experiment: the joined examples, the GRU with attention, and a short
rerun of benchmarks/bench_bottleneck.py whose JSON has the shape the notebook reads."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from helpers.families.bottleneck import MODELS, JoinedPairs
from helpers.families.rnn import AttentionGRUSeq2Seq, GRUSeq2Seq, gru_greedy_decode
from helpers.families.translation import EOS_ID, TranslationData
from helpers.text.corpus import data_dir

ROOT = Path(__file__).resolve().parents[2]
SENTENCES = ["The dog barked.", "Mia found a red box.", "Tom saw the old tree.", "The cat sat."]


def test_joined_pairs_are_their_sentences_one_after_another():
    data = TranslationData(SENTENCES)
    joined = JoinedPairs(data, range(4), n_examples=6, max_sentences=3, seed=0)
    assert [len(e) for e in joined.examples] == [1, 2, 3, 1, 2, 3]
    source, target = joined.pair(2)
    parts = [data.pair(i) for i in joined.examples[2]]
    assert source == sum((s for s, _ in parts), [])
    assert target == sum((t[:-1] for _, t in parts), []) + [EOS_ID] and target.count(EOS_ID) == 1
    with pytest.raises(ValueError, match="at least max_sentences = 5"):
        JoinedPairs(data, range(4), n_examples=2, max_sentences=5)


def test_additive_attention_by_hand_matches_the_step():
    torch.manual_seed(0)
    model = AttentionGRUSeq2Seq(12, 9, hidden=8).eval()
    source = torch.tensor([[3, 4, 5, 0], [6, 7, 8, 9]])
    with torch.no_grad():
        states, last = model.encode_all(source)
        e = model.v(torch.tanh(model.w_s(last[0])[:, None] + model.w_h(states)))[..., 0]
        a = e.masked_fill(source == 0, float("-inf")).softmax(-1)
        model.step(torch.ones(2, 1, dtype=torch.long), model.start(source))
    assert torch.allclose(model.last_weights, a, atol=1e-6)
    assert model.last_weights[0, 3] == 0 and torch.allclose(a.sum(-1), torch.ones(2))


@pytest.mark.parametrize("cls", [GRUSeq2Seq, AttentionGRUSeq2Seq])
def test_padding_on_the_right_changes_nothing(cls):
    torch.manual_seed(0)
    model = cls(12, 9, hidden=8).eval()
    target_in = torch.tensor([[1, 4, 5]])
    short, padded = torch.tensor([[3, 4, 5]]), torch.tensor([[3, 4, 5, 0, 0]])
    assert torch.allclose(model(short, target_in), model(padded, target_in), atol=1e-6)
    other = torch.tensor([[3, 4, 6]])  # and a real token does change it: the test can fail
    assert not torch.allclose(model(short, target_in), model(other, target_in), atol=1e-5)


def test_greedy_decoding_agrees_with_teacher_forcing_on_its_own_output():
    torch.manual_seed(0)
    model = AttentionGRUSeq2Seq(12, 9, hidden=8).eval()
    source = torch.tensor([[3, 4, 5, 6]])
    out = gru_greedy_decode(model, source, max_length=5)
    with torch.no_grad():
        forced = model(source, torch.cat([torch.ones(1, 1, dtype=torch.long), out[:, :-1]], dim=1))
    assert torch.equal(forced.argmax(-1), out)


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
