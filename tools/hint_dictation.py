"""How much of an exercise's solution a hint dictates: its operations, named in the same order.

    python tools/hint_dictation.py            # every exercise, the worst first
    python tools/hint_dictation.py --all      # and the checkers' hints beside them

A hint that is a plan says what to compute and in which order ("the ratio and its clipped twin,
the pessimistic objective, a mean per answer then over the answers"); a hint that dictates walks
the solution line by line, naming every operation of every line ("exponentiate the difference,
clamp it to 1 minus epsilon and 1 plus epsilon, give the advantages a trailing axis, take the
elementwise minimum, negate it ..."). The measure tells the two apart without reading code:

1. The solution becomes the sequence of its operations: every call, method and operator it uses,
   each mapped to the word a hint would use for it (`torch.exp`, `.exp()`, `exp_shifted` ->
   "exponential"; `amax`, `torch.maximum` -> "maximum"; `a - b` -> "subtract"; `keepdim=True`,
   `[:, None]`, `unsqueeze` -> "keep an axis"; `for`/`while` -> "loop").
2. The hint becomes the sequence of the same words, found in its prose in the order it says them
   ("minus" and "subtract" are one word, "exponentiate" and "exponential" another).
3. The share is the longest common subsequence of the two, over the solution's operations: the
   fraction of the solution's operations that the hint names in the solution's order.

Bookkeeping (names, indexing, returns, constructors) is no operation; a few words that every plan
uses ("each", "and", "if") are not matched. It is a heuristic: a hint can dictate in words the
table does not know, and a plan can mention an operation or two by name. It is calibrated on the
course's own hints (tests/notebooks/test_exercises.py holds the threshold and why).
"""

from __future__ import annotations

import io
import re
import tokenize

# operation -> (the code tokens that perform it, the words a hint names it with, as a regex)
OPERATIONS: dict[str, tuple[frozenset[str], str]] = {
    "exp": (frozenset({"exp", "exp_shifted", "logaddexp"}), r"exponen\w*|\bexp\b"),
    "log": (frozenset({"log", "logsigmoid", "logaddexp"}), r"\blog\b|logarithm\w*"),
    "log_softmax": (frozenset({"log_softmax"}), r"log-?\s?softmax"),
    "softmax": (frozenset({"softmax"}), r"(?<!log-)(?<!log )\bsoftmax"),
    "sigmoid": (frozenset({"sigmoid", "logsigmoid", "silu", "gelu"}), r"sigmoid|silu|gelu"),
    "max": (frozenset({"max", "amax", "maximum", "argmax"}), r"\bmax\w*|largest|greatest|most likely"),
    "min": (frozenset({"min", "amin", "minimum"}), r"\bmin\b|minimum|smallest|smaller of"),
    "sum": (frozenset({"sum", "cumsum", "+="}), r"\bsum\w*|add up|adds? (?:it|them|what|the)\b|total"),
    "mean": (frozenset({"mean", "std"}), r"\bmean\b|\baverag\w*"),
    "sqrt": (frozenset({"sqrt", "rsqrt", "norm", "matrix_norm", "std"}), r"square root|\broot\b|norm\b|length"),
    "matmul": (frozenset({"@", "einsum", "matmul"}), r"matrix(?:-vector)? product|matrix multipl\w*|\bproducts?\b|einstein"),
    "mul": (frozenset({"*", "*="}), r"multipl\w*|\btimes\b"),
    "div": (frozenset({"/", "//", "/=", "divmod"}), r"divid\w*|\bdivision\b|\bover\b"),
    "sub": (frozenset({"-", "-="}), r"subtract\w*|\bminus\b|difference|negat\w*"),
    "mod": (frozenset({"%", "divmod"}), r"remainder|modulo"),
    "add": (frozenset({"+"}), r"\badd\b|\badding\b|\bplus\b"),
    "pow": (frozenset({"**", "square", "pow"}), r"power|raised|squar\w*"),
    "transpose": (frozenset({"transpose", "T", "mT", "permute"}), r"transpos\w*|\bswap\w*"),
    "axis": (frozenset({"keepdim", "None", "unsqueeze", "squeeze", "view", "reshape", "flatten"}),
             r"\bkeep\w* (?:the |that |its )?(?:last )?(?:axis|dimension)|trailing axis|axes? of size|"
             r"\breshap\w*|\bview\b|flatten\w*|\bcolumn\b|\brow of shape"),
    "cat": (frozenset({"cat", "stack", "append"}), r"concatenat\w*|\bappend\w*|\bjoin\w*|\bstack\w*"),
    "fill": (frozenset({"masked_fill", "where"}), r"\bfill\w*|\bset (?:the |every |it )|replac\w*"),
    "clamp": (frozenset({"clamp", "clip"}), r"\bclamp\w*|\bclip\w*|\bcapped\b|floored"),
    "gather": (frozenset({"gather", "index_add_"}), r"\bgather\w*|indexed add"),
    "topk": (frozenset({"topk", "sort"}), r"\btop\b|\bsort\w*|k largest|largest entries"),
    "zeros": (frozenset({"zeros", "zeros_like", "empty", "empty_like", "full", "new_zeros"}),
              r"\bzeros\b|all zero|\bempty\b|of zeros"),
    "arange": (frozenset({"arange"}), r"\bpositions? 0\b|0 to\b|arange"),
    "triangle": (frozenset({"tril", "triu"}), r"triangle|above the diagonal"),
    "loop": (frozenset({"for", "while"}), r"\bloop\w*|\brepeat\w*|once per\b|as many times|for each\b"),
    "compare": (frozenset({"<", ">", "<=", ">=", "==", "!=", "ne"}),
                r"\bbelow\b|\bat least\b|\bat most\b|smaller than|less than|compar\w*"),
    "round": (frozenset({"round"}), r"\bround\w*"),
    "abs": (frozenset({"abs"}), r"absolute"),
    "trig": (frozenset({"sin", "cos"}), r"\bsines?\b|\bcosines?\b"),
    "draw": (frozenset({"multinomial", "rand", "randint", "randn"}), r"\bdraw\w*|uniform"),
    "copy": (frozenset({"copy_", "clone"}), r"\bcopy\b|\bcopies\b|\bclone\b"),
}

