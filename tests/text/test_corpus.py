"""The committed corpus is exactly what its seeded generator writes, and its grammar checker works."""

from __future__ import annotations

import random
import re

from helpers.text.corpus import (
    CORPUS_MIN_BYTES,
    SLOTS,
    TOY_CAT,
    TOY_SOUP,
    data_dir,
    generate_corpus,
    generate_story,
    is_well_formed,
    load_corpus,
    well_formed_fraction,
    with_article,
)

# How each word that can follow an article in the grammar is *pronounced* at its start, written
# out by hand (not by the rule under test). A new word in the grammar must be added here.
FIRST_SOUND = {
    "vowel": {"honest", "old", "orange", "empty", "enormous", "umbrella"},
    "consonant": {"brave", "kind", "young", "clever", "quiet", "cheerful", "curious", "busy",
                  "gentle", "shy", "small", "blue", "tall", "wooden", "little", "big", "tiny",
                  "red", "shiny", "heavy", "strange", "golden", "broken", "magic", "wet"},
}


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


def test_toy_fixtures_are_the_lecture_notes_sentences():
    assert (data_dir() / "toy_soup.txt").read_text().strip() == TOY_SOUP
    assert (data_dir() / "toy_cat.txt").read_text().strip() == TOY_CAT
    assert TOY_SOUP == "I like to eat soup. I am a good cook. Soup is yummy."


def test_every_noun_phrase_of_the_grammar_has_the_article_of_its_first_sound():
    phrases = [p for slot in ("a_person", "a_home", "a_thing") for p in SLOTS[slot]]
    first_words = {p.split()[1] for p in phrases}
    unclassified = first_words - FIRST_SOUND["vowel"] - FIRST_SOUND["consonant"]
    assert not unclassified, f"add these words to FIRST_SOUND by how they sound: {sorted(unclassified)}"
    for phrase in phrases:
        article, first = phrase.split()[:2]
        expected = "an" if first in FIRST_SOUND["vowel"] else "a"
        assert article == expected, f"{phrase!r} should start with {expected!r}"
    assert "an honest baker" in SLOTS["a_person"] and "a honest baker" not in SLOTS["a_person"]


def test_article_rule_follows_the_sound_not_the_letter():
    cases = {"honest baker": "an", "hour": "an", "heir": "an", "horse": "a", "heavy box": "a",
             "unique map": "a", "useful key": "a", "unicorn": "a", "European city": "a",
             "one-eyed cat": "a", "umbrella": "an", "uncle": "an", "unusual box": "an",
             "old hat": "an", "apple": "an", "box": "a"}
    for phrase, article in cases.items():
        assert with_article(phrase) == f"{article} {phrase}"


def test_corpus_has_no_article_errors():
    text = load_corpus()
    wrong_a = re.findall(r"\ba (?:honest|[aeio]\w*)", text)
    wrong_an = re.findall(r"\ban (?!honest\b)[b-df-hj-np-tv-z]\w*", text)
    assert not wrong_a and not wrong_an, (wrong_a + wrong_an)[:5]
    assert "an honest" in text
