"""helpers.model.embeddings (one-hot, cosine, sinusoidal and learned positions) and notebook 2's checkers."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from shared_tools import full

from helpers.lab.exercises import evaluate
from helpers.model.embeddings import (
    TokenAndPositionEmbedding,
    check_token_ids,
    cosine_similarity,
    one_hot,
    sinusoid_frequencies,
    sinusoid_wavelengths,
    sinusoidal_positions,
)


def sinusoid_entry(pos: int, column: int, d_model: int, base: float) -> float:
    """One entry of the table, read straight off the formula of the paper."""
    angle = pos / base ** (2 * (column // 2) / d_model)
    return math.sin(angle) if column % 2 == 0 else math.cos(angle)


# --- one_hot -----------------------------------------------------------------------------------

def test_one_hot_puts_a_single_one_in_the_column_of_the_id():
    ids = torch.tensor([[2, 0], [1, 2]])
    vectors = one_hot(ids, 3)
    assert vectors.shape == (2, 2, 3) and vectors.dtype == torch.float32
    assert torch.equal(vectors.sum(-1), torch.ones(2, 2))
    assert torch.equal(vectors.argmax(-1), ids)


@settings(max_examples=40, deadline=None)
@given(vocab_size=st.integers(1, 40), d_model=st.integers(1, 12), n_tokens=st.integers(0, 20),
       seed=st.integers(0, 2**16))
def test_one_hot_product_is_exactly_an_embedding_lookup(vocab_size, d_model, n_tokens, seed):
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randn(vocab_size, d_model, generator=generator)
    ids = torch.randint(vocab_size, (n_tokens,), generator=generator)
    assert torch.equal(one_hot(ids, vocab_size) @ weight, F.embedding(ids, weight))


@pytest.mark.parametrize("ids, vocab_size, error, match", [
    (torch.tensor([0, 5]), 5, ValueError, r"contains the id 5, expected ids in \[0, 4\]"),
    (torch.tensor([-1, 2]), 5, ValueError, r"contains the id -1"),
    (torch.tensor([0.0, 1.0]), 5, TypeError, r"dtype torch.float32, expected an integer dtype"),
    ([0, 1], 5, TypeError, r"must be a torch.Tensor"),
    (torch.tensor([0]), 0, ValueError, r"vocab_size is 0, expected a positive int"),
])
def test_one_hot_rejects_bad_input_naming_it(ids, vocab_size, error, match):
    with pytest.raises(error, match=match):
        one_hot(ids, vocab_size)


# --- cosine_similarity ---------------------------------------------------------------------------

@settings(max_examples=30, deadline=None)
@given(rows=st.integers(1, 6), d=st.integers(1, 10), seed=st.integers(0, 2**16))
def test_cosine_similarity_matches_torch_and_ignores_length(rows, d, seed):
    generator = torch.Generator().manual_seed(seed)
    a = torch.randn(rows, d, generator=generator, dtype=torch.float64) + 0.1
    b = torch.randn(rows, d, generator=generator, dtype=torch.float64) + 0.1
    ours = cosine_similarity(a, b)
    assert ours.shape == (rows,)
    assert torch.allclose(ours, F.cosine_similarity(a, b, dim=-1, eps=0.0))
    assert torch.allclose(cosine_similarity(3.5 * a, b), ours)
    assert (ours.abs() <= 1 + 1e-12).all()


def test_cosine_similarity_of_the_seed_vectors():
    boy, girl = torch.tensor([10.0, 8.0, 9.0]), torch.tensor([9.0, 7.0, 10.0])
    assert cosine_similarity(boy, girl).item() == pytest.approx(236 / math.sqrt(245 * 230))
    assert cosine_similarity(boy, -boy).item() == pytest.approx(-1.0)


def test_cosine_similarity_broadcasts_a_query_against_a_table():
    table = torch.tensor([[1.0, 0.0], [0.0, 2.0], [-3.0, 0.0]])
    assert torch.allclose(cosine_similarity(torch.tensor([1.0, 0.0]), table), torch.tensor([1.0, 0.0, -1.0]))


def test_cosine_similarity_refuses_zero_vectors_and_mismatched_sizes():
    with pytest.raises(ValueError, match="b contains a zero vector"):
        cosine_similarity(torch.ones(2, 3), torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.0, 0.0]]))
    with pytest.raises(ValueError, match=r"a has shape \(2, 3\) and b has shape \(2, 4\)"):
        cosine_similarity(torch.ones(2, 3), torch.ones(2, 4))
    with pytest.raises(TypeError, match=r"^b is of dtype torch.int64 and shape \(2,\), expected a floating-point "
                                        r"tensor of vectors \(\.\.\., d\): convert it with b.float\(\)$"):
        cosine_similarity(torch.ones(2), torch.tensor([3, 4]))
    with pytest.raises(TypeError, match=r"^a is a list, expected a floating-point tensor of vectors \(\.\.\., d\)$"):
        cosine_similarity([1.0, 2.0], torch.ones(2))
    with pytest.raises(TypeError, match=r"^a is of dtype torch.float32 and shape \(\), expected a floating-point tensor of vectors \(\.\.\., d\)$"):
        cosine_similarity(torch.tensor(1.0), torch.ones(1))


# --- sinusoidal positions ------------------------------------------------------------------------

@settings(max_examples=40, deadline=None)
@given(n_positions=st.integers(1, 30), d_model=st.integers(1, 33),
       base=st.sampled_from([2.5, 100.0, 10000.0]))
def test_sinusoidal_positions_follow_the_formula_entry_by_entry(n_positions, d_model, base):
    table = sinusoidal_positions(n_positions, d_model, base)
    assert table.shape == (n_positions, d_model) and table.dtype == torch.float32
    expected = torch.tensor([[sinusoid_entry(p, c, d_model, base) for c in range(d_model)]
                             for p in range(n_positions)])
    assert torch.allclose(table, expected, atol=1e-6)


def test_sinusoidal_positions_reproduce_the_usf_notes_table():
    usf_table = torch.tensor([[0.0000, 1.0000, 0.0000, 1.0000],
                             [0.8415, 0.5403, 0.0100, 0.9999],
                             [0.9093, -0.4161, 0.0200, 0.9998],
                             [0.1411, -0.9900, 0.0300, 0.9996]])
    # The slide truncates cos(0.01) = 0.99995 to 0.9999, hence 5e-5 and a hair more.
    assert torch.allclose(sinusoidal_positions(4, 4), usf_table, atol=5.1e-5)


def test_position_zero_is_sin_0_cos_0_and_every_entry_is_bounded():
    table = sinusoidal_positions(500, 64)
    assert torch.equal(table[0], torch.tensor([0.0, 1.0] * 32))
    assert table.abs().max() <= 1.0


def test_dot_product_of_two_positions_depends_only_on_their_distance():
    table = sinusoidal_positions(80, 16).double()
    dots = table @ table.T
    for offset in (0, 1, 7, 50):
        diagonal = torch.diagonal(dots, offset)
        assert torch.allclose(diagonal, diagonal[0].expand_as(diagonal), atol=1e-5)


def test_every_position_gets_a_different_row():
    table = sinusoidal_positions(1000, 32)
    assert torch.cdist(table, table).add(torch.eye(1000)).min() > 1e-3


def test_wavelengths_of_the_textbook_exercise():
    wavelengths = sinusoid_wavelengths(512)
    assert wavelengths.shape == (256,)
    assert wavelengths[0].item() == pytest.approx(2 * math.pi)
    assert wavelengths[-1].item() == pytest.approx(2 * math.pi * 10000 ** (510 / 512))
    assert wavelengths[-1].item() == pytest.approx(60_611.5, abs=0.1)
    assert (wavelengths.diff() > 0).all()
    assert torch.allclose(wavelengths * sinusoid_frequencies(512), torch.full((256,), 2 * math.pi,
                                                                            dtype=torch.float64))


def test_a_column_pair_repeats_after_its_wavelength():
    d_model, base = 8, 10.0
    wavelength = sinusoid_wavelengths(d_model, base)[1].item()  # pair 1: columns 2 and 3
    positions = torch.tensor([3.0, 3.0 + wavelength], dtype=torch.float64)
    angles = positions * sinusoid_frequencies(d_model, base)[1]
    assert torch.allclose(torch.sin(angles[0]), torch.sin(angles[1]))


@pytest.mark.parametrize("args, error, match", [
    ((0, 4), ValueError, r"n_positions is 0, expected a positive int"),
    ((4, 0), ValueError, r"d_model is 0, expected a positive int"),
    ((2.5, 4), TypeError, r"n_positions is 2.5 \(a float\), expected a positive int"),
    ((4, 4, 1.0), ValueError, r"base is 1.0, expected a number > 1 \(10000.0 in the paper\)"),
    ((4, 4, -3.0), ValueError, r"base is -3.0, expected a number > 1"),
])
def test_sinusoidal_positions_reject_bad_arguments_naming_them(args, error, match):
    with pytest.raises(error, match=match):
        sinusoidal_positions(*args)


# --- TokenAndPositionEmbedding -----------------------------------------------------------------------

def make_embedding(vocab_size: int = 12, context_length: int = 4, d_model: int = 8) -> TokenAndPositionEmbedding:
    torch.manual_seed(0)
    return TokenAndPositionEmbedding(vocab_size, context_length, d_model)


def test_token_and_position_embedding_is_the_sum_of_two_lookups():
    embed = make_embedding()
    ids = torch.tensor([[0, 1, 2, 3], [11, 11, 5, 0]])
    out = embed(ids)
    assert out.shape == (2, 4, 8)
    expected = embed.token.weight[ids] + embed.position.weight[:4]
    assert torch.equal(out, expected)
    assert torch.equal(embed(ids[1]), expected[1])  # one unbatched sequence


def test_the_same_token_at_two_positions_gets_two_vectors():
    out = make_embedding()(torch.tensor([7, 7, 7]))
    assert not torch.allclose(out[0], out[1]) and not torch.allclose(out[1], out[2])


def test_shorter_sequences_use_the_first_position_rows():
    embed = make_embedding()
    out = embed(torch.tensor([[4, 4]]))
    assert torch.equal(out[0], embed.token.weight[4] + embed.position.weight[:2])


def test_a_later_piece_of_a_sequence_uses_the_rows_from_its_start():
    embed = make_embedding()
    ids = torch.tensor([[4, 2, 7]])
    torch.testing.assert_close(embed(ids[:, 1:], start=1), embed(ids)[:, 1:], atol=0, rtol=0)
    with pytest.raises(ValueError, match=r"after 3 earlier ones, expected at most context_length"):
        embed(ids[:, :2], start=embed.context_length - 1)
    with pytest.raises(ValueError, match="start is -1"):
        embed(ids, start=-1)


def test_training_moves_only_the_rows_that_were_used():
    embed = make_embedding()
    embed(torch.tensor([[3, 5]])).sum().backward()
    token_rows = embed.token.weight.grad.abs().sum(1).nonzero().flatten().tolist()
    position_rows = embed.position.weight.grad.abs().sum(1).nonzero().flatten().tolist()
    assert token_rows == [3, 5] and position_rows == [0, 1]


@pytest.mark.parametrize("ids, error, match", [
    (torch.tensor([[0, 12]]), ValueError, r"contains the id 12, expected ids in \[0, 11\]"),
    (torch.tensor([[0, -2]]), ValueError, r"contains the id -2"),
    (torch.zeros(1, 5, dtype=torch.long), ValueError,
     r"token_ids has 5 positions \(shape \(1, 5\)\), expected at most context_length = 4"),
    (torch.zeros(2, 1, 3, dtype=torch.long), ValueError, r"shape \(2, 1, 3\), expected \(batch, seq_len\)"),
    (torch.zeros(1, 3), TypeError, r"dtype torch.float32, expected an integer dtype"),
])
def test_token_and_position_embedding_explains_bad_input(ids, error, match):
    with pytest.raises(error, match=match):
        make_embedding()(ids)


def test_token_and_position_embedding_rejects_bad_sizes():
    with pytest.raises(ValueError, match=r"context_length is 0, expected a positive int"):
        TokenAndPositionEmbedding(vocab_size=10, context_length=0, d_model=4)


# --- notebook 2's exercise checkers ----------------------------------------------------------------

def reference_sinusoids(n_positions, d_model, base=10000.0):
    return sinusoidal_positions(n_positions, d_model, base)


def sines_and_cosines_swapped(n_positions, d_model, base=10000.0):
    table = sinusoidal_positions(n_positions, d_model, base)
    return table.view(n_positions, d_model // 2, 2).flip(-1).reshape(n_positions, d_model)


def sines_then_cosines(n_positions, d_model, base=10000.0):
    table = sinusoidal_positions(n_positions, d_model, base)
    return torch.cat([table[:, 0::2], table[:, 1::2]], dim=1)


def verdicts(name, *answers):
    """(passed, message) of exercise `name` for each answer, built from the course's functions to
    test the checker's judgement, so with the call watch off (graded, each would be refused)."""
    return [evaluate(name, answer, watched=False) for answer in answers]