_WORDS = [(name, re.compile(pattern, re.I)) for name, (_, pattern) in OPERATIONS.items()]
_SKIPPED = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
            tokenize.ENDMARKER, tokenize.STRING}


def _code_tokens(source: str) -> list[str]:
    """The names and operators of `source` in order, without comments and strings."""
    try:
        return [t.string for t in tokenize.generate_tokens(io.StringIO(source).readline)
                if t.type not in _SKIPPED and not t.string.startswith(("f'", 'f"'))]
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return re.findall(r"\w+|\*\*|//|[-+*/@<>=!]=?|[^\s\w]", re.sub(r"#.*", "", source))


def solution_operations(solution: str) -> list[str]:
    """The operations of `solution`, in the order its code performs them (one per token).

    A minus sign before a number (`dim=-1`, `[-2:]`) is a constant, not a subtraction, and a
    power of one half (`d ** 0.5`, `d ** -0.5`) is a square root.
    """
    found = []
    tokens = _code_tokens(solution)
    for index, token in enumerate(tokens):
        before, after = tokens[index - 1] if index else "(", tokens[index + 1 : index + 3]
        if token == "-" and after[:1] and after[0][:1].isdigit() and not re.match(r"[\w)\]]", before):
            continue
        if token == "**" and "".join(after).lstrip("-").startswith("0.5"):
            found.append("sqrt")
            continue
        found += [name for name, (codes, _) in OPERATIONS.items() if token in codes]
    return found


def hint_operations(hint: str) -> list[str]:
    """The operations `hint` names, in the order it names them."""
    text = re.sub(r"\$|\\text\{|\\|[{}]", " ", hint)
    hits = [(match.start(), name) for name, pattern in _WORDS for match in pattern.finditer(text)]
    return [name for _, name in sorted(hits)]


def _common_subsequence(a: list[str], b: list[str]) -> int:
    previous = [0] * (len(b) + 1)
    for x in a:
        row = [0]
        for j, y in enumerate(b):
            row.append(previous[j] + 1 if x == y else max(previous[j + 1], row[j]))
        previous = row
    return previous[-1]


def named_in_order(solution: str, hint: str) -> int:
    """How many of the solution's operations `hint` names in the solution's order."""
    return _common_subsequence(solution_operations(solution), hint_operations(hint))


def dictated_share(solution: str, hint: str) -> float:
    """The fraction of the solution's operations that `hint` names in the solution's order."""
    return named_in_order(solution, hint) / max(len(solution_operations(solution)), 1)


def _measure(show_checkers: bool) -> None:
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    sys.path[:0] = [str(root / "tests"), str(root / "tools"), str(root)]
    from build_notebooks import to_notebook
    from notebook_tools import SOURCES, exercises_in, lesson_cells

    import helpers.lab.exercises as exercises

    hint = re.compile(r"<details>\s*<summary>\s*Hint (\d)[^<]*</summary>(.*?)</details>", re.S)
    rows = []
    for path in sorted(SOURCES.glob("[0-9][0-9]_*.py")):
        cells = lesson_cells(to_notebook(path).cells)  # a speaker note is no exercise statement
        for exercise in exercises_in(cells):
            statement = next(c.source for c in reversed(cells[:exercise.answer_index])
                             if c.cell_type == "markdown")
            hints = dict(hint.findall(statement))
            rows.append((dictated_share(exercise.solution, hints.get("2", "")),
                         dictated_share(exercise.solution, exercises.get(exercise.name).hint),
                         len(solution_operations(exercise.solution)), exercise.name))
    rows.sort(reverse=True)
    print(f"{'Hint 2':>7} {'checker':>8} {'ops':>4}  exercise")
    for share, checker, ops, name in rows:
        print(f"{share:7.0%} {checker:8.0%} {ops:4d}  {name}" if show_checkers or share else "")
    shares = sorted(share for share, *_ in rows)
    print(f"{len(rows)} exercises; Hint 2 median {shares[len(shares) // 2]:.0%}, max {shares[-1]:.0%}")


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--all", action="store_true", help="print every row, the checkers' column too")
    _measure(parser.parse_args().all)
