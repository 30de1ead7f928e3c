"""The chat template and the answer-only loss (helpers.post.sft), and the task's checker."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from shared_tools import full, post_tokenizer, tiny_gpt

from helpers.model.generation import generate
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


# helpers.post.sft, exactly:
#
# The log-probabilities against log_softmax by hand (and their dtype), sampled and greedy answers
# against helpers.model.generation.generate called directly with the same generator, greedy
# answers of mixed prompt lengths against one question at a time, train_sft against a hand AdamW
# loop drawing the same batches, the edges (N = 2, a completion without END), and every message
# in full.

@pytest.fixture(scope="module")
def tok():
    return post_tokenizer()

_gpt = tiny_gpt


def test_chat_prompt_and_its_errors():
    assert sft.chat_prompt("q?") == "<|user|>q?<|assistant|>"
    for bad in ("", " \n", None, 3):
        with pytest.raises(ValueError, match=full(f"question is {bad!r}, expected a non-empty str")):
            sft.chat_prompt(bad)


def test_encode_example_masks_answer_and_end(tok):
    ids, mask = sft.encode_example(tok, "what is one plus one?", "two")
    n_prompt = len(tok.encode(sft.chat_prompt("what is one plus one?")))
    assert mask.tolist() == [0] * n_prompt + [1] * (len(tok.encode("two")) + 1)
    assert ids[-1] == tok.special_tokens[sft.END] and ids.shape == mask.shape
    for bad in ("", "  ", None):
        with pytest.raises(ValueError, match=full(f"answer is {bad!r}, expected a non-empty str: an "
                                                  "empty answer gives the loss nothing to learn but END")):
            sft.encode_example(tok, "q?", bad)


def test_pad_batch_right_pads_with_pad_id():
    examples = [(torch.tensor([5, 6]), torch.tensor([0, 1])), (torch.tensor([7, 8, 9]), torch.tensor([0, 1, 1]))]
    ids, mask = sft.pad_batch(examples, pad_id=3)
    assert ids.tolist() == [[5, 6, 3], [7, 8, 9]] and mask.tolist() == [[0, 1, 0], [0, 1, 1]]
    assert ids.dtype == mask.dtype == torch.long


@pytest.mark.parametrize("examples, pad_id, error, message", [
    ([], 0, ValueError, "examples is empty, expected at least one (ids, mask) pair"),
    ([(torch.tensor([1]), torch.tensor([1]))], -1, ValueError, "pad_id is -1, expected an int >= 0"),
    ([(torch.tensor([1]), torch.tensor([1])), (torch.tensor([1, 2]), torch.tensor([1]))], 0, ValueError,
     "example 1: ids (2,) and mask (1,) differ"),
])
def test_pad_batch_errors_in_full(examples, pad_id, error, message):
    with pytest.raises(error, match=full(message)):
        sft.pad_batch(examples, pad_id)


def test_token_logps_by_hand_and_their_dtype():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 4, 6, generator=gen, dtype=torch.float64)
    ids = torch.randint(6, (2, 4), generator=gen)
    got = sft.token_logps(logits, ids)
    want = torch.stack([torch.stack([logits[b, t].log_softmax(0)[ids[b, t + 1]] for t in range(3)])
                        for b in range(2)])
    assert got.shape == (2, 3) and got.dtype == torch.float64 and (got - want).abs().max() < 1e-12
    half = sft.token_logps(logits.to(torch.bfloat16), ids)
    assert half.dtype == torch.float32
    assert (half - sft.token_logps(logits.to(torch.bfloat16).float(), ids)).abs().max() == 0


@pytest.mark.parametrize("logits", [torch.zeros(2, 4), torch.zeros(2, 3, 6), torch.zeros(1, 4, 6)])
def test_token_logps_error_in_full(logits):
    with pytest.raises(ValueError, match=full(f"logits has shape {tuple(logits.shape)}, expected "
                                              "(B, N, V) with (B, N) = (2, 4)")):
        sft.token_logps(logits, torch.zeros(2, 4, dtype=torch.long))


def test_answer_only_loss_at_the_shortest_sequence():
    logits = torch.randn(1, 2, 5, generator=torch.Generator().manual_seed(0))
    ids, mask = torch.tensor([[1, 3]]), torch.tensor([[0, 1]])
    want = F.cross_entropy(logits[0, :1], ids[0, 1:])
    assert (sft.answer_only_loss(logits, ids, mask) - want).abs() < 1e-6


def test_answer_only_loss_weights_rows_by_their_answer_tokens():
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(2, 4, 5, generator=gen)
    ids = torch.randint(5, (2, 4), generator=gen)
    mask = torch.tensor([[0, 0, 1, 1], [0, 1, 1, 1]])
    per = F.cross_entropy(logits[:, :-1].reshape(-1, 5), ids[:, 1:].reshape(-1), reduction="none").view(2, 3)
    want = (per * mask[:, 1:]).sum() / 5
    assert (sft.answer_only_loss(logits, ids, mask) - want).abs() < 1e-6


@pytest.mark.parametrize("logits, ids, mask, message", [
    (torch.zeros(1, 1, 5), torch.zeros(1, 1, dtype=torch.long), torch.ones(1, 1),
     "ids has shape (1, 1), expected (B, N) with N >= 2"),
    (torch.zeros(1, 3, 5), torch.zeros(3, dtype=torch.long), torch.ones(3),
     "ids has shape (3,), expected (B, N) with N >= 2"),
    (torch.zeros(1, 3, 5), torch.zeros(1, 3, dtype=torch.long), torch.ones(1, 4),
     "mask has shape (1, 4), expected (1, 3) like ids"),
    (torch.zeros(2, 3, 5), torch.zeros(1, 3, dtype=torch.long), torch.ones(1, 3),
     "logits has shape (2, 3, 5), expected (B, N, V) with (B, N) = (1, 3)"),
    (torch.zeros(1, 3, 5), torch.zeros(1, 3, dtype=torch.long), torch.tensor([[1, 0, 0]]),
     "mask has no answer tokens after position 0, expected some to learn from"),
])
def test_answer_only_loss_errors_in_full(logits, ids, mask, message):
    with pytest.raises(ValueError, match=full(message)):
        sft.answer_only_loss(logits, ids, mask)


def test_sequence_logps_sums_the_answer_tokens(tok):
    model = _gpt(tok)
    ids, mask = sft.pad_batch([sft.encode_example(tok, "what is one plus one?", "two"),
                               sft.encode_example(tok, "what is two plus one?", "three")], 0)
    with torch.no_grad():
        per = sft.token_logps(model(ids), ids)
        got = sft.sequence_logps(model, ids, mask)
    assert got.shape == (2,) and (got - (per * mask[:, 1:]).sum(1)).abs().max() < 1e-6
    with pytest.raises(ValueError, match=full("mask has shape (2,), expected (2, 9) like ids")):
        sft.sequence_logps(model, ids[:, :9], mask[:, 0])
    with pytest.raises(ValueError, match=full("mask holds the values [0, 2], expected only 0 and 1: "
                                              "a 2 would count a token twice, a -1 subtract it")):
        sft.sequence_logps(model, ids, mask * 2)
    assert torch.equal(sft.sequence_logps(model, ids, mask.bool()), got)


def test_sampled_answers_are_generate_with_the_same_generator(tok):
    model = _gpt(tok)
    prompt = torch.tensor(tok.encode(sft.chat_prompt("what is one plus one?")))
    end = tok.special_tokens[sft.END]
    ids, mask = sft.sample_answers(model, prompt, 3, 6, end, temperature=0.05,
                                   generator=torch.Generator().manual_seed(2))
    want = generate(model, prompt[None].expand(3, -1), 6, temperature=0.05,
                    generator=torch.Generator().manual_seed(2))
    assert torch.equal(ids, want)
    hot = generate(model, prompt[None].expand(3, -1), 6, temperature=1.0,
                   generator=torch.Generator().manual_seed(2))
    assert not torch.equal(ids, hot)  # the temperature reached generate
    completion = want[:, len(prompt):]
    assert mask[:, :len(prompt)].sum() == 0
    assert torch.equal(mask[:, len(prompt):], sft.completion_mask(completion, end))


def test_sampled_answers_default_temperature_is_one(tok):
    model = _gpt(tok)
    prompt = torch.tensor([1, 2, 3])
    ids, _ = sft.sample_answers(model, prompt, 2, 5, 0, generator=torch.Generator().manual_seed(4))
    want = generate(model, prompt[None].expand(2, -1), 5, temperature=1.0,
                    generator=torch.Generator().manual_seed(4))
    assert torch.equal(ids, want)


def test_greedy_answers_are_one_greedy_completion_repeated(tok):
    model = _gpt(tok)
    prompt = torch.tensor([1, 2, 3])
    ids, mask = sft.sample_answers(model, prompt, 4, 5, end_id=tok.special_tokens[sft.END], temperature=0)
    want = generate(model, prompt[None], 5, top_k=1)
    assert ids.shape == (4, 8) and all(torch.equal(row, want[0]) for row in ids)
    assert mask.shape == (4, 8) and mask[:, :3].sum() == 0 and mask[:, 3].sum() == 4


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(n=0), ValueError, "n is 0, expected a positive int"),
    (dict(prompt=torch.zeros(0, dtype=torch.long)), ValueError, "prompt has shape (0,), expected (P,) with P >= 1"),
    (dict(prompt=torch.zeros(1, 2, dtype=torch.long)), ValueError,
     "prompt has shape (1, 2), expected (P,) with P >= 1"),
    (dict(temperature=-0.5), ValueError, "temperature is -0.5, expected a finite number > 0 (or 0 for greedy)"),
])
def test_sample_answers_errors_in_full(tok, kwargs, error, message):
    args = dict(prompt=torch.tensor([1, 2]), n=2, max_new_tokens=3, end_id=0) | kwargs
    with pytest.raises(error, match=full(message)):
        sft.sample_answers(_gpt(tok), **args)


def test_answer_text_cuts_at_the_first_end(tok):
    end = tok.special_tokens[sft.END]
    two = tok.encode("two")
    assert sft.answer_text(tok, two + [end] + tok.encode("x") + [end], end) == "two"
    assert sft.answer_text(tok, two, end) == "two"
    assert sft.answer_text(tok, [end] + two, end) == ""


def test_greedy_answers_of_mixed_lengths_equal_one_at_a_time(tok):
    model = _gpt(tok, 3)
    questions = ["what is one plus one?", "what is two plus three?", "what is one plus two?"]
    end = tok.special_tokens[sft.END]
    want = []
    for q in questions:
        prompt = torch.tensor([tok.encode(sft.chat_prompt(q))])
        completion = generate(model, prompt, 10, top_k=1)[0, prompt.shape[1]:].tolist()
        want.append(sft.answer_text(tok, completion, end))
    assert sft.greedy_answers(model, tok, questions) == want
    short = sft.greedy_answers(model, tok, questions, max_new_tokens=2)
    assert all(len(tok.encode(a)) <= 2 for a in short)


def test_greedy_accuracy_is_the_fraction_answered_exactly(tok, monkeypatch):
    model = _gpt(tok, 3)
    facts = tasks.all_facts(2)[:4]
    answers = sft.greedy_answers(model, tok, [f.question() for f in facts])
    want = sum(tasks.is_correct(a, f) for a, f in zip(answers, facts, strict=True)) / 4
    assert sft.greedy_accuracy(model, tok, facts) == want
    seen = []
    monkeypatch.setattr(sft, "greedy_answers", lambda m, t, questions, n: seen.append((questions, n))
                        or [facts[0].answer() + "."] + ["x"] * 3)
    assert sft.greedy_accuracy(model, tok, facts, max_new_tokens=7) == 0.25
    assert seen == [([f.question() for f in facts], 7)]
    sft.greedy_accuracy(model, tok, facts)
    assert seen[-1][1] == 10  # the default
    with pytest.raises(ValueError, match=full("facts is empty, expected questions to answer")):
        sft.greedy_accuracy(model, tok, [])


def test_train_sft_equals_a_hand_loop(tok):
    model = _gpt(tok).train()
    model.embed.position.weight.requires_grad_(False)
    hand = copy.deepcopy(model)
    batches = [sft.pad_batch([sft.encode_example(tok, f.question(), f.answer())], 0)
               for f in tasks.all_facts(2)[:3]]
    losses = sft.train_sft(model, batches, steps=3, lr=1e-2, seed=5)
    gen = torch.Generator().manual_seed(5)
    optimizer = torch.optim.AdamW([p for p in hand.parameters() if p.requires_grad], lr=1e-2,
                                  weight_decay=0.0)
    want = []
    for _ in range(3):
        ids, mask = batches[int(torch.randint(3, (1,), generator=gen))]
        loss = sft.answer_only_loss(hand(ids), ids, mask)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        want.append(loss.item())
    assert losses == pytest.approx(want, abs=1e-6)
    for p, q in zip(model.parameters(), hand.parameters(), strict=True):
        assert (p - q).abs().max() < 1e-6
    assert not model.training


@pytest.mark.parametrize("kwargs, message", [
    (dict(steps=0), "steps is 0, expected a positive int"),
    (dict(lr=-1.0), "lr is -1.0, expected a finite number > 0"),
    (dict(batches=[]), "batches is empty, expected (ids, mask) batches"),
])
def test_train_sft_errors_in_full(tok, kwargs, message):
    args = dict(batches=[(torch.zeros(1, 2, dtype=torch.long), torch.ones(1, 2))], steps=1, lr=1e-3) | kwargs
    with pytest.raises(ValueError, match=full(message)):
        sft.train_sft(_gpt(tok), **args)


def test_greedy_answers_stop_at_end(tok, monkeypatch):
    end = tok.special_tokens[sft.END]
    two, three = tok.encode("two"), tok.encode("three")

    def fake(model, prompt, max_new_tokens, top_k):
        return torch.cat([prompt, torch.tensor([two + [end] + three] * prompt.shape[0])], dim=1)
    monkeypatch.setattr(sft, "generate", fake)
    assert sft.greedy_answers(None, tok, ["what is one plus one?", "what is three plus one?"]) == \
        ["two", "two"]


def test_train_sft_default_seed_is_0(tok):
    batches = [sft.pad_batch([sft.encode_example(tok, f.question(), f.answer())], 0)
               for f in tasks.all_facts(2)[:3]]
    a, b = _gpt(tok), _gpt(tok)
    assert sft.train_sft(a, batches, steps=3, lr=1e-2) == sft.train_sft(b, batches, steps=3, lr=1e-2, seed=0)
    c = _gpt(tok)
    assert sft.train_sft(c, batches, steps=3, lr=1e-2, seed=1) != sft.train_sft(_gpt(tok), batches, steps=3,
                                                                                lr=1e-2, seed=0)


def test_check_ids_and_mask_refuses_by_name():
    ids = torch.zeros(2, 4, dtype=torch.long)
    with pytest.raises(ValueError, match="^ids has shape"):
        sft.check_ids_and_mask(ids[:, :1], torch.ones(2, 1))
    with pytest.raises(ValueError, match="^mask has shape"):
        sft.check_ids_and_mask(ids, torch.ones(2, 3))
    with pytest.raises(ValueError, match="^mask holds the values"):
        sft.check_ids_and_mask(ids, torch.full((2, 4), 2))
    sft.check_ids_and_mask(ids, torch.ones(2, 4))
