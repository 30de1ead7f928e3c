"""helpers.text.gpt2_tokenizer on a vocabulary built by hand (no Hugging Face files): GPT-2's byte
table at its edges, ids relabelled in an order of their own, decode's checks of ids (NumPy and
torch integers taken, bools refused, as BPETokenizer.decode), the file readers' messages in full.
Written for the mutation run (benchmarks/mutation.py, issue 30)."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch

from helpers.text.gpt2_tokenizer import GPT2Tokenizer, bytes_to_unicode, read_merges, read_vocab

EOT = "<|endoftext|>"
MERGES = [("a", "b"), ("ab", "c"), ("Ġ", "t")]


def hand_built(reverse: bool = False) -> tuple[dict[str, int], GPT2Tokenizer]:
    """The 256 bytes, three merges and <|endoftext|>; with reverse, every id counts down instead."""
    tokens = [*bytes_to_unicode().values(), *(left + right for left, right in MERGES), EOT]
    ids = range(len(tokens) - 1, -1, -1) if reverse else range(len(tokens))
    vocab = dict(zip(tokens, ids, strict=True))
    return vocab, GPT2Tokenizer(vocab, MERGES)


def test_bytes_to_unicode_at_its_edges():
    table = bytes_to_unicode()
    assert list(table) == list(range(256))  # in byte order
    assert table[0] == chr(256) and table[32] == "Ġ" == chr(288)  # 33 bytes 0..32 shifted first
    assert table[127] == chr(289) and table[160] == chr(322) and table[173] == chr(323)
    assert table[33] == "!" and table[126] == "~" and table[161] == "¡" and table[172] == "¬"
    assert table[174] == "®" and table[255] == "ÿ"


@pytest.mark.parametrize("reverse", [False, True])
def test_ids_are_relabelled_both_ways(reverse):
    vocab, tokenizer = hand_built(reverse)
    text = f"abc t{EOT}a"
    ours = tokenizer.bpe.encode(text)
    assert ours == [257, 258, 259, 97]
    assert tokenizer.encode(text) == [vocab["abc"], vocab["Ġt"], vocab[EOT], vocab["a"]]
    assert tokenizer.decode(tokenizer.encode(text)) == text
    assert tokenizer.special_tokens == {EOT: vocab[EOT]}
    assert tokenizer.vocab_size == 260 and len(tokenizer.to_gpt2) == 260
    assert all(tokenizer.from_gpt2[gpt2] == i for i, gpt2 in enumerate(tokenizer.to_gpt2))
    assert repr(tokenizer) == f"GPT2Tokenizer(vocab_size=260, merges=3, special_tokens=['{EOT}'])"


def test_decode_takes_numpy_and_torch_ids_like_bpe_decode():
    vocab, tokenizer = hand_built(reverse=True)
    ids = tokenizer.encode("abc t")
    assert tokenizer.decode(torch.tensor(ids)) == "abc t"  # a row of generate's output
    assert tokenizer.decode(np.array(ids)) == "abc t"
    assert tokenizer.decode([np.int64(vocab["a"])]) == "a"


def test_decode_refuses_bools_strings_and_unknown_ids_naming_them():
    _, tokenizer = hand_built()
    with pytest.raises(TypeError, match=r"^ids\[0\] is True of type bool, expected an integer id$"):
        tokenizer.decode([True])  # was read as id 1
    with pytest.raises(TypeError, match=r"^ids is 'ab' of type str, expected a list of integer ids$"):
        tokenizer.decode("ab")
    with pytest.raises(ValueError, match=r"^ids\[1\] is 260, expected an id in range\(0, 260\)"):
        tokenizer.decode([0, 260])
    with pytest.raises(ValueError, match=r"^ids\[0\] is -1, expected an id in range\(0, 260\)"):
        tokenizer.decode([-1])


def test_constructor_messages_in_full():
    vocab, _ = hand_built()
    message = "merge 1 is 'ab' + 'zz', but 'zz' is neither a byte nor made by an earlier merge"
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        GPT2Tokenizer(vocab, [("a", "b"), ("ab", "zz")])
    with pytest.raises(ValueError, match=re.escape("merge 1 makes 'ab', which an earlier merge made already: "
                                                   "each merge must add a new token")):
        GPT2Tokenizer(vocab, [("a", "b"), ("a", "b")])
    without = {token: i for i, token in enumerate(t for t in vocab if t != "Ġt")}
    with pytest.raises(ValueError, match=re.escape("the vocabulary has no id for ['Ġt'] (made by the bytes or the "
                                                   "merges): vocab.json and merges.txt do not belong together")):
        GPT2Tokenizer(without, MERGES)
    with pytest.raises(ValueError, match=re.escape("the vocabulary's 260 ids are not 0 .. 259, each once: "
                                                   "it is not a GPT-2 vocab.json")):
        GPT2Tokenizer({**vocab, EOT: 300}, MERGES)


def test_a_cut_short_merges_file_names_the_counts_and_the_tokens():
    vocab, _ = hand_built()
    message = ("merges.txt has 1 merges, but vocab.json has 2 tokens that only a merge makes and no merge "
               "does, such as ['abc', 'Ġt']: merges.txt is cut short (an interrupted download?), expected "
               "one merge for every such token")
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        GPT2Tokenizer(vocab, MERGES[:1])


def test_the_file_readers(tmp_path):
    merges = tmp_path / "merges.txt"
    merges.write_text("#version: 0.2\na b\n\nab c\nĠ t\n", encoding="utf-8")
    assert read_merges(merges) == MERGES
    merges.write_text("a b\nab  c\n", encoding="utf-8")
    with pytest.raises(ValueError, match=re.escape(f"{merges} line 2 is 'ab  c', expected two tokens separated "
                                                   "by one space, such as 'Ġ t'")):
        read_merges(merges)
    vocab_path = tmp_path / "vocab.json"
    vocab_path.write_text('{"a": 0, "b": "1"}', encoding="utf-8")
    with pytest.raises(ValueError, match=re.escape(f"{vocab_path} holds a dict, expected a JSON object")):
        read_vocab(vocab_path)
    vocab_path.write_text("{", encoding="utf-8")
    with pytest.raises(ValueError, match=re.escape(f"{vocab_path} is not a JSON vocabulary file: ")):
        read_vocab(vocab_path)
    vocab, tokenizer = hand_built(reverse=True)
    vocab_path.write_text(json.dumps(vocab), encoding="utf-8")
    merges.write_text("#version: 0.2\na b\nab c\nĠ t\n", encoding="utf-8")
    loaded = GPT2Tokenizer.from_files(vocab_path, merges)
    assert loaded.to_gpt2 == tokenizer.to_gpt2 and loaded.bpe == tokenizer.bpe


def test_the_readers_read_utf8_whatever_the_locale(monkeypatch, tmp_path):
    # On a machine whose locale encoding is a Windows code page, reading without encoding="utf-8"
    # would turn GPT-2's 'Ġ' (two bytes in UTF-8) into two characters.
    import io

    real = io.text_encoding
    monkeypatch.setattr(io, "text_encoding",
                        lambda encoding, stacklevel=2: "latin-1" if encoding is None else real(encoding))
    merges = tmp_path / "merges.txt"
    merges.write_text("Ġ t\n", encoding="utf-8")
    assert read_merges(merges) == [("Ġ", "t")]
    vocab_path = tmp_path / "vocab.json"
    vocab_path.write_text('{"Ġt": 0}', encoding="utf-8")
    assert read_vocab(vocab_path) == {"Ġt": 0}


def test_a_vocabulary_that_is_not_an_object_is_named_in_full(tmp_path):
    vocab_path = tmp_path / "vocab.json"
    vocab_path.write_text("[1, 2]", encoding="utf-8")
    message = f"{vocab_path} holds a list, expected a JSON object " + '{"token": id, ...} like GPT-2\'s vocab.json'
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        read_vocab(vocab_path)


def test_the_messages_name_three_tokens_of_many():
    vocab, _ = hand_built()
    merges = [*MERGES, ("c", "d"), ("e", "f"), ("g", "h")]  # three more tokens vocab lacks
    with pytest.raises(ValueError, match=re.escape("no id for ['cd', 'ef', 'gh'] (made")):
        GPT2Tokenizer(vocab, [*merges, ("i", "j")])
    tokens = [*bytes_to_unicode().values(), *(left + right for left, right in merges), EOT]
    full = {token: i for i, token in enumerate(tokens)}
    with pytest.raises(ValueError, match=re.escape("has 0 merges, but vocab.json has 5 tokens that only a "
                                                   "merge makes and no merge does, such as ['ab', 'Ġt', 'cd']:")):
        GPT2Tokenizer(full, [])  # 'abc' needs 'ab', which no merge makes here: not among them


def test_special_tokens_keep_the_vocabularys_id_order():
    tokens = [*bytes_to_unicode().values(), *(left + right for left, right in MERGES)]
    vocab = {token: i for i, token in enumerate(tokens)} | {"<|z|>": 259, "<|a|>": 260}
    tokenizer = GPT2Tokenizer(vocab, MERGES)
    assert list(tokenizer.special_tokens) == ["<|z|>", "<|a|>"]  # by id, not alphabetically
    assert tokenizer.encode("<|z|><|a|>") == [259, 260]