def test_sinusoid_checker_accepts_the_formula_and_names_classic_mistakes():
    right, swapped, split = verdicts("embeddings.sinusoidal_table", reference_sinusoids,
                                     sines_and_cosines_swapped, sines_then_cosines)
    assert right[0] and not swapped[0] and not split[0]
    assert "sines and cosines are swapped" in swapped[1] and "all sines first" in split[1]


def test_lookup_checker_wants_a_product_not_an_index():
    right, *wrong = verdicts("embeddings.lookup_by_product",
                             lambda ids, w: one_hot(ids, w.shape[0]) @ w,
                             lambda ids, w: w[ids],
                             lambda ids, w: F.embedding(ids, w),
                             lambda ids, w: one_hot(ids, w.shape[0])[..., :-1] @ w[:-1])
    assert right[0] and not any(passed for passed, _ in wrong)
    assert sum("you read rows of the weight by index" in message for _, message in wrong) == 3


def test_similarity_checker_catches_ranking_by_dot_product():
    def by_cosine(query, table, k):
        return cosine_similarity(query, table).topk(k).indices

    right, by_dot, reversed_order = verdicts(
        "embeddings.most_similar", by_cosine,
        lambda query, table, k: (table @ query).topk(k).indices,
        lambda query, table, k: by_cosine(query, table, k).flip(0))
    assert right[0] and not by_dot[0] and not reversed_order[0]
    assert "you ranked by dot product" in by_dot[1] and "put the most similar first" in reversed_order[1]


