"""The word stems of the rich corpus (`helpers.text.corpus_rich`) and the English morphology that
turns them into word forms: plurals, past tenses, -ing forms, comparatives, un- and -ly.

Each stem is written once; every other form is computed by the spelling rules below, with a short
table of irregular forms for the words English keeps from older times (child -> children,
go -> went, good -> better). `tests/text/test_corpus_rich.py` checks the rules on hand-picked words.
"""

from __future__ import annotations

from helpers import checks

VOWELS = "aeiou"

# --- the stems -------------------------------------------------------------------------------

NAMES_SHE = ("Mia Lena Asha Nora Zoe Ines Maya Rosa Yuki Ada Lucy Priya Hana Ella Sofia Amara "
             "Clara Eva Freya Grace Iris Julia Kira Lila Mara Nina Olga Paula Rita Sara Tara "
             "Vera Wendy Alma Beth Dana Emma Fatima Gita Helen").split()
NAMES_HE = ("Tom Ravi Omar Leo Sam Kenji Noah Ben Ivan Max Felix Arjun Hugo Luca Theo Kofi "
            "Adam Bruno Carlos Dev Eli Finn Gus Hiro Igor Jack Karl Liam Marco Nils Oscar Pablo "
            "Rafael Sven Tariq Umar Victor Walter Yusuf Zane").split()

# Nouns by what they name, so that sentences make sense: people eat foods, not ladders.
ANIMALS = ("dog cat goat parrot rabbit horse duck turtle fox wolf sheep goose mouse owl frog bee "
           "pony donkey lamb hen crow swan deer bear lion tiger monkey otter beaver squirrel "
           "hedgehog badger mole snail spider butterfly puppy kitten calf fish whale seal "
           "camel zebra moose robin sparrow pigeon eagle hawk falcon beetle ant ladybird worm "
           "crab lobster octopus penguin panda koala kangaroo rhino hippo giraffe "
           "raccoon ostrich peacock").split()
FOODS = ("apple pear plum cherry peach lemon orange banana berry grape melon carrot potato "
         "tomato onion bean pea cabbage pumpkin nut cookie cake pie muffin bun sandwich "
         "pancake biscuit egg olive radish turnip peanut strawberry blueberry raspberry "
         "apricot coconut mango lime fig date walnut almond pretzel dumpling noodle "
         "cupcake doughnut waffle cracker tart lolly toffee").split()
THINGS = ("box key map ball book lamp shell hat kite coin drum ring basket umbrella violin "
          "anchor ladder feather bottle candle clock compass cup dish flag glove hammer jar "
          "kettle knife leaf letter mirror needle net paintbrush pebble pencil pillow plate "
          "rope scarf spoon stamp stick stone sock thimble torch toy trumpet wheel whistle "
          "brush bell bucket button chair crown dress jacket wagon boat sled tent bench "
          "ribbon puzzle marble shovel fork lantern blanket bowl pot pan saucer teapot "
          "envelope parcel postcard ticket wallet purse badge medal trophy helmet boot "
          "sandal mitten necklace bracelet brooch statue vase painting poster globe "
          "telescope microscope magnet battery bicycle scooter raft canoe kayak").split()
PLACES = ("river forest market beach hill garden lake bridge library harbour meadow cave park "
          "mountain bakery school village city farm castle island valley field orchard pond "
          "station museum kitchen attic cellar barn tower lighthouse square stream "
          "playground zoo desert jungle swamp canyon glacier volcano cliff shore bay "
          "workshop theatre cinema hospital stable cottage palace temple fountain "
          "tunnel quarry vineyard").split()
PEOPLE = ("baker farmer painter sailor teacher doctor gardener fisher potter singer tailor "
          "builder writer inventor librarian pilot cook nurse driver miller dancer hunter "
          "judge knight guard poet child person neighbour stranger cousin").split()
# Family and gendered words: "my aunt", "ten women", never "a woman named Tom".
FAMILY = ("mother father sister brother grandmother grandfather aunt uncle king queen woman man "
          "boy girl").split()

