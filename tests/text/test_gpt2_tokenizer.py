"""GPT-2's tokenizer files in the course BPE: files written from a byte-level BPE trained by
Hugging Face `tokenizers` (no download), loaded, and every id compared with HF's encoder."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from shared_tools import full
from tokenizer_cases import ASSIGNED

from helpers.text.corpus import TOY_SOUP
from helpers.text.gpt2_tokenizer import GPT2Tokenizer, bytes_to_unicode, read_merges, read_vocab

tokenizers = pytest.importorskip("tokenizers")

EOT = "<|endoftext|>"
TRAINING_TEXT = "\n".join([
    TOY_SOUP * 3,
    "The quick brown fox jumps over the lazy dog. It's 2024; we'll see 3.14159 and 1,000,000 apples!",
    "Grüße aus Köln — naïve café, smörgåsbord, jalapeño. Ελληνικά κείμενα. Русский текст тоже здесь.",
    "日本語のテキストと中文文本。한국어 텍스트. emoji: 🙂🙂🚀🚀 👩‍💻 ✓✓ ∑∫√ ¼½¾",
    "    indented code:\n\tdef f(x):\n\t\treturn x ** 2  # square\r\n\r\n",
] * 4)


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, object]:
    """A byte-level BPE trained by HF `tokenizers` with GPT-2's pre-tokenizer; its files written
    as GPT-2 publishes them (vocab.json, merges.txt). HF puts <|endoftext|> at id 0 here, so
    even the bytes have ids other than GPT-2's: nothing may assume an order."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    hf = Tokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=700, special_tokens=[EOT], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    hf.train_from_iterator([TRAINING_TEXT], trainer)
    folder = tmp_path_factory.mktemp("gpt2_files")
    hf.model.save(str(folder))
    return folder, hf


@pytest.fixture(scope="module")
def ours(trained) -> GPT2Tokenizer:
    folder, _ = trained
    return GPT2Tokenizer.from_files(folder / "vocab.json", folder / "merges.txt")


def test_bytes_to_unicode_is_gpt2s_table():
    table = bytes_to_unicode()
    assert sorted(table) == list(range(256)) and len(set(table.values())) == 256
    assert table[ord("!")] == "!" and table[ord(" ")] == "Ġ" and table[ord("\n")] == "Ċ"
    assert all(char.isprintable() and not char.isspace() for char in table.values())
    from tokenizers.pre_tokenizers import ByteLevel
    assert set(table.values()) == set(ByteLevel.alphabet())


def test_the_files_really_relabel_ids(trained, ours):
    folder, hf = trained
    vocab = json.loads((folder / "vocab.json").read_text(encoding="utf-8"))
    assert vocab[EOT] == 0 and ours.special_tokens == {EOT: 0}
    assert ours.vocab_size == len(vocab) == hf.get_vocab_size()
    assert len(ours.bpe.merges) == len(read_merges(folder / "merges.txt")) > 300
    assert ours.to_gpt2[:256] != list(range(256))  # GPT-2 order, not the byte values


def pieces_of_training_text() -> st.SearchStrategy[str]:
    words = sorted(set(TRAINING_TEXT.replace("\n", " ").split(" ")))
    piece = st.one_of(st.sampled_from(words), st.sampled_from([" ", "  ", "\n", "\t", EOT, "'s", "'ll"]),
                      st.text(ASSIGNED, max_size=6))
    return st.lists(piece, max_size=20).map("".join)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.one_of(st.text(ASSIGNED, max_size=60), pieces_of_training_text()))
def test_ids_equal_hugging_face_and_round_trip(trained, ours, text):
    _, hf = trained
    assert ours.encode(text) == hf.encode(text).ids
    assert ours.decode(ours.encode(text)) == text


