"""The rich corpus: byte-identical regeneration, real morphology, and a checker that can say no."""

from __future__ import annotations

import random

import pytest
from shared_tools import FixedDraw

from helpers.text import corpus
from helpers.text import corpus_rich as cr
from helpers.text import lexicon as lx
from helpers.text.corpus_rich import (
    FORMS,
    RICH_CORPUS_FILE,
    RICH_CORPUS_MIN_BYTES,
    SLOTS,
    TEMPLATES,
    data_dir,
    generate_rich_corpus,
    generate_rich_story,
    is_rich_well_formed,
    known_word_fraction,
    load_rich_corpus,
    rich_well_formed_fraction,
    word_forms,
)


def test_committed_rich_corpus_is_byte_identical_to_a_regeneration():
    committed = (data_dir() / RICH_CORPUS_FILE).read_bytes()
    assert generate_rich_corpus().encode("utf-8") == committed


def test_rich_corpus_is_a_few_megabytes_of_varied_text():
    text = load_rich_corpus()
    size = len(text.encode("utf-8"))
    assert RICH_CORPUS_MIN_BYTES <= size <= 3_000_000
    assert len(word_forms()) >= 2_000
    used = set(text.replace('"', " ").replace(",", " ").replace(".", " ").split())
    assert len(used) >= 2_000  # the corpus really uses thousands of distinct forms
    for sample in ("boxes", "berries", "carried", "hopped", "untied", "travelled", "wolves", "bigger", "happiest",
                   "unhappy", "quietly", "children", "went", "forty-two", "4,250", "7:30",
                   "o'clock", "21st"):
        assert sample in text, sample


def test_every_generated_sentence_is_well_formed():
    text = load_rich_corpus()
    assert rich_well_formed_fraction(text) == 1.0
    stories = [story for story in text.split("\n\n") if story.strip()]
    assert len(stories) > 5_000
    kinds = {"tale": 0, "dialogue": 0, "diary": 0}
    for story in stories:
        first = story.splitlines()[0]
        kind = "dialogue" if first.startswith('"') else "diary" if first[:3] in (
            "Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun") else "tale"
        kinds[kind] += 1
    assert min(kinds.values()) > len(stories) // 5  # all three forms appear often


def test_fresh_stories_from_other_seeds_are_well_formed_too():
    rng = random.Random(7)
    for _ in range(300):
        for sentence in generate_rich_story(rng):
            assert is_rich_well_formed(sentence), sentence


@pytest.mark.parametrize("broken", [
    "",
    "Once upon a time",  # cut short
    "On Monday, the 3rd of May, Mia walked to the river",  # no full stop
    "On Monday, the 3rd of May, Mia walkd to the river.",  # misspelt past
    "On Monday, the 3rd of May, Mia walk to the river.",  # base form where a past belongs
    "On Funday, the 3rd of May, Mia walked to the river.",  # no such weekday
    "On Monday, the 3th of May, Mia walked to the river.",  # wrong ordinal suffix
    "Once upon a time, a honest baker named Mia lived near the river.",  # a/an wrong
    "Once upon a time, an brave baker named Mia lived near the river.",
    '"I saw seven foxs and 12 owls," said Tom.',  # wrong plural
    '"I saw seven foxes and 12 owls, said Tom.',  # missing quote
    "The weather was sunny, sunnyer than yesterday.",  # wrong comparative
    "At 7:30 I ate seven cookies, which were very delicious",
    "river the to walked Mia",
    "Once upon a time, a brave baker named Mia lived near the river. Extra.",
])
def test_broken_sentences_are_rejected(broken):
    assert not is_rich_well_formed(broken)


def test_valid_hand_written_sentences_are_accepted():
    for sentence in ["On Monday, the 3rd of May, Mia walked to the river.",
                     "Once upon a time, an honest baker named Tom lived near the harbour.",
                     '"I saw seven foxes and 12 owls," said Tom.',
                     "The weather was sunny, sunnier than yesterday.",
                     "Tuesday, 14 March"]:
        assert is_rich_well_formed(sentence), sentence


def test_well_formed_fraction_and_type_check():
    assert rich_well_formed_fraction("") == 0.0
    assert rich_well_formed_fraction("Tuesday, 14 March\nnot a sentence\n\n") == 0.5
    with pytest.raises(TypeError, match="sentence"):
        is_rich_well_formed(3)


