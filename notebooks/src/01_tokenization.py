# %% [markdown] slideshow={"slide_type": "slide"}
# # 1. Tokenization
#
# A Transformer never reads letters. It reads a list of integers, one per *token*, and all it
# learns, it learns about those integers. This notebook builds the part that turns text into
# integers and back, and asks what a good token is.
#
# **After this notebook you can**
# - weigh characters, words and subwords as tokens, with figures measured on the course corpus;
# - train a byte-level BPE tokenizer from scratch, follow its first merges, and use it to encode
#   and decode any Unicode text, special tokens included;
# - compare BPE, WordPiece and Unigram on the same words;
# - reason about vocabulary size: shorter sequences against a bigger embedding table.
#
# **It assumes** Python: lists, dicts, strings and `bytes`. No machine learning yet.

# %% [setup]

# %% slideshow={"slide_type": "fragment"}
import html
import math
import pathlib
import re
import tempfile
import time
from collections import Counter
from itertools import pairwise

import ipywidgets as widgets
import matplotlib.pyplot as plt
from IPython.display import HTML, display

from helpers.text.corpus import TOY_SOUP, load_corpus
from helpers.lab.exercises import check
from helpers.timing import format_duration
from helpers.lab.sections import catch_up

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 1. The smallest vocabulary: one id per word (core)
#
# The Matrix Magic notes tokenize three sentences by cutting them into words and
# punctuation marks, and list the distinct tokens as the *vocabulary*. A token's *id* is its
# position in that list. Let us do the same.

# %% slideshow={"slide_type": "fragment"}
def split_words(text: str) -> list[str]:
    """Words and punctuation marks, spaces dropped: "Soup is yummy." -> ["Soup", "is", "yummy",
    "."]."""
    return re.findall(r"\w+|[^\w\s]", text)


soup_words = split_words(TOY_SOUP)
vocabulary = list(dict.fromkeys(soup_words))  # distinct, in order of first appearance
print(TOY_SOUP)
print(f"{len(soup_words)} tokens, {len(vocabulary)} distinct: {vocabulary}")

# %% [markdown] slideshow={"slide_type": "subslide"}
# The notes list a vocabulary of 12 tokens. We find one more, and the cell below shows which:

# %% slideshow={"slide_type": "fragment"}
MATRIX_MAGIC_VOCABULARY = ["I", "like", "to", "eat", "soup", "am", "a", "good", "cook", "is",
                           "yummy", "."]
print(f"the Matrix Magic notes: {len(MATRIX_MAGIC_VOCABULARY)} tokens | our split: "
      f"{len(vocabulary)} tokens")
print("only in ours:", sorted(set(vocabulary) - set(MATRIX_MAGIC_VOCABULARY)))
lowercased = list(dict.fromkeys(word.lower() for word in soup_words))
print(f"after lower-casing every word: {len(lowercased)} tokens")

# %% [markdown] slideshow={"slide_type": "subslide"}
# The difference is `Soup`: the notes quietly fold the capital *Soup* into *soup* (while keeping
# the capital *I*). A tokenizer that keeps case must give the two spellings two ids; lower-casing
# everything gives the notes' count, at the price of never writing a capital letter again. The
# notes also say that spaces are tokens, but their list has none, and neither has ours.
#
# Encoding is a dictionary lookup, decoding is indexing into the list:

# %% slideshow={"slide_type": "fragment"}
id_of = {token: index for index, token in enumerate(vocabulary)}
soup_ids = [id_of[token] for token in soup_words]
print("ids    :", soup_ids)
print("decoded:", " ".join(vocabulary[i] for i in soup_ids))

# %% [markdown] slideshow={"slide_type": "slide"}
# The decoded text is not the original: the spaces were thrown away, so we cannot tell
# `soup.` from `soup .`. A tokenizer should give back exactly what it was given; the byte-level
# tokenizer we build below does.
#
# ## 2. Characters, words, or something in between? (optional)
#
# The course corpus is a megabyte of short stories, one sentence per line. Count what each
# choice of token would cost on it:

# %% slideshow={"slide_type": "fragment"}
catch_up("01_tokenization", "2.")  # started here after a restart? this runs the sections above

# %% slideshow={"slide_type": "fragment"}
corpus = load_corpus()
corpus_words = split_words(corpus)
corpus_bytes = len(corpus.encode("utf-8"))
print(f"corpus: {corpus_bytes:,} bytes = {len(corpus):,} characters = {len(corpus_words):,} words "
      f"and marks")
print(f"distinct characters: {len(set(corpus))} | distinct words and marks: "
      f"{len(set(corpus_words))}")

# %% [markdown] slideshow={"slide_type": "subslide"}
# Characters give a tiny vocabulary but long sequences: every sentence is several times more
# tokens, and attention's cost grows with the square of the length. Words give short sequences,
# but the vocabulary must hold every word ever seen, and a word that was never seen has no id:

# %% slideshow={"slide_type": "fragment"}
known_words = set(corpus_words)
new_sentence = "The dragon found a shiny key."
print("words the corpus never uses:", [w for w in split_words(new_sentence)
                                       if w not in known_words])

# %% [markdown] slideshow={"slide_type": "subslide"}
# Real text keeps producing new words (names, typos, numbers, other languages), so a word
# vocabulary is never finished. A character tokenizer is two small tables, one each way:

# %% slideshow={"slide_type": "fragment"}
chars = sorted(set(corpus))
char_id = {char: index for index, char in enumerate(chars)}
plain_ids = [char_id[char] for char in new_sentence]
print(plain_ids)
print("".join(chars[i] for i in plain_ids))

# %% [markdown] slideshow={"slide_type": "subslide"}
# The same thing, with special tokens, saving and clear errors, is `CharTokenizer` in
# `helpers/text/chars.py`; the assertion checks that it agrees with the two lines above. It
# still fails on a character the corpus never used, and says so:

# %% slideshow={"slide_type": "fragment"}
from helpers.text.chars import CharTokenizer

char_tokenizer = CharTokenizer.train(corpus)
assert char_tokenizer.encode(new_sentence) == plain_ids
assert char_tokenizer.decode(plain_ids) == new_sentence
print(char_tokenizer)
try:
    char_tokenizer.encode("Zoë found a key.")
except ValueError as error:
    print("ValueError:", error)

# %% [markdown] slideshow={"slide_type": "slide"}
# *Subword* tokenizers sit in between: frequent words stay whole, rare ones are spelled from
# smaller pieces, so nothing is ever unknown and common text stays short. The question is which
# pieces to keep. To make sure that *any* text can be spelled, start from bytes.
#
# ## 3. Bytes: 256 symbols that spell every text (core)
#
# UTF-8 writes each Unicode character as one to four bytes, each a number from 0 to 255:

# %% slideshow={"slide_type": "fragment"}
catch_up("01_tokenization", "3.")  # started here after a restart? this runs the sections above

# %% slideshow={"slide_type": "fragment"}
for text in ["soup", "Zoë", "☕", "東京", "👋"]:
    data = text.encode("utf-8")
    print(f"{text!r:7} {len(text)} character(s) -> {len(data)} byte(s): {list(data)}")
