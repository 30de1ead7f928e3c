"""One-off, mechanical regroup of tests/lab/exercises/ by the checker module each test tests
(issue 49, item 4). Run from the repository root on a tree that still has the round-named files:

    python tools/regroup_exercise_tests.py          # writes the new files, removes the old ones
    python -m ruff check --no-cache --fix --select F401,I001 tests/lab/exercises

Each top-level statement of an old file goes to one new file: a test by the exercise names it
holds ("tokenization.count_pairs" -> test_tokenization.py), else by OVERRIDE, else by its old
file's DEFAULT; a helper or answer function follows the statements that use it; a table of
(name, answer, message) cases is split element by element by the exercise name. What more than
one new file uses goes to SUPPORT (judging.py).
"""

from __future__ import annotations

import ast
import re
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FOLDER = ROOT / "tests" / "lab" / "exercises"
CHECKERS = sorted(p.stem for p in (ROOT / "helpers" / "lab" / "exercises").glob("*.py")
                  if not p.stem.startswith("_"))
SOURCES = ["test_checkers.py", "test_core_exercises.py", "test_core_exercises_middle.py",
           "test_encoders_exercises.py", "test_gpt_checkers.py", "test_grader.py",
           "test_hidden_inputs.py", "test_late_exercises.py", "test_muon_exercise.py",
           "test_slip_messages.py", "test_stated_rules.py", "test_watch.py"]
DEFAULT = {"test_checkers.py": "check", "test_core_exercises.py": "check",
           "test_core_exercises_middle.py": "check", "test_encoders_exercises.py": "encoders",
           "test_gpt_checkers.py": "gpt", "test_grader.py": "grader",
           "test_hidden_inputs.py": "grader", "test_late_exercises.py": "check",
           "test_muon_exercise.py": "modern_decoder", "test_slip_messages.py": "check",
           "test_stated_rules.py": "watch", "test_watch.py": "watch"}
# tests whose exercise names span modules, or name none: where they belong, by what they test
OVERRIDE = {
    ("test_checkers.py", "test_helper_split_mlp_refuses_bad_input_by_name"): "distributed",
    ("test_checkers.py", "test_exercise_checkers_refuse_the_usual_mistakes"): "distributed",
    ("test_checkers.py", "test_check_refuses_a_float_count"): "check",
    ("test_core_exercises.py", "test_the_checkers_leave_the_global_random_numbers_alone"): "check",
    ("test_core_exercises_middle.py", "test_an_exercise_may_ask_for_more_time_than_the_default"): "check",
    ("test_late_exercises.py", "test_not_attempted_messages_of_12_to_14_say_what_to_write_not_the_recipe"): "check",
    ("test_hidden_inputs.py", "*"): "grader",
    ("test_grader.py", "*"): "grader",
    ("test_watch.py", "*"): "watch",
    ("test_stated_rules.py", "test_the_tensor_log_counts_operations_and_the_largest_tensor"): "watch",
    ("test_late_exercises.py", "test_dpo_solution_equals_trl_on_the_same_log_probabilities"): "post_training",
    ("test_late_exercises.py", "test_the_round_checker_leaves_torchs_global_generator_alone"): "serving",
    ("test_late_exercises.py", "test_speculative_generate_runs_a_students_round_and_stays_exact"): "serving",
    ("test_late_exercises.py", "test_speculative_generate_refuses_a_verify_that_is_not_a_round"): "serving",
    ("test_late_exercises.py", "test_verify_round_refuses_mismatched_shapes"): "serving",
    ("test_watch.py", "own_loss"): "watch", ("test_watch.py", "rows"): "watch",
    ("test_muon_exercise.py", None): "modern_decoder",
    ("test_late_exercises.py", "test_helper_moe_forward_equals_the_helpers_experts_loop"): "frontier_decoder",
    ("test_late_exercises.py", "test_sliding_decode_helper_refuses_bad_input_by_name"): "frontier_decoder",
    ("test_core_exercises_middle.py", "CELL"): "distributed",
    ("test_core_exercises_middle.py", "cell"): "distributed",
}
# the checkers of these modules each have a right and two wrong cases in their file's CASES
OWNED = ("tokenization", "embeddings", "attention", "masking", "multihead_attention", "layers",
         "flash_attention", "modern_decoder", "distributed")
SUPPORT_NAMES = ("from_the_checker", "verdict", "named", "judge", "case_ids", "assert_cases_cover",
                 "assert_not_attempted_says_the_task", "exercise_names",
                 "assert_leaves_the_global_random_numbers_alone")
