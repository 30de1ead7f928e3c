"""The committed corpus is exactly what its seeded generator writes, and its grammar checker works."""

from __future__ import annotations

import random

from helpers.corpus import (
    CORPUS_MIN_BYTES,
    TOY_CAT,
    TOY_SOUP,
    data_dir,
    generate_corpus,
    generate_story,
    is_well_formed,
    load_corpus,
    well_formed_fraction,
)


def test_committed_corpus_is_byte_identical_to_a_regeneration():
    committed = (data_dir() / "corpus.txt").read_bytes()
    assert generate_corpus().encode("utf-8") == committed


def test_corpus_is_large_and_varied():
    text = load_corpus()
    assert len(text.encode("utf-8")) >= CORPUS_MIN_BYTES
    stories = text.split("\n\n")
    assert len(stories) > 1000
    assert len(set(stories)) == len(stories), "every story is different"
    assert len(set(text.split())) > 250


def test_every_corpus_line_is_well_formed():
    assert well_formed_fraction(load_corpus()) == 1.0


def test_checker_rejects_broken_sentences():
    story = generate_story(random.Random(0))
    assert all(is_well_formed(s) for s in story)
    broken = [
        story[0].replace(" ", "  ", 1),        # a doubled space
        story[0][:-1],                          # no full stop
        "There, she found a apple.",            # wrong article, and no adjective
        "There, she found an old apple",        # no full stop
        "Once upon a time, there was a brave baker named Bob.",  # a name not in the grammar
        "",
    ]
    assert not any(is_well_formed(s) for s in broken)
    assert is_well_formed("There, she found an old apple.")
    assert well_formed_fraction("There, she found an old apple.\nnonsense words\n\n") == 0.5
    assert well_formed_fraction("") == 0.0


def test_toy_fixtures_are_the_seed_sentences():
    assert (data_dir() / "toy_soup.txt").read_text().strip() == TOY_SOUP
    assert (data_dir() / "toy_cat.txt").read_text().strip() == TOY_CAT
    assert TOY_SOUP == "I like to eat soup. I am a good cook. Soup is yummy."