# helpers.model.embeddings, exactly:
#
# Grouped by issue 30's classes: configuration asserted (the defaults and the bounds of `base`),
# exact properties whatever the default device or dtype, edge inputs (unbatched ids, bool and
# complex ids, a start that is not an int), and every error message read in full.

def test_the_default_base_is_the_papers_10000():
    assert torch.equal(sinusoidal_positions(64, 33), sinusoidal_positions(64, 33, 10000.0))
    assert not torch.equal(sinusoidal_positions(64, 33), sinusoidal_positions(64, 33, 10001.0))


def test_any_base_above_1_is_accepted_and_follows_the_formula():
    table = sinusoidal_positions(3, 4, 1.5)  # below 2: only "> 1" is required
    assert table[2, 2].item() == pytest.approx(math.sin(2 / 1.5 ** 0.5), abs=1e-6)


@pytest.mark.parametrize("base", [1.0, math.inf])
def test_a_base_of_1_or_infinity_is_refused_with_the_reason(base):
    message = (f"base is {base!r}, expected a number > 1 (10000.0 in the paper): with base <= 1 the "
               "wavelengths would not grow along the dimensions")
    with pytest.raises(ValueError, match=full(message)):
        sinusoidal_positions(4, 4, base)


def test_one_hot_and_the_positions_follow_the_ids_device_not_the_default_one():
    embed = TokenAndPositionEmbedding(5, 4, 2)
    ids = torch.tensor([[1, 4, 0]])
    expected = embed(ids)
    with torch.device("meta"):  # factory calls without a device would land on meta
        vectors = one_hot(ids, 5)
        out = embed(ids)
    assert vectors.device == ids.device and torch.equal(vectors.argmax(-1), ids)
    assert out.device == ids.device and torch.equal(out, expected)


