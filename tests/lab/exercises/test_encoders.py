"""Notebook 10's checkers (helpers/lab/exercises/encoders.py): every correct formulation passes,
each usual slip fails with a message that names it, and a stub hears what to write."""

from __future__ import annotations

import pytest
import torch

from helpers.families.mlm import IGNORE, mask_tokens
from helpers.lab.exercises import evaluate
from helpers.lab.exercises.encoders import CROSS_ATTENTION_MISTAKES, cross_attention_variant
from helpers.model.multihead import MultiHeadAttention


def corrupt(mask_share=0.8, random_share=0.1, labels_everywhere=False, pick_padding=False,
            first_random=None, seeded=True, rate_scale=1.0):
    """A mask_tokens answer with one knob turned away from BERT's recipe."""
    def answer(ids, mask_id, vocab_size, first_word_id, generator, rate=0.15, pad_id=0):
        gen = generator if seeded else None
        real = torch.ones_like(ids, dtype=torch.bool) if pick_padding else ids != pad_id
        picked = (torch.rand(ids.shape, generator=gen) < rate * rate_scale) & real
        labels = ids.clone() if labels_everywhere else ids.masked_fill(~picked, IGNORE)
        roll = torch.rand(ids.shape, generator=gen)
        low = first_word_id if first_random is None else first_random
        words = torch.randint(low, vocab_size, ids.shape, generator=gen)
        inputs = ids.masked_fill(picked & (roll < mask_share), mask_id)
        inputs = torch.where(picked & (roll >= mask_share) & (roll < mask_share + random_share), words, inputs)
        return inputs, labels
    return answer


@pytest.mark.parametrize("answer, words", [
    (corrupt(mask_share=0.9), "proportions are off: of the picked tokens you made <mask> 90%, random 10%, kept 0%"),
    (corrupt(random_share=0.2), "80 % / random 10 % / keep 10 % proportions are off"),
    (corrupt(labels_everywhere=True), "labels are the ids everywhere"),
    (corrupt(pick_padding=True), "padding positions were picked"),
    (corrupt(first_random=0), "special tokens"),
    (corrupt(seeded=False), "generator=generator"),
    (corrupt(rate_scale=0.5), "of the real tokens were picked, expected about 15 %"),
])
def test_the_masking_checker_names_the_wrong_recipe(answer, words):
    passed, said = evaluate("encoders.mask_tokens", answer)
    assert not passed and words in said


def test_the_masking_checker_refuses_the_course_and_accepts_another_draw_order():
    passed, said = evaluate("encoders.mask_tokens", mask_tokens)
    assert not passed and "helpers.families.mlm.mask_tokens" in said

    def split_first(ids, mask_id, vocab_size, first_word_id, generator, rate=0.15, pad_id=0):
        roll = torch.rand(ids.shape, generator=generator)        # the split first, then the pick
        picked = (torch.rand(ids.shape, generator=generator) < rate) & (ids != pad_id)
        words = torch.randint(first_word_id, vocab_size, ids.shape, generator=generator)
        inputs = torch.where(picked & (roll >= 0.9), words, ids)  # the random 10 % at the top
        inputs = torch.where(picked & (roll < 0.8), torch.full_like(ids, mask_id), inputs)
        return inputs, torch.where(picked, ids, torch.full_like(ids, IGNORE))
    assert evaluate("encoders.mask_tokens", split_first)[0]


