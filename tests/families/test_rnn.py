"""helpers.families.rnn against torch.nn's GRU cell step by step, with every check's message read in full.

 The encoder and
decoder are unrolled here by hand with nn.GRUCell carrying the module's own GRU weights, one
sentence at a time and without padding; the greedy decoder runs a scripted model whose choices
are known in advance.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from helpers.families.rnn import AttentionGRUSeq2Seq, GRUSeq2Seq, gru_greedy_decode, source_lengths
from helpers.families.seq2seq import Seq2SeqConfig


def _message(excinfo) -> str:
    return str(excinfo.value)


def _cell_from(gru: nn.GRU) -> nn.GRUCell:
    """The one-layer GRU's weights in a GRUCell: the reference that runs one token at a time."""
    cell = nn.GRUCell(gru.input_size, gru.hidden_size)
    with torch.no_grad():
        cell.weight_ih.copy_(gru.weight_ih_l0)
        cell.weight_hh.copy_(gru.weight_hh_l0)
        cell.bias_ih.copy_(gru.bias_ih_l0)
        cell.bias_hh.copy_(gru.bias_hh_l0)
    return cell


# Rows of different lengths, not sorted by length, with padding on the right (pad_id 0).
SOURCE = torch.tensor([[3, 4, 0, 0], [5, 6, 7, 8], [9, 3, 4, 0]])
TARGET_IN = torch.tensor([[1, 4, 5], [1, 6, 3], [1, 2, 7]])