def test_the_sinusoidal_table_is_computed_in_float64_whatever_the_default_dtype():
    expected = sinusoidal_positions(300, 10)
    previous = torch.get_default_dtype()
    try:
        torch.set_default_dtype(torch.bfloat16)
        table = sinusoidal_positions(300, 10)
    finally:
        torch.set_default_dtype(previous)
    assert table.dtype == torch.float32 and torch.equal(table, expected)


@pytest.mark.parametrize("ids, dtype", [
    (torch.tensor([True, False]), "torch.bool"),
    (torch.tensor([1.0]), "torch.float32"),
    (torch.tensor([1 + 0j]), "torch.complex64"),
])
def test_bool_float_and_complex_ids_get_the_integer_dtype_message(ids, dtype):
    message = f"token_ids has dtype {dtype}, expected an integer dtype (torch.long)"
    with pytest.raises(TypeError, match=full(message)):
        check_token_ids(ids, 5)


def test_ids_that_are_not_a_tensor_or_on_the_meta_device_are_named():
    with pytest.raises(TypeError, match=full("ids must be a torch.Tensor of integer ids, got list")):
        check_token_ids([0, 1], 5, name="ids")
    message = ("token_ids is on the meta device, which holds shapes but no values: "
               "expected real ids (on the CPU or a GPU)")
    with pytest.raises(ValueError, match=full(message)):
        check_token_ids(torch.zeros(3, dtype=torch.long, device="meta"), 5)


def test_a_zero_vector_in_a_is_named_a():
    message = "a contains a zero vector, which has no direction: cosine similarity is undefined for it"
    with pytest.raises(ValueError, match=full(message)):
        cosine_similarity(torch.zeros(3), torch.ones(3))


def test_a_zero_d_model_is_named():
    with pytest.raises(ValueError, match=r"^d_model is 0, expected a positive int"):
        TokenAndPositionEmbedding(10, 4, 0)


@pytest.mark.parametrize("start", [True, 1.0, "1"])
def test_a_start_that_is_not_an_int_is_refused(start):
    with pytest.raises(ValueError, match=full(f"start is {start!r}, expected an int >= 0")):
        TokenAndPositionEmbedding(10, 4, 2)(torch.tensor([1]), start=start)


def test_too_many_unbatched_ids_get_the_whole_message():
    message = ("token_ids has 5 positions (shape (5,)), expected at most context_length = 4: "
               "the position table has no row for the later positions")
    with pytest.raises(ValueError, match=full(message)):
        TokenAndPositionEmbedding(10, 4, 2)(torch.zeros(5, dtype=torch.long))
