"""Regenerate the course corpus: python data/make_corpus.py

The corpus is produced by a seeded grammar (helpers/corpus.py), so this script always writes the
same bytes; tests/test_corpus.py checks that the committed file matches.
"""

from pathlib import Path

from helpers.corpus import CORPUS_FILE, generate_corpus

if __name__ == "__main__":
    path = Path(__file__).resolve().parent / CORPUS_FILE
    text = generate_corpus()
    path.write_text(text, encoding="utf-8", newline="\n")
    print(f"wrote {len(text.encode('utf-8')):,} bytes to {path.name}")