print("bytes per character:", {char: len(char.encode("utf-8")) for char in "së☕👋"})
print("possible byte values:", len(range(256)))

# %% [markdown] slideshow={"slide_type": "slide"}
# A tokenizer whose first 256 ids are the byte values has no unknown characters, ever. The price
# is length: the wave emoji is four tokens. *Byte-pair encoding* (BPE) wins the length back by
# learning new tokens for byte sequences that are frequent in the training text.
#
# ## 4. Byte-pair encoding, by hand (core)
#
# 1. Write the training text as bytes (ids 0 to 255).
# 2. Count every pair of neighbouring ids.
# 3. Give the most frequent pair a new id (256, then 257, ...) and replace it everywhere.
# 4. Repeat from 2 until the vocabulary is as large as wanted.
#
# The list of merges *is* the tokenizer: encoding a new text replays them.
#
# ### Exercise 1: count the pairs
# Write the counting step of item 2 for one list of ids: a dict from each pair of neighbouring
# ids to how often it occurs. This exercise stands alone: no later cell runs on your answer (the
# cells below use the course's own `count_pairs` on the soup sentences and on the whole corpus).
#
# <details><summary>Hint 1: the idea</summary>
#
# A list of n ids has n - 1 neighbouring pairs, and each one adds 1 to its own count.
# </details>
#
# <details><summary>Hint 2: the plan</summary>
#
# Walk along the list one position at a time, pairing each id with the one after it, and stop at
# the last pair. Keep a running count per pair in a dict, starting a pair at zero the first time
# you meet it. Overlapping pairs count: three fives in a row hold the pair (5, 5) twice.
# </details>

# %% slideshow={"slide_type": "fragment"}
catch_up("01_tokenization", "4.")  # started here after a restart? this runs the sections above

# %% slideshow={"slide_type": "fragment"}
def count_pairs(ids: list[int]) -> dict[tuple[int, int], int]:
    """How often each pair of neighbours occurs: [1, 2, 1, 2] -> {(1, 2): 2, (2, 1): 1}."""
    ### BEGIN SOLUTION
    counts = {}
    for pair in zip(ids[:-1], ids[1:], strict=True):  # (ids[0], ids[1]), (ids[1], ids[2]), ...
        counts[pair] = counts.get(pair, 0) + 1
    return counts
    ### END SOLUTION


# %% slideshow={"slide_type": "fragment"}
check("tokenization.count_pairs", count_pairs)

# %% [markdown] slideshow={"slide_type": "subslide"}
# From here on we use the same function from `helpers.text.bpe` (it returns a `Counter`, a dict
# that also finds the most common entries). On the soup sentences,
# several pairs are equally frequent, so the first merge needs a rule for ties. The course uses
# the rule of Stanford's CS336 reference trainer: the pair whose byte strings come last in
# dictionary order (compared byte by byte, `b"u"` after `b"o"` after `b"I"`) wins. It depends
# only on what the tokens spell, not on the order in which their ids were handed out.

# %% slideshow={"slide_type": "fragment"}
from helpers.text.bpe import count_pairs, most_frequent_pair
from helpers.text.chars import readable

soup_pairs = count_pairs(list(TOY_SOUP.encode("utf-8")))
top_count = max(soup_pairs.values())
tied_pairs = [pair for pair, n in soup_pairs.items() if n == top_count]
soup_tied = [readable(bytes(pair)) for pair in tied_pairs]
soup_first = readable(bytes(most_frequent_pair(soup_pairs)))
# Single bytes compare as their values do, so here the greatest byte strings are the greatest ids.
assert most_frequent_pair(soup_pairs) == max(tied_pairs)
print(f"soup sentences: {len(soup_pairs)} distinct pairs; {len(soup_tied)} tie at {top_count} "
      f"times: {soup_tied}")
print(f"the tie-break picks {soup_first!r}")

# %% [markdown] slideshow={"slide_type": "subslide"}
# (`readable` shows a space as `␣` and a new line as `↵`.) Among the tied pairs, `I␣` and `.␣`
# join the end of one word to the space before the next. The whole corpus shows the same thing
# with more weight behind it:

# %% slideshow={"slide_type": "fragment"}
corpus_pairs = count_pairs(list(corpus.encode("utf-8")))
corpus_top = corpus_pairs.most_common(5)
print(f"whole corpus: {len(corpus_pairs):,} distinct pairs; the five most frequent:")
for pair, n in corpus_top:
    print(f"{readable(bytes(pair))!r:6} {n:7,} times")
word_enders = [readable(bytes(pair)) for pair, _ in corpus_top if pair[1] in b" \n"]
print(f"{len(word_enders)} of them end a word and reach into what follows: {word_enders}")

# %% [markdown] slideshow={"slide_type": "subslide"}
# Merging such pairs would fill the vocabulary with tokens such as `ed␣` or `d␣the` that tie a
# word to its neighbour. GPT-2 therefore first cuts the text into word-like *chunks* (a word
# keeps the space in front of it; punctuation, numbers and line breaks go apart) and never merges
# across a chunk boundary. A space can still merge with the word *after* it, since they share a
# chunk (` soup`); what never happens is a merge of a word with the space *after* it:

# %% slideshow={"slide_type": "fragment"}
from helpers.text.chars import pre_split

print(pre_split(TOY_SOUP))

# %% [markdown] slideshow={"slide_type": "subslide"}
# Step 3 replaces a pair by its new id, left to right, so that overlapping occurrences are not
# merged twice:

# %% slideshow={"slide_type": "fragment"}
def merge_pair(ids: list[int], pair: tuple[int, int], new_id: int) -> list[int]:
    """`ids` with each occurrence of `pair` (read left to right) replaced by `new_id`."""
    merged = []
    position = 0
    while position < len(ids):
        if ids[position:position + 2] == list(pair):
            merged.append(new_id)
            position += 2
        else:
            merged.append(ids[position])
            position += 1
    return merged


print(merge_pair([7, 7, 7, 1], (7, 7), 256))

# The same step lives in helpers.text.bpe as `merge`; the two agree:
from helpers.text.bpe import merge

assert merge_pair([7, 7, 7, 1, 7, 7], (7, 7), 256) == merge([7, 7, 7, 1, 7, 7], (7, 7), 256)

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### Exercise 2: the training loop
# Now put the pieces together: the whole textbook loop, on the chunks. Return the merged pairs in
# the order they were learned (merge `i` makes id `256 + i`), and stop early if no chunk has a
# pair left. `pre_split`, `count_pairs`, `most_frequent_pair` and `merge_pair` are all defined
# above; the cells after this one train with your function.
#
# <details><summary>Hint 1: the idea</summary>
#
# Keep every chunk as a list of ids and, beside it, what each id spells in bytes (to break ties).
# Each step sees the chunks as the previous merge left them, so count afresh every time.
# </details>
#
# <details><summary>Hint 2: the plan</summary>(1) The starting state: every chunk of the pre-split
# text spelled in bytes, and the vocabulary of what each id spells. (2) Once per merge: count the
# pairs of all the chunks together, stop if there are none, and let the tie-breaking function of
# above pick the pair. (3) Record the pair, give it the next new id in the vocabulary, and merge it
# in every chunk.</details>
#
# <details><summary>Hint 3: closer</summary>The vocabulary starts as the 256 single bytes; a new id
# spells its two parts' bytes joined. Counts of several chunks add up in a Counter.</details>