def test_same_ids_from_the_older_file_names(trained, ours, tmp_path):
    folder, _ = trained
    shutil.copy(folder / "vocab.json", tmp_path / "encoder.json")
    merges = (folder / "merges.txt").read_text(encoding="utf-8")
    if not merges.startswith("#version"):
        merges = "#version: 0.2\n" + merges
    (tmp_path / "vocab.bpe").write_text(merges, encoding="utf-8")
    older = GPT2Tokenizer.from_files(tmp_path / "encoder.json", tmp_path / "vocab.bpe")
    assert older.to_gpt2 == ours.to_gpt2 and older.bpe == ours.bpe
    assert older.encode(TRAINING_TEXT) == ours.encode(TRAINING_TEXT)


def test_transformers_gpt2_tokenizer_agrees(trained, ours):
    transformers = pytest.importorskip("transformers")
    folder, _ = trained
    reference = transformers.GPT2Tokenizer.from_pretrained(str(folder))
    text = TRAINING_TEXT + EOT + " The end. 🙂"
    assert ours.encode(text) == reference.encode(text)
    assert ours.decode(ours.encode(text)) == reference.decode(reference.encode(text)) == text


# --- errors ----------------------------------------------------------------------------------

def test_mismatched_files_are_named(trained, tmp_path):
    folder, _ = trained
    vocab = json.loads((folder / "vocab.json").read_text(encoding="utf-8"))
    merges = read_merges(folder / "merges.txt")
    with pytest.raises(ValueError, match=r"merge 1 is .*neither a byte nor made by an earlier merge"):
        GPT2Tokenizer(vocab, [merges[0], ("zzz", "q")])
    with pytest.raises(ValueError, match="which an earlier merge made already"):
        GPT2Tokenizer(vocab, [merges[0], merges[0]])
    last = merges[-1][0] + merges[-1][1]
    with pytest.raises(ValueError, match="vocab.json and merges.txt do not belong together"):
        GPT2Tokenizer({t: i for i, t in enumerate(t for t in vocab if t != last)}, merges)
    with pytest.raises(ValueError, match="are not 0 .. "):
        GPT2Tokenizer({**vocab, "extra": 10**6}, merges)
    bad = tmp_path / "merges.txt"
    bad.write_text("#version: 0.2\nĠ t\nthree parts here\n", encoding="utf-8")
    with pytest.raises(ValueError, match="line 3 is 'three parts here', expected two tokens"):
        read_merges(bad)
    (tmp_path / "vocab.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="holds a list, expected a JSON object"):
        GPT2Tokenizer.from_files(tmp_path / "vocab.json", bad)


def test_decode_refuses_unknown_ids(ours):
    with pytest.raises(ValueError, match=rf"ids\[1\] is 100000, expected an id in range\(0, {ours.vocab_size}\)"):
        ours.decode([1, 100000])


# helpers.text.gpt2_tokenizer on a vocabulary built by hand (no Hugging Face files): GPT-2's byte
# table at its edges, ids relabelled in an order of their own, decode's checks of ids (NumPy and
# torch integers taken, bools refused, as BPETokenizer.decode), the file readers' messages in full.

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
    with pytest.raises(ValueError, match=full(message)):
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
    with pytest.raises(ValueError, match=full(message)):
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
    with pytest.raises(ValueError, match=full(message)):
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


def test_a_cut_short_merges_file_is_refused(tmp_path):
    from helpers.text.gpt2_tokenizer import GPT2Tokenizer, bytes_to_unicode
    chars = list(bytes_to_unicode().values())
    vocab = {c: i for i, c in enumerate(chars)}
    merges = [("a", "b"), ("ab", "c"), ("Ġ", "t")]
    for left, right in merges:
        vocab[left + right] = len(vocab)
    vocab["<|endoftext|>"] = len(vocab)
    assert GPT2Tokenizer(vocab, merges).vocab_size == len(vocab)  # whole: fine
    with pytest.raises(ValueError, match=r"merges.txt has 1 merges, but vocab.json has 2 tokens .*cut short"):
        GPT2Tokenizer(vocab, merges[:1])