# Verbs by how they are used.
VERBS_THING = ("carry find paint wash open drop fix hide lift pull push clean fold wrap lock tie "
               "pack load cover bury mend polish drag kick catch throw shake hold fetch sell buy "
               "borrow keep lose bring give send take hang ring fill empty stack count measure "
               "weigh sketch trade collect guard carve chip spot grab hug juggle balance bend "
               "scrub dust paint sort label mark pat rub tap tug wipe zip clip drip "
               "sew knit glue stamp wave whisk").split()
VERBS_FOOD = ("eat cook bake peel slice share taste chop boil fry roast pick grow plant "
              "wash sell buy mash stir squeeze dry hide").split()
VERBS_ALONE = ("run jump sleep laugh sing dance swim climb walk hurry wait shout whisper cry "
               "smile rest play travel wander hop skip shiver sneeze yawn giggle clap nod "
               "cheer sigh listen dream fly sit stand hum paddle skate ski jog hike bounce "
               "tumble wobble stumble snore blink frown grin wink scream howl").split()
# Verbs of moving somewhere: "to the river".
VERBS_TO = ("run walk hurry travel wander hop skip go come ride march race stroll drive "
            "sail fly paddle crawl").split()
# Verbs that take un- in front (lock -> unlock).
UN_VERBS = ("lock tie pack load cover wrap fold do zip clip bolt buckle button dress "
            "hook latch screw seal twist wind").split()
# Verbs that take re- in front (paint -> repaint).
RE_VERBS = ("paint fill pack load wrap fold wash tie count measure stack polish sort label "
            "sew knit glue mark").split()
# Adjectives that make a noun with -ness (kind -> kindness, happy -> happiness).
NESS_SOURCES = ("happy sad kind dark bright calm quiet lazy silly gentle clever soft sweet weak "
                "fresh fair polite friendly tired bold cool fierce gentle wild ready "
                "unhappy unkind").split()
# Verbs that name a person who does them with -er (run -> runner, dance -> dancer).
AGENT_SOURCES = ("run swim climb sing dance jump walk travel ride dream listen sleep play race "
                 "paddle skate ski jog hike juggle knit").split()

ADJ_SHORT = ("big small tall short old young new brave kind quick slow warm cold hot wet dry "
             "loud quiet soft hard bright dark clean dirty happy sad busy lazy funny silly "
             "lucky tiny heavy light fast strong weak wise calm proud rich poor safe red "
             "green blue fine deep wide thin fat sweet sour fresh ripe shiny muddy sunny "
             "windy cloudy rainy snowy gentle simple clever noisy tidy smooth rough sharp "
             "round flat odd strange friendly easy late early hungry thirsty sleepy cheap "
             "great tough neat plain grand bold cool crisp damp dull faint fierce firm grim "
             "harsh jolly keen kind mild narrow pale pretty proud ready shallow steep "
             "stiff sticky tame wild").split()
ADJ_LONG = ("beautiful careful curious wonderful famous honest polite patient cheerful "
            "helpful useful peaceful colourful dangerous nervous generous golden magic "
            "important unusual excited surprised tired delicious enormous ancient "
            "interesting comfortable").split()
# Adjectives that take un- in front (happy -> unhappy).
UN_ADJECTIVES = ("happy kind lucky safe tidy fair friendly wise usual fit well clean ripe "
                 "even known common certain able sure true welcome fortunate "
                 "comfortable important helpful").split()
# The un- adjectives that can describe how someone is or feels.
UN_PERSON = ("happy kind lucky safe tidy friendly wise well fit sure comfortable helpful "
             "fortunate").split()
ADJ_PERSON = ("brave kind young old quick slow busy lazy funny silly lucky strong wise calm "
              "proud rich poor happy sad clever noisy friendly hungry thirsty sleepy gentle "
              "curious careful cheerful honest polite patient helpful generous nervous tired "
              "excited surprised famous bold cool fierce jolly keen mild pale pretty ready wild "
              "grim").split()