# %% slideshow={"slide_type": "fragment"}
def train_textbook(text: str, n_merges: int) -> list[tuple[int, int]]:
    """The textbook BPE loop: the first `n_merges` merged pairs of `text`, merge i making id 256 +
    i."""
    ### BEGIN SOLUTION
    chunks = [list(chunk.encode("utf-8")) for chunk in pre_split(text)]
    vocab = [bytes([byte]) for byte in range(256)]  # id -> the bytes it spells, to break ties
    merges = []
    for step in range(n_merges):
        counts = Counter()
        for ids in chunks:
            counts.update(count_pairs(ids))
        if not counts:
            break  # every chunk is a single token
        pair = most_frequent_pair(counts, vocab)  # a tie goes to the greatest byte strings
        merges.append(pair)
        vocab.append(vocab[pair[0]] + vocab[pair[1]])
        chunks = [merge_pair(ids, pair, 256 + step) for ids in chunks]
    return merges
    ### END SOLUTION


# %% slideshow={"slide_type": "fragment"}
check("tokenization.train_bpe", train_textbook)

# %% [markdown] slideshow={"slide_type": "subslide"}
# The next cell trains with your loop if it passes, and with the course's `textbook_pairs`
# (the same loop, in `helpers.text.bpe`) if not, saying which:

# %% slideshow={"slide_type": "fragment"}
from helpers.lab.exercises import yours_or
from helpers.text.bpe import textbook_merges


def textbook_pairs(text: str, n_merges: int) -> list[tuple[int, int]]:
    """The course's textbook loop, as pairs only."""
    return [m.pair for m in textbook_merges(text, n_merges)]


def show_merges(merges: list[tuple[int, int]]) -> None:
    """Print each merge as 'left + right -> new token'."""
    token = {byte: bytes([byte]) for byte in range(256)}
    for step, (left, right) in enumerate(merges):
        token[256 + step] = token[left] + token[right]
        print(f"merge {step}: {readable(token[left]):>6} + {readable(token[right]):<6}"
              f" -> id {256 + step}: {readable(token[256 + step])}")


train_textbook = yours_or("tokenization.train_bpe", train_textbook, textbook_pairs)
show_merges(train_textbook(TOY_SOUP, 6))

# %% [markdown] slideshow={"slide_type": "subslide"}
# This loop is the slow rung of the course's package: `helpers.text.bpe.textbook_merges` is the same
# loop, kept plain on purpose, and the tests and the benchmark measure the fast trainer below
# against it. It also records how often each pair occurred when it was merged:

# %% slideshow={"slide_type": "fragment"}
soup_merges = textbook_merges(TOY_SOUP, 6)
assert [m.pair for m in soup_merges] == train_textbook(TOY_SOUP, 6)
print(soup_merges[0])

# %% [markdown] slideshow={"slide_type": "subslide"}
# The same algorithm lives in `helpers.text.bpe.learn_merges`, with three changes that make it
# fast without changing a single merge:
#
# - **count each chunk once**: a chunk that occurs thousands of times is stored once with its
#   count;
# - **update the counts instead of recounting**: a merge only changes the chunks that contain
#   the merged pair, so only the counts of their pairs change;
# - **keep the counts in a heap** (Python's `heapq`), so that finding the most frequent pair
#   does not mean looking at every pair.
#
# The first idea shrinks the work the most on this corpus: every count of pairs scans the
# distinct chunks instead of all of them, several hundred times fewer (the cell prints the ratio;
# the times of both trainers follow below):

# %% slideshow={"slide_type": "fragment"}
chunk_counts = Counter(pre_split(corpus))
print(f"{sum(chunk_counts.values()):,} chunks in the corpus, only {len(chunk_counts)} distinct: "
      f"{sum(chunk_counts.values()) / len(chunk_counts):.0f}x fewer to scan")
print("most common:", [(readable(chunk.encode()), n) for chunk, n in chunk_counts.most_common(4)])

# %% [markdown] slideshow={"slide_type": "subslide"}
# The cell below trains both versions on the first 10,000 characters of the corpus and checks
# that they learn the same merges; the next one prints the times, which depend on the machine
# (`benchmarks/bench_tokenizer.py` holds the speed budgets):

# %% slideshow={"slide_type": "fragment"}
from helpers.text.bpe import learn_merges

sample = corpus[:10_000]
started = time.perf_counter()
plain_merges = train_textbook(sample, 30)
textbook_seconds = time.perf_counter() - started
started = time.perf_counter()
fast_merges = learn_merges(sample, 30)
fast_seconds = time.perf_counter() - started

assert [m.pair for m in fast_merges] == plain_merges
assert fast_merges == textbook_merges(sample, 30)  # the same pairs, ids and counts
print(f"{len(plain_merges)} identical merges")

# %% slideshow={"slide_type": "fragment"}
# NBVAL_IGNORE_OUTPUT
# Wall-clock times change from run to run and from machine to machine.
print(f"textbook loop {format_duration(textbook_seconds)} | learn_merges "
      f"{format_duration(fast_seconds)}")

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 5. Training on the whole corpus, step by step (optional)
#
# `BPETokenizer.train` runs `learn_merges` until the vocabulary (256 bytes, the merges and the
# special tokens) reaches `VOCAB_SIZE`. It also reserves `<|endoftext|>`, the special token GPT-2
# puts between documents; more on it below.

# %% slideshow={"slide_type": "fragment"}
catch_up("01_tokenization", "5.")  # started here after a restart? this runs the sections above

# %% slideshow={"slide_type": "fragment"}
from helpers.text.bpe import BPETokenizer

VOCAB_SIZE = 512  # the knob: try 300, or a size past where this corpus runs out (section 8)
END = "<|endoftext|>"

started = time.perf_counter()
bpe = BPETokenizer.train(corpus, vocab_size=VOCAB_SIZE, special_tokens=[END])
train_seconds = time.perf_counter() - started
print(bpe)
print(f"= {256} bytes + {len(bpe.merges)} merges + {len(bpe.special_tokens)} special token")

# %% slideshow={"slide_type": "fragment"}
# NBVAL_IGNORE_OUTPUT
# A wall-clock time: it changes from run to run and from machine to machine.
print(f"training on the whole corpus {format_duration(train_seconds)}")

# %% [markdown] slideshow={"slide_type": "subslide"}
# The first merges, with how often each pair occurred when it was merged. Merges that glue a
# space to the start of a word (`␣t`, `␣a`, `␣w`) alternate with frequent letter pairs inside
# words (`he`, `ed`); soon whole frequent words appear (`␣the`, `␣to`):

