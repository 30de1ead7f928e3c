"""helpers.post.classify: the classifier head reads the last real token of each row, and the
post-training helpers (classify, tasks, sft, dpo, grpo) refuse bad input by name."""

from __future__ import annotations

import pytest
import torch

from helpers.model.gpt import GPT, GPTConfig
from helpers.post import classify, dpo, grpo, sft, tasks
from helpers.text.chars import CharTokenizer


@pytest.fixture(scope="module")
def tiny():
    tok = CharTokenizer.train(tasks.pretraining_text(tasks.all_facts(3), 50, seed=0), sft.SPECIAL_TOKENS)
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=tok.vocab_size, context_length=48, n_layers=1, n_heads=2, d_model=16))
    return tok, model


def test_classifier_head_reads_the_last_real_token(tiny):
    tok, model = tiny
    ids, lengths = classify.encode_texts(tok, ["one plus one is two", "two plus two is four"],
                                         tok.special_tokens[sft.PAD])
    clf = classify.Classifier(model, 2)
    alone = clf(ids[1:, :lengths[1]], lengths[1:])
    torch.testing.assert_close(clf(ids, lengths)[1:], alone)  # padding changes nothing
    assert classify.freeze_for(clf, "head") == 16 * 2 + 2
    assert classify.freeze_for(clf, "head") < classify.freeze_for(clf, "last") < classify.freeze_for(clf, "all")


def test_bad_input_is_refused(tiny):
    tok, model = tiny
    with pytest.raises(ValueError, match="which"):
        classify.freeze_for(classify.Classifier(model, 2), "middle")
    with pytest.raises(ValueError, match="lengths"):
        classify.last_hidden(model, torch.zeros(2, 4, dtype=torch.long), torch.tensor([0, 4]))
    with pytest.raises(ValueError, match="texts is empty"):
        classify.encode_texts(tok, [], 0)
    with pytest.raises(ValueError, match="n_classes"):
        classify.Classifier(model, 0)
    with pytest.raises(ValueError, match="largest"):
        tasks.all_facts(12)
    with pytest.raises(ValueError, match="held_out"):
        tasks.split_facts(tasks.all_facts(), 1.5, 0)
    with pytest.raises(ValueError, match="group_size"):
        grpo.train_grpo(model, model, tok, tasks.all_facts(3), steps=1, group_size=1)
    with pytest.raises(ValueError, match="beta"):
        dpo.train_dpo(model, model, dpo.preference_batch(tok, tasks.all_facts(1), 0, 0), 0.0, 1, 1e-3)
    with pytest.raises(ValueError, match="facts is empty"):
        dpo.preference_batch(tok, [], 0, 0)
    with pytest.raises(ValueError, match="steps"):
        sft.train_sft(model, [], 0, 1e-3)
    with pytest.raises(ValueError, match="temperature"):
        sft.sample_answers(model, torch.tensor([1, 2]), 2, 3, 5, temperature=-1.0)
