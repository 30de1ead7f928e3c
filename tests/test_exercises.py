"""Every exercise's published solution passes its checker, and the untouched stub does not.

Each notebook is run in a fresh kernel with every stub cell (a code cell calling `check(...)`
followed by a solution block) replaced by that solution, in strict mode, where a failing check
raises. Running the real notebook, rather than the solution alone, gives each solution the
variables the cells above it defined.
"""

from __future__ import annotations

import pytest
from nbclient import NotebookClient
from notebook_tools import NOTEBOOKS, notebook_paths, read, solution_after

import helpers.lab.exercises as exercises

NOTEBOOK_IDS = [p.stem for p in notebook_paths()]
STRICT_CELL = "import helpers.lab.exercises\nhelpers.lab.exercises.STRICT = True"


def with_solutions(name: str):
    nb = read(NOTEBOOKS / f"{name}.ipynb")
    replaced = 0
    for index, cell in enumerate(nb.cells):
        if cell.cell_type == "code" and 'check("' in cell.source:
            solution = solution_after(nb.cells, index)
            assert solution is not None, f"{name} cell {index}: an exercise without a solution block after it"
            cell.source = solution
            replaced += 1
    first_code = next(i for i, c in enumerate(nb.cells) if c.cell_type == "code")
    nb.cells.insert(first_code + 1, type(nb.cells[first_code])(cell_type="code", source=STRICT_CELL,
                                                                metadata={}, outputs=[], execution_count=None))
    return nb, replaced