DOCS = {
    "check": "The package's own machinery (helpers/lab/exercises/__init__.py): `check` and `evaluate` "
             "give up on\nan answer that never returns, refuse a float count, and say what to write "
             "while an exercise is\nnot attempted.",
    "grader": "The hidden tests decide the grade (helpers/lab/exercises/grader.py): they trust nothing "
              "the\nnotebook could have changed, they fail an answer that only reproduces what the "
              "visible check\nsaw, and the hidden round shows every exercise inputs the visible "
              "check did not (issue 50).",
    "watch": "The watch sees what an answer calls, whatever name it was captured under\n"
             "(helpers/lab/exercises/watch.py): the course's own code and forbidden library calls are "
             "refused\nby name, building blocks and the checker's own work are not; its TensorLog "
             "counts the tensors an\nanswer makes.",
}
NOTEBOOKS = ["tokenization", "embeddings", "attention", "masking", "multihead_attention", "layers", "gpt",
             "flash_attention", "modern_decoder", "encoders", "distributed", "frontier_decoder",
             "post_training", "serving"]
JUDGING_DOC = (
    "What the checker tests of tests/lab/exercises/ share: how a case (name, answer, message) is "
    "judged,\nhow a slip's message is asserted, and what every checker module's cases must "
    "cover. Not a test\nmodule: the test files import it (a test module never imports another).")
JUDGING_CODE = '''

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
'''
PACKAGE_DOC = (
    '"""The exercise checkers\' tests, one file per module of helpers/lab/exercises/ (test_<module>.py).\n\n'
    "A package, unlike the other test folders: its files share their names with the modules they "
    "mirror,\nand four of those names (test_attention, test_embeddings, test_gpt, test_layers) are "
    "tests/model\'s too;\nas a package they import as exercises.test_attention and do not collide. "
    "Shared pieces: judging.py.\n\"\"\"\n")
# test_core_exercises' test_the_checkers_leave_the_global_random_numbers_alone, one per module
RANDOM_ALONE = {
    "multihead_attention": '("multihead_attention.mha_forward", mha_answer()), ("multihead_attention.fuse_heads", fuse_answer())',
    "layers": '("layers.block_forward", block_answer()), ("layers.gpt2_init", init_answer())',
    "embeddings": '("embeddings.train_word_vectors", word_loop()), ("embeddings.token_and_position", input_layer())',
    "attention": '("attention.attention_layer", layer_answer())',
}
RANDOM_TAIL = '''

def test_the_checkers_leave_the_global_random_numbers_alone():
    assert_leaves_the_global_random_numbers_alone([{cases}])
'''
TAIL_JUDGED = '''

@pytest.mark.parametrize("name, answer, message", CASES, ids=case_ids(CASES))
def test_checker_judges(name, answer, message):
    judge(name, answer, message)
'''
TAIL_OWNED = '''

def test_every_checker_has_a_right_and_two_wrong_cases():
    assert_cases_cover("{module}", CASES)


@pytest.mark.parametrize("name", exercise_names("{module}"))
def test_not_attempted_says_the_task_not_the_recipe(name):
    assert_not_attempted_says_the_task(name)
'''
CORE_TAIL = '''CASES += [("{name}", answer, message) for answer, message in {table}]'''
CORE_NAMES = {"BPE_CASES": "tokenization.train_bpe", "STEP_CASES": "embeddings.train_word_vectors",
              "INPUT_CASES": "embeddings.token_and_position", "ATTENTION_CASES": "attention.scaled_attention",
              "LAYER_CASES": "attention.attention_layer", "BACKWARD_CASES": "attention.attention_backward",
              "MASKED_CASES": "masking.masked_attention", "MHA_CASES": "multihead_attention.mha_forward",
              "FUSE_CASES": "multihead_attention.fuse_heads", "BLOCK_CASES": "layers.block_forward",
              "INIT_CASES": "layers.gpt2_init", "NS_CASES": None}
# used by tests of several modules: written once, in judging.py
SUPPORT = {"from_the_checker"}
TABLES = {"CASES"}  # (name, answer, message) tables, split element by element
DROP = {"CORE_CASES", "OWNED", "test_checker_judges", "test_every_owned_checker_has_a_right_and_two_wrong_cases",
        "test_not_attempted_says_the_task_not_the_recipe", "SMALL", "ids", "_from_the_checker",
        "test_the_checkers_leave_the_global_random_numbers_alone"}  # rebuilt per module, by hand