@pytest.mark.parametrize(("rule", "cases"), [
    (lx.plural, {"cat": "cats", "box": "boxes", "peach": "peaches", "berry": "berries",
                 "day": "days", "child": "children", "knife": "knives", "sheep": "sheep"}),
    (lx.past, {"walk": "walked", "bake": "baked", "carry": "carried", "stop": "stopped",
               "play": "played", "visit": "visited", "open": "opened", "travel": "travelled",
               "go": "went", "catch": "caught"}),
    (lx.present_participle, {"walk": "walking", "bake": "baking", "tie": "tying", "run": "running",
                             "see": "seeing", "open": "opening", "fix": "fixing"}),
    (lx.third_person, {"run": "runs", "wash": "washes", "carry": "carries", "go": "goes",
                       "play": "plays"}),
    (lx.comparative, {"big": "bigger", "brave": "braver", "happy": "happier", "slow": "slower",
                      "quiet": "quieter", "good": "better"}),
    (lx.superlative, {"big": "biggest", "brave": "bravest", "happy": "happiest", "bad": "worst"}),
    (lx.adverb, {"quick": "quickly", "happy": "happily", "gentle": "gently", "true": "truly",
                 "careful": "carefully"}),
    (lx.ordinal, {1: "1st", 2: "2nd", 3: "3rd", 4: "4th", 11: "11th", 12: "12th", 13: "13th",
                  21: "21st", 22: "22nd"}),
    (lx.number_word, {0: "zero", 7: "seven", 13: "thirteen", 20: "twenty", 42: "forty-two",
                      99: "ninety-nine"}),
])
def test_spelling_rules_on_hand_picked_words(rule, cases):
    assert {word: rule(word) for word in cases} == cases


def test_number_word_range_is_checked():
    with pytest.raises(ValueError, match="n is 100"):
        lx.number_word(100)


def test_templates_are_all_used():
    text = load_rich_corpus()
    lines = set(text.splitlines())
    # each template's fixed opening (up to its first slot) appears at the start of some line
    for template in TEMPLATES:
        opening = template.split("{", 1)[0]
        assert any(line.startswith(opening) for line in lines), template


def test_known_word_fraction_counts_words_the_grammar_knows():
    assert known_word_fraction(load_rich_corpus()[:50_000].rsplit("\n", 1)[0]) == 1.0
    assert known_word_fraction("Mia walkd to the rivr.") == 3 / 5
    assert known_word_fraction('"It cost 4,250 coins," said the potter at 7:30 on the 21st.') == 1.0
    # letter O for digit 0 and back: "7:3", "O", "forty-tw" and "0" are not words of the grammar
    assert known_word_fraction("At 7:3O, forty-tw0 owls") == 2 / 6
    assert known_word_fraction("") == 0.0 and known_word_fraction(" ,.!? ") == 0.0
    with pytest.raises(TypeError, match="text"):
        known_word_fraction(["Mia"])


# helpers.text.corpus_rich: the rich grammar's generator, checker and word measures, asserted
# exactly on tiny inputs.
#
#

def test_forms_apply_every_rule_to_every_word_in_order_without_repeats():
    assert cr._forms(["cat", "box"], lx.plural, cr._same) == ("cats", "boxes", "cat", "box")
    assert cr._forms(["sheep", "cat", "sheep"], lx.plural, cr._same) == ("sheep", "cats", "cat")
    assert cr._forms([], lx.plural) == ()
    assert cr._same("box") == "box"


def test_a_numbered_slot_takes_the_words_of_its_slot():
    assert cr._vocab("animal") == SLOTS["animal"]
    assert cr._vocab("animal2") == SLOTS["animal"]
    assert cr._vocab("adj_person12") == SLOTS["adj_person"]
    with pytest.raises(KeyError):
        cr._vocab("thingX")  # only digits are stripped
    with pytest.raises(KeyError):
        cr._vocab("2thing")


