"""The committed corpus is exactly what its seeded generator writes, and its grammar checker works."""

from __future__ import annotations

import random
import re

import pytest
from shared_tools import FixedDraw

from helpers.text import corpus
from helpers.text.corpus import (
    CORPUS_MIN_BYTES,
    NAMES,
    SLOTS,
    STORY,
    TEMPLATES,
    TOY_CAT,
    TOY_SOUP,
    data_dir,
    generate_corpus,
    generate_story,
    is_well_formed,
    load_corpus,
    starts_with_vowel_sound,
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


# helpers.text.corpus: the article rule, the story generator, the corpus size rule, the grammar
# checker and the data folder, each asserted exactly.
#
# Tiny inputs only: a few stories, a few sentences.

@pytest.mark.parametrize(("phrase", "vowel"), [
    ("apple", True), ("egg", True), ("ice", True), ("owl", True), ("uncle", True),
    ("Egg cup", True), ("Ice", True), ("Owl", True), ("Honest baker", True), ("HOUR", True),
    ("box", False), ("yak", False), ("Box", False), ("", False), ("7 cats", False),
    ("One-eyed cat", False), ("once-famous cook", False), ("one", False), ("onion", True),
    ("oneness", True), ("onward", True),
    ("Unique map", False), ("Usual", False), ("Euro coin", False),
])
def test_first_sound_of_each_vowel_and_each_exception(phrase, vowel):
    # "one"/"once" are exceptions only as whole words ("onion", "oneness" keep their vowel);
    # the silent h and the "you" sound are prefixes of the word ("honesty", "usually").
    assert starts_with_vowel_sound(phrase) is vowel
    assert with_article(phrase) == ("an " if vowel else "a ") + phrase


def test_prefix_exceptions_apply_to_longer_words():
    assert starts_with_vowel_sound("honesty")
    assert not starts_with_vowel_sound("usually")
    assert not starts_with_vowel_sound("unicorns")


def _story_facts(seed):
    """What generate_story must have drawn, replayed from the same generator by hand."""
    rng = random.Random(seed)
    gender = rng.choice(["she", "he"])
    hero = rng.choice(corpus.HEROES[gender])
    friends = [n for n in NAMES if n != hero]
    friend = rng.choice(friends)
    return gender, hero, friend


@pytest.mark.parametrize("seed", range(12))
def test_story_keeps_hero_friend_and_pronouns_consistent(seed):
    story = generate_story(random.Random(seed))
    gender, hero, friend = _story_facts(seed)
    assert hero != friend and hero in corpus.HEROES[gender]
    text = " ".join(story)
    assert hero in text
    words = set(re.findall(r"[A-Za-z]+", text))
    wrong = {"he", "He", "his"} if gender == "she" else {"she", "She", "her"}
    assert not words & wrong, (gender, words & wrong)
    assert all(is_well_formed(line) for line in story)
    assert 2 <= len(story) <= len(STORY)


def _section_of(sentence):
    regexes = corpus._template_regexes()
    return {i for i, section in enumerate(STORY) for t in section
            if regexes[TEMPLATES.index(t)].fullmatch(sentence)}


def test_first_two_sections_always_appear_and_later_ones_sometimes_do_not():
    lengths = set()
    for seed in range(60):
        story = generate_story(random.Random(seed))
        assert 0 in _section_of(story[0]) and 1 in _section_of(story[1])
        lengths.add(len(story))
    assert max(lengths) == len(STORY) and min(lengths) < len(STORY) - 1


def test_story_draws_exactly_as_documented():
    # The draw order is part of the committed corpus: replay it by hand for one seed.
    rng = random.Random(5)
    gender = rng.choice(["she", "he"])
    hero = rng.choice(corpus.HEROES[gender])
    friend = rng.choice([n for n in NAMES if n != hero])
    a_thing = rng.choice(SLOTS["a_thing"])
    values = {slot: rng.choice(words) for slot, words in SLOTS.items()}
    values.update(hero=hero, friend=friend, a_thing=a_thing, thing=a_thing.split(" ", 2)[-1],
                  subj=gender, Subj=gender.capitalize(), poss="her" if gender == "she" else "his")
    sections = [s for i, s in enumerate(STORY) if i < 2 or rng.random() < 0.9]
    expected = [corpus._SLOT.sub(lambda m: values[m.group(1)], rng.choice(s)) for s in sections]
    assert generate_story(random.Random(5)) == expected


def test_a_two_word_thing_is_named_whole_later_in_the_story():
    # "an old owl feather" is later "the owl feather", not "the feather".
    for seed in range(400):
        text = "\n".join(generate_story(random.Random(seed)))
        if "owl feather" in text and "the owl feather" in text:
            assert "the feather" not in text
            return
    pytest.fail("no story with an owl feather in 400 seeds")


def test_corpus_stops_at_the_first_story_that_reaches_min_bytes():
    assert generate_corpus(seed=3, min_bytes=0) == ""
    one = "\n".join(generate_story(random.Random(3))) + "\n"
    n = len(one.encode("utf-8"))
    # Each story counts its bytes and the blank line after it.
    assert generate_corpus(seed=3, min_bytes=1) == one
    assert generate_corpus(seed=3, min_bytes=n + 1) == one
    two = generate_corpus(seed=3, min_bytes=n + 2)
    stories = two.split("\n\n")
    assert len(stories) == 2 and stories[0] + "\n" == one
    assert two.startswith(one + "\n")
    assert two.endswith("\n") and not two.endswith("\n\n")


@pytest.mark.parametrize("min_bytes", [500, 1234, 3000])
def test_corpus_is_the_shortest_run_of_stories_past_min_bytes(min_bytes):
    text = generate_corpus(seed=11, min_bytes=min_bytes)
    assert len(text.encode("utf-8")) + 1 >= min_bytes
    stories = text.split("\n\n")
    shorter = "\n\n".join(stories[:-1])
    # Without its last story the text counted len + 2 bytes (the blank line after each story,
    # and the newline that ends the last): that was still short of min_bytes.
    assert len(shorter.encode("utf-8")) + 2 < min_bytes
    rng = random.Random(11)
    assert stories == ["\n".join(generate_story(rng)) + ("\n" if i == len(stories) - 1 else "")
                       for i in range(len(stories))]


def test_corpus_counts_bytes_not_characters(monkeypatch):
    # A story with a two-byte character reaches min_bytes one character sooner.
    monkeypatch.setattr(corpus, "generate_story", lambda rng: ["é" * 9])
    # Each story is nine "é" and a newline: 10 characters, 19 bytes, plus 1 for the blank line.
    assert generate_corpus(seed=0, min_bytes=20) == "é" * 9 + "\n"
    assert generate_corpus(seed=0, min_bytes=21).count("é") == 18


def test_checker_escapes_the_punctuation_of_words_and_templates():
    assert is_well_formed('"Who left this here?" said Mia.')
    assert not is_well_formed('"Who left this her" said Mia.')       # "?" is a literal
    assert not is_well_formed('"Who left this here?" said MiaX')      # "." is a literal
    assert not is_well_formed("Once upon a time, there was a brave baker named Mia!")
    assert is_well_formed('Mia smiled and said, "Thank you, my friend!"')
    assert not is_well_formed('Mia smiled and said, "Thank you my friend!"')


def test_checker_takes_every_slot_word_and_rejects_others():
    assert is_well_formed("Every morning, she liked to watch the birds.")
    assert is_well_formed("Every autumn, he liked to read books.")
    assert not is_well_formed("Every autumn, it liked to read books.")
    assert not is_well_formed("Every year, he liked to read books.")
    assert not is_well_formed("Every autumn, he liked to read.")
    assert is_well_formed("  One night, Zoe walked to the cave alone.\n")
    assert is_well_formed("There, she found an owl feather.") is False
    assert is_well_formed("There, she found an old owl feather.")
    assert is_well_formed("There, she found a tiny owl feather.")
    # The longest words and the shortest of a slot both match whole.
    assert is_well_formed("Long ago, Ada was an honest librarian who lived near the harbour.")
    assert is_well_formed("Ben and Ada took it to the market.")
    assert not is_well_formed("Ben and Ada took it to the.")


def test_every_template_has_a_matching_regex_in_order():
    regexes = corpus._template_regexes()
    assert len(regexes) == len(TEMPLATES)
    values = {slot: words[0] for slot, words in SLOTS.items()}
    for i, template in enumerate(TEMPLATES):
        sentence = corpus._fill(template, values)
        assert regexes[i].fullmatch(sentence), template
        assert is_well_formed(sentence)
        values_last = {slot: words[-1] for slot, words in SLOTS.items()}
        assert regexes[i].fullmatch(corpus._fill(template, values_last)), template


def test_fraction_counts_non_empty_lines_only():
    good = "There, she found an old apple."
    assert well_formed_fraction(f"{good}\n   \n\nbad line\n{good}\n") == pytest.approx(2 / 3)
    assert well_formed_fraction(f"{good}\n\t\n") == 1.0
    assert well_formed_fraction("bad\nworse") == 0.0
    assert well_formed_fraction(" \n\n") == 0.0


def test_data_dir_is_the_checkout_data_folder(monkeypatch, tmp_path):
    fake = tmp_path / "pkg" / "text" / "corpus.py"
    monkeypatch.setattr(corpus, "__file__", str(fake))
    assert data_dir() == tmp_path / "data"
    (tmp_path / "pkg" / "coursedata").mkdir(parents=True)
    assert data_dir() == tmp_path / "data", "an empty coursedata folder is not the data"
    (tmp_path / "pkg" / "coursedata" / corpus.CORPUS_FILE).mkdir()
    assert data_dir() == tmp_path / "data", "a folder named corpus.txt is not the corpus"


def test_data_dir_is_the_packaged_folder_in_a_wheel(monkeypatch, tmp_path):
    fake = tmp_path / "pkg" / "text" / "corpus.py"
    monkeypatch.setattr(corpus, "__file__", str(fake))
    packaged = tmp_path / "pkg" / "coursedata"
    packaged.mkdir(parents=True)
    (packaged / corpus.CORPUS_FILE).write_text("Mia ran.\n", encoding="utf-8")
    assert data_dir() == packaged
    assert load_corpus() == "Mia ran.\n"


def test_load_corpus_reads_utf8_and_names_the_missing_file(monkeypatch, tmp_path):
    fake = tmp_path / "pkg" / "text" / "corpus.py"
    monkeypatch.setattr(corpus, "__file__", str(fake))
    with pytest.raises(FileNotFoundError) as error:
        load_corpus()
    assert str(error.value) == (f"course corpus not found at {tmp_path / 'data' / 'corpus.txt'}: "
                                "run python data/make_corpus.py")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "corpus.txt").write_bytes("Zoë smiled.\n".encode())
    assert load_corpus() == "Zoë smiled.\n"