def _encode_by_hand(model: GRUSeq2Seq, source: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
    cell = _cell_from(model.encoder)
    all_states, last = [], []
    for row in source:
        h = torch.zeros(1, model.encoder.hidden_size)
        states = []
        for token in row[row != model.pad_id]:
            h = cell(model.source_embed(token[None]), h)
            states.append(h[0])
        all_states.append(torch.stack(states))
        last.append(h[0])
    return all_states, torch.stack(last)


# --- the encoder and the plain decoder against nn.GRUCell ------------------------------------

def test_encode_all_matches_a_cell_run_over_each_unpadded_sentence():
    torch.manual_seed(0)
    model = GRUSeq2Seq(10, 9, hidden=6).eval()
    with torch.no_grad():
        states, last = model.encode_all(SOURCE)
        by_hand, last_by_hand = _encode_by_hand(model, SOURCE)
    assert states.shape == (3, 4, 6) and last.shape == (1, 3, 6)
    torch.testing.assert_close(last[0], last_by_hand, atol=1e-6, rtol=1e-5)
    for row, reference in zip(states, by_hand, strict=True):
        n = len(reference)
        torch.testing.assert_close(row[:n], reference, atol=1e-6, rtol=1e-5)
        assert torch.equal(row[n:], torch.zeros_like(row[n:]))  # zero on padding
    torch.testing.assert_close(model.encode(SOURCE), last)


def test_encode_all_keeps_the_source_width_when_every_row_ends_in_padding():
    torch.manual_seed(0)
    model = GRUSeq2Seq(10, 9, hidden=6).eval()
    states, _ = model.encode_all(torch.tensor([[3, 4, 0, 0], [5, 0, 0, 0]]))
    assert states.shape == (2, 4, 6)


def test_decode_and_forward_match_a_cell_run_word_by_word():
    torch.manual_seed(0)
    model = GRUSeq2Seq(10, 9, hidden=6).eval()
    cell = _cell_from(model.decoder)
    with torch.no_grad():
        logits = model(SOURCE, TARGET_IN)
        _, h = _encode_by_hand(model, SOURCE)
        expected = []
        for t in range(TARGET_IN.shape[1]):
            h = cell(model.target_embed(TARGET_IN[:, t]), h)
            expected.append(model.head(h))
        expected = torch.stack(expected, dim=1)
        decoded, state = model.decode(TARGET_IN, model.encode(SOURCE))
    assert logits.shape == (3, 3, 9)
    torch.testing.assert_close(logits, expected, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(decoded, expected, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(state[0], h, atol=1e-6, rtol=1e-5)


def test_the_plain_step_is_one_word_of_decode():
    torch.manual_seed(0)
    model = GRUSeq2Seq(10, 9, hidden=6).eval()
    with torch.no_grad():
        carry = model.start(SOURCE)
        torch.testing.assert_close(carry, model.encode(SOURCE))
        full, _ = model.decode(TARGET_IN[:, :2], carry)
        first, carry = model.step(TARGET_IN[:, :1], carry)
        second, _ = model.step(TARGET_IN[:, 1:2], carry)
    assert first.shape == (3, 9)
    torch.testing.assert_close(first, full[:, 0])
    torch.testing.assert_close(second, full[:, 1])


# --- the attention translator against a by-hand Bahdanau loop ------------------------------

def test_attention_forward_matches_bahdanau_by_hand():
    torch.manual_seed(0)
    model = AttentionGRUSeq2Seq(10, 9, hidden=6).eval()
    with torch.no_grad():
        logits = model(SOURCE, TARGET_IN)
        weights = model.last_weights
        by_hand, last = _encode_by_hand(model, SOURCE)
        s = last
        expected, expected_weights = [], []
        for t in range(TARGET_IN.shape[1]):
            step_logits, step_weights = [], []
            for b, h in enumerate(by_hand):
                e = torch.stack([model.v(torch.tanh(model.w_s(s[b]) + model.w_h(h_j)))[0] for h_j in h])
                a = torch.softmax(e, dim=0)
                context = (a[:, None] * h).sum(0)
                x = torch.cat([model.target_embed(TARGET_IN[b, t]), context])
                s_b = model.cell(x[None], s[b][None])[0]
                step_logits.append(model.head(torch.cat([s_b, context])))
                step_weights.append(torch.cat([a, torch.zeros(SOURCE.shape[1] - len(a))]))
                s = torch.cat([s[:b], s_b[None], s[b + 1:]])
            expected.append(torch.stack(step_logits))
            expected_weights.append(torch.stack(step_weights))
    assert logits.shape == (3, 3, 9) and weights.shape == (3, 3, 4)  # (B, N, M)
    torch.testing.assert_close(logits, torch.stack(expected, dim=1), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(weights, torch.stack(expected_weights, dim=1), atol=1e-6, rtol=1e-5)


def test_attention_start_carries_state_states_keys_and_mask():
    torch.manual_seed(0)
    model = AttentionGRUSeq2Seq(10, 9, hidden=6).eval()
    with torch.no_grad():
        state, states, keys, mask = model.start(SOURCE)
        all_states, last = model.encode_all(SOURCE)
    torch.testing.assert_close(state, last[0])
    torch.testing.assert_close(states, all_states)
    torch.testing.assert_close(keys, model.w_h(all_states))
    assert torch.equal(mask, SOURCE != 0)


def test_attention_layers_have_bahdanaus_shapes_and_no_extra_bias():
    model = AttentionGRUSeq2Seq(10, 9, hidden=6)
    shapes = {name: tuple(p.shape) for name, p in model.named_parameters()}
    assert shapes == {
        "source_embed.weight": (10, 6), "target_embed.weight": (9, 6),
        "encoder.weight_ih_l0": (18, 6), "encoder.weight_hh_l0": (18, 6),
        "encoder.bias_ih_l0": (18,), "encoder.bias_hh_l0": (18,),
        "cell.weight_ih": (18, 12), "cell.weight_hh": (18, 6), "cell.bias_ih": (18,), "cell.bias_hh": (18,),
        "w_s.weight": (6, 6), "w_h.weight": (6, 6), "w_h.bias": (6,), "v.weight": (1, 6),
        "head.weight": (9, 12), "head.bias": (9,),
    }
    assert model.last_weights is None
    plain = {name: tuple(p.shape) for name, p in GRUSeq2Seq(10, 9, hidden=6).named_parameters()}
    assert plain["head.weight"] == (9, 6) and plain["decoder.weight_ih_l0"] == (18, 6)
    assert GRUSeq2Seq(10, 9, hidden=6).decoder.batch_first


def test_special_ids_are_kept():
    model = GRUSeq2Seq(10, 9, hidden=4, pad_id=3, bos_id=5, eos_id=7)
    assert (model.pad_id, model.bos_id, model.eos_id) == (3, 5, 7)
    assert (model.source_vocab_size, model.target_vocab_size) == (10, 9)
    model = AttentionGRUSeq2Seq(10, 9, hidden=4, pad_id=3, bos_id=5, eos_id=7)
    assert (model.pad_id, model.bos_id, model.eos_id) == (3, 5, 7)
    # pad_id 3 is the source's padding: a row ending in 3 is right-padded
    assert source_lengths(torch.tensor([[4, 5, 3]]), 10, 3).tolist() == [2]


# --- the greedy decoder, on a model whose every choice is scripted ---------------------------

class Scripted:
    """start/step like the GRU translators; step t answers the t-th row of `script` for each row."""

    def __init__(self, script: list[list[int]], vocab: int = 6, pad_id: int = 0, bos_id: int = 1, eos_id: int = 2):
        self.script, self.vocab = script, vocab
        self.pad_id, self.bos_id, self.eos_id = pad_id, bos_id, eos_id
        self.fed: list[list[int]] = []

    def start(self, source):
        return 0

    def step(self, token, t):
        assert token.shape == (len(self.script[0]), 1) and token.dtype == torch.long
        self.fed.append(token[:, 0].tolist())
        logits = torch.zeros(token.shape[0], self.vocab)
        logits[torch.arange(token.shape[0]), torch.tensor(self.script[t])] = 1.0
        return logits, t + 1


def test_greedy_decode_pads_finished_rows_and_stops_when_all_are_done():
    model = Scripted([[3, 4], [2, 5], [4, 3], [5, 2], [3, 3], [3, 3]])
    out = gru_greedy_decode(model, torch.zeros(2, 3, dtype=torch.long), max_length=6)
    assert out.tolist() == [[3, 2, 0, 0], [4, 5, 3, 2]]
    assert model.fed == [[1, 1], [3, 4], [2, 5], [0, 3]]  # bos first, then each row's own last word


def test_greedy_decode_stops_at_max_length_and_keeps_the_special_ids():
    model = Scripted([[4]] * 5, vocab=8, pad_id=6, bos_id=7, eos_id=5)
    out = gru_greedy_decode(model, torch.zeros(1, 2, dtype=torch.long), max_length=3)
    assert out.tolist() == [[4, 4, 4]] and model.fed == [[7], [4], [4]]
    model = Scripted([[5, 3], [3, 5], [3, 3]], vocab=8, pad_id=6, bos_id=7, eos_id=5)
    out = gru_greedy_decode(model, torch.zeros(2, 2, dtype=torch.long), max_length=3)
    assert out.tolist() == [[5, 6], [3, 5]]


def test_greedy_decode_allows_exactly_ten_thousand_steps():
    model = Scripted([[2]])
    assert gru_greedy_decode(model, torch.zeros(1, 1, dtype=torch.long), max_length=10_000).tolist() == [[2]]
    with pytest.raises(ValueError) as excinfo:
        gru_greedy_decode(model, torch.zeros(1, 1, dtype=torch.long), max_length=10_001)
    assert _message(excinfo) == "max_length is 10001, expected at most 10,000 steps"
    with pytest.raises(ValueError) as excinfo:
        gru_greedy_decode(model, torch.zeros(1, 1, dtype=torch.long), max_length=0)
    assert "max_length" in _message(excinfo) and "XX" not in _message(excinfo)


def test_greedy_decode_of_a_real_model_is_the_argmax_of_its_own_steps():
    torch.manual_seed(0)
    model = GRUSeq2Seq(10, 9, hidden=6).eval()
    out = gru_greedy_decode(model, SOURCE, max_length=4)
    with torch.no_grad():
        forced = model(SOURCE, torch.cat([torch.ones(3, 1, dtype=torch.long), out[:, :-1]], dim=1))
    done = torch.zeros(3, dtype=torch.bool)
    for t in range(out.shape[1]):
        expected = forced[:, t].argmax(-1).masked_fill(done, 0)
        assert torch.equal(out[:, t], expected)
        done |= expected == 2


# --- every check's message, in full -------------------------------------------------------

@pytest.mark.parametrize("source, message", [
    (torch.tensor([3, 4]), "source has shape (2,), expected (B, M) ids with M >= 1"),
    (torch.zeros(2, 0, dtype=torch.long), "source has shape (2, 0), expected (B, M) ids with M >= 1"),
    ([[3, 4]], "source has shape list, expected (B, M) ids with M >= 1"),
    (torch.tensor([[0, 0], [3, 4], [0, 0]]),
     "source rows [0, 2] hold padding only (empty sentences): expected at least one real token in each"),
    (torch.tensor([[3, 0, 4], [0, 4, 0]]),
     "source rows [0, 1] have padding before a real token: expected right-padded rows (the GRU reads "
     "left to right, so padding in front would run through its state)"),
])
def test_source_lengths_messages(source, message):
    with pytest.raises(ValueError) as excinfo:
        source_lengths(source, 10, 0)
    assert _message(excinfo) == message


def test_source_lengths_of_good_rows():
    assert source_lengths(torch.tensor([[3, 0, 0], [3, 4, 5], [3, 4, 0]]), 10, 0).tolist() == [1, 3, 2]
    assert source_lengths(torch.tensor([[3]]), 10, 0).tolist() == [1]


@pytest.mark.parametrize("cls", [GRUSeq2Seq, AttentionGRUSeq2Seq])
def test_constructor_messages(cls):
    for args, message in [((0, 9, 4), "source_vocab_size"), ((10, 0, 4), "target_vocab_size"),
                          ((10, 9, 0), "hidden")]:
        with pytest.raises(ValueError) as excinfo:
            cls(*args)
        assert _message(excinfo).startswith(f"{message} ") and "XX" not in _message(excinfo)
    with pytest.raises(ValueError) as excinfo:
        cls(3, 9, hidden=4, pad_id=3, bos_id=1, eos_id=2)
    assert _message(excinfo) == "pad_id is 3, outside source_vocab_size 3"
    with pytest.raises(ValueError) as excinfo:
        cls(10, 9, hidden=4, pad_id=0, bos_id=9, eos_id=2)
    assert "target_vocab_size" in _message(excinfo) and "XX" not in _message(excinfo)
    assert cls(4, 9, hidden=4, pad_id=3, bos_id=1, eos_id=2).pad_id == 3  # the last source id works


def test_decode_refuses_a_batch_that_is_not_the_states():
    model = GRUSeq2Seq(10, 9, hidden=4)
    state = torch.zeros(1, 2, 4)
    with pytest.raises(ValueError) as excinfo:
        model.decode(torch.tensor([[1, 3], [1, 3], [1, 3]]), state)
    assert _message(excinfo) == ("target_in has shape (3, 2) and the source 2 sentences: expected (B, N), "
                                 "the batch sizes must match")
    with pytest.raises(ValueError) as excinfo:
        model.decode(torch.tensor([1, 3]), state)
    assert _message(excinfo).startswith("target_in has shape (2,) and the source 2 sentences")
    with pytest.raises(ValueError) as excinfo:
        model.decode(torch.tensor([[1, 9]]), torch.zeros(1, 1, 4))
    assert "target_in" in _message(excinfo) and "XX" not in _message(excinfo)


def test_attention_forward_refuses_a_batch_that_is_not_the_sources():
    model = AttentionGRUSeq2Seq(10, 9, hidden=4)
    with pytest.raises(ValueError) as excinfo:
        model(torch.tensor([[3, 4, 5], [5, 6, 7]]), torch.tensor([[1, 3]]))
    assert _message(excinfo) == ("target_in has shape (1, 2), expected (B, N) with B = 2 like the source: "
                                 "the batch sizes must match")
    with pytest.raises(ValueError) as excinfo:
        model(torch.tensor([[3, 4], [5, 6]]), torch.tensor([1, 3]))
    assert _message(excinfo).startswith("target_in has shape (2,), expected (B, N) with B = 2")
    with pytest.raises(ValueError) as excinfo:
        model(torch.tensor([[3, 4]]), torch.tensor([[1, 9]]))
    assert "target_in" in _message(excinfo) and "XX" not in _message(excinfo)
    with pytest.raises(ValueError) as excinfo:
        model.step(torch.tensor([[9]]), model.start(torch.tensor([[3, 4]])))
    assert _message(excinfo) == "token contains the id 9, expected ids in [0, 8] for a vocabulary of 9 tokens"


# --- defaults, the encoder module on its own, the device of the first token -------------------

@pytest.mark.parametrize("cls", [GRUSeq2Seq, AttentionGRUSeq2Seq])
def test_defaults(cls):
    model = cls(10, 9)
    assert model.encoder.hidden_size == 128 and model.source_embed.weight.shape == (10, 128)
    assert (model.pad_id, model.bos_id, model.eos_id) == (0, 1, 2)


def test_the_encoder_gru_reads_batch_first_like_the_decoder():
    torch.manual_seed(0)
    model = GRUSeq2Seq(10, 9, hidden=6).eval()
    source = torch.tensor([[3, 4, 5], [6, 7, 8]])  # no padding: the plain module sees the same rows
    with torch.no_grad():
        states, last = model.encoder(model.source_embed(source))
        expected_states, expected_last = model.encode_all(source)
    torch.testing.assert_close(states, expected_states)
    torch.testing.assert_close(last, expected_last)


class FirstTokenSeen(Exception):
    pass


def test_the_first_token_is_made_on_the_sources_device():
    seen = []

    class Probe(Scripted):
        def step(self, token, carry):
            seen.append((token.device.type, token.dtype))
            raise FirstTokenSeen

    with pytest.raises(FirstTokenSeen):
        gru_greedy_decode(Probe([[2]]), torch.zeros(1, 3, dtype=torch.long, device="meta"), max_length=2)
    assert seen == [("meta", torch.long)]


@pytest.mark.parametrize("ids", [dict(pad_id=0, bos_id=0, eos_id=0), dict(pad_id=1, bos_id=1, eos_id=2),
                                 dict(pad_id=0, bos_id=2, eos_id=2)])
def test_special_ids_that_coincide(ids):
    with pytest.raises(ValueError, match="special ids coincide"):
        Seq2SeqConfig(13, 11, **ids)
    with pytest.raises(ValueError, match="special ids coincide"):
        GRUSeq2Seq(13, 11, hidden=4, **ids)
    with pytest.raises(ValueError, match="special ids coincide"):
        AttentionGRUSeq2Seq(13, 11, hidden=4, **ids)


@pytest.mark.parametrize("cls", [GRUSeq2Seq, AttentionGRUSeq2Seq])
def test_a_left_padded_source_for_the_gru(cls):
    model = cls(10, 9, hidden=8)
    with pytest.raises(ValueError, match=r"source rows \[1\] have padding before a real token"):
        model(torch.tensor([[3, 4, 5], [0, 4, 5]]), torch.tensor([[1, 3], [1, 3]]))
    with pytest.raises(ValueError, match="right-padded"):
        gru_greedy_decode(model, torch.tensor([[3, 0, 5]]), max_length=3)


@pytest.mark.parametrize("cls", [GRUSeq2Seq, AttentionGRUSeq2Seq])
def test_a_padding_only_row_for_the_gru(cls):
    with pytest.raises(ValueError, match=r"source rows \[0\] hold padding only"):
        cls(10, 9, hidden=8)(torch.tensor([[0, 0], [3, 4]]), torch.tensor([[1, 3], [1, 3]]))