def test_fill_uses_story_values_draws_the_rest_and_fits_each_article():
    values = {"hero": "Mia", "thing": "umbrella"}
    assert cr._fill("{hero} has {a} {thing}.", values, random.Random(0)) == "Mia has an umbrella."
    assert cr._fill("{hero} has {a} {thing}.", {"hero": "Mia", "thing": "box"},
                    random.Random(0)) == "Mia has a box."
    assert cr._fill("{a} {adj_thing}", {"adj_thing": "useful"}, random.Random(0)) == "a useful"
    assert cr._fill("{a} {adj_thing}", {"adj_thing": "old"}, random.Random(0)) == "an old"
    # A slot with no story value is drawn from the generator, one draw per slot, in order.
    rng = random.Random(3)
    expected_animal = rng.choice(SLOTS["animal"])
    expected_thing = rng.choice(SLOTS["thing"])
    assert cr._fill("{animal} and {thing2}", {}, random.Random(3)) == (
        f"{expected_animal} and {expected_thing}")
    # An article with no slot after it looks up the empty name: an error, not a guess.
    with pytest.raises(KeyError) as error:
        cr._fill("{thing} {a}", {"thing": "box"}, random.Random(0))
    assert error.value.args == ("",)
    # An empty story value counts as none.
    assert cr._fill("{hero}", {"hero": ""}, random.Random(0)) in SLOTS["hero"]


def test_word_forms_are_the_slot_words_only():
    forms = word_forms()
    assert forms == {w for words in SLOTS.values() for w in words}
    assert {"cats", "Monday", "4,250", "7:30", "21st", "forty-two", "unhappy"} <= forms
    assert "o'clock" not in forms and "Dear" not in forms


def _replay(seed):
    """generate_rich_story's draws, replayed by hand from the same seed."""
    rng = random.Random(seed)
    form = rng.choice(list(FORMS))
    she = rng.random() < 0.5
    hero = rng.choice(lx.NAMES_SHE if she else lx.NAMES_HE)
    names = [n for n in SLOTS["hero"] if n != hero]
    values = {"hero": hero, "friend": rng.choice(names), "Subj": "She" if she else "He",
              "subj": "she" if she else "he", "poss": "her" if she else "his"}
    story, choice = [], 0
    for i, section in enumerate(FORMS[form]):
        if i > 0 and rng.random() >= 0.9:
            continue
        choice = choice % len(section) if i in cr.ANSWERS[form] else rng.randrange(len(section))
        story.append(cr._fill(section[choice], values, rng))
    return form, hero, values["friend"], story


@pytest.mark.parametrize("seed", range(8))
def test_story_is_the_documented_draws(seed):
    form, hero, friend, story = _replay(seed)
    assert generate_rich_story(random.Random(seed)) == story
    assert hero != friend
    assert all(is_rich_well_formed(s) for s in story)


def _story_values(monkeypatch, rng):
    """The story-wide values generate_rich_story passes to _fill."""
    seen = []
    monkeypatch.setattr(cr, "_fill", lambda template, values, rng: seen.append(dict(values)) or "")
    generate_rich_story(rng)
    monkeypatch.undo()
    assert seen and all(v == seen[0] for v in seen)
    return seen[0]


@pytest.mark.parametrize("seed", range(6))
def test_pronouns_follow_the_heros_name_and_a_half_makes_a_he(monkeypatch, seed):
    he = _story_values(monkeypatch, FixedDraw(seed, 0.5))
    assert he["hero"] in lx.NAMES_HE and (he["Subj"], he["subj"], he["poss"]) == ("He", "he", "his")
    she = _story_values(monkeypatch, FixedDraw(seed, 0.4999999999999999))
    assert she["hero"] in lx.NAMES_SHE
    assert (she["Subj"], she["subj"], she["poss"]) == ("She", "she", "her")
    for values in (he, she):
        assert values["friend"] in SLOTS["friend"] and values["friend"] != values["hero"]
        assert set(values) == {"hero", "friend", "Subj", "subj", "poss"}


def test_each_later_section_appears_when_the_draw_is_below_nine_tenths():
    for seed in range(6):
        form = random.Random(seed).choice(list(FORMS))
        assert len(generate_rich_story(FixedDraw(seed, 0.9))) == 1
        assert len(generate_rich_story(FixedDraw(seed, 0.8999999999999999))) == len(FORMS[form])