ADJ_THING = ("big small tall short old new warm cold wet dry soft hard bright dark clean dirty "
             "tiny heavy light red green blue shiny muddy round flat strange smooth rough "
             "sharp deep wide thin sweet fresh ripe beautiful golden magic useful colourful "
             "enormous ancient odd plain grand neat cheap cool crisp damp dull faint firm narrow "
             "pale pretty shallow steep stiff sticky").split()
ADJ_FOOD = ("sweet sour fresh ripe warm cold hot big small red green soft hard "
            "delicious tiny juicy crunchy").split()
# Adjectives that give a good -ly adverb (quick -> quickly).
ADVERB_SOURCES = ("quick slow quiet soft loud happy sad busy lazy calm proud kind brave gentle "
                  "careful cheerful honest polite patient nervous curious sleepy hungry noisy "
                  "wise lucky simple bright warm sudden eager silent proper bold fierce firm wild "
                  "brisk").split()
ADJ_WEATHER = ("warm cold hot wet dry bright dark sunny windy cloudy rainy snowy calm "
               "quiet grey").split()

WEEKDAYS = "Monday Tuesday Wednesday Thursday Friday Saturday Sunday".split()
MONTHS = ("January February March April May June July August September October November "
          "December").split()

# --- irregular forms -------------------------------------------------------------------------

IRREGULAR_PLURALS = {
    "child": "children", "woman": "women", "man": "men", "person": "people", "mouse": "mice",
    "goose": "geese", "sheep": "sheep", "deer": "deer", "fish": "fish", "knife": "knives",
    "leaf": "leaves", "wolf": "wolves", "calf": "calves", "potato": "potatoes",
    "tomato": "tomatoes", "scarf": "scarves",
}
IRREGULAR_PASTS = {
    "run": "ran", "sleep": "slept", "sing": "sang", "swim": "swam", "find": "found",
    "hide": "hid", "catch": "caught", "throw": "threw", "shake": "shook", "hold": "held",
    "sell": "sold", "buy": "bought", "keep": "kept", "lose": "lost", "bring": "brought",
    "give": "gave", "send": "sent", "take": "took", "hang": "hung", "ring": "rang",
    "eat": "ate", "grow": "grew", "fry": "fried", "go": "went", "come": "came", "ride": "rode",
    "drive": "drove", "fly": "flew", "sit": "sat", "stand": "stood", "do": "did",
    "undo": "undid", "dream": "dreamt", "see": "saw", "wind": "wound", "bend": "bent",
}
IRREGULAR_COMPARATIVES = {"good": ("better", "best"), "bad": ("worse", "worst"),
                          "far": ("farther", "farthest")}
NUMBER_WORDS = ("zero one two three four five six seven eight nine ten eleven twelve thirteen "
                "fourteen fifteen sixteen seventeen eighteen nineteen").split()
TENS_WORDS = "twenty thirty forty fifty sixty seventy eighty ninety".split()

# --- the spelling rules ----------------------------------------------------------------------


# British spelling doubles the final l of these two-syllable verbs too: travelled, travelling.
DOUBLES_FINAL_L = ("travel", "label", "signal")


def _ends_cvc(word: str) -> bool:
    """One-syllable word ending consonant-vowel-consonant (stop, big): it doubles the last letter."""
    if word in DOUBLES_FINAL_L:
        return True
    syllables = sum(1 for i, ch in enumerate(word)
                    if ch in VOWELS and (i == 0 or word[i - 1] not in VOWELS))
    return (syllables == 1 and len(word) >= 3 and word[-1] not in VOWELS + "wxy"
            and word[-2] in VOWELS and word[-3] not in VOWELS)


def _consonant_y(word: str) -> bool:
    return len(word) >= 2 and word[-1] == "y" and word[-2] not in VOWELS


def _add_s(word: str) -> str:
    """The regular -s ending of plurals and of verbs: cats, boxes, berries; runs, washes, carries."""
    if word.endswith(("s", "x", "z", "ch", "sh")):
        return word + "es"
    if _consonant_y(word):
        return word[:-1] + "ies"
    return word + "s"


def plural(noun: str) -> str:
    """cat -> cats, box -> boxes, berry -> berries, child -> children."""
    if noun in IRREGULAR_PLURALS:
        return IRREGULAR_PLURALS[noun]
    return _add_s(noun)


