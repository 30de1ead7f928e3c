"""Arithmetic in words: a task whose every answer is checked exactly (notebook 13, section 1).

    NUMBER_WORDS              "zero" ... "eighteen"
    Fact                      a, op, b and the true result c; `question`, `answer`, `statement`
    all_facts                 every a + b and a - b (b <= a) with a, b in 0..9
    split_facts               a seeded split into training and held-out facts
    pretraining_text          the facts as plain sentences ("three plus four is seven.")
    is_correct                the exact checker: does an answer text name the right number?
    true_false_statements     statements with the true or a wrong result, labelled 1 / 0
    is_well_formed            the grammar's checker: "<number> plus <number> is <number>"?
    well_formed_statements    statements and scrambled ones, labelled by is_well_formed

The pretraining text states facts; the chat questions ("what is three plus four?") appear only
after pretraining, in supervised finetuning. The checker compares words, so accuracy is counted,
never judged by eye.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from helpers import checks

NUMBER_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine",
                "ten", "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen",
                "seventeen", "eighteen")
OPERATIONS = {"plus": lambda a, b: a + b, "minus": lambda a, b: a - b}


@dataclass(frozen=True)
class Fact:
    """a op b = c, with a, b in 0..9 and c in 0..18."""

    a: int
    op: str
    b: int

    def __post_init__(self) -> None:
        checks.one_of("op", self.op, tuple(OPERATIONS))
        for name in ("a", "b"):
            checks.number_in(name, getattr(self, name), 0, 9, expected="an int in 0..9")
        if self.op == "minus" and self.b > self.a:
            raise ValueError(f"{self.a} minus {self.b} is negative, expected b <= a")

    @property
    def c(self) -> int:
        return OPERATIONS[self.op](self.a, self.b)

    def question(self) -> str:
        return f"what is {NUMBER_WORDS[self.a]} {self.op} {NUMBER_WORDS[self.b]}?"

    def answer(self) -> str:
        return NUMBER_WORDS[self.c]

    def statement(self, result: int | None = None) -> str:
        """'three plus four is seven' (or with `result` in place of the true c)."""
        c = self.c if result is None else result
        return f"{NUMBER_WORDS[self.a]} {self.op} {NUMBER_WORDS[self.b]} is {NUMBER_WORDS[c]}"


def all_facts(largest: int = 9, operations: tuple[str, ...] = ("plus",)) -> list[Fact]:
    """Every a op b with a, b in 0..largest (b <= a for minus), in a fixed order: with the
    defaults the 100 sums of two digits."""
    checks.number_in("largest", largest, 1, 9, expected="an int in 1..9")
    for op in operations:
        checks.one_of("operations", op, tuple(OPERATIONS))
    return [Fact(a, op, b) for op in operations for a in range(largest + 1)
            for b in range(largest + 1) if op == "plus" or b <= a]


def split_facts(facts: list[Fact], held_out: float, seed: int) -> tuple[list[Fact], list[Fact]]:
    """Shuffle with `seed` and keep the fraction `held_out` apart: (train, held-out)."""
    if not facts:
        raise ValueError("facts is empty, expected at least two facts to split")
    checks.number_in("held_out", held_out, 0.0, 1.0, low_open=True, high_open=True)
    checks.non_negative_int("seed", seed)
    shuffled = list(facts)
    random.Random(seed).shuffle(shuffled)
    cut = max(1, round(held_out * len(shuffled)))
    return shuffled[cut:], shuffled[:cut]


def pretraining_text(facts: list[Fact], n_sentences: int, seed: int) -> str:
    """`n_sentences` facts drawn with replacement, one per line, as a statement ('three plus four
    is seven.') or as a question and its answer in plain prose ('what is three plus four? seven.')."""
    if not facts:
        raise ValueError("facts is empty, expected facts to write sentences about")
    checks.positive_int("n_sentences", n_sentences)
    rng = random.Random(seed)
    lines = []
    for _ in range(n_sentences):
        fact = rng.choice(facts)
        lines.append(rng.choice([fact.statement(), f"{fact.question()} {fact.answer()}"]) + ".")
    return "\n".join(lines) + "\n"


def is_correct(answer: str, fact: Fact) -> bool:
    """The exact checker: the answer, stripped of spaces and a final '.', is the true number word."""
    if not isinstance(answer, str):
        raise TypeError(f"answer is a {type(answer).__name__}, expected a str")
    return answer.strip().rstrip(".").strip() == fact.answer()


def wrong_result(fact: Fact, rng: random.Random) -> int:
    """A result near the true one (off by 1 to 3), never the true one, always in 0..18."""
    choices = [c for c in range(fact.c - 3, fact.c + 4) if c != fact.c and 0 <= c <= 18]
    return rng.choice(choices)


def true_false_statements(facts: list[Fact], seed: int) -> tuple[list[str], list[int]]:
    """Each fact twice: its true statement (label 1) and one with a wrong result (label 0)."""
    if not facts:
        raise ValueError("facts is empty, expected facts to make statements from")
    rng = random.Random(seed)
    texts, labels = [], []
    for fact in facts:
        texts += [fact.statement(), fact.statement(wrong_result(fact, rng))]
        labels += [1, 0]
    return texts, labels


_NUMBER = "(?:" + "|".join(NUMBER_WORDS) + ")"
_STATEMENT = re.compile(f"{_NUMBER} (?:{'|'.join(OPERATIONS)}) {_NUMBER} is {_NUMBER}")


def is_well_formed(sentence: str) -> bool:
    """The grammar's own checker: a number word, an operation, a number word, 'is', a number word
    (whether the sum is right does not matter)."""
    if not isinstance(sentence, str):
        raise TypeError(f"sentence is a {type(sentence).__name__}, expected a str")
    return _STATEMENT.fullmatch(sentence) is not None


def well_formed_statements(facts: list[Fact], seed: int) -> tuple[list[str], list[int]]:
    """Each fact twice: its statement (label 1) and the same words in a shuffled order that the
    grammar refuses (label 0); labels come from `is_well_formed`."""
    if not facts:
        raise ValueError("facts is empty, expected facts to make statements from")
    rng = random.Random(seed)
    texts, labels = [], []
    for fact in facts:
        words = fact.statement().split()
        while is_well_formed(" ".join(words)):
            rng.shuffle(words)
        for text in (fact.statement(), " ".join(words)):
            texts.append(text)
            labels.append(int(is_well_formed(text)))
    return texts, labels
