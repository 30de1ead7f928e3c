"""The RNN bottleneck experiment (notebook 10, section 2; run by benchmarks/bench_bottleneck.py).

One course sentence (5-14 tokens) fits easily in a GRU's state, so the bottleneck needs longer
sources: `JoinedPairs` joins 1 to `max_sentences` sentences of one split into one example (the
source and the target are the sentences' words one after another, one <eos> at the end). Three
translators then learn the same examples, in the same order, for the same number of steps:

    gru            GRUSeq2Seq: the source squeezed into one vector of `hidden` numbers
    gru_attention  AttentionGRUSeq2Seq: the same GRUs, plus Bahdanau's additive attention
    transformer    EncoderDecoder: attention, and no recurrence at all

`run_bottleneck` trains the three for one seed, decodes the test examples greedily at half the
steps and at the end (the convergence check: a model that still improves is undertrained), and
scores them by source length; `beam_against_greedy` compares the two decoders on one model.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence

import torch

from helpers import checks
from helpers.families.rnn import AttentionGRUSeq2Seq, GRUSeq2Seq, gru_greedy_decode
from helpers.families.seq2seq import (
    EncoderDecoder,
    Seq2SeqConfig,
    beam_search,
    greedy_decode,
    sequence_log_prob,
)
from helpers.families.translation import (
    EOS_ID,
    PAD_ID,
    TranslationData,
    make_batch,
    score_translations,
    train_translator,
)

MODELS = ("gru", "gru_attention", "transformer")


class JoinedPairs:
    """`n_examples` examples, each 1..max_sentences sentences of `sentence_ids` joined (k cycles)."""

    def __init__(self, data: TranslationData, sentence_ids: Sequence[int], n_examples: int,
                 max_sentences: int, seed: int = 0) -> None:
        checks.positive_int("n_examples", n_examples)
        checks.positive_int("max_sentences", max_sentences)
        if len(sentence_ids) < max_sentences:
            raise ValueError(f"sentence_ids holds {len(sentence_ids)} sentences, expected at least "
                             f"max_sentences = {max_sentences}")
        rng = random.Random(seed)
        self.data = data
        self.examples = [rng.sample(list(sentence_ids), 1 + i % max_sentences) for i in range(n_examples)]

    def __len__(self) -> int:
        return len(self.examples)

    def pair(self, index: int) -> tuple[list[int], list[int]]:
        """(source ids, target ids + <eos>) of example `index`: its sentences one after another."""
        source, target = [], []
        for i in self.examples[index]:
            s, t = self.data.pair(i)
            source += s
            target += t[:-1]
        return source, target + [EOS_ID]

    def source_length(self, index: int) -> int:
        return len(self.pair(index)[0])


def build_model(name: str, data: TranslationData, hidden: int, context_length: int) -> torch.nn.Module:
    """One of MODELS; the GRUs' state and the Transformer's width are both `hidden`."""
    checks.one_of("name", name, MODELS)
    v_s, v_t = data.source_vocab.vocab_size, data.target_vocab.vocab_size
    if name == "gru":
        return GRUSeq2Seq(v_s, v_t, hidden=hidden)
    if name == "gru_attention":
        return AttentionGRUSeq2Seq(v_s, v_t, hidden=hidden)
    return EncoderDecoder(Seq2SeqConfig(v_s, v_t, context_length=context_length, n_layers=2,
                                        n_heads=4, d_model=hidden))


def decode(model: torch.nn.Module, source: torch.Tensor, max_length: int) -> torch.Tensor:
    if isinstance(model, EncoderDecoder):
        return greedy_decode(model, source, max_length)
    return gru_greedy_decode(model, source, max_length)


def evaluate(model: torch.nn.Module, test: JoinedPairs, max_length: int) -> dict[str, list[float]]:
    """Greedy decoding of every test example -> per-example exact match, token accuracy, length."""
    indices = list(range(len(test)))
    source, _, target = make_batch(test, indices)
    with torch.no_grad():
        exact, tokens = score_translations(decode(model, source, max_length), target)
    return {"exact": exact.float().tolist(), "tokens": tokens.tolist(),
            "source_length": [test.source_length(i) for i in indices]}


def run_bottleneck(data: TranslationData, train: JoinedPairs, test: JoinedPairs, seed: int,
                   steps: int, hidden: int, batch_size: int = 32,
                   models: Sequence[str] = MODELS, keep: dict | None = None) -> dict:
    """Train each model for `steps` steps (same batches, same seed); score at steps // 2 and at the end.

    keep: a dict that receives the trained models by name, if given.
    """
    checks.positive_int("steps", steps)
    if steps < 2:
        raise ValueError(f"steps is {steps}, expected at least 2 (the result is read at half the steps)")
    longest = max(max(len(s), len(t)) for pairs in (train, test) for s, t in map(pairs.pair, range(len(pairs))))
    results = {}
    for name in models:
        torch.manual_seed(seed)
        model = build_model(name, data, hidden, context_length=longest + 2)
        started = time.perf_counter()
        halves = []

        def read_half(step: int, model=model, halves=halves) -> None:
            if step + 1 == steps // 2:
                halves.append(evaluate(model, test, longest + 1))
                model.train()

        losses = train_translator(model, train, list(range(len(train))), steps=steps,
                                  batch_size=batch_size, seed=seed, on_step=read_half)
        halves.append(evaluate(model, test, longest + 1))
        if keep is not None:
            keep[name] = model
        results[name] = {"parameters": sum(p.numel() for p in model.parameters()),
                         "seconds": time.perf_counter() - started, "final_loss": losses[-1],
                         "half": halves[0], "end": halves[1]}
    return results


def beam_against_greedy(model: EncoderDecoder, test: JoinedPairs, n: int, beam_width: int = 4) -> dict:
    """On the first n test examples: how often beam search finds a more likely output than greedy,
    and both decoders' exact-match counts."""
    checks.positive_int("n", n)
    more_likely = beam_exact = greedy_exact = 0
    for i in range(min(n, len(test))):
        source, target = (torch.tensor(x) for x in test.pair(i))
        longest = model.config.context_length - 1
        greedy = greedy_decode(model, source[None], longest)[0]
        greedy = greedy[greedy != PAD_ID]
        beam, beam_score = beam_search(model, source, beam_width, longest)
        more_likely += beam_score > sequence_log_prob(model, source, greedy) + 1e-4
        beam_exact += torch.equal(beam, target)
        greedy_exact += torch.equal(greedy, target)
    return {"n": min(n, len(test)), "beam_more_likely": int(more_likely),
            "beam_exact": int(beam_exact), "greedy_exact": int(greedy_exact)}