# the core exercises' tables of (answer, message): each is one exercise's
CORE_TABLES = {"BPE_CASES": "tokenization", "STEP_CASES": "embeddings", "INPUT_CASES": "embeddings",
               "ATTENTION_CASES": "attention", "LAYER_CASES": "attention", "BACKWARD_CASES": "attention",
               "MASKED_CASES": "masking", "MHA_CASES": "multihead_attention",
               "FUSE_CASES": "multihead_attention", "BLOCK_CASES": "layers", "INIT_CASES": "layers"}
# two files' helpers of one name that now share a file
RENAME = {("test_slip_messages.py", "sampler"): "cropping_sampler",
          ("test_late_exercises.py", "_from_the_checker"): "from_the_checker",
          # exercises registered by a test file are named after it
          ("test_core_exercises_middle.py", "test_core_exercises_middle"): "test_check"}
# text that changes with the move: tests/post/test_dpo.py's TRL pieces now live in tests/dpo_reference.py
REPLACE = {"test_late_exercises.py": [("from test_dpo import", "from dpo_reference import")]}
NAME = re.compile(r"^([a-z_]+)\.[a-z_0-9]+$")


def span(lines: list[str], node: ast.stmt) -> tuple[int, int]:
    """0-based [start, end) of a statement with its decorators and the comment lines right above."""
    start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])]) - 1
    while start > 0 and lines[start - 1].startswith("#") and not lines[start - 1].startswith("# ---"):
        start -= 1
    return start, node.end_lineno


def names_in(node: ast.AST) -> tuple[set[str], set[str]]:
    """(names the node reads, checker modules of the exercise names it holds)."""
    read, modules, bound = set(), set(), set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.arg):
            bound.add(sub.arg)
        elif isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Store) and sub is not node:
            bound.add(sub.id)
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name) and (sub.id not in bound or isinstance(node, ast.expr)):
            read.add(sub.id)
        elif isinstance(sub, ast.Constant) and isinstance(sub.value, str):
            match = NAME.match(sub.value)
            if match and match.group(1) in CHECKERS:
                modules.add(match.group(1))
        elif isinstance(sub, ast.ImportFrom) and sub.module and sub.module.startswith("helpers.lab.exercises."):
            module = sub.module.split(".")[3]
            if module in CHECKERS:
                modules.add(module)
    if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
        read.discard(node.name)
    return read, modules


def defined(node: ast.stmt) -> str | None:
    if isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)):
        return node.name
    if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
        target = node.targets[0] if isinstance(node, ast.Assign) else node.target
        return target.id if isinstance(target, ast.Name) else None
    return None


