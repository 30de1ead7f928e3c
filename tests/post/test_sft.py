"""The chat template and the answer-only loss (helpers.post.sft), and the task's checker."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from helpers.model.gpt import GPT, GPTConfig
from helpers.post import sft, tasks
from helpers.text.chars import CharTokenizer


def tokenizer() -> CharTokenizer:
    text = tasks.pretraining_text(tasks.all_facts(), 300, seed=0)
    return CharTokenizer.train(text, sft.SPECIAL_TOKENS)


def test_template_masks_only_the_answer_and_end():
    tok = tokenizer()
    ids, mask = sft.encode_example(tok, "what is two plus two?", "four")
    assert tok.decode(ids.tolist()) == "<|user|>what is two plus two?<|assistant|>four<|end|>"
    assert tok.decode(ids[mask.bool()].tolist()) == "four<|end|>"
    assert ids[mask.bool()][0] != tok.special_tokens[sft.ASSISTANT]


def test_prompt_tokens_get_zero_gradient_and_loss_matches_cross_entropy():
    tok = tokenizer()
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=tok.vocab_size, context_length=48, n_layers=1, n_heads=2, d_model=16))
    ids, mask = sft.pad_batch([sft.encode_example(tok, "what is two plus two?", "four"),
                               sft.encode_example(tok, "what is one plus zero?", "one")],
                              tok.special_tokens[sft.PAD])
    logits = model(ids).detach().requires_grad_(True)
    loss = sft.answer_only_loss(logits, ids, mask)
    loss.backward()
    predicts_answer = mask[:, 1:].bool()  # position t predicts token t + 1
    assert logits.grad[:, :-1][~predicts_answer].abs().max() == 0
    assert logits.grad[:, :-1][predicts_answer].abs().min() > 0
    by_hand = F.cross_entropy(logits[:, :-1][predicts_answer], ids[:, 1:][predicts_answer])
    torch.testing.assert_close(loss, by_hand)
    logps = sft.token_logps(logits, ids)
    torch.testing.assert_close(-(logps * mask[:, 1:]).sum() / mask[:, 1:].sum(), loss)


def test_completion_mask_stops_after_the_first_end():
    got = sft.completion_mask(torch.tensor([[3, 4, 9, 5, 9], [9, 1, 1, 1, 1], [1, 2, 3, 4, 5]]), 9)
    assert got.tolist() == [[1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [1, 1, 1, 1, 1]]


def test_checker_is_exact():
    fact = tasks.Fact(3, "plus", 4)
    assert fact.question() == "what is three plus four?" and fact.answer() == "seven"
    assert tasks.is_correct(" seven.", fact) and not tasks.is_correct("seventeen", fact)
    assert len(tasks.all_facts()) == 100 and len(tasks.all_facts(9, ("minus",))) == 55
    texts, labels = tasks.true_false_statements(tasks.all_facts(3), seed=0)
    assert labels.count(1) == labels.count(0) == 16
    assert all(t.endswith(tasks.NUMBER_WORDS[f.c]) == bool(lab)
               for t, lab, f in zip(texts, labels, [f for f in tasks.all_facts(3) for _ in (0, 1)],
                                     strict=True))


def test_bad_input_is_refused():
    tok = tokenizer()
    with pytest.raises(ValueError, match="answer is ''"):
        sft.encode_example(tok, "what is two plus two?", "")
    with pytest.raises(ValueError, match="question"):
        sft.chat_prompt("  ")
    with pytest.raises(ValueError, match="examples is empty"):
        sft.pad_batch([], 0)
    ids = torch.zeros(2, 5, dtype=torch.long)
    with pytest.raises(ValueError, match="no answer tokens"):
        sft.answer_only_loss(torch.zeros(2, 5, 7), ids, torch.zeros_like(ids))
    with pytest.raises(ValueError, match="mask has shape"):
        sft.answer_only_loss(torch.zeros(2, 5, 7), ids, torch.zeros(2, 4))
    with pytest.raises(ValueError, match="b <= a"):
        tasks.Fact(2, "minus", 5)
    with pytest.raises(ValueError, match="op"):
        tasks.Fact(2, "times", 5)
    with pytest.raises(ValueError, match="facts is empty"):
        tasks.split_facts([], 0.3, 0)


def test_well_formed_labels_come_from_the_grammar():
    texts, labels = tasks.well_formed_statements(tasks.all_facts(4), seed=0)
    assert labels == [1, 0] * 25
    assert sorted(texts[0].split()) == sorted(texts[1].split())
    assert tasks.is_well_formed("three plus two is six")  # form, not truth
    assert not tasks.is_well_formed("three plus two is") and not tasks.is_well_formed("plus three two is five")
