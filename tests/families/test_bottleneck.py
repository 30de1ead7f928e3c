"""Notebook 10's bottleneck experiment: the joined examples, the GRU with attention, and a short
rerun of benchmarks/bench_bottleneck.py whose JSON has the shape the notebook reads."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

import helpers.families.bottleneck as bottleneck
from helpers.families.bottleneck import (
    MODELS,
    JoinedPairs,
    beam_against_greedy,
    build_model,
    decode,
    evaluate,
    run_bottleneck,
)
from helpers.families.rnn import AttentionGRUSeq2Seq, GRUSeq2Seq, gru_greedy_decode
from helpers.families.seq2seq import EncoderDecoder, beam_search, greedy_decode, sequence_log_prob
from helpers.families.translation import (
    EOS_ID,
    TranslationData,
    make_batch,
    score_translations,
    train_translator,
)

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






# helpers.families.bottleneck: the joined examples, the three models, evaluation and the beam
# comparison by hand, and a two-model run of run_bottleneck checked against its pieces.
#
# Each piece by hand (the benchmark's rerun is in tests/benchmarks/test_bench_bottleneck.py). Tiny sizes throughout (width 8, a few steps).

FEW_SENTENCES = ["The dog barked.", "Mia found a red box.", "Tom saw the old tree.", "The cat sat.",
             "Luca loved to sing songs with Amara."]

SHORT = [0, 3]  # four tokens each: decoding stays short


def _message(excinfo) -> str:
    return str(excinfo.value)


@pytest.fixture(scope="module")
def data():
    return TranslationData(FEW_SENTENCES)


def test_joined_pairs_draws_like_the_seeded_rule(data):
    joined = JoinedPairs(data, [4, 1, 3], n_examples=7, max_sentences=3, seed=5)
    rng = random.Random(5)
    assert joined.examples == [rng.sample([4, 1, 3], 1 + i % 3) for i in range(7)]
    assert len(joined) == 7 and joined.data is data
    default = JoinedPairs(data, range(5), n_examples=4, max_sentences=2)
    rng = random.Random(0)
    assert default.examples == [rng.sample(list(range(5)), 1 + i % 2) for i in range(4)]
    source, target = joined.pair(2)
    pairs = [data.pair(i) for i in joined.examples[2]]
    assert source == [x for s, _ in pairs for x in s]
    assert target == [x for _, t in pairs for x in t[:-1]] + [EOS_ID]
    assert joined.source_length(2) == len(source) and joined.source_length(0) == len(data.pair(joined.examples[0][0])[0])
    JoinedPairs(data, [0, 1], n_examples=1, max_sentences=2)  # exactly max_sentences ids is enough


def test_joined_pairs_messages(data):
    with pytest.raises(ValueError) as excinfo:
        JoinedPairs(data, [0, 1], n_examples=2, max_sentences=3)
    assert _message(excinfo) == "sentence_ids holds 2 sentences, expected at least max_sentences = 3"
    for name, args in (("n_examples", dict(n_examples=0, max_sentences=1)),
                       ("max_sentences", dict(n_examples=1, max_sentences=0))):
        with pytest.raises(ValueError) as excinfo:
            JoinedPairs(data, [0, 1], **args)
        assert _message(excinfo).startswith(f"{name} ") and "XX" not in _message(excinfo)


def test_build_model(data):
    v_s, v_t = data.source_vocab.vocab_size, data.target_vocab.vocab_size
    gru = build_model("gru", data, hidden=8, context_length=10)
    assert type(gru) is GRUSeq2Seq and gru.encoder.hidden_size == 8
    assert (gru.source_vocab_size, gru.target_vocab_size) == (v_s, v_t)
    attention = build_model("gru_attention", data, hidden=8, context_length=10)
    assert type(attention) is AttentionGRUSeq2Seq and attention.encoder.hidden_size == 8
    assert (attention.source_vocab_size, attention.target_vocab_size) == (v_s, v_t)
    transformer = build_model("transformer", data, hidden=8, context_length=10)
    c = transformer.config
    assert type(transformer) is EncoderDecoder
    assert (c.source_vocab_size, c.target_vocab_size, c.context_length, c.n_layers, c.n_heads, c.d_model) == \
        (v_s, v_t, 10, 2, 4, 8)
    with pytest.raises(ValueError) as excinfo:
        build_model("lstm", data, hidden=8, context_length=10)
    assert "name" in _message(excinfo) and "'lstm'" in _message(excinfo) and "XX" not in _message(excinfo)


@pytest.mark.parametrize("name", MODELS)
def test_decode_is_each_models_own_greedy_decoder(data, name):
    torch.manual_seed(0)
    model = build_model(name, data, hidden=8, context_length=12).eval()
    source = torch.tensor([data.pair(1)[0], data.pair(2)[0]])
    own = greedy_decode if name == "transformer" else gru_greedy_decode
    assert torch.equal(decode(model, source, 5), own(model, source, 5))


def test_evaluate_by_hand(data):
    torch.manual_seed(0)
    model = build_model("gru_attention", data, hidden=8, context_length=12).eval()
    test = JoinedPairs(data, range(5), n_examples=3, max_sentences=2, seed=1)
    result = evaluate(model, test, 6)
    source, _, target = make_batch(test, [0, 1, 2])
    with torch.no_grad():
        exact, tokens = score_translations(gru_greedy_decode(model, source, 6), target)
    assert result == {"exact": exact.float().tolist(), "tokens": tokens.tolist(),
                      "source_length": [len(test.pair(i)[0]) for i in range(3)]}
    assert all(isinstance(x, float) for x in result["exact"])


def test_evaluate_decodes_max_length_tokens(data, monkeypatch):
    seen = []
    monkeypatch.setattr(bottleneck, "decode", lambda model, source, n: seen.append((source.shape, n)) or source)
    test = JoinedPairs(data, range(5), n_examples=2, max_sentences=1)
    evaluate(None, test, 9)
    assert seen == [(make_batch(test, [0, 1])[0].shape, 9)]


def test_run_bottleneck_is_train_then_evaluate_at_half_and_end(data):
    train = JoinedPairs(data, SHORT, n_examples=4, max_sentences=2, seed=0)
    test = JoinedPairs(data, SHORT, n_examples=1, max_sentences=1, seed=1)
    kept = {}
    results = run_bottleneck(data, train, test, seed=3, steps=4, hidden=8, batch_size=3,
                             models=("gru", "transformer"), keep=kept)
    assert list(results) == ["gru", "transformer"] and set(kept) == {"gru", "transformer"}
    longest = max(max(len(s), len(t)) for pairs in (train, test) for s, t in (pairs.pair(i) for i in range(len(pairs))))
    assert kept["transformer"].config.context_length == longest + 2
    for name in ("gru", "transformer"):
        torch.manual_seed(3)
        model = build_model(name, data, 8, context_length=longest + 2)
        halves = []

        def at_half(step, model=model, halves=halves):
            if step == 1:  # steps // 2 updates done
                halves.append(evaluate(model, test, longest + 1))

        losses = train_translator(model, train, list(range(4)), steps=4, batch_size=3, seed=3, on_step=at_half)
        result = results[name]
        assert result["final_loss"] == pytest.approx(losses[-1], rel=1e-6)
        assert result["half"] == halves[0]
        assert result["end"] == evaluate(model, test, longest + 1) == evaluate(kept[name], test, longest + 1)
        assert result["parameters"] == sum(p.numel() for p in model.parameters())
        assert 0 < result["seconds"] < 60
        assert not kept[name].training


def test_run_bottleneck_defaults_and_messages(data, monkeypatch):
    seen = []

    def fake_train(model, pairs, indices, steps, batch_size, seed, on_step):
        seen.append((type(model).__name__, batch_size))
        for step in range(steps):
            on_step(step)
        return [0.5]

    monkeypatch.setattr(bottleneck, "train_translator", fake_train)
    train = JoinedPairs(data, SHORT, n_examples=2, max_sentences=1)
    results = run_bottleneck(data, train, train, seed=0, steps=2, hidden=8)
    assert list(results) == list(MODELS)
    assert seen == [("GRUSeq2Seq", 32), ("AttentionGRUSeq2Seq", 32), ("EncoderDecoder", 32)]
    with pytest.raises(ValueError) as excinfo:
        run_bottleneck(data, train, train, seed=0, steps=1, hidden=8)
    assert _message(excinfo) == "steps is 1, expected at least 2 (the result is read at half the steps)"
    with pytest.raises(ValueError) as excinfo:
        run_bottleneck(data, train, train, seed=0, steps=0, hidden=8)
    assert _message(excinfo).startswith("steps ") and "XX" not in _message(excinfo)


def test_run_bottleneck_reads_the_half_once_and_trains_on(data, monkeypatch):
    modes = []

    def fake_train(model, pairs, indices, steps, batch_size, seed, on_step):
        for step in range(steps):
            model.eval()
            on_step(step)
            modes.append(model.training)
        return [0.5]

    reads = []
    monkeypatch.setattr(bottleneck, "train_translator", fake_train)
    monkeypatch.setattr(bottleneck, "evaluate", lambda model, test, n: reads.append(n) or {"read": len(reads)})
    train = JoinedPairs(data, SHORT, n_examples=2, max_sentences=1)
    test = JoinedPairs(data, [1], n_examples=1, max_sentences=1)
    results = run_bottleneck(data, train, test, seed=0, steps=5, hidden=8, models=("gru",))
    assert modes == [False, True, False, False, False]  # back to training right after the half read
    longest = max(len(data.pair(1)[1]), len(data.pair(0)[1]), len(data.pair(3)[1]))  # the longest target
    assert reads == [longest + 1, longest + 1]  # one token more than the longest target
    assert results["gru"]["half"] == {"read": 1} and results["gru"]["end"] == {"read": 2}


def test_beam_against_greedy_by_hand(data, monkeypatch):
    torch.manual_seed(0)
    model = build_model("transformer", data, hidden=8, context_length=6).eval()
    test = JoinedPairs(data, [0, 1, 3], n_examples=3, max_sentences=1, seed=2)
    widths = []
    monkeypatch.setattr(bottleneck, "beam_search",
                        lambda m, s, w, n: widths.append((w, n)) or beam_search(m, s, w, n))
    result = beam_against_greedy(model, test, n=5)
    more = beam = greedy_hits = 0
    for i in range(3):
        source, target = (torch.tensor(x) for x in test.pair(i))
        greedy = greedy_decode(model, source[None], 5)[0]
        greedy = greedy[greedy != 0]
        ids, score = beam_search(model, source, 4, 5)
        more += score > sequence_log_prob(model, source, greedy) + 1e-4
        beam += torch.equal(ids, target)
        greedy_hits += torch.equal(greedy, target)
    assert result == {"n": 3, "beam_more_likely": int(more), "beam_exact": beam, "greedy_exact": greedy_hits}
    assert widths == [(4, 5)] * 3
    assert beam_against_greedy(model, test, n=2, beam_width=1)["n"] == 2


def test_beam_against_greedy_counts_only_a_strictly_better_beam_and_exact_outputs(data, monkeypatch):
    torch.manual_seed(0)
    model = build_model("transformer", data, hidden=8, context_length=6).eval()
    test = JoinedPairs(data, SHORT, n_examples=2, max_sentences=1, seed=2)
    # width 1 is greedy: never more likely (within 1e-4)
    assert beam_against_greedy(model, test, n=2, beam_width=1)["beam_more_likely"] == 0
    # both decoders made to return the target: counted as exact
    target_of = {tuple(test.pair(i)[0]): torch.tensor(test.pair(i)[1]) for i in range(2)}
    monkeypatch.setattr(bottleneck, "greedy_decode",
                        lambda m, s, n: torch.cat([target_of[tuple(s[0].tolist())], torch.zeros(2, dtype=torch.long)])[None])
    monkeypatch.setattr(bottleneck, "beam_search", lambda m, s, w, n: (target_of[tuple(s.tolist())], -1.0))
    monkeypatch.setattr(bottleneck, "sequence_log_prob", lambda m, s, out: -1.0 - 0.5e-4)
    result = beam_against_greedy(model, test, n=2)
    assert result == {"n": 2, "beam_more_likely": 0, "beam_exact": 2, "greedy_exact": 2}
    monkeypatch.setattr(bottleneck, "sequence_log_prob", lambda m, s, out: -1.0 - 2e-4)
    assert beam_against_greedy(model, test, n=2)["beam_more_likely"] == 2
    monkeypatch.setattr(bottleneck, "beam_search", lambda m, s, w, n: (target_of[tuple(s.tolist())], -1.0 + 1e-4))
    monkeypatch.setattr(bottleneck, "sequence_log_prob", lambda m, s, out: -1.0)
    assert beam_against_greedy(model, test, n=2)["beam_more_likely"] == 0  # exactly 1e-4 better is not enough
    with pytest.raises(ValueError) as excinfo:
        beam_against_greedy(model, test, n=0)
    assert _message(excinfo).startswith("n ") and "XX" not in _message(excinfo)