def main() -> int:
    pieces: list[dict] = []                                  # every top-level statement
    module_imports: dict[str, dict[str, str]] = {}           # file -> name -> checker module
    for file in SOURCES:
        text = (FOLDER / file).read_text(encoding="utf-8")
        lines = text.splitlines()
        tree = ast.parse(text)
        module_imports[file] = {}
        for node in tree.body:
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
                continue  # the docstring: every new file gets its own
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                if isinstance(node, ast.ImportFrom) and node.module in ("__future__",):
                    continue
                if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("test_"):
                    continue  # another test module: its tables are here now
                pieces.append({"file": file, "kind": "import",
                               "text": "\n".join(lines[node.lineno - 1:node.end_lineno])})
                continue
            name = defined(node)
            if name in DROP:
                continue
            if name in TABLES and isinstance(node.value, ast.List):
                for element in node.value.elts:
                    read, modules = names_in(element)
                    (module,) = modules or {"modern_decoder"}  # NS_CASES' elements say NAME
                    source = ast.get_source_segment(text, element)
                    pieces.append({"file": file, "kind": "row", "name": None, "target": module,
                                   "read": read, "text": source})
                continue
            if (file, name) in RENAME:
                pass
            start, end = span(lines, node)
            read, modules = names_in(node)
            piece = {"file": file, "kind": "def", "name": name, "read": read,
                     "text": "\n".join(lines[start:end]), "modules": modules, "target": None}
            if name in CORE_TABLES:
                piece["target"] = CORE_TABLES[name]
            elif name in SUPPORT:
                piece["target"] = "judging"
            elif (file, name) in OVERRIDE:
                piece["target"] = OVERRIDE[(file, name)]
            elif name and name.startswith("test_"):
                if (file, "*") in OVERRIDE:
                    piece["target"] = OVERRIDE[(file, "*")]
                elif len(modules) == 1:
                    piece["target"] = next(iter(modules))
                else:
                    piece["target"] = DEFAULT[file]
            pieces.append(piece)
    # helpers follow their users, until nothing moves
    by_name = defaultdict(list)
    for piece in pieces:
        if piece["kind"] == "def" and piece["name"]:
            by_name[(piece["file"], piece["name"])].append(piece)
    changed = True
    while changed:
        changed = False
        for piece in pieces:
            if piece["kind"] == "import" or piece.get("target") is None:
                continue
            for name in piece["read"]:
                for helper in by_name.get((piece["file"], name), []):
                    if helper is piece:
                        continue
                    wanted = helper.setdefault("users", set())
                    if piece["target"] not in wanted:
                        wanted.add(piece["target"])
                        changed = True
                    if helper["target"] is None or (helper["target"] != "judging" and len(wanted) > 1
                                                    and helper["target"] != piece["target"]):
                        new = piece["target"] if len(wanted) == 1 else "judging"
                        if helper["target"] != new:
                            helper["target"] = new
                            changed = True
    unplaced = [(p["file"], p["name"]) for p in pieces if p["kind"] == "def" and p["target"] is None]
    files: dict[str, list[dict]] = defaultdict(list)
    for piece in pieces:
        if piece["kind"] != "import" and piece.get("target") and piece.get("name") not in DROP:
            files[piece["target"]].append(piece)
    report = {t: sorted({p["file"] for p in ps}) for t, ps in files.items()}
    for target, sources in sorted(report.items()):
        print(f"{target}: from {', '.join(sources)}")
        for p in files[target]:
            if p["kind"] == "def" and len(p.get("users", ())) > 1:
                print(f"   shared: {p['name']} used by {sorted(p['users'])}")
    print("unplaced (used by no test):", unplaced)
    clashes = {t: sorted({p["name"] for p in ps if p["kind"] == "def" and p["name"]
                          and sum(q["name"] == p["name"] and q["kind"] == "def" for q in ps) > 1})
               for t, ps in files.items()}
    print("clashing names:", {t: c for t, c in clashes.items() if c})
    if "--write" not in sys.argv:
        return 0
    written = {}
    for target, ps in files.items():
        sources = {p["file"] for p in ps}
        import_lines = []
        for p in pieces:
            if p["kind"] == "import" and p["file"] in sources and p["text"] not in import_lines:
                import_lines.append(p["text"])
        body = []
        for p in ps:
            if p["kind"] != "def":
                continue
            text = p["text"]
            for (file, old), new in RENAME.items():
                if p["file"] == file:
                    text = re.sub(rf"\b{old}\b", new, text)
            for old, new in REPLACE.get(p["file"], []):
                text = text.replace(old, new)
            body.append(text)
        rows = [p["text"] for p in ps if p["kind"] == "row"]
        tables = [p["name"] for p in ps if p["kind"] == "def" and p["name"] in CORE_NAMES]
        tail = []
        if rows or tables:
            tail = ["CASES = [", *[f"    {r}," for r in rows], "]"]
            for table in tables:
                if CORE_NAMES[table] is None:
                    tail.append(f"CASES += {table}")
                else:
                    tail.append(CORE_TAIL.format(name=CORE_NAMES[table], table=table))
            tail.append(TAIL_JUDGED)
            if target in RANDOM_ALONE:
                tail.append(RANDOM_TAIL.format(cases=RANDOM_ALONE[target]))
            if target in OWNED:
                tail.append(TAIL_OWNED.format(module=target))
        text = "\n\n\n".join(body) + "\n\n\n" + "\n".join(tail)
        if target != "judging":
            local = {p["name"] for p in ps if p["kind"] == "def"}
            wanted = [n for n in SUPPORT_NAMES if n not in local and re.search(rf"\b{n}\b", text)]
            if wanted:
                import_lines.append(f"from .judging import {', '.join(wanted)}")
        if target == "judging":
            text += JUDGING_CODE
            import_lines += ["import torch", "", "from helpers.lab.exercises import grader"]
        number = {m: i for i, m in enumerate(NOTEBOOKS, start=1)}.get(target)
        doc = JUDGING_DOC if target == "judging" else DOCS.get(target, (
            f"Notebook {number}'s checkers (helpers/lab/exercises/{target}.py): every correct formulation "
            "passes,\neach usual slip fails with a message that names it, and a stub hears what to write."))
        out = [f'"""{doc}"""', "", "from __future__ import annotations", "", *import_lines, "", "", text]
        name = "judging.py" if target == "judging" else f"test_{target}.py"
        written[name] = "\n".join(out).rstrip() + "\n"
    for file in SOURCES:
        (FOLDER / file).unlink()
    for name, text in written.items():
        (FOLDER / name).write_text(text, encoding="utf-8")
    (FOLDER / "__init__.py").write_text(PACKAGE_DOC, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