# %% slideshow={"slide_type": "fragment"}
merges = learn_merges(corpus, len(bpe.merges))
assert [m.pair for m in merges] == bpe.merges
for m in merges[:12]:
    left, right = bpe.labels(m.pair)
    print(f"merge {m.new_id - 256:3}: {left:>6} + {right:<6} -> {bpe.labels([m.new_id])[0]:<9}"
          f" seen {m.count:6,} times")

# %% [markdown] slideshow={"slide_type": "subslide"}
# Watch the vocabulary grow. Each merge is at most as frequent as the one before it, so the
# corpus shrinks by less and less; and new tokens tend to get longer, as merges start to join
# tokens that are themselves merges:

# %% slideshow={"slide_type": "fragment"}
def corpus_length(merge_list: list[tuple[int, int]]) -> int:
    """Tokens in the whole corpus after these merges, counted once per distinct chunk."""
    tokenizer = BPETokenizer(merge_list)
    return sum(n * len(tokenizer.encode(chunk)) for chunk, n in chunk_counts.items())


steps = [*range(0, len(bpe.merges), 16), len(bpe.merges)]
lengths = [corpus_length(bpe.merges[:k]) for k in steps]
new_token_bytes = [len(bpe.vocab[m.new_id]) for m in merges]
assert all(earlier.count >= later.count for earlier, later in pairwise(merges))

fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.5))
left.plot(steps, [n / 1e3 for n in lengths], marker="o")
left.set(title="The corpus gets shorter", xlabel="merges learned",
         ylabel="corpus length (thousand tokens)")
right.scatter(range(len(merges)), new_token_bytes, s=12)
right.set(title="New tokens get longer", xlabel="merge step",
          ylabel="length of the new token (bytes)")
fig.tight_layout()
plt.show()
print(f"{lengths[0]:,} tokens before any merge, {lengths[-1]:,} after {steps[-1]}: "
      f"{lengths[0] / lengths[-1]:.2f} bytes per token")

# %% [markdown] slideshow={"slide_type": "subslide"}
# The longest tokens learned are whole words, most of them with the space in front:

# %% slideshow={"slide_type": "fragment"}
learned = range(256, 256 + len(bpe.merges))
longest = sorted(learned, key=lambda i: (-len(bpe.vocab[i]), i))[:8]
print(bpe.labels(longest))

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 6. Encode, decode, and any text at all (optional)
#
# To encode, pre-split the text and replay the merges inside each chunk, earliest-learned
# first, exactly as training applied them.
#
# ### Exercise 3: encode any text
# Write `encode_text(text, merges)`: given the merges as a list of pairs (merge `i` made id
# `256 + i`, so `i` is the merge's *rank*), return the ids of a whole text. Pre-split it as
# training did and start each chunk from its UTF-8 bytes. Trying all the merges in turn on every
# chunk would work, but most of them cannot apply; instead, repeat one step: among the chunk's
# neighbouring pairs, merge the one learned earliest (lowest rank), with `merge_pair` from above,
# until no pair of the chunk was ever learned. This gives the same ids as replaying the merges in
# order: a pair that holds a merged id was learned after the merge that made the id, so a merge
# never creates a pair of lower rank than its own. A text repeats its
# words: the corpus has hundreds of times more chunks than distinct ones (section 4 printed both
# counts), so remember the ids of each chunk the first time you encode it and reuse them after.
# The rest of this section, and the comparison of the three tokenizers on the whole corpus,
# encode with your function.
#
# <details><summary>Hint 1: the idea</summary>
#
# Encoding replays training: the same chunks, the same merges, in the order they were learned.
# A dict from each pair to its rank tells at once whether a pair was learned, and when.
# </details>
#
# <details><summary>Hint 2: the plan</summary>(1) Give every learned pair its rank, the step at
# which training learned it. (2) Cut the text into chunks as training did and spell each chunk in
# bytes. (3) Inside a chunk, repeat: of its neighbouring pairs, merge the one learned earliest into
# its new id; stop when none of its pairs was learned. (4) Join the chunks' ids in order; a chunk
# met before can reuse what it gave then.</details>
#
# <details><summary>Hint 3: closer</summary>A pair learned at rank r becomes id 256 plus r. A pair
# never learned must lose every comparison when you look for the earliest one: give it an infinite
# rank. Merges never cross a chunk boundary.</details>

# %% slideshow={"slide_type": "fragment"}
catch_up("01_tokenization", "6.")  # started here after a restart? this runs the sections above

# %% slideshow={"slide_type": "fragment"}
def encode_text(text: str, merges: list[tuple[int, int]]) -> list[int]:
    """The ids of `text`: each chunk's UTF-8 bytes with every merge applied, in the order
    learned."""
    ### BEGIN SOLUTION
    rank_of = {pair: rank for rank, pair in enumerate(merges)}  # the pair -> when it was learned
    known: dict[str, list[int]] = {}  # chunk -> its ids; a text repeats most of its chunks
    encoded: list[int] = []
    for chunk in pre_split(text):  # merges never cross a chunk boundary
        if chunk not in known:
            tokens = list(chunk.encode("utf-8"))
            while len(tokens) > 1:
                earliest = min(pairwise(tokens), key=lambda p: rank_of.get(p, math.inf))
                if earliest not in rank_of:
                    break  # no pair left in this chunk was ever merged
                tokens = merge_pair(tokens, earliest, 256 + rank_of[earliest])
            known[chunk] = tokens
        encoded += known[chunk]
    return encoded
    ### END SOLUTION


# %% slideshow={"slide_type": "fragment"}
check("tokenization.encode_text", encode_text)

# %% [markdown] slideshow={"slide_type": "subslide"}
# `BPETokenizer.encode` does the same (for a very long chunk it keeps the pairs in a heap, with
# the same result). The next cell encodes with your `encode_text` if it passes its check, and with
# the course's tokenizer if not, saying which; `decode` looks each id up and joins the bytes:

# %% slideshow={"slide_type": "fragment"}
def course_encode(text: str, merges: list[tuple[int, int]]) -> list[int]:
    """The course's encoder: a BPETokenizer with these merges."""
    return BPETokenizer(merges).encode(text)


encode = yours_or("tokenization.encode_text", encode_text, course_encode)

sentence = "One morning, Mia found a shiny key."
sentence_ids = encode(sentence, bpe.merges)
assert sentence_ids == bpe.encode(sentence)
print(f"{len(sentence)} characters -> {len(sentence_ids)} tokens: {sentence_ids}")
print(bpe.labels(sentence_ids))
assert bpe.decode(sentence_ids) == sentence

# %% [markdown] slideshow={"slide_type": "subslide"}
# Text that the corpus never contained still round-trips exactly, because every byte has an id.
# It just costs more tokens: the tokenizer learned English stories, not Japanese or emoji.

# %% slideshow={"slide_type": "fragment"}
for text in ["Zoë's café ☕", "東京で会いましょう", "👋🏽 hello", "x_1 = 3.14  # π", "  two\tspaces\n"]:
    ids = encode(text, bpe.merges)
    assert ids == bpe.encode(text) and bpe.decode(ids) == text
    print(f"{len(text):2} characters -> {len(ids):2} tokens   {bpe.labels(ids)[:8]}")

