"""Speed budgets of the from-scratch byte-level BPE (helpers.bpe), on the 1 MB course corpus.

    python benchmarks/bench_tokenizer.py              # the budgets, plus the Rust `tokenizers` library for scale
    python benchmarks/bench_tokenizer.py --textbook   # also the textbook loop, on a tenth of the corpus

Budgets: training 256 merges in at most 1 s, encoding at 1 MB/s or better, and encoding 100,000
letters with no space (a single chunk, merged with a heap) in at most 1 s. Prints each figure and exits
with status 1 when a budget is missed. Each time is the best of a few runs.
"""

from __future__ import annotations

import argparse
import sys
import time

from helpers.bpe import BPETokenizer, learn_merges, textbook_merges
from helpers.corpus import load_corpus
from helpers.timing import best_time, format_duration

N_MERGES = 256
TRAIN_BUDGET_SECONDS = 1.0
ENCODE_BUDGET_MB_PER_SECOND = 1.0
TEXTBOOK_CHARACTERS = 100_000  # the textbook loop takes minutes on the whole corpus
LONG_CHUNK_CHARACTERS = 100_000
LONG_CHUNK_BUDGET_SECONDS = 1.0


def rust_library_seconds(text: str) -> float | None:
    """Training time of the Hugging Face `tokenizers` byte-level BPE, or None if it is missing."""
    try:
        from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    except ImportError:
        return None

    def train() -> None:
        tokenizer = Tokenizer(models.BPE())
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        trainer = trainers.BpeTrainer(vocab_size=256 + N_MERGES, show_progress=False,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        tokenizer.train_from_iterator([text], trainer)

    return best_time(train, repeats=3)


def report(name: str, value: str, ok: bool | None = None) -> None:
    verdict = "" if ok is None else ("  ok" if ok else "  MISSED")
    print(f"{name:48} {value}{verdict}")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--textbook", action="store_true",
                        help="also time the textbook loop on the first 100 kB (slow: tens of seconds)")
    args = parser.parse_args(argv)

    corpus = load_corpus()
    megabytes = len(corpus.encode("utf-8")) / 1e6
    print(f"corpus: {megabytes:.2f} MB; best of 5 runs unless noted")

    train_seconds = best_time(lambda: BPETokenizer.train(corpus, vocab_size=256 + N_MERGES))
    train_ok = train_seconds <= TRAIN_BUDGET_SECONDS
    report(f"train {N_MERGES} merges (budget {TRAIN_BUDGET_SECONDS:g} s)", format_duration(train_seconds), train_ok)

    merges = BPETokenizer.train(corpus, vocab_size=256 + N_MERGES).merges
    # A fresh tokenizer each run, so that the chunk cache starts empty, as for a new text.
    encode_seconds = best_time(lambda: BPETokenizer(merges).encode(corpus))
    speed = megabytes / encode_seconds
    encode_ok = speed >= ENCODE_BUDGET_MB_PER_SECOND
    report(f"encode the corpus (budget {ENCODE_BUDGET_MB_PER_SECOND:g} MB/s)",
           f"{speed:.1f} MB/s ({format_duration(encode_seconds)})", encode_ok)

    letters = "".join(char for char in corpus if char.isalpha())[:LONG_CHUNK_CHARACTERS]  # one chunk
    long_seconds = best_time(lambda: BPETokenizer(merges).encode(letters))
    long_ok = long_seconds <= LONG_CHUNK_BUDGET_SECONDS
    report(f"encode {len(letters):,} letters, no space (budget {LONG_CHUNK_BUDGET_SECONDS:g} s)",
           format_duration(long_seconds), long_ok)

    tokenizer = BPETokenizer(merges)
    ids = tokenizer.encode(corpus)
    decode_seconds = best_time(lambda: tokenizer.decode(ids))
    report("decode the corpus", f"{megabytes / decode_seconds:.1f} MB/s ({format_duration(decode_seconds)})")

    rust_seconds = rust_library_seconds(corpus)
    if rust_seconds is not None:
        report(f"Rust `tokenizers` BPE, {N_MERGES} merges (best of 3)", format_duration(rust_seconds))

    if args.textbook:
        tenth = corpus[:TEXTBOOK_CHARACTERS]
        started = time.perf_counter()
        slow = textbook_merges(tenth, N_MERGES)
        report(f"textbook loop, {N_MERGES} merges on 0.1 MB (one run)", format_duration(time.perf_counter() - started))
        fast_seconds = best_time(lambda: learn_merges(tenth, N_MERGES))
        report(f"learn_merges, {N_MERGES} merges on 0.1 MB", format_duration(fast_seconds))
        if slow != learn_merges(tenth, N_MERGES):
            print("ERROR: the textbook loop learned different merges", file=sys.stderr)
            return 1

    return 0 if train_ok and encode_ok and long_ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