def test_answers_take_the_choice_of_their_question():
    # Dialogue sections 2/3 (question, answer), 4/5 and 6/7 pair up; the tale's 2/3 too.
    for seed in range(120):
        rng = random.Random(seed)
        story = generate_rich_story(FixedDraw(seed, 0.0))
        form = rng.choice(list(FORMS))
        sections = FORMS[form]
        picks = [[j for j, t in enumerate(section) if _matches(t, story[i])]
                 for i, section in enumerate(sections)]
        for i in cr.ANSWERS[form]:
            question = picks[i - 1]
            answer = picks[i]
            assert any(q % len(sections[i]) in answer for q in question), (form, i, story)


def _matches(template, sentence):
    index = TEMPLATES.index(template)
    regex, slots = cr._template_regexes()[index]
    match = regex.fullmatch(sentence)
    return bool(match) and cr._slots_fit(match.groups(), slots)


def test_corpus_stops_at_the_first_story_that_reaches_min_bytes():
    assert generate_rich_corpus(seed=3, min_bytes=0) == ""
    one = "\n".join(generate_rich_story(random.Random(3))) + "\n"
    n = len(one.encode("utf-8"))
    assert generate_rich_corpus(seed=3, min_bytes=1) == one
    assert generate_rich_corpus(seed=3, min_bytes=n + 1) == one
    two = generate_rich_corpus(seed=3, min_bytes=n + 2)
    assert two.startswith(one + "\n") and len(two.split("\n\n")) == 2
    assert two.endswith("\n") and not two.endswith("\n\n")


def test_corpus_counts_bytes_not_characters(monkeypatch):
    monkeypatch.setattr(cr, "generate_rich_story", lambda rng: ["é" * 9])
    assert generate_rich_corpus(seed=0, min_bytes=20) == "é" * 9 + "\n"
    assert generate_rich_corpus(seed=0, min_bytes=21).count("é") == 18


def test_corpus_adds_up_the_sizes_of_all_its_stories(monkeypatch):
    # Stories of 3, 4, 5, ... bytes (with newline and blank line): 3 + 4 + 5 = 12 reaches 10 after
    # three. A stub that refuses an eleventh story stops a loop whose size does not grow.
    drawn = []

    def story(rng):
        assert len(drawn) < 10, "more than ten stories drawn"
        drawn.append(chr(ord("a") + len(drawn)) * (len(drawn) + 1))
        return [drawn[-1]]

    monkeypatch.setattr(cr, "generate_rich_story", story)
    assert generate_rich_corpus(seed=0, min_bytes=10) == "a\n\nbb\n\nccc\n"


@pytest.mark.parametrize("min_bytes", [700, 2500])
def test_corpus_is_the_seeded_stories(min_bytes):
    text = generate_rich_corpus(seed=11, min_bytes=min_bytes)
    stories = text.split("\n\n")
    assert len(text.encode("utf-8")) + 1 >= min_bytes
    assert len("\n\n".join(stories[:-1]).encode("utf-8")) + 2 < min_bytes
    rng = random.Random(11)
    assert stories == ["\n".join(generate_rich_story(rng)) + ("\n" if i == len(stories) - 1 else "")
                       for i in range(len(stories))]


def test_checker_reads_articles_slots_and_punctuation():
    assert is_rich_well_formed("Dear diary, today I found an old box at the river.")
    assert not is_rich_well_formed("Dear diary, today I found a old box at the river.")
    assert is_rich_well_formed("Dear diary, today I found a useful box at the river.")
    assert not is_rich_well_formed("Dear diary, today I found an useful box at the river.")
    assert not is_rich_well_formed("Dear diary, today I found an old boxes at the river.")
    assert not is_rich_well_formed("Dear diary, today I found an old box at the river")
    assert is_rich_well_formed("  \tMonday, 3 May\n")
    assert not is_rich_well_formed("Monday, 30 May")
    assert not is_rich_well_formed("")
    assert is_rich_well_formed('"Goodbye, Tom!"')
    assert is_rich_well_formed("I am braver than I was on Friday.")
    assert not is_rich_well_formed("I am braver than I was on Fryday.")