def third_person(verb: str) -> str:
    """run -> runs, wash -> washes, carry -> carries, go -> goes, fish -> fishes."""
    if verb in ("go", "do", "undo"):
        return verb + "es"
    return _add_s(verb)  # the irregular noun plurals are not verb forms: she fishes, not fishs


def past(verb: str) -> str:
    """walk -> walked, bake -> baked, carry -> carried, stop -> stopped, go -> went."""
    if verb in IRREGULAR_PASTS:
        return IRREGULAR_PASTS[verb]
    if verb.endswith("e"):
        return verb + "d"
    if _consonant_y(verb):
        return verb[:-1] + "ied"
    if _ends_cvc(verb):
        return verb + verb[-1] + "ed"
    return verb + "ed"


def present_participle(verb: str) -> str:
    """walk -> walking, bake -> baking, tie -> tying, run -> running, see -> seeing."""
    if verb.endswith("ie"):
        return verb[:-2] + "ying"
    if verb.endswith("e") and not verb.endswith(("ee", "ye", "oe")) and len(verb) > 2:
        return verb[:-1] + "ing"
    if _ends_cvc(verb):
        return verb + verb[-1] + "ing"
    return verb + "ing"


def comparative(adjective: str) -> str:
    """big -> bigger, brave -> braver, happy -> happier, good -> better."""
    if adjective in IRREGULAR_COMPARATIVES:
        return IRREGULAR_COMPARATIVES[adjective][0]
    if adjective.endswith("e"):
        return adjective + "r"
    if _consonant_y(adjective):
        return adjective[:-1] + "ier"
    if _ends_cvc(adjective):
        return adjective + adjective[-1] + "er"
    return adjective + "er"


def superlative(adjective: str) -> str:
    """big -> biggest, brave -> bravest, happy -> happiest, good -> best."""
    if adjective in IRREGULAR_COMPARATIVES:
        return IRREGULAR_COMPARATIVES[adjective][1]
    return comparative(adjective)[:-2] + "est"


def adverb(adjective: str) -> str:
    """quick -> quickly, happy -> happily, gentle -> gently, true -> truly, full -> fully."""
    if adjective == "true":
        return "truly"
    if _consonant_y(adjective):
        return adjective[:-1] + "ily"
    if adjective.endswith("le") and adjective[-3] not in VOWELS:
        return adjective[:-1] + "y"
    if adjective.endswith("ll"):
        return adjective + "y"
    return adjective + "ly"


def ness(adjective: str) -> str:
    """kind -> kindness, happy -> happiness, unhappy -> unhappiness."""
    return (adjective[:-1] + "i" if _consonant_y(adjective) else adjective) + "ness"


def agent(verb: str) -> str:
    """Who does it: sing -> singer, dance -> dancer, run -> runner, travel -> traveller."""
    if verb.endswith("e"):
        return verb + "r"
    if _ends_cvc(verb):
        return verb + verb[-1] + "er"
    return verb + "er"


def re_prefixed(word: str) -> str:
    """paint -> repaint, filled -> refilled."""
    return "re" + word


def un(word: str) -> str:
    """happy -> unhappy, lock -> unlock."""
    return "un" + word


def number_word(n: int) -> str:
    """0..99 written out: 7 -> seven, 42 -> forty-two."""
    n = checks.integer("n", n, "a whole number from 0 to 99")
    if not 0 <= n <= 99:
        raise ValueError(f"n is {n}, expected a whole number from 0 to 99")
    if n < 20:
        return NUMBER_WORDS[n]
    tens, ones = divmod(n, 10)
    return TENS_WORDS[tens - 2] + ("" if ones == 0 else "-" + NUMBER_WORDS[ones])


def ordinal(n: int) -> str:
    """1 -> 1st, 2 -> 2nd, 3 -> 3rd, 11 -> 11th, 22 -> 22nd."""
    n = checks.non_negative_int("n", n)
    if n % 100 in (11, 12, 13):
        return f"{n}th"
    return f"{n}" + {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