@pytest.mark.parametrize("name", NOTEBOOK_IDS)
def test_every_solution_passes_its_check(name):
    nb, replaced = with_solutions(name)
    assert replaced >= 1, f"{name} has no checked exercise"
    NotebookClient(nb, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
    passed = sum("✅" in "".join(o.get("text", "") for o in c.get("outputs", []))
                 for c in nb.cells if c.cell_type == "code")
    assert passed >= replaced


@pytest.mark.parametrize("name", NOTEBOOK_IDS)
def test_stored_stubs_say_not_attempted(name):
    cells = read(NOTEBOOKS / f"{name}.ipynb").cells
    for cell in cells:
        if cell.cell_type == "code" and 'check("' in cell.source:
            text = "".join(o.get("text", "") for o in cell.outputs)
            assert "not attempted yet" in text, f"{name}: a stub's stored output is {text!r}"


def test_every_registered_exercise_is_used_by_a_notebook():
    used = "\n".join(c.source for p in notebook_paths() for c in read(p).cells if c.cell_type == "code")
    for name in exercises.all_exercises():
        if name.startswith("test_"):
            continue  # registered by this file's own tests
        assert f'check("{name}"' in used, f"exercise {name} is registered but no notebook uses it"


def test_check_reports_problems_without_a_traceback(capsys):
    from helpers.lab.exercises import ExerciseFailed, check, exercise

    @exercise(hint="return 42")
    def answer_is_42(fn):
        if fn() != 42:
            raise ExerciseFailed(f"got {fn()!r}, expected 42")

    def stub():
        raise NotImplementedError

    verdicts = {}
    for label, answer in [("right", lambda: 42), ("wrong", lambda: 41), ("crash", lambda: 1 / 0),
                          ("stub", stub)]:
        assert check("test_exercises.answer_is_42", answer) is None
        verdicts[label] = capsys.readouterr().out
    assert verdicts["right"].startswith("✅")
    assert verdicts["wrong"].startswith("❌") and "got 41, expected 42" in verdicts["wrong"]
    assert "ZeroDivisionError" in verdicts["crash"] and "Traceback" not in verdicts["crash"]
    assert "not attempted yet" in verdicts["stub"] and "Hint: return 42" in verdicts["stub"]
    with pytest.raises(KeyError, match="no exercise"):
        check("test_exercises.nope", stub)


def test_strict_mode_raises_on_a_wrong_answer(monkeypatch):
    from helpers.lab.exercises import ExerciseFailed, check, exercise

    @exercise(hint="return 7")
    def answer_is_7(fn):
        if fn() != 7:
            raise ExerciseFailed("not 7")

    monkeypatch.setattr(exercises, "STRICT", True)
    check("test_exercises.answer_is_7", lambda: 7)
    with pytest.raises(AssertionError, match="not 7"):
        check("test_exercises.answer_is_7", lambda: 8)


# --- notebook 7's step-by-hand exercises refuse the usual slips, naming them ------------------

def _unshifted_cross_entropy(gpt, ids):
    """A loss that forgets the shift: the model reads all N + 1 tokens."""
    import torch.nn.functional as F
    return F.cross_entropy(gpt(ids).flatten(0, 1), ids.flatten())


def _loss_from(scored: str, reduce: str = "mean", sign: float = -1.0):
    """A next-token loss answer; `scored` picks the targets, `reduce` and `sign` its slips."""
    def answer(gpt, ids):
        log_probs = gpt(ids[:, :-1]).log_softmax(-1)
        targets = ids[:, 1:] if scored == "next" else ids[:, :-1]
        picked = log_probs.gather(-1, targets[..., None])
        return sign * (picked.mean() if reduce == "mean" else picked.sum())
    return answer


@pytest.mark.parametrize("answer, message", [
    (_loss_from("next"), None),
    (_loss_from("same"), "the target of position i is the token at i + 1"),
    (_loss_from("next", reduce="sum"), "the mean, not the sum"),
    (_loss_from("next", sign=1.0), "the sign"),
    (_unshifted_cross_entropy, "run the model on ids[:, :-1] only"),
])
def test_next_token_loss_checker(answer, message):
    passed, said = exercises.evaluate("gpt.next_token_loss", answer)
    assert passed == (message is None), said
    assert message is None or message in said


def _adamw(bias_correction: bool = True, decoupled: bool = True, t_offset: int = 0):
    """An AdamW answer, right by default, with one of the usual slips on request."""
    def answer(p, g, m, v, t, lr, betas, eps, weight_decay):
        beta1, beta2 = betas
        if not decoupled:
            g, weight_decay = g + weight_decay * p, 0.0
        m = beta1 * m + (1 - beta1) * g
        v = beta2 * v + (1 - beta2) * g * g
        t = t + t_offset
        m_hat = m / (1 - beta1 ** t) if bias_correction else m
        v_hat = v / (1 - beta2 ** t) if bias_correction else v
        return p * (1 - lr * weight_decay) - lr * m_hat / (v_hat.sqrt() + eps), m, v
    return answer


@pytest.mark.parametrize("answer, message", [
    (_adamw(), None),
    (_adamw(bias_correction=False), "no bias correction"),
    (_adamw(decoupled=False), "weight decay is decoupled"),
    (_adamw(t_offset=1), "counting from 1"),
    (lambda *args: _adamw()(*args)[0], "return the tuple (param, m, v)"),
])
def test_adamw_update_checker(answer, message):
    passed, said = exercises.evaluate("gpt.adamw_update", answer)
    assert passed == (message is None), said
    assert message is None or message in said


def _cache_step(scale: bool = True, see_itself: bool = True, dim: int = 1):
    """A cache-step answer; dim is the axis it appends the returned keys and values on."""
    def answer(x_new, w_q, w_k, w_v, keys, values):
        import torch
        q = x_new @ w_q
        all_keys = torch.cat([keys, x_new @ w_k], dim=1)
        all_values = torch.cat([values, x_new @ w_v], dim=1)
        seen_k, seen_v = (all_keys, all_values) if see_itself else (keys, values)
        scores = q @ seen_k.transpose(-2, -1) / (keys.shape[-1] ** 0.5 if scale else 1.0)
        returned = [torch.cat([stored, x_new @ w], dim=dim) for stored, w in ((keys, w_k), (values, w_v))]
        return scores.softmax(-1) @ seen_v, *returned
    return answer


@pytest.mark.parametrize("answer, message", [
    (_cache_step(), None),
    (_cache_step(scale=False), "sqrt(d_h)"),
    (_cache_step(see_itself=False), "stored tokens only"),
    (_cache_step(dim=2), "along the token axis, dim=1"),
])
def test_cache_step_checker(answer, message):
    passed, said = exercises.evaluate("gpt.cache_step", answer)
    assert passed == (message is None), said
    assert message is None or message in said
