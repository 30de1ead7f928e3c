"""Notebook 10's encoder-decoder: shapes, masks, beam search against exhaustive search, bad input."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from torch import nn

from helpers.families.rnn import GRUSeq2Seq, gru_greedy_decode
from helpers.families.seq2seq import (
    DecoderLayer,
    Encoder,
    EncoderDecoder,
    EncoderLayer,
    Seq2SeqConfig,
    beam_search,
    check_source_mask,
    exhaustive_search,
    greedy_decode,
    sequence_log_prob,
)
from helpers.model.multihead import MultiHeadAttention

SMALL = Seq2SeqConfig(source_vocab_size=13, target_vocab_size=11, context_length=12, n_layers=2,
                      n_heads=2, d_model=16)


def small_model(seed: int = 0, **changes) -> EncoderDecoder:
    torch.manual_seed(seed)
    return EncoderDecoder(Seq2SeqConfig(**{**SMALL.__dict__, **changes})).eval()


def ids(batch: int, length: int, vocab: int, seed: int = 1, low: int = 3) -> torch.Tensor:
    return torch.randint(low, vocab, (batch, length), generator=torch.Generator().manual_seed(seed))


def test_shapes_and_cross_attention_weights():
    model = small_model()
    source, target = ids(3, 7, 13), ids(3, 5, 11)
    logits = model(source, target)
    assert logits.shape == (3, 5, 11)
    assert model.cross_attention_weights().shape == (2, 3, 2, 5, 7)  # (L, B, H, N, M)
    assert all(isinstance(layer.cross_attn, MultiHeadAttention) for layer in model.decoder)


def test_padding_the_source_changes_nothing():
    model = small_model()
    source, target = ids(2, 6, 13), ids(2, 4, 11)
    padded = torch.cat([source, torch.zeros(2, 3, dtype=torch.long)], dim=1)
    assert torch.allclose(model(source, target), model(padded, target), atol=1e-6)
    other_padding = padded.clone()
    other_padding[:, 6:] = 5  # different tokens under an explicit mask that hides them
    mask = padded != 0
    assert torch.allclose(model(padded, target), model(other_padding, target, mask), atol=1e-6)
    # without the mask the same change does reach the output: the test can fail
    assert not torch.allclose(model(padded, target), model(other_padding, target), atol=1e-4)


def test_a_future_target_token_changes_nothing_before_it():
    model = small_model()
    source, target = ids(2, 6, 13), ids(2, 6, 11)
    changed = target.clone()
    changed[:, 4] = (changed[:, 4] + 1) % 11
    before, after = model(source, target), model(source, changed)
    assert torch.allclose(before[:, :4], after[:, :4], atol=1e-6)
    assert not torch.allclose(before[:, 4:], after[:, 4:], atol=1e-4)


def test_every_source_token_reaches_every_target_position():
    model = small_model()
    source, target = ids(1, 6, 13), ids(1, 3, 11)
    changed = source.clone()
    changed[0, 5] = (changed[0, 5] + 1) % 13  # the last source token
    assert not torch.allclose(model(source, target)[:, 0], model(changed, target)[:, 0], atol=1e-5)


def test_greedy_is_beam_search_of_width_one():
    model = small_model(seed=3)
    source = ids(1, 5, 13)[0]
    greedy = greedy_decode(model, source[None], max_length=6)[0]
    greedy = greedy[:int((greedy == 2).nonzero()[0]) + 1] if (greedy == 2).any() else greedy
    beam, score = beam_search(model, source, beam_width=1, max_length=6)
    assert torch.equal(beam, greedy)
    assert score == pytest.approx(sequence_log_prob(model, source, beam), abs=1e-5)


@pytest.mark.parametrize("seed", range(4))
def test_beam_search_matches_exhaustive_search_on_a_tiny_vocabulary(seed):
    model = small_model(seed=seed, target_vocab_size=5)
    source = ids(1, 4, 13, seed=seed)[0]
    best, best_score = exhaustive_search(model, source, max_length=2)
    beam, beam_score = beam_search(model, source, beam_width=5, max_length=2)  # width V: exhaustive
    assert torch.equal(beam, best) and beam_score == pytest.approx(best_score, abs=1e-5)
    best3, best3_score = exhaustive_search(model, source, max_length=3)
    for width in (1, 2, 3):
        _, score = beam_search(model, source, beam_width=width, max_length=3)
        assert score <= best3_score + 1e-5


@pytest.mark.parametrize("seed", range(6))
def test_beam_search_at_least_as_likely_as_greedy_here(seed):
    model = small_model(seed=seed)
    source = ids(1, 5, 13, seed=seed)[0]
    greedy = greedy_decode(model, source[None], max_length=5)[0]
    greedy = greedy[:int((greedy == 2).nonzero()[0]) + 1] if (greedy == 2).any() else greedy
    _, beam_score = beam_search(model, source, beam_width=4, max_length=5)
    assert beam_score >= sequence_log_prob(model, source, greedy) - 1e-5


# --- bad input ------------------------------------------------------------------------------

def test_source_and_target_batches_of_different_sizes():
    with pytest.raises(ValueError, match="batch sizes must match"):
        small_model()(ids(2, 5, 13), ids(3, 4, 11))


def test_a_mask_of_the_wrong_shape():
    with pytest.raises(ValueError, match=r"source_mask has shape \(2, 4\), expected \(2, 5\)"):
        small_model()(ids(2, 5, 13), ids(2, 4, 11), torch.ones(2, 4, dtype=torch.bool))


def test_a_mask_that_marks_padding_as_a_real_token_is_refused():
    model = small_model()
    source = ids(2, 5, 13)
    source[1, 3:] = model.config.pad_id
    with pytest.raises(ValueError, match=r"^source_mask marks the padding id 0 as a real token at "
                                         r"\(row, position\) \[\[1, 3\], \[1, 4\]\]"):
        model.encode(source, torch.ones(2, 5, dtype=torch.bool))
    memory, mask = model.encode(source, source != model.config.pad_id)
    assert memory.shape[:2] == (2, 5) and mask[1].tolist() == [True, True, True, False, False]


def test_an_empty_sentence():
    model = small_model()
    with pytest.raises(ValueError, match="empty sentences"):
        model(torch.tensor([[3, 4], [0, 0]]), ids(2, 3, 11))
    with pytest.raises(ValueError, match="M >= 1"):
        model(torch.zeros(2, 0, dtype=torch.long), ids(2, 3, 11))
    with pytest.raises(ValueError, match="not empty"):
        beam_search(model, torch.zeros(0, dtype=torch.long), beam_width=2, max_length=3)


def test_a_token_outside_the_vocabulary():
    with pytest.raises(ValueError, match=r"source contains the id 13, expected ids in \[0, 12\]"):
        small_model()(torch.tensor([[3, 13]]), ids(1, 3, 11))
    with pytest.raises(ValueError, match="target_in contains the id 11"):
        small_model()(ids(1, 3, 13), torch.tensor([[1, 11]]))


@pytest.mark.parametrize("width, match", [(0, "beam_width"), (12, "at most the target vocabulary size 11")])
def test_a_beam_width_of_zero_or_above_the_vocabulary(width, match):
    with pytest.raises(ValueError, match=match):
        beam_search(small_model(), ids(1, 4, 13)[0], beam_width=width, max_length=3)


# helpers.families.seq2seq against torch.nn's Transformer layers, decoding on scripted models.
#
# The encoder and
# decoder layers are checked against nn.TransformerEncoderLayer / nn.TransformerDecoderLayer
# (norm_first=True, GELU, 4D hidden) carrying the same weights; greedy decoding, beam search and
# exhaustive search run on a scripted model whose next-token log-probabilities are a fixed table of
# the prefix, so that their outputs can be computed here by brute force; every check's message is
# read in full.

def _message(excinfo) -> str:
    return str(excinfo.value)


def _x(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _copy_attention(theirs: nn.MultiheadAttention, ours) -> None:
    theirs.in_proj_weight.copy_(torch.cat([ours.q_proj.weight, ours.k_proj.weight, ours.v_proj.weight]))
    theirs.in_proj_bias.copy_(torch.cat([ours.q_proj.bias, ours.k_proj.bias, ours.v_proj.bias]))
    theirs.out_proj.weight.copy_(ours.out_proj.weight)
    theirs.out_proj.bias.copy_(ours.out_proj.bias)


def _copy_norm(theirs: nn.LayerNorm, ours) -> None:
    theirs.weight.copy_(ours.weight)
    theirs.bias.copy_(ours.bias)


def _randomise(module: nn.Module, seed: int) -> None:
    """Every parameter random (LayerNorm's ones and zeros would hide a swapped norm)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=generator, dtype=p.dtype) * 0.5)


def test_encoder_layer_matches_torch_transformer_encoder_layer():
    d, heads = 8, 2
    ours = EncoderLayer(d, heads).double().eval()
    _randomise(ours, 1)
    theirs = nn.TransformerEncoderLayer(d, heads, dim_feedforward=4 * d, dropout=0.0, activation="gelu",
                                        batch_first=True, norm_first=True).double().eval()
    with torch.no_grad():
        _copy_attention(theirs.self_attn, ours.self_attn)
        theirs.linear1.weight.copy_(ours.mlp.up.weight)
        theirs.linear1.bias.copy_(ours.mlp.up.bias)
        theirs.linear2.weight.copy_(ours.mlp.down.weight)
        theirs.linear2.bias.copy_(ours.mlp.down.bias)
        _copy_norm(theirs.norm1, ours.ln1)
        _copy_norm(theirs.norm2, ours.ln2)
        x = _x(2, 5, d)
        real = torch.tensor([[True] * 5, [True, True, True, False, False]])
        torch.testing.assert_close(ours(x, real[:, None, None, :]), theirs(x, src_key_padding_mask=~real))
        torch.testing.assert_close(ours(x), theirs(x))


def test_decoder_layer_matches_torch_transformer_decoder_layer():
    d, heads = 8, 2
    ours = DecoderLayer(d, heads).double().eval()
    _randomise(ours, 2)
    theirs = nn.TransformerDecoderLayer(d, heads, dim_feedforward=4 * d, dropout=0.0, activation="gelu",
                                        batch_first=True, norm_first=True).double().eval()
    with torch.no_grad():
        _copy_attention(theirs.self_attn, ours.self_attn)
        _copy_attention(theirs.multihead_attn, ours.cross_attn)
        theirs.linear1.weight.copy_(ours.mlp.up.weight)
        theirs.linear1.bias.copy_(ours.mlp.up.bias)
        theirs.linear2.weight.copy_(ours.mlp.down.weight)
        theirs.linear2.bias.copy_(ours.mlp.down.bias)
        _copy_norm(theirs.norm1, ours.ln1)
        _copy_norm(theirs.norm2, ours.ln2)
        _copy_norm(theirs.norm3, ours.ln3)
        y, memory = _x(2, 4, d, seed=3), _x(2, 6, d, seed=4)
        real = torch.tensor([[True] * 6, [True, True, False, False, False, False]])
        causal = nn.Transformer.generate_square_subsequent_mask(4, dtype=torch.float64)
        expected = theirs(y, memory, tgt_mask=causal, memory_key_padding_mask=~real)
        torch.testing.assert_close(ours(y, memory, real[:, None, None, :]), expected)
        torch.testing.assert_close(ours(y, memory), theirs(y, memory, tgt_mask=causal))


def test_dropout_reaches_every_sublayer():
    layer = DecoderLayer(8, 2, dropout=0.25)
    assert [layer.self_attn.dropout.p, layer.cross_attn.dropout.p, layer.mlp.dropout.p] == [0.25] * 3
    layer = EncoderLayer(8, 2, dropout=0.25)
    assert [layer.self_attn.dropout.p, layer.mlp.dropout.p] == [0.25] * 2
    encoder = Encoder(11, 6, n_layers=3, n_heads=2, d_model=8, dropout=0.125)
    assert len(encoder.layers) == 3 and all(layer.mlp.dropout.p == 0.125 for layer in encoder.layers)
    assert encoder.embed.token.weight.shape == (11, 8) and encoder.ln_f.d_model == 8
    assert [layer.self_attn.n_heads for layer in encoder.layers] == [2, 2, 2]
    model = EncoderDecoder(Seq2SeqConfig(13, 11, context_length=6, n_layers=3, n_heads=4, d_model=8,
                                         dropout=0.125))
    assert len(model.decoder) == 3 and len(model.encoder.layers) == 3
    assert all(layer.cross_attn.dropout.p == 0.125 and layer.cross_attn.n_heads == 4 for layer in model.decoder)
    assert model.encoder.layers[0].mlp.dropout.p == 0.125 and model.encoder.layers[0].self_attn.n_heads == 4
    assert model.head.weight.shape == (11, 8) and model.target_embed.token.weight.shape == (11, 8)
    assert model.encoder.embed.token.weight.shape == (13, 8) and model.encoder.embed.position.weight.shape[0] == 6
    assert model.target_embed.position.weight.shape[0] == 6


def test_encoder_is_embed_layers_and_final_norm():
    torch.manual_seed(0)
    encoder = Encoder(11, 6, n_layers=2, n_heads=2, d_model=8).eval()
    _randomise(encoder, 5)
    source = torch.tensor([[3, 4, 5, 0], [6, 7, 8, 9]])
    real = source != 0
    with torch.no_grad():
        x = encoder.embed(source)
        for layer in encoder.layers:
            x = layer(x, real[:, None, None, :])
        torch.testing.assert_close(encoder(source, real), encoder.ln_f(x))


def test_encoder_decoder_forward_by_hand_and_its_cross_attention_weights():
    torch.manual_seed(0)
    model = EncoderDecoder(Seq2SeqConfig(13, 11, context_length=6, n_layers=2, n_heads=2, d_model=8,
                                         pad_id=4, bos_id=1, eos_id=2)).eval()
    _randomise(model, 6)
    source = torch.tensor([[3, 5, 6, 4], [6, 7, 8, 9]])
    target_in = torch.tensor([[1, 5, 6], [1, 7, 3]])
    with torch.no_grad():
        memory = model.encoder(source, source != 4)
        y = model.target_embed(target_in)
        for layer in model.decoder:
            y = layer(y, memory, (source != 4)[:, None, None, :])
        expected = model.head(model.ln_f(y))
        torch.testing.assert_close(model(source, target_in), expected)
        weights = model.cross_attention_weights()
        assert weights.shape == (2, 2, 2, 3, 4)
        assert torch.equal(weights[:, 0, :, :, 3], torch.zeros(2, 2, 3))  # the padding (id 4) gets none
        assert torch.equal(weights[1], model.decoder[1].cross_attn.last_weights)
        encoded, mask = model.encode(source)
        torch.testing.assert_close(encoded, memory)
        assert torch.equal(mask, source != 4) and torch.equal(model.source_mask(source), source != 4)


def test_config_defaults():
    c = Seq2SeqConfig(13, 11)
    assert (c.context_length, c.n_layers, c.n_heads, c.d_model, c.dropout) == (32, 2, 4, 64, 0.0)
    assert (c.pad_id, c.bos_id, c.eos_id) == (0, 1, 2)


@pytest.mark.parametrize("name", ["source_vocab_size", "target_vocab_size", "context_length", "n_layers",
                                  "n_heads", "d_model"])
def test_config_names_the_setting_that_is_not_positive(name):
    with pytest.raises(ValueError) as excinfo:
        Seq2SeqConfig(**{**dict(source_vocab_size=13, target_vocab_size=11), name: 0})
    assert _message(excinfo).startswith(f"{name} ") and "XX" not in _message(excinfo)


def test_config_special_ids_against_both_vocabularies():
    with pytest.raises(ValueError) as excinfo:
        Seq2SeqConfig(5, 11, pad_id=5, bos_id=1, eos_id=2)
    assert _message(excinfo) == "pad_id is 5, outside source_vocab_size 5: the source is padded with it too"
    assert Seq2SeqConfig(5, 11, pad_id=4, bos_id=1, eos_id=2).pad_id == 4
    with pytest.raises(ValueError) as excinfo:
        Seq2SeqConfig(13, 11, pad_id=0, bos_id=11, eos_id=2)
    assert _message(excinfo) == "bos_id is 11, outside target_vocab_size 11: expected an id in [0, 10]"
    with pytest.raises(ValueError) as excinfo:
        Encoder(11, 6, n_layers=0, n_heads=2, d_model=8)
    assert _message(excinfo).startswith("n_layers ") and "XX" not in _message(excinfo)


def test_check_source_mask_messages():
    source = torch.tensor([[3, 4], [5, 6]])
    with pytest.raises(TypeError) as excinfo:
        check_source_mask(torch.ones(2, 2, dtype=torch.long), source)
    assert _message(excinfo) == "source_mask is torch.int64, expected a torch.bool tensor (True = real token)"
    with pytest.raises(TypeError) as excinfo:
        check_source_mask([[True, True]], source)
    assert _message(excinfo) == "source_mask is list, expected a torch.bool tensor (True = real token)"
    with pytest.raises(ValueError) as excinfo:
        check_source_mask(torch.ones(2, 3, dtype=torch.bool), source)
    assert _message(excinfo) == "source_mask has shape (2, 3), expected (2, 2), the (B, M) shape of the source ids"
    with pytest.raises(ValueError) as excinfo:
        check_source_mask(torch.tensor([[False, False], [True, False], [False, False]]), torch.ones(3, 2))
    assert _message(excinfo) == ("source rows [0, 2] are empty sentences (every token is padding), expected "
                                 "at least one real token in each")
    check_source_mask(torch.tensor([[False, True], [True, False]]), source)  # one real token a row is enough


def tiny_model(**changes) -> EncoderDecoder:
    torch.manual_seed(0)
    settings = dict(source_vocab_size=13, target_vocab_size=11, context_length=8, n_layers=1, n_heads=2, d_model=8)
    return EncoderDecoder(Seq2SeqConfig(**{**settings, **changes})).eval()


def test_encode_and_decode_messages():
    model = tiny_model()
    memory = torch.zeros(2, 3, 8)
    mask = torch.ones(2, 3, dtype=torch.bool)
    for source, got in [(torch.tensor([3, 4]), "(2,)"), (torch.zeros(2, 0, dtype=torch.long), "(2, 0)"),
                        ([[3, 4]], "list")]:
        with pytest.raises(ValueError) as excinfo:
            model.encode(source)
        assert _message(excinfo) == f"source has shape {got}, expected (B, M) ids with M >= 1"
    for target_in, got in [(torch.tensor([1, 4]), "(2,)"), (torch.zeros(2, 0, dtype=torch.long), "(2, 0)"),
                           ([[1, 4]], "list")]:
        with pytest.raises(ValueError) as excinfo:
            model.decode(target_in, memory, mask)
        assert _message(excinfo) == f"target_in has shape {got}, expected (B, N) ids with N >= 1"
    with pytest.raises(ValueError) as excinfo:
        model.decode(torch.ones(3, 2, dtype=torch.long), memory, mask)
    assert _message(excinfo) == ("target_in has 3 sentences and the source 2: the batch sizes must match "
                                 "(one target per source)")
    with pytest.raises(ValueError) as excinfo:
        model.decode(torch.tensor([[1, 11], [1, 3]]), memory, mask)
    assert "target_in" in _message(excinfo) and "XX" not in _message(excinfo)
    with pytest.raises(ValueError) as excinfo:
        model.encode(torch.tensor([[3, 13]]))
    assert "source" in _message(excinfo) and "XX" not in _message(excinfo)
    assert model.decode(torch.ones(2, 1, dtype=torch.long), memory, mask).shape == (2, 1, 11)  # N = 1 works
    assert model.encode(torch.tensor([[3]]))[0].shape == (1, 1, 8)  # M = 1 works


def test_decoding_messages():
    model = tiny_model()
    source = torch.tensor([3, 4, 5])
    with pytest.raises(ValueError) as excinfo:
        greedy_decode(model, source[None], 9)
    assert _message(excinfo) == ("max_length is 9, past the model's context_length 8: expected at most 8 "
                                 "(the decoder has no position beyond it)")
    with pytest.raises(ValueError) as excinfo:
        greedy_decode(model, source[None], 0)
    assert _message(excinfo).startswith("max_length ") and "XX" not in _message(excinfo)
    for bad, got in [(torch.tensor([[3, 4]]), "(1, 2)"), (torch.zeros(0, dtype=torch.long), "(0,)"), ([3], "list")]:
        with pytest.raises(ValueError) as excinfo:
            beam_search(model, bad, beam_width=2, max_length=3)
        assert _message(excinfo) == f"source has shape {got}, expected one sentence: a 1-D tensor of ids, not empty"
    for bad, got in [(torch.tensor([[3, 4]]), "(1, 2)"), (torch.zeros(0, dtype=torch.long), "(0,)"), ([3], "list")]:
        with pytest.raises(ValueError) as excinfo:
            sequence_log_prob(model, source, bad)
        assert _message(excinfo) == f"output has shape {got}, expected a non-empty 1-D tensor of target ids"
    with pytest.raises(ValueError) as excinfo:
        sequence_log_prob(model, source, torch.tensor([3, 11]))
    assert "output" in _message(excinfo) and "XX" not in _message(excinfo)
    with pytest.raises(ValueError) as excinfo:
        beam_search(model, source, beam_width=12, max_length=3)
    assert _message(excinfo) == ("beam_width is 12, expected at most the target vocabulary size 11: a step "
                                 "cannot keep more prefixes than it has tokens")
    with pytest.raises(ValueError) as excinfo:
        beam_search(model, source, beam_width=0, max_length=3)
    assert _message(excinfo).startswith("beam_width ") and "XX" not in _message(excinfo)
    assert beam_search(model, source, beam_width=11, max_length=1)[0].shape == (1,)  # width V works
    with pytest.raises(ValueError) as excinfo:
        exhaustive_search(model, source, max_length=6)
    assert _message(excinfo) == ("max_length 6 with 11 target words means 9^6 outputs: expected at most "
                                 "100,000 (exhaustive search is for tiny test vocabularies)")
    tiny = tiny_model(target_vocab_size=12)
    with pytest.raises(ValueError, match="10\\^6 outputs"):
        exhaustive_search(tiny, source, max_length=6)
    ok = tiny_model(target_vocab_size=12, context_length=5)
    assert exhaustive_search(ok, source, max_length=1)[0].shape == (1,)


def test_exhaustive_search_bound_is_exactly_one_hundred_thousand():
    class Config:
        target_vocab_size, context_length, pad_id, bos_id, eos_id = 12, 8, 0, 1, 2

    class Fake:
        config = Config()

    with pytest.raises(ValueError, match="10\\^6 outputs"):
        exhaustive_search(Fake(), torch.tensor([3]), max_length=6)
    with pytest.raises(AttributeError):  # 10^5 passes the bound and goes on to the (absent) model
        exhaustive_search(Fake(), torch.tensor([3]), max_length=5)
    Config.target_vocab_size = 100_003  # one output too many, with max_length 1
    with pytest.raises(ValueError, match="100001\\^1 outputs"):
        exhaustive_search(Fake(), torch.tensor([3]), max_length=1)
    Config.target_vocab_size = 100_002
    with pytest.raises(AttributeError):
        exhaustive_search(Fake(), torch.tensor([3]), max_length=1)


def test_exhaustive_search_up_to_the_context_length_and_on_int32_ids():
    model = Table(vocab=4, seed=2, context_length=3, eos_boost=0.3)
    ids, score = exhaustive_search(model, torch.tensor([3]), max_length=3)  # never a 4th token
    expected_ids, expected_score = _best_by_brute_force(model, 3)
    assert ids.tolist() == expected_ids and ids.dtype == torch.long
    real = tiny_model(target_vocab_size=5)
    source = torch.tensor([3, 4, 5])
    ids32, score32 = exhaustive_search(real, source.int(), max_length=2)
    ids64, score64 = exhaustive_search(real, source, max_length=2)
    assert torch.equal(ids32, ids64) and ids32.dtype == torch.long and score32 == pytest.approx(score64)


class Table(nn.Module):
    """encode/decode like EncoderDecoder; the next-token logits are a fixed random table of the prefix."""

    def __init__(self, vocab: int = 6, seed: int = 0, context_length: int = 8, pad_id: int = 0, bos_id: int = 1,
                 eos_id: int = 2, eos_boost: float = 0.0):
        super().__init__()
        self.config = Seq2SeqConfig(13, vocab, context_length=context_length, n_layers=1, n_heads=1, d_model=4,
                                    pad_id=pad_id, bos_id=bos_id, eos_id=eos_id)
        self.seed, self.vocab, self.eos_boost = seed, vocab, eos_boost
        self.calls: list[list[list[int]]] = []

    def logits(self, prefix: tuple[int, ...]) -> torch.Tensor:
        key = self.seed * 1_000_003 + sum((t + 1) * 31 ** i for i, t in enumerate(prefix))
        out = torch.randn(self.vocab, generator=torch.Generator().manual_seed(key)) * 2
        out[self.config.eos_id] += self.eos_boost * len(prefix)
        return out

    def encode(self, source, source_mask=None):
        return torch.zeros(source.shape[0], source.shape[1], 4), source != self.config.pad_id

    def decode(self, target_in, memory, mask):
        assert memory.shape[0] == mask.shape[0] == target_in.shape[0]
        self.calls.append(target_in.tolist())
        rows = [[self.logits(tuple(row[:j + 1])) for j in range(len(row))] for row in target_in.tolist()]
        return torch.stack([torch.stack(r) for r in rows])


def _log_prob(model: Table, output: list[int]) -> float:
    prefix, total = [model.config.bos_id], 0.0
    for token in output:
        total += model.logits(tuple(prefix)).log_softmax(-1)[token].item()
        prefix.append(token)
    return total


def _allowed(model: Table) -> list[int]:
    c = model.config
    return [i for i in range(model.vocab) if i not in (c.pad_id, c.bos_id)]


def _best_by_brute_force(model: Table, max_length: int) -> tuple[list[int], float]:
    c = model.config
    best = None
    for length in range(1, max_length + 1):
        for seq in itertools.product(_allowed(model), repeat=length):
            if c.eos_id in seq[:-1] or (length < max_length and seq[-1] != c.eos_id):
                continue
            score = _log_prob(model, list(seq))
            if best is None or score > best[1]:
                best = (list(seq), score)
    return best


def _beam_by_hand(model: Table, width: int, max_length: int) -> tuple[list[int], float]:
    c = model.config
    beams, finished = [([c.bos_id], 0.0)], []
    for step in range(max_length):
        children = []
        for prefix, score in beams:
            log_p = model.logits(tuple(prefix)).log_softmax(-1)
            children += [(prefix + [t], score + log_p[t].item()) for t in _allowed(model)]
        children = sorted(children, key=lambda ch: -ch[1])[:width]
        ends = [ch for ch in children if ch[0][-1] == c.eos_id or step == max_length - 1]
        finished += [(ch[0][1:], ch[1]) for ch in ends]
        beams = [ch for ch in children if not (ch[0][-1] == c.eos_id or step == max_length - 1)]
        if not beams or (finished and max(s for _, s in beams) <= max(s for _, s in finished)):
            break
    return max(finished, key=lambda f: f[1])


@pytest.mark.parametrize("seed", range(6))
def test_beam_search_on_a_table_matches_beam_search_by_hand(seed):
    model = Table(vocab=6, seed=seed, eos_boost=0.8)
    source = torch.tensor([3, 4])
    for width, max_length in [(1, 4), (2, 4), (3, 3), (6, 3)]:
        ids, score = beam_search(model, source, beam_width=width, max_length=max_length)
        expected_ids, expected_score = _beam_by_hand(model, width, max_length)
        assert ids.tolist() == expected_ids
        assert score == pytest.approx(expected_score, abs=1e-5)
        assert score == pytest.approx(_log_prob(model, expected_ids), abs=1e-5)


@pytest.mark.parametrize("seed", range(4))
def test_exhaustive_search_and_sequence_log_prob_on_a_table(seed):
    model = Table(vocab=5, seed=seed, eos_boost=0.5)
    source = torch.tensor([3, 4])
    ids, score = exhaustive_search(model, source, max_length=3)
    expected_ids, expected_score = _best_by_brute_force(model, 3)
    assert ids.tolist() == expected_ids and score == pytest.approx(expected_score, abs=1e-5)
    for output in ([3], [4, 2], [3, 3, 4], [2, 4]):
        assert sequence_log_prob(model, source, torch.tensor(output)) == pytest.approx(_log_prob(model, output), abs=1e-5)
    # width V keeps every prefix: beam search is exhaustive then
    beam_ids, beam_score = beam_search(model, source, beam_width=5, max_length=3)
    assert beam_ids.tolist() == expected_ids and beam_score == pytest.approx(expected_score, abs=1e-5)


def test_the_special_ids_are_never_emitted_and_the_prefix_starts_with_bos():
    class Forbidden(Table):
        def logits(self, prefix):  # the forbidden tokens the likeliest everywhere
            return super().logits(prefix).index_fill(0, torch.tensor([5, 3]), 50.0)

    model = Forbidden(vocab=7, seed=1, pad_id=5, bos_id=3, eos_id=6)
    ids, score = beam_search(model, torch.tensor([4]), beam_width=3, max_length=3)
    assert not set(ids.tolist()) & {3, 5} and math.isfinite(score)
    assert all(row[0] == 3 for call in model.calls for row in call)
    out = greedy_decode(model, torch.tensor([[4, 4]]), max_length=3)
    assert not set(out.flatten().tolist()) & {3, 5} and out.shape == (1, 3)


def _greedy_by_hand(model: Table, rows: int, max_length: int) -> list[list[int]]:
    c = model.config
    out = []
    for _ in range(rows):
        prefix, row = [c.bos_id], []
        for _ in range(max_length):
            logits = model.logits(tuple(prefix)).clone()
            logits[[c.pad_id, c.bos_id]] = float("-inf")
            token = int(logits.argmax())
            row.append(token)
            prefix.append(token)
            if token == c.eos_id:
                break
        out.append(row)
    length = max(len(r) for r in out)
    return [r + [c.pad_id] * (length - len(r)) for r in out]


@pytest.mark.parametrize("seed", range(8))
def test_greedy_decode_on_a_table(seed):
    model = Table(vocab=6, seed=seed, eos_boost=0.7, pad_id=4, bos_id=1, eos_id=2)
    source = torch.tensor([[3, 5], [6, 7]])
    out = greedy_decode(model, source, max_length=7)
    expected = _greedy_by_hand(model, 1, 7)[0]
    assert out[0].tolist()[:len(expected)] == expected and out[1].tolist() == out[0].tolist()
    assert out.shape[1] == len(expected)  # it stops as soon as every row has ended (or at max_length)


def test_greedy_decode_pads_a_finished_row_while_another_goes_on():
    class TwoRows(Table):
        def decode(self, target_in, memory, mask):
            logits = super().decode(target_in, memory, mask)
            logits[0, -1, self.config.eos_id] = 100.0 if target_in.shape[1] == 2 else -100.0
            logits[1, -1, self.config.eos_id] = 100.0 if target_in.shape[1] == 4 else -100.0
            return logits

    model = TwoRows(vocab=6, seed=0, pad_id=4)
    out = greedy_decode(model, torch.tensor([[3], [3]]), max_length=6)
    assert out.shape == (2, 4) and out[0, 1] == 2 and out[0, 2:].tolist() == [4, 4] and out[1, 3] == 2
    assert not (out[1, :3] == 2).any() and not (out[1] == 4).any()
    assert all(row[0] == 1 for call in model.calls for row in call)


class Seen(Exception):
    pass


class Probe(Table):
    """Records the device and dtype of the first target ids decode receives, then stops."""

    def __init__(self):
        super().__init__(vocab=6)
        self.seen = []

    def encode(self, source, source_mask=None):
        return torch.zeros(source.shape[0], source.shape[1], 4, device=source.device), source != 0

    def decode(self, target_in, memory, mask):
        self.seen.append((target_in.device.type, target_in.dtype, target_in.tolist() if target_in.device.type == "cpu" else None))
        raise Seen


@pytest.mark.parametrize("run", [
    lambda model, source: greedy_decode(model, source[None], 3),
    lambda model, source: beam_search(model, source, beam_width=2, max_length=3),
])
def test_the_first_target_ids_are_made_on_the_sources_device(run):
    model = Probe()
    with pytest.raises(Seen):
        run(model, torch.tensor([3, 4], device="meta"))
    assert model.seen == [("meta", torch.long, None)]
    model = Probe()
    with pytest.raises(Seen):
        run(model, torch.tensor([3, 4]))
    assert model.seen[0][2][0][0] == 1  # <bos> first


def test_never_emitted_works_on_the_log_probs_device():
    from helpers.families.seq2seq import _never_emitted

    model = Table(vocab=6, pad_id=4, bos_id=1, eos_id=2)
    out = _never_emitted(model, torch.zeros(2, 3, 6, device="meta"))
    assert out.device.type == "meta" and out.shape == (2, 3, 6)
    out = _never_emitted(model, torch.zeros(2, 6))
    assert out[:, [1, 4]].eq(float("-inf")).all() and out[:, [0, 2, 3, 5]].eq(0).all()
    out = _never_emitted(model, torch.zeros(2, 3, 6))  # (B, N, V): the last dimension
    assert out[..., [1, 4]].eq(float("-inf")).all() and out[..., [0, 2, 3, 5]].eq(0).all()


def test_beam_scores_live_on_the_sources_device():
    class MetaLogits(Table):
        def encode(self, source, source_mask=None):
            return torch.zeros(1, source.shape[-1], 4, device="meta"), torch.ones(1, source.shape[-1], dtype=torch.bool, device="meta")

        def decode(self, target_in, memory, mask):
            return torch.zeros(target_in.shape[0], target_in.shape[1], self.vocab, device="meta")

    # it gets past the scores' sum (a CPU score would raise there) to the first step meta cannot do:
    # dropping the -inf children needs their count
    with pytest.raises(NotImplementedError):
        beam_search(MetaLogits(vocab=6), torch.tensor([3, 4], device="meta"), beam_width=2, max_length=3)


def test_exhaustive_search_keeps_the_first_of_equally_likely_outputs():
    class Uniform(Table):
        def logits(self, prefix):
            return torch.zeros(self.vocab)

    model = Uniform(vocab=6, pad_id=0, bos_id=1, eos_id=2)
    ids, score = exhaustive_search(model, torch.tensor([3]), max_length=1)
    assert ids.tolist() == [2] and score == pytest.approx(-math.log(6))  # 2, 3, 4, 5 tie: the first is kept
    ids, score = exhaustive_search(model, torch.tensor([3]), max_length=2)
    assert ids.tolist() == [2]  # the one-token output is likelier than any two-token one


def test_beam_search_keeps_the_first_finished_output_on_a_tie():
    class Uniform(Table):
        def logits(self, prefix):
            return torch.zeros(self.vocab)

    model = Uniform(vocab=6, pad_id=0, bos_id=1, eos_id=2)
    ids, score = beam_search(model, torch.tensor([3]), beam_width=3, max_length=1)
    # every child ties; the children come in topk's order, and the first one finished is kept
    total = torch.full((6,), -math.log(6)).index_fill(0, torch.tensor([0, 1]), float("-inf"))
    first = total.topk(3).indices[0].item()
    assert ids.tolist() == [first] and score == pytest.approx(-math.log(6))
    assert first != max(total.topk(3).indices.tolist())  # the tie is not broken by the largest id


def small_seq2seq(**changes) -> EncoderDecoder:
    torch.manual_seed(0)
    settings = dict(source_vocab_size=13, target_vocab_size=11, context_length=8, n_layers=1,
                    n_heads=2, d_model=8)
    return EncoderDecoder(Seq2SeqConfig(**{**settings, **changes})).eval()


def test_special_ids_outside_the_vocabulary():
    with pytest.raises(ValueError, match="eos_id is 11, outside target_vocab_size 11"):
        Seq2SeqConfig(13, 11, eos_id=11)
    with pytest.raises(ValueError, match="pad_id is 5, outside source_vocab_size 5"):
        GRUSeq2Seq(5, 11, hidden=4, pad_id=5, bos_id=1, eos_id=2)


@pytest.mark.parametrize("max_length, match", [(0, "max_length"), (9, "past the model's context_length 8"),
                                               (-3, "max_length")])
def test_decoders_refuse_a_max_length_past_the_context_or_zero(max_length, match):
    model = small_seq2seq()
    source = torch.tensor([[3, 4, 5]])
    with pytest.raises(ValueError, match=match):
        greedy_decode(model, source, max_length)
    with pytest.raises(ValueError, match=match):
        beam_search(model, source[0], beam_width=2, max_length=max_length)
    with pytest.raises(ValueError, match="max_length"):
        gru_greedy_decode(GRUSeq2Seq(13, 11, hidden=4), source, 0)
    assert greedy_decode(model, source, 8).shape[1] <= 8  # the context's own length still works


def test_sequence_log_prob_and_exhaustive_search_refuse_bad_outputs():
    model = small_seq2seq()
    source = torch.tensor([3, 4, 5])
    with pytest.raises(ValueError, match="past the model's context_length"):
        sequence_log_prob(model, source, torch.full((9,), 3))
    with pytest.raises(ValueError, match="output contains the id 11"):
        sequence_log_prob(model, source, torch.tensor([3, 11]))
    with pytest.raises(ValueError, match="non-empty 1-D"):
        sequence_log_prob(model, source, torch.tensor([], dtype=torch.long))
    with pytest.raises(ValueError, match="exhaustive search is for tiny"):
        exhaustive_search(model, source, max_length=8)


class ScriptedDecoder:
    """A stand-in encoder-decoder whose next-token probabilities depend on the prefix only.

    Tokens: 0 <pad>, 1 <bos>, 2 <eos>, 3 "A", 4 "B". After <bos>: A 0.6, B 0.4. After <bos> A:
    <eos> 0.30, A 0.36, B 0.34. After <bos> B: <eos> 0.95. Any longer prefix: <eos> 0.99.
    Greedy takes A, then A, then <eos>: 0.6 x 0.36 x 0.99 = 0.214. The best sequence, B <eos>,
    has 0.4 x 0.95 = 0.38, and only a search that keeps the second choice of step 1 finds it.
    """

    config = type("Config", (), {"target_vocab_size": 5, "pad_id": 0, "bos_id": 1, "eos_id": 2,
                                 "context_length": 16})()
    TABLE = {(1,): [0, 0, 0, 0.6, 0.4], (1, 3): [0, 0, 0.30, 0.36, 0.34], (1, 4): [0, 0, 0.95, 0.025, 0.025]}

    def encode(self, source: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.zeros(1, len(source), 4), torch.ones(1, len(source), dtype=torch.bool)

    def decode(self, prefixes: torch.Tensor, memory: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        rows = [self.TABLE.get(tuple(p), [0, 0, 0.99, 0.005, 0.005]) for p in prefixes.tolist()]
        probs = torch.tensor(rows, dtype=torch.float64).clamp_min(1e-12)
        return probs.log()[:, None, :].expand(-1, prefixes.shape[1], -1)  # (k, t, V) logits


def test_beam_search_finds_the_sequence_greedy_misses_over_several_steps():
    from helpers.families.seq2seq import beam_search

    model, source = ScriptedDecoder(), torch.tensor([5, 6, 7])
    greedy, greedy_logp = beam_search(model, source, beam_width=1, max_length=5)
    beam, beam_logp = beam_search(model, source, beam_width=2, max_length=5)
    assert greedy.tolist() == [3, 3, 2] and abs(greedy_logp - math.log(0.6 * 0.36 * 0.99)) < 1e-9
    assert beam.tolist() == [4, 2] and abs(beam_logp - math.log(0.4 * 0.95)) < 1e-9