def test_slots_fit_checks_every_word_and_every_article():
    assert cr._slots_fit(("an", "old", "box"), ["a", "adj_thing", "thing"])
    assert not cr._slots_fit(("a", "old", "box"), ["a", "adj_thing", "thing"])
    assert not cr._slots_fit(("an", "old", "boxes"), ["a", "adj_thing", "thing"])
    assert not cr._slots_fit(("the", "old", "box"), ["a", "adj_thing", "thing"])
    assert cr._slots_fit(("old", "a", "useful"), ["adj_thing", "a", "adj_thing"])
    assert not cr._slots_fit(("old", "an", "useful"), ["adj_thing", "a", "adj_thing"])
    assert cr._slots_fit((), [])
    with pytest.raises(ValueError):  # one word per slot, checked
        cr._slots_fit(("old",), ["adj_thing", "thing"])
    with pytest.raises(ValueError):
        cr._slots_fit(("old", "box"), ["adj_thing"])


def test_fraction_counts_non_empty_lines_only():
    good = "Monday, 3 May"
    assert rich_well_formed_fraction(f"{good}\n  \n\nbad line\n{good}\n") == pytest.approx(2 / 3)
    assert rich_well_formed_fraction(f"{good}\n\t\n") == 1.0
    assert rich_well_formed_fraction("bad\nworse") == 0.0
    assert rich_well_formed_fraction(" \n\n") == 0.0


def test_known_word_fraction_reads_words_and_numbers_whole():
    assert known_word_fraction("cats dogs zzz") == pytest.approx(2 / 3)
    assert known_word_fraction("o'clock forty-two 4,250 7:30 21st") == 1.0
    assert known_word_fraction("cat's") == 0.0
    assert known_word_fraction("Dear diary") == 1.0  # template words count too
    assert known_word_fraction("... !!") == 0.0
    assert known_word_fraction("") == 0.0
    assert known_word_fraction("4,2500 cats") == 0.5


def test_load_rich_corpus_reads_utf8_and_names_the_missing_file(monkeypatch, tmp_path):
    import io

    monkeypatch.setattr(corpus, "__file__", str(tmp_path / "pkg" / "text" / "corpus.py"))
    with pytest.raises(FileNotFoundError) as error:
        load_rich_corpus()
    assert str(error.value) == (f"rich corpus not found at {tmp_path / 'data' / 'corpus_rich.txt'}: "
                                "run python data/make_corpus.py")
    real = io.text_encoding
    monkeypatch.setattr(io, "text_encoding",
                        lambda encoding, stacklevel=2: "latin-1" if encoding is None else real(encoding))
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "corpus_rich.txt").write_bytes("Zoë smiled.\n".encode())
    assert load_rich_corpus() == "Zoë smiled.\n"


@pytest.mark.parametrize(("call", "message"), [
    (lambda: is_rich_well_formed(None), "sentence is a NoneType, expected a str"),
    (lambda: is_rich_well_formed(5), "sentence is a int, expected a str"),
    (lambda: rich_well_formed_fraction(None), "text is a NoneType, expected a str"),
    (lambda: rich_well_formed_fraction(["Mia ran."]), "text is a list, expected a str"),
    (lambda: known_word_fraction(b"cat"), "text is a bytes, expected a str"),
    (lambda: generate_rich_story(7), "rng is 7 (a int), expected a random.Random"),
    (lambda: generate_rich_corpus(seed="7"), "seed is '7' (a str), expected an int"),
    (lambda: generate_rich_corpus(seed=7.0), "seed is 7.0 (a float), expected an int"),
    (lambda: generate_rich_corpus(min_bytes=None), "min_bytes is None (a NoneType), expected an int >= 0"),
])
def test_bad_input_is_refused_with_a_type_error_naming_the_argument(call, message):
    with pytest.raises(TypeError) as error:
        call()
    assert str(error.value) == message


def test_negative_min_bytes_is_refused():
    with pytest.raises(ValueError) as error:
        generate_rich_corpus(min_bytes=-5)
    assert str(error.value) == "min_bytes is -5, expected an int >= 0"


def test_numpy_integer_seed_and_size_give_the_int_corpus():
    np = pytest.importorskip("numpy")
    assert generate_rich_corpus(np.int64(4), np.int64(400)) == generate_rich_corpus(4, 400)
    assert cr.generate_rich_story(random.Random(4)) == cr.generate_rich_story(random.Random(4))