# %% [markdown] slideshow={"slide_type": "subslide"}
# **Special tokens** get one id each and are never cut into bytes. Joining two stories with
# `<|endoftext|>` tells a model where one document stops and the next begins:

# %% slideshow={"slide_type": "fragment"}
two_stories = END.join(corpus.split("\n\n")[:2])
story_ids = bpe.encode(two_stories)
print("special tokens:", bpe.special_tokens)
print(f"{len(story_ids)} tokens, of which {story_ids.count(bpe.special_tokens[END])} is {END}")
assert bpe.decode(story_ids) == two_stories

# %% [markdown] slideshow={"slide_type": "subslide"}
# (Here any text containing the characters `<|endoftext|>` gets the special id. Production
# tokenizers often refuse that by default, so that a user cannot type a control token.)
#
# Decoding joins the *bytes* first and only then reads them as UTF-8. Decoding part of a
# character gives the replacement mark `�`:

# %% slideshow={"slide_type": "fragment"}
wave_ids = bpe.encode("👋")
print("👋 ->", wave_ids, "| first two ids decode to", repr(bpe.decode(wave_ids[:2])))

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### Exercise 4: decode
# Given a list of token ids and a dict `token_bytes` from each id to the bytes of its token,
# return the text. Some tokens hold only part of a character. The cell after the check decodes the
# wave and the two stories above with your function and the tokenizer's vocabulary.
#
# <details><summary>Hint 1: the idea</summary>
#
# A token is bytes, not text: one character may start in one token and end in the next.
# </details>
#
# <details><summary>Hint 2: the plan</summary>
#
# Decoding token by token breaks a character split across two tokens. Look up every id's bytes
# and join them into one bytes object first; then decode it once as UTF-8, asking Python to
# replace whatever is not a whole character instead of raising an error.
# </details>

# %% slideshow={"slide_type": "fragment"}
def decode_ids(token_ids: list[int], token_bytes: dict[int, bytes]) -> str:
    """The text of `token_ids`, `token_bytes` giving each id's bytes; bytes that do not form whole
    characters become '�'."""
    ### BEGIN SOLUTION
    return b"".join(token_bytes[token_id] for token_id in token_ids).decode("utf-8",
                                                                            errors="replace")
    ### END SOLUTION


# %% slideshow={"slide_type": "fragment"}
check("tokenization.decode_ids", decode_ids)

# %% slideshow={"slide_type": "fragment"}
def course_decode_ids(token_ids: list[int], token_bytes: dict[int, bytes]) -> str:
    """The course's version: `bpe.decode`, for `token_bytes` = bpe.vocab only."""
    return bpe.decode(token_ids)


decode_with = yours_or("tokenization.decode_ids", decode_ids, course_decode_ids)
print("👋 ->", wave_ids, "| the first two ids:", repr(decode_with(wave_ids[:2], bpe.vocab)),
      "| all of them:", repr(decode_with(wave_ids, bpe.vocab)))
assert decode_with(story_ids, bpe.vocab) == two_stories
print(f"the two stories' {len(story_ids):,} ids decode to the text they came from")

# %% [markdown] slideshow={"slide_type": "subslide"}
# A tokenizer is its merges and special tokens, so saving it is writing those down. Reloading
# gives an identical tokenizer:

# %% slideshow={"slide_type": "fragment"}
with tempfile.TemporaryDirectory() as folder:
    saved = bpe.save(pathlib.Path(folder) / "bpe.json")
    saved_size = saved.stat().st_size
    reloaded = BPETokenizer.load(saved)
assert reloaded == bpe and reloaded.encode(two_stories) == story_ids
print(f"saved as {saved_size:,} bytes of JSON; the reloaded tokenizer is identical: "
      f"{reloaded == bpe}")

# %% [markdown] slideshow={"slide_type": "subslide"}
# Bad ids get an error that says what is wrong, not a bare `KeyError`:

# %% slideshow={"slide_type": "fragment"}
try:
    bpe.decode([72, 9999])
except ValueError as error:
    print("ValueError:", error)

# %% [markdown] slideshow={"slide_type": "subslide"}
# The three tokenizers on the whole corpus, and on a sentence with a word and a letter the
# corpus never used:

# %% slideshow={"slide_type": "fragment"}
unseen = "Zoë met a dragon."
corpus_ids = encode(corpus, bpe.merges)
assert corpus_ids == bpe.encode(corpus) and bpe.decode(corpus_ids) == corpus


def can_encode(encode, text: str) -> bool:
    try:
        encode(text)
    except (KeyError, ValueError):
        return False
    return True


id_of_word = {word: index for index, word in enumerate(sorted(known_words))}
rows = [("characters", char_tokenizer.vocab_size, len(corpus), can_encode(char_tokenizer.encode,
                                                                          unseen)),
        ("words", len(known_words), len(corpus_words), can_encode(lambda t: [id_of_word[w]
                for w in split_words(t)], unseen)),
        ("byte-level BPE", bpe.vocab_size, len(corpus_ids), can_encode(bpe.encode, unseen))]
print(f"{'tokens':15} {'vocabulary':>10} {'corpus length':>14}  encodes {unseen!r}?")
for name, vocab_size, length, ok in rows:
    print(f"{name:15} {vocab_size:>10,} {length:>14,}  {'yes' if ok else 'no'}")

# %% [markdown] slideshow={"slide_type": "subslide"}
# A text too big for memory, such as a file of many gigabytes, is encoded a piece at a time:
# `encode_iterable` takes the lines of a file (or chunks cut anywhere) and yields the ids one by
# one. It joins the pieces and cuts them again only where GPT-2's pre-split always cuts, where
# a character that is not a space meets a space, so the ids are exactly those of `encode` on
# the whole text:

# %% slideshow={"slide_type": "fragment"}
corpus_lines = corpus.splitlines(keepends=True)
streamed_ids = list(bpe.encode_iterable(corpus_lines))
assert streamed_ids == corpus_ids
print(f"{len(corpus_lines):,} lines -> {len(streamed_ids):,} ids, the same as encoding the corpus "
      f"at once: {streamed_ids == corpus_ids}")

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 7. BPE, WordPiece and Unigram (optional)
#
# BPE is one of three subword families in wide use. The DS 246 notes compare them:
#
# | | Unigram | BPE | WordPiece |
# |---|---|---|---|
# | **Training** | starts from a large vocabulary and removes the pieces the data needs least | starts from characters (here: bytes) and merges the most frequent pair | like BPE, but merges the pair that most raises the likelihood of the training data |
# | **Encoding** | probabilistic: every segmentation has a probability; the most likely one is used | deterministic: one segmentation per word | deterministic: one segmentation per word |
# | **Flexibility** | the most flexible; can follow the morphology of a language | less flexible: based on counts alone | between the two |
# | **Used by** | T5, ALBERT (through SentencePiece) | GPT models, StarCoder2 (code), Galactica | BERT |
#
# `helpers/text/subword.py` holds small from-scratch versions of the other two, trained here
# on the same corpus with the same vocabulary size:
#
# - `WordPieceTokenizer` merges the pair with the highest `count(ab) / (count(a) * count(b))`,
#   which ranks pairs by how much merging them raises the likelihood of the training words;
#   pieces inside a word carry `##`. Encoding takes the longest known piece from the left.
# - `UnigramTokenizer` starts from the most frequent substrings and repeatedly drops the pieces
#   whose loss costs the corpus least, re-estimating every piece's probability in between.
#   Encoding picks the most probable segmentation. (It counts only each word's best segmentation
#   when re-estimating, a common simplification of SentencePiece's expected counts.)