def test_load_corpus_reads_utf8_whatever_the_locale(monkeypatch, tmp_path):
    # On a machine whose locale encoding is Latin-1 (a Windows code page), reading without
    # encoding="utf-8" would turn "ë" into two characters.
    import io

    real = io.text_encoding
    monkeypatch.setattr(io, "text_encoding",
                        lambda encoding, stacklevel=2: "latin-1" if encoding is None else real(encoding))
    monkeypatch.setattr(corpus, "__file__", str(tmp_path / "pkg" / "text" / "corpus.py"))
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "corpus.txt").write_bytes("Zoë smiled.\n".encode())
    assert load_corpus() == "Zoë smiled.\n"


def test_noun_phrases_pair_every_adjective_with_every_noun():
    assert corpus._noun_phrases(["old", "red"], ["box", "owl feather"]) == [
        "an old box", "an old owl feather", "a red box", "a red owl feather"]
    assert corpus._noun_phrases([], ["box"]) == []


def test_each_later_section_appears_when_the_draw_is_below_nine_tenths():
    # random() in [0, 0.9) keeps a section, [0.9, 1) drops it: 0.9 itself drops it.
    assert len(generate_story(FixedDraw(1, 0.9))) == 2
    assert len(generate_story(FixedDraw(1, 0.8999999999999999))) == len(STORY)


