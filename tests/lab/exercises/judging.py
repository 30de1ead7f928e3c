"""What the checker tests of tests/lab/exercises/ share: how a case (name, answer, message) is judged,
how a slip's message is asserted, and what every checker module's cases must cover. Not a test
module: the test files import it (a test module never imports another)."""

from __future__ import annotations

import torch

import helpers.lab.exercises as exercises
from helpers.lab.exercises import evaluate, grader


def from_the_checker(answer):
    """Mark a slip built from a checker's own variant function: it is judged with watched=False,
    which refuses only the forbidden library calls, so that the test sees how the checker names the
    slip (the watch would refuse the variant itself by name, issue 50)."""
    answer.watched = False
    return answer


def verdict(name: str, answer) -> tuple[bool, str]:
    return exercises.evaluate(name, answer, time_limit=60)


def named(name: str, answer, *words: str, watched: bool = True) -> str:
    """The checker's message for a wrong `answer`, asserted to fail and to hold every word
    (watched=False for a slip built from the checker's own variant, which the watch would refuse)."""
    passed, message = evaluate(name, answer, watched=watched)
    assert not passed, message
    for word in words:
        assert word in message, message
    return message


def case_ids(cases: list[tuple]) -> list[str]:
    """pytest ids for a table of (name, answer, message): "tokenization.count_pairs-pairs_counter"."""
    return [f"{name}-{getattr(answer, '__name__', 'answer')}" for name, answer, _ in cases]


def judge(name: str, answer, message: str | None) -> None:
    """Assert that exercise `name` passes `answer` when `message` is None, else fails it with a
    message that holds `message` and names the mistake (no crash report)."""
    passed, said = exercises.evaluate(name, answer, time_limit=None, watched=getattr(answer, "watched", True))
    assert passed == (message is None), said
    if message is None and getattr(answer, "watched", True):  # a right answer, however written,
        # passes the grader's hidden tests too (one built from a checker's variant is no student's)
        grader.hidden_check(name, answer, {"check": exercises.check})
    if message is not None:
        assert message in said, said
        assert "❌" in said and "raised" not in said, said  # a named mistake, not a crash report


def exercise_names(module: str) -> list[str]:
    """Every exercise of checker module `module` ("tokenization"), sorted."""
    return sorted(n for n in exercises.all_exercises() if n.split(".")[0] == module)


def assert_cases_cover(module: str, cases: list[tuple]) -> None:
    """Every exercise of `module` has at least one right and two wrong cases in `cases`."""
    for name in exercise_names(module):
        right = sum(1 for n, _, m in cases if n == name and m is None)
        wrong = sum(1 for n, _, m in cases if n == name and m is not None)
        assert right >= 1 and wrong >= 2, (name, right, wrong)


def assert_not_attempted_says_the_task(name: str) -> None:
    """A stub that raises NotImplementedError hears the task, not the hint or the recipe."""
    def stub(*args):
        raise NotImplementedError

    passed, said = exercises.evaluate(name, stub)
    assert not passed and "not attempted yet" in said
    assert "Hint" not in said and exercises.get(name).hint not in said
    assert "Write " in said and "The check" in said


def assert_leaves_the_global_random_numbers_alone(cases: list[tuple[str, object]]) -> None:
    """Each (name, right answer) passes, and checking them leaves torch's global generator as it was."""
    torch.manual_seed(123)
    before = torch.get_rng_state()
    for name, answer in cases:
        assert verdict(name, answer)[0], name
    assert torch.equal(torch.get_rng_state(), before)