# %% slideshow={"slide_type": "fragment"}
catch_up("01_tokenization", "7.")  # started here after a restart? this runs the sections above

# %% slideshow={"slide_type": "fragment"}
from helpers.text.subword import UnigramTokenizer, WordPieceTokenizer

wordpiece = WordPieceTokenizer.train(corpus, vocab_size=VOCAB_SIZE)
unigram = UnigramTokenizer.train(corpus, vocab_size=VOCAB_SIZE)
print(f"vocabulary sizes: BPE {bpe.vocab_size}, WordPiece {wordpiece.vocab_size}, Unigram "
      f"{unigram.vocab_size}")

words_to_compare = ["the", "found", "basket", "librarian", "umbrellas", "gardening", "unigram",
                    "Zoë"]
print(f"{'word':10} | {'BPE (with its space)':32} | {'WordPiece':32} | Unigram")
for word in words_to_compare:
    bpe_pieces = " ".join(bpe.labels(bpe.encode(" " + word)))
    print(f"{word:10} | {bpe_pieces:32} | {' '.join(wordpiece.tokenize(word)):32} | "
          f"{' '.join(unigram.tokenize(word))}")

# %% [markdown] slideshow={"slide_type": "subslide"}
# Same corpus, same vocabulary size, different pieces. BPE and Unigram keep the most frequent
# words whole. WordPiece's score favours pairs whose parts rarely occur apart, so it builds rare
# fragments such as `##ning` (in *gardening*, where BPE has `ing`) and, at this size, still writes
# *the* in two pieces. Unigram
# keeps whole words and splits off an ending (`umbrella s`). Words the corpus never used
# (*unigram*) come out as small pieces in all three. Only byte-level BPE can spell `Zoë`: the
# other two never saw `ë`. WordPiece gives up on the whole word (`[UNK]`); Unigram spells what it
# can and puts one unknown token in place of each character it never saw.
#
# ### The notes' example: "unigram"
#
# The notes list four ways the word *unigram* could be cut. A Unigram model gives each a
# probability: the product of its pieces' probabilities. Our corpus has no word with *gram* in
# it, so the cell trains a small Unigram model on a word list that does, then scores the four
# cuts (a cut that uses a piece missing from the vocabulary has probability 0):

# %% slideshow={"slide_type": "fragment"}
from helpers.text.subword import segmentations

word_list = ("unicorn uniform union unit universe unique unicycle unify unison united "
             "program diagram telegram kilogram hologram anagram grammar "
             "under until undo unfair uncle unless unhappy night nine nice ninja ink idea ice ivy")
small_unigram = UnigramTokenizer.train(word_list, vocab_size=30)
every_cut = segmentations("unigram", small_unigram.log_probs)
total = sum(math.exp(small_unigram.score(cut)) for cut in every_cut)

DS_246_CUTS = [["uni", "gram"], ["u", "ni", "gram"], ["un", "i", "gram"], list("unigram")]
print(f"multi-letter pieces kept: {sorted(p for p in small_unigram.log_probs if len(p) > 1)}")
for cut in DS_246_CUTS:
    log_p = small_unigram.score(cut)
    share = math.exp(log_p) / total
    print(f"{str(cut):38} log P = {log_p:7.2f}   P(this cut | unigram) = {share:.4f}")
print(f"{len(every_cut)} possible cuts in all; the model picks "
      f"{small_unigram.tokenize_word('unigram')}")

# %% [markdown] slideshow={"slide_type": "subslide"}
# The model prefers `uni + gram`, gives `un + i + gram` a smaller share, and nearly nothing to
# seven single letters; `u + ni + gram` is impossible because `ni` did not survive pruning.
# Sampling a cut in proportion to these probabilities, instead of always taking the best, is
# how Unigram training can show a model several spellings of one word ("subword
# regularization"). BPE and WordPiece have one answer each:

# %% slideshow={"slide_type": "fragment"}
small_bpe = BPETokenizer.train(word_list, vocab_size=256 + 30)
small_wordpiece = WordPieceTokenizer.train(word_list, vocab_size=30 + 30)
print("BPE      :", small_bpe.labels(small_bpe.encode("unigram")))
print("WordPiece:", small_wordpiece.tokenize("unigram"))

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 8. How big should the vocabulary be? (optional)
#
# More merges make the text shorter, which makes every sequence cheaper for attention, but each
# token needs a row in the embedding table (and, untied, another in the output layer). On our
# corpus:

# %% slideshow={"slide_type": "fragment"}
catch_up("01_tokenization", "8.")  # started here after a restart? this runs the sections above

# %% slideshow={"slide_type": "fragment"}
all_merges = [m.pair for m in learn_merges(corpus, 10_000)]
vocab_sizes = [*range(256, 256 + len(all_merges), 50), 256 + len(all_merges)]
bytes_per_token = [corpus_bytes / corpus_length(all_merges[:v - 256]) for v in vocab_sizes]
D_MODEL = 768  # GPT-2 small's embedding width
GPT2_VOCAB_SIZE = 50_257
table_sizes = [2 ** k for k in range(8, 19)]  # 256 ... 262,144

fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.5))
left.plot(vocab_sizes, bytes_per_token, marker="o")
left.set(title="Our corpus: bigger vocabulary, shorter text", xlabel="vocabulary size",
         ylabel="bytes per token")
right.plot(table_sizes, [v * D_MODEL / 1e6 for v in table_sizes], marker="o", color="tab:red")
right.plot([GPT2_VOCAB_SIZE], [GPT2_VOCAB_SIZE * D_MODEL / 1e6], marker="*", markersize=18,
           color="black")
right.annotate("GPT-2", (GPT2_VOCAB_SIZE, GPT2_VOCAB_SIZE * D_MODEL / 1e6), xytext=(-70, 10),
               textcoords="offset points", fontsize=13)
right.set(xscale="log", title=f"Bigger vocabulary, bigger table (d = {D_MODEL})",
          xlabel="vocabulary size (log scale)", ylabel="embedding parameters (millions)")
fig.tight_layout()
plt.show()
print(f"this corpus runs out of pairs after {len(all_merges)} merges (vocabulary "
      f"{256 + len(all_merges)}): "
      f"{bytes_per_token[0]:.2f} -> {bytes_per_token[-1]:.2f} bytes per token")