@pytest.mark.parametrize(("call", "message"), [
    (lambda: is_well_formed(None), "sentence is None (a NoneType), expected a str"),
    (lambda: is_well_formed(b"Mia ran."), "sentence is b'Mia ran.' (a bytes), expected a str"),
    (lambda: well_formed_fraction(["a"]), "text is ['a'] (a list), expected a str"),
    (lambda: with_article(3), "phrase is 3 (a int), expected a str"),
    (lambda: starts_with_vowel_sound(None), "phrase is None (a NoneType), expected a str"),
    (lambda: generate_story(3), "rng is 3 (a int), expected a random.Random"),
    (lambda: generate_corpus(seed="1"), "seed is '1' (a str), expected an int"),
    (lambda: generate_corpus(seed=1.0), "seed is 1.0 (a float), expected an int"),
    (lambda: generate_corpus(seed=True), "seed is True (a bool), expected an int"),
    (lambda: generate_corpus(min_bytes=2.5), "min_bytes is 2.5 (a float), expected an int >= 0"),
])
def test_bad_input_is_refused_with_a_type_error_naming_the_argument(call, message):
    with pytest.raises(TypeError) as error:
        call()
    assert str(error.value) == message


def test_negative_min_bytes_is_refused():
    with pytest.raises(ValueError) as error:
        generate_corpus(min_bytes=-1)
    assert str(error.value) == "min_bytes is -1, expected an int >= 0"


def test_numpy_integer_seed_and_size_give_the_int_corpus():
    np = pytest.importorskip("numpy")
    assert generate_corpus(seed=np.int64(4), min_bytes=np.int64(300)) == generate_corpus(4, 300)


def test_corpus_adds_up_the_sizes_of_all_its_stories(monkeypatch):
    # Stories "a", "bb", "ccc", ... of 3, 4, 5, ... bytes each with their newline and blank line:
    # 3 + 4 + 5 = 12 reaches 10 after three. A size that is not summed would never get there
    # (or only at the eighth story); a stub that refuses an eleventh story stops such a loop.
    drawn = []

    def story(rng):
        assert len(drawn) < 10, "more than ten stories drawn"
        drawn.append(chr(ord("a") + len(drawn)) * (len(drawn) + 1))
        return [drawn[-1]]

    monkeypatch.setattr(corpus, "generate_story", story)
    assert generate_corpus(seed=0, min_bytes=10) == "a\n\nbb\n\nccc\n"
