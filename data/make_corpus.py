"""Regenerate the course corpora: python data/make_corpus.py

Both corpora come from seeded grammars (helpers/text/corpus.py, the small one; helpers/text/corpus_rich.py,
the rich one), so this script always writes the same bytes; tests/text/test_corpus.py and
tests/text/test_corpus_rich.py check that the committed files match.
"""

from pathlib import Path

from helpers.text.corpus import CORPUS_FILE, generate_corpus
from helpers.text.corpus_rich import RICH_CORPUS_FILE, generate_rich_corpus

if __name__ == "__main__":
    folder = Path(__file__).resolve().parent
    for name, make in ((CORPUS_FILE, generate_corpus), (RICH_CORPUS_FILE, generate_rich_corpus)):
        text = make()
        (folder / name).write_text(text, encoding="utf-8", newline="\n")
        print(f"wrote {len(text.encode('utf-8')):,} bytes to {name}")