# %% [markdown] slideshow={"slide_type": "subslide"}
# The corpus is made from a small grammar, so after the 752 merges printed above every distinct
# chunk is a single token and more merges have nothing left to do.
#
# ### A richer corpus: merges that find morphemes
#
# The course has a second corpus, `helpers.text.corpus_rich`: tales, conversations and diary pages
# from a larger grammar whose thousands of word forms are made from stems by English spelling
# rules (box, boxes; carry, carried, carrying; happy, happier, happiest, unhappy, happily), with
# numbers in digits and in words, dates and clock times. BPE keeps finding pairs far longer on it,
# and some of the pieces it learns on the way are the suffixes and the prefix of those rules,
# learned from counts alone:

# %% slideshow={"slide_type": "fragment"}
from helpers.text.corpus_rich import load_rich_corpus

rich_corpus = load_rich_corpus()
rich_merges = learn_merges(rich_corpus, 10_000)
rich_bpe = BPETokenizer([m.pair for m in rich_merges])
print(f"rich corpus: {len(rich_corpus.encode('utf-8')):,} bytes, "
      f"{len(set(split_words(rich_corpus))):,} distinct "
      f"words and marks; BPE runs out of pairs after {len(rich_merges):,} merges (small corpus: "
      f"{len(all_merges)})")
MORPHEMES = ["ing", "ed", "es", "ies", "er", "est", "ier", "iest", "ly", "ily", " un"]
learned_at = {bytes(rich_bpe.vocab[m.new_id]): m.new_id - 256 for m in reversed(rich_merges)}
for morpheme in MORPHEMES:
    print(f"{morpheme!r:>7} learned as a token at merge {learned_at[morpheme.encode()]:5,}")
assert len(rich_merges) > 2 * len(all_merges)

# %% [markdown] slideshow={"slide_type": "subslide"}
# With only the first 1,000 of those merges, frequent words are already single tokens, and many
# rarer forms end in one of the suffixes above. What comes before the suffix is not always the
# stem: BPE learns counts, not morphology, so *berries* and *unfolding* break where frequent
# pieces happen to be (the cell prints them):

# %% slideshow={"slide_type": "fragment"}
early_bpe = BPETokenizer([m.pair for m in rich_merges[:1000]])
for word in [" quickly", " sleepily", " happiest", " unfolding", " travelled", " berries"]:
    pieces = early_bpe.labels(early_bpe.encode(word))
    print(f"{word!r:>14} -> {' + '.join(pieces)}")
split_ends = [bytes(early_bpe.vocab[early_bpe.encode(w)[-1]]).decode() for w in [" quickly",
        " sleepily", " happiest", " unfolding"]]
print("last pieces:", split_ends)
assert all(end in MORPHEMES for end in split_ends)
berries = early_bpe.labels(early_bpe.encode(" berries"))
assert berries[-1] not in MORPHEMES and "␣berr" not in berries  # not a stem + suffix

# %% [markdown] slideshow={"slide_type": "subslide"}
# Real text never runs out: GPT-2 learned 50,000 merges from web pages, and its vocabulary is

# %% slideshow={"slide_type": "fragment"}
GPT2_MERGES = 50_000
gpt2_vocab = 256 + GPT2_MERGES + 1  # bytes + merges + <|endoftext|>
assert gpt2_vocab == GPT2_VOCAB_SIZE
GPT2_SMALL_PARAMETERS = 124_439_808  # counted exactly in notebook 7
gpt2_embedding = gpt2_vocab * D_MODEL
print(f"GPT-2 vocabulary: 256 + {GPT2_MERGES:,} + 1 = {gpt2_vocab:,}")
print(f"its embedding table: {gpt2_vocab:,} x {D_MODEL} = {gpt2_embedding:,} parameters, "
      f"{gpt2_embedding / GPT2_SMALL_PARAMETERS:.1%} of GPT-2 small's {GPT2_SMALL_PARAMETERS:,}")

# %% [markdown] slideshow={"slide_type": "slide"}
# Nearly a third of GPT-2 small is its embedding table. A bigger vocabulary makes sequences
# shorter and rare words cheaper, but costs parameters and spreads the training data over more
# rows: a token seen rarely gets a poorly trained embedding. That is why vocabularies sit in the
# tens of thousands (GPT-2: 50,257) to a few hundred thousand, not in the millions.
#
# ## 9. Tokenizer playground (optional)
#
# Each token gets a colour and its id underneath; `␣` is a space, `↵` a new line, and `\xf0`
# a byte that is only part of a character. First the same drawing for a fixed sentence, as a
# static picture:

# %% slideshow={"slide_type": "fragment"}
catch_up("01_tokenization", "9.")  # started here after a restart? this runs the sections above

# %% slideshow={"slide_type": "fragment"}
COLOURS = ["#ffd6a5", "#caffbf", "#9bf6ff", "#bdb2ff", "#ffc6ff", "#fdffb6"]


def coloured_tokens(text: str) -> tuple[str, list[int]]:
    """HTML showing `text` as coloured BPE tokens with their ids, and the ids themselves."""
    ids = bpe.encode(text)
    spans = [f'<span style="background:{COLOURS[i % len(COLOURS)]}; padding:2px 3px; margin:1px;'
             f' display:inline-block; text-align:center">{html.escape(label)}'
             f'<br><small style="color:#555">{token_id}</small></span>'
             for i, (token_id, label) in enumerate(zip(ids, bpe.labels(ids), strict=True))]
    summary = f"<p>{len(text)} characters, {len(ids)} tokens</p>"
    return (
        f'<div style="font-family:monospace; font-size:20px">{"".join(spans)}{summary}</div>',
        ids,
    )


def show_tokens(text: str) -> list[int]:
    """Display `text` as coloured tokens; return its ids."""
    page, ids = coloured_tokens(text)
    display(HTML(page))
    return ids


_ = show_tokens("Once upon a time, Zoë found a golden key 🔑.")

# %% [markdown] slideshow={"slide_type": "subslide"}
# The live version: a text box, and below it the same drawing, redrawn as you type. (It updates
# an HTML widget rather than printing, so nothing piles up below the cell.)

# %% slideshow={"slide_type": "fragment"}
class TokenBox:
    """A text box with its text drawn below as coloured tokens, redrawn on every change."""

    def __init__(self, text: str) -> None:
        self.box = widgets.Text(value=text, description="text",
                                layout=widgets.Layout(width="700px"))
        self.tokens = widgets.HTML()
        self.last: list[int] = []  # the ids on screen, for the check below
        self.start = text
        self.box.observe(self._redraw, names="value")
        self._redraw()

    def _redraw(self, _change=None) -> None:
        self.tokens.value, self.last = coloured_tokens(self.box.value)

    def _ipython_display_(self) -> None:
        display(widgets.VBox([self.box, self.tokens]))


# %% slideshow={"slide_type": "fragment"}
class TokenPlayground(TokenBox):
    """The token box with the two moves the check below makes: type a text, go back to the first."""

    def set(self, text: str) -> list[int]:
        """Type `text` into the box, as a student would; return the ids now shown."""
        self.box.value = text
        return self.last

    def reset(self) -> list[int]:
        """Back to the first text, so that the check below gives the same answer run twice."""
        return self.set(self.start)


# %% slideshow={"slide_type": "fragment"}
# NBVAL_IGNORE_OUTPUT
# A live widget: its display holds a model id that changes on every run.
playground = TokenPlayground("Once upon a time, Zoë found a golden key 🔑.")
playground