def shapes_by_running(b, n, m, d, h):
    """Another correct answer: run real cross-attention, written with torch, and read the shapes off."""
    q_proj, k_proj, v_proj, out_proj = (torch.nn.Linear(d, d) for _ in range(4))
    y, memory = torch.zeros(b, n, d), torch.zeros(b, m, d)
    q = q_proj(y).view(b, n, h, d // h).transpose(1, 2)
    k = k_proj(memory).view(b, m, h, d // h).transpose(1, 2)
    v = v_proj(memory).view(b, m, h, d // h).transpose(1, 2)
    weights = (q @ k.transpose(-2, -1)).softmax(-1)
    output = out_proj((weights @ v).transpose(1, 2).reshape(b, n, d))
    return {"q": list(q.shape), "k": k.shape, "v": v.shape, "weights": weights.shape, "output": output.shape}


def shapes_by_the_course_layer(b, n, m, d, h):
    """The course's layer run to read the shapes off: its code, not the student's, refused by name."""
    attn = MultiHeadAttention(d, h)
    y, memory = torch.zeros(b, n, d), torch.zeros(b, m, d)
    return {"q": (b, h, n, d // h), "k": (b, h, m, d // h), "v": (b, h, m, d // h), "weights": (b, h, n, m),
            "output": attn(y, context=memory).shape}


def shapes_keys_from_target(b, n, m, d, h):
    return {"q": (b, h, n, d // h), "k": (b, h, n, d // h), "v": (b, h, n, d // h),
            "weights": (b, h, n, n), "output": (b, n, d)}


def shapes_weights_transposed(b, n, m, d, h):
    return {"q": (b, h, n, d // h), "k": (b, h, m, d // h), "v": (b, h, m, d // h),
            "weights": (b, h, m, n), "output": (b, n, d)}


def test_cross_attention_shapes_checker():
    assert evaluate("encoders.cross_attention_shapes", shapes_by_running)[0]
    passed, message = evaluate("encoders.cross_attention_shapes", shapes_by_the_course_layer)
    assert not passed and "helpers.model.multihead.MultiHeadAttention" in message
    passed, message = evaluate("encoders.cross_attention_shapes", shapes_keys_from_target)
    assert not passed and "k should be" in message and "Keys and values come from the source" in message
    passed, message = evaluate("encoders.cross_attention_shapes", shapes_weights_transposed)
    assert not passed and "weights should be (2, 4, 5, 7), got (2, 4, 7, 5)" in message


def test_source_key_mask_checker():
    assert evaluate("encoders.source_key_mask", lambda s, p: s.ne(p).unsqueeze(1).unsqueeze(2))[0]
    assert evaluate("encoders.source_key_mask", lambda s, p: (s != p).view(s.shape[0], 1, 1, -1))[0]
    passed, message = evaluate("encoders.source_key_mask", lambda s, p: (s == p)[:, None, None, :])
    assert not passed and "swapped" in message
    passed, message = evaluate("encoders.source_key_mask", lambda s, p: s != p)
    assert not passed and "shape (B, 1, 1, M)" in message
    passed, message = evaluate("encoders.source_key_mask", lambda s, p: (s != p).long()[:, None, None, :])
    assert not passed and "torch.bool" in message


def beam_by_sorting(scores, log_probs, width):
    """Another correct answer: sort the whole table, divmod the flat indices."""
    total = (log_probs + scores.unsqueeze(1)).reshape(-1)
    order = total.argsort(descending=True)[:width]
    rows = torch.div(order, log_probs.shape[1], rounding_mode="floor")
    return total[order], rows, order - rows * log_probs.shape[1]


def beam_by_unravel(scores, log_probs, width):
    best, flat = (scores[:, None] + log_probs).flatten().topk(width)
    rows, tokens = torch.unravel_index(flat, log_probs.shape)
    return best, rows, tokens


def beam_per_row(scores, log_probs, width):
    """The slip: the best `width` children of each prefix."""
    best, tokens = (scores[:, None] + log_probs).topk(width, dim=1)
    rows = torch.arange(len(scores))[:, None].expand_as(tokens)
    return best.flatten(), rows.flatten(), tokens.flatten()


def beam_best_word_per_row(scores, log_probs, width):
    """The slip: each prefix extended by its best word only, then the best `width` of those."""
    best_each, tokens = (scores[:, None] + log_probs).max(dim=1)
    best, rows = best_each.topk(min(width, len(scores)))
    return best, rows, tokens[rows]


def beam_without_prefix_scores(scores, log_probs, width):
    best, flat = log_probs.flatten().topk(width)
    return best, flat // log_probs.shape[1], flat % log_probs.shape[1]


def beam_swapped(scores, log_probs, width):
    best, flat = (scores[:, None] + log_probs).flatten().topk(width)
    return best, flat % log_probs.shape[1], flat // log_probs.shape[1]


def test_beam_step_checker_accepts_other_correct_answers():
    for answer in (beam_by_sorting, beam_by_unravel):
        passed, message = evaluate("encoders.beam_step", answer)
        assert passed, message


def test_beam_step_checker_names_a_per_row_top_k():
    for answer in (beam_per_row, beam_best_word_per_row):
        passed, message = evaluate("encoders.beam_step", answer)
        assert not passed and "best children of each prefix separately" in message, message
        assert "Flatten the table" in message


def test_beam_step_checker_names_the_other_slips():
    passed, message = evaluate("encoders.beam_step", beam_without_prefix_scores)
    assert not passed and "add each prefix's score" in message
    passed, message = evaluate("encoders.beam_step", beam_swapped)
    assert not passed and "swapped" in message


def cross_attention_with_einsum(layer, x, memory, key_mask=None):
    """Another correct answer: einsum, and the mask applied to the weights after the softmax,
    renormalised."""
    b, n, d = x.shape
    h = layer.n_heads
    q = layer.q_proj(x).unflatten(-1, (h, d // h))
    k = layer.k_proj(memory).unflatten(-1, (h, d // h))
    v = layer.v_proj(memory).unflatten(-1, (h, d // h))
    weights = torch.einsum("bnhe,bmhe->bhnm", q, k).div((d // h) ** 0.5).exp()
    if key_mask is not None:
        weights = weights * key_mask
    weights = weights / weights.sum(-1, keepdim=True)
    return layer.out_proj(torch.einsum("bhnm,bmhe->bnhe", weights, v).flatten(-2))


def test_the_cross_attention_checker_accepts_other_formulations():
    assert evaluate("encoders.cross_attention", cross_attention_with_einsum)[0]
    # the checker's own variant is refused by name, and right once the watch looks away (watched=False)
    passed, said = evaluate("encoders.cross_attention", cross_attention_variant)
    assert not passed and "helpers.lab.exercises.encoders.cross_attention_variant" in said
    assert evaluate("encoders.cross_attention", cross_attention_variant, watched=False)[0]


@pytest.mark.parametrize("mistake", list(CROSS_ATTENTION_MISTAKES))
def test_the_cross_attention_checker_names_each_mistake(mistake):
    """The slips come from the checker's variant: judged with watched=False to see how it names them."""
    message, fix = CROSS_ATTENTION_MISTAKES[mistake]
    passed, said = evaluate("encoders.cross_attention",
                            lambda *args: cross_attention_variant(*args, mistake=mistake), watched=False)
    assert not passed and message in said and fix in said
    first_try = evaluate("encoders.cross_attention",
                         lambda *args: cross_attention_variant(*args, mistake=mistake), attempt=1,
                         watched=False)[1]
    assert message in first_try and fix not in first_try


def test_the_cross_attention_checker_refuses_the_layer_and_swapped_sequences():
    passed, said = evaluate("encoders.cross_attention",
                            lambda layer, x, memory, mask=None: layer(x, context=memory, mask=mask))
    assert not passed and "MultiHeadAttention.forward" in said
    passed, said = evaluate("encoders.cross_attention",
                            lambda layer, x, memory, mask=None: cross_attention_variant(layer, memory, x),
                            watched=False)
    assert not passed and "the queries came from the source" in said
    state = torch.random.get_rng_state()
    evaluate("encoders.cross_attention", cross_attention_variant, watched=False)
    assert torch.equal(torch.random.get_rng_state(), state), "the check leaves the global RNG alone"
