"""GPT-2's tokenizer files in the course BPE: files written from a byte-level BPE trained by
Hugging Face `tokenizers` (no download), loaded, and every id compared with HF's encoder."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizer_cases import ASSIGNED

from helpers.text.corpus import TOY_SOUP
from helpers.text.gpt2_tokenizer import GPT2Tokenizer, bytes_to_unicode, read_merges

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