# %% slideshow={"slide_type": "fragment"}
before = playground.reset()
after = playground.set("The brave librarian said hello 👋")
assert after != before and bpe.decode(after) == "The brave librarian said hello 👋"
assert playground.tokens.value == coloured_tokens("The brave librarian said hello 👋")[0]
print(f"typing new text re-tokenizes it: {len(before)} tokens before, {len(after)} after")

# %% [markdown] slideshow={"slide_type": "slide"}
# Try your name, a sentence in another language, some code, or a long number. Which cost the
# most tokens per character, and why?
#
# ## Check your understanding (optional)
#
# The numbers in the answers are computed in the cell below.

# %% slideshow={"slide_type": "fragment"}
catch_up("01_tokenization", "Check")  # started here after a restart? this runs the sections above

# %% slideshow={"slide_type": "fragment"}
chars_per_token = len(corpus) / len(corpus_ids)
wave_tokens = len(bpe.encode("👋"))
unigram_cuts_all_pieces = len(segmentations("unigram", {"unigram"[i:j] for i in range(7)
                                                        for j in range(i + 1, 8)}))
print(f"corpus: {chars_per_token:.2f} characters per BPE token; {len(known_words):,} distinct "
      f"words and marks")
print(f"GPT-2: {gpt2_vocab:,} = 256 + {GPT2_MERGES:,} + 1; embedding {gpt2_embedding:,} parameters")
print(f"'👋' is {wave_tokens} BPE tokens; decoding the first two gives "
      f"{bpe.decode(bpe.encode('👋')[:2])!r}")
print(f"cuts of 'unigram' if every substring were a piece: {unigram_cuts_all_pieces} "
      f"(2 ** {len('unigram') - 1} gaps)")
print(f"soup sentences: {soup_tied} tie for the most frequent pair; the tie-break picks "
      f"{soup_first!r}")
print(f"corpus: frequent pairs that end a word and reach into the next: {word_enders}")

# %% [markdown] slideshow={"slide_type": "subslide"}
# **1. Why not use characters as tokens?**
# <details><summary>Answer</summary>
#
# Sequences get long: on the corpus one BPE token covers the number of characters printed above,
# so a character model would see that many times more positions, and attention's cost grows with the
# square of the length. Each position also carries little meaning, so the model spends layers
# assembling words.
# </details>

# %% [markdown] slideshow={"slide_type": "subslide"}
# **2. Why not use whole words?**
# <details><summary>Answer</summary>
#
# A word that was never seen has no id (the corpus's distinct words and marks, counted above,
# have no `dragon`), so the model cannot even read it. Real text keeps inventing words, so the
# vocabulary would never be complete, and each rare word would get its own, poorly trained row.
# </details>

# %% [markdown] slideshow={"slide_type": "subslide"}
# **3. Where does GPT-2's vocabulary size of 50,257 come from?**
# <details><summary>Answer</summary>
#
# 256 byte tokens + 50,000 learned merges + 1 special token, `<|endoftext|>`. With
# d_model = 768 its embedding table alone holds 38,597,376 parameters; with weight tying
# (the textbook section) the output layer reuses them instead of adding as many again.
# </details>

# %% [markdown] slideshow={"slide_type": "subslide"}
# **4. Why can a byte-level BPE encode any text, and what goes wrong when you decode only some
# of the ids?**
# <details><summary>Answer</summary>
#
# Its first 256 ids are all possible byte values, and every text is a sequence of UTF-8 bytes,
# so at worst a text is spelled byte by byte. `👋` takes 4 tokens; the first two are half a
# character, so decoding them alone gives the replacement mark `�`. That is why `decode` joins
# all the bytes before reading them as text.
# </details>

# %% [markdown] slideshow={"slide_type": "subslide"}
# **5. What is the difference between BPE and Unigram when encoding a word?**
# <details><summary>Answer</summary>
#
# BPE replays its merges and always gives one answer. A Unigram model gives every way of cutting
# the word into known pieces a probability and picks the most likely; if every substring of
# *unigram* were a piece there would be 64 cuts (2 choices, cut or not, at each of the 6 gaps
# between letters). Sampling among them gives the model varied spellings during training.
# </details>

# %% [markdown] slideshow={"slide_type": "subslide"}
# **6. Which merges does GPT-2's pre-splitting rule out, and why?**
# <details><summary>Answer</summary>
#
# The text is first cut into word-like chunks and merges stay inside a chunk. A chunk carries the
# space in front of its word (` soup`), so a space does merge with the word after it; what never
# happens is a merge across a chunk boundary, such as a word with the space or line break after
# it. Without the split such pairs would be merged early: on the corpus several of the most
# frequent pairs end a word and reach into the next (printed above), and on the soup sentences
# `I␣` and `.␣` tie for first place (the tie-break happens to pick `up`). The tokens made from
# them would only fit one phrase.
# </details>

# %% [markdown] slideshow={"slide_type": "slide"}
# ## Optional: your own text (optional)
#
# Everything above ran on the course corpus. The same BPE learns from any text: a novel from
# Project Gutenberg, your notes, a chat log, code. Save it as a plain UTF-8 text file, put its
# path in `MY_TEXT_FILE` and run the cell: `helpers.lab.own_text.bpe_on_text_file` reads the file
# with `read_text_file`, learns `MY_MERGES` merges with section 5's `learn_merges` (fewer if
# the text runs out of pairs), encodes the file with them and prints the first merges and how
# many bytes one token covers. Compare the merges with the corpus's: which words of your text
# become single tokens first?
#
# `read_text_file` says clearly what is wrong with a file it cannot use: a path that does not
# exist, a folder, an empty file, a binary file (an image, a PDF, a Word document: export those
# as plain text first) or a file in another encoding than UTF-8 (it names the first bad byte
# and how to convert the file). Left `None`, the cell only says what it would do.

# %% slideshow={"slide_type": "fragment"}
catch_up("01_tokenization",
         "Optional:")  # started here after a restart? this runs the sections above

# %% slideshow={"slide_type": "fragment"}
from helpers.lab.own_text import bpe_on_text_file, read_text_file

MY_TEXT_FILE = None  # <- the path of a UTF-8 text file, such as "my_story.txt"
MY_MERGES = 1_000

if MY_TEXT_FILE is not None:
    my_bpe = bpe_on_text_file(MY_TEXT_FILE, MY_MERGES)
    print(my_bpe.summary(first=20))
    my_line = next(line for line in read_text_file(MY_TEXT_FILE).splitlines() if line.strip())[:200]
    print("its first line, token by token:",
          " | ".join(my_bpe.tokenizer.labels(my_bpe.tokenizer.encode(my_line))))
    print(f"the course corpus: {len(corpus.encode('utf-8')) / len(corpus_ids):.2f} bytes per token "
          f"with {len(bpe.merges):,} merges")
else:
    print(f"MY_TEXT_FILE = None: nothing read. A path would train the course BPE ({MY_MERGES:,} "
          f"merges) "
          "on that file and print its first merges, its first line split into tokens and the bytes "
          "per token.")
