"""Mutation testing of helpers/ with mutmut 3: how many planted one-line bugs the fast tests catch.

    pip install -c constraints.txt -e ".[mutation]"          # mutmut; not in the `test` extra
    nice -n 10 python benchmarks/mutation.py --module helpers/flash/tiled.py
    python benchmarks/mutation.py --module helpers/flash/tiled.py helpers/model/attention.py
    python benchmarks/mutation.py --report-only                # rewrite MUTATION.md from the results

Slow (minutes per module), so not in CI. For each module it:
  1. copies helpers/, tests/, data/ and pyproject.toml into a scratch folder (--workdir, outside the
     repository) and appends a [tool.mutmut] table there: mutate that one module, run only the
     test files that MODULE_TESTS maps to it less SLOW_TESTS, stop at the first failure (-x), a
     fixed hypothesis seed. The repository's own pyproject.toml carries no mutmut configuration;
  2. runs `mutmut run` there (mutmut runs, for each mutant, only the tests that call the mutated
     function; a mutant is a timeout when it runs longer than
     (the tests' clean time + --timeout-constant) x --timeout-multiplier x 2 CPU seconds);
  3. reads mutmut's verdicts and the diff of every mutant that was not killed, stores them in
     benchmarks/mutation_results.json (one entry per module; a rerun replaces that module's), and
     writes benchmarks/MUTATION.md from all the modules stored.

Score = killed / (total - equivalent). A timeout is counted apart (neither killed nor equivalent).
A surviving mutant judged equivalent (no test can tell it from the original) is listed in
benchmarks/mutation_equivalent.toml with its reason:

    [[equivalent]]
    module = "helpers/flash/tiled.py"
    function = "tile_step"                      # as in mutmut's name, x_tile_step__mutmut_7
    before = "m = torch.maximum(state.m, ...)"  # the changed line(s), stripped, joined by newlines
    after = "m = torch.maximum(state.m, ...)"
    reason = "why no input can tell them apart"

Matched by module, function and the changed lines, not by mutmut's number, so that a judgement
survives edits elsewhere in the function. An entry that matches no surviving mutant is reported as
stale.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the report needs 3.11's tomllib to read the judgements
    tomllib = None

ROOT = Path(__file__).resolve().parent.parent
REPORT = ROOT / "benchmarks" / "MUTATION.md"
RESULTS = ROOT / "benchmarks" / "mutation_results.json"
EQUIVALENT = ROOT / "benchmarks" / "mutation_equivalent.toml"
WORKDIR = Path(tempfile.gettempdir()) / "transformer-course-mutation"

# The test files that exercise each module: its own (tests/<subpackage>/test_<module>.py) first,
# then the files of the modules that call it. Fast tests only: tests marked `processes` (worker
# processes, which mutmut cannot see) and SLOW_TESTS are deselected; notebook runs, interpreted
# Triton kernels (tests/flash/test_triton_kernels.py) and benchmark reruns (tests/benchmarks/)
# are in files of their own. mutmut narrows them further to the tests that call the mutated
# function. tests/course/test_layout.py checks that every path here exists.
MODULE_TESTS: dict[str, list[str]] = {
    "helpers/flash/tiled.py": ["tests/flash/test_tiled.py"],
    "helpers/model/attention.py": [
        "tests/model/test_attention.py", "tests/model/test_multihead.py",
        "tests/flash/test_tiled.py",
    ],
    "helpers/training/trainer.py": [
        "tests/training/test_trainer.py", "tests/training/test_by_hand.py",
    ],
    "helpers/training/by_hand.py": [
        "tests/training/test_by_hand.py", "tests/lab/exercises/test_gpt.py",
    ],
    "helpers/training/guards.py": [
        "tests/training/test_guards.py", "tests/training/test_trainer.py",
    ],
    "helpers/training/speed.py": ["tests/training/test_speed.py", "tests/training/test_trainer.py"],
    "helpers/scale/sharded.py": ["tests/scale/test_sharded.py"],
    "helpers/model/multihead.py": ["tests/model/test_multihead.py"],
    "helpers/model/layers.py": [
        "tests/model/test_layers.py", "tests/model/test_gpt.py", "tests/model/test_modern.py",
    ],
    "helpers/model/gpt.py": ["tests/model/test_gpt.py"],
    "helpers/model/embeddings.py": ["tests/model/test_embeddings.py"],
    "helpers/model/modern.py": ["tests/model/test_modern.py"],
    "helpers/model/llama.py": ["tests/model/test_llama.py", "tests/model/test_modern.py"],
    "helpers/model/gpt2.py": ["tests/model/test_gpt2.py"],
    "helpers/model/gemma.py": ["tests/model/test_gemma.py"],
    "helpers/model/checkpoints.py": ["tests/model/test_checkpoints.py"],
    "helpers/model/deepseek.py": ["tests/model/test_deepseek.py", "tests/model/test_mla.py"],
    "helpers/model/mla.py": ["tests/model/test_mla.py"],
    "helpers/model/moe.py": [
        "tests/model/test_moe.py", "tests/lab/exercises/test_frontier_decoder.py",
    ],
    "helpers/model/frontier.py": [
        "tests/model/test_frontier.py", "tests/model/test_moe.py", "tests/model/test_sliding.py",
    ],
    "helpers/model/sliding.py": ["tests/model/test_sliding.py"],
    "helpers/model/kv_cache.py": [
        "tests/model/test_kv_cache.py", "tests/model/test_gpt.py", "tests/model/test_modern.py",
    ],
    "helpers/model/generation.py": [
        "tests/model/test_generation.py", "tests/model/test_gpt.py", "tests/serve/test_sampling.py",
    ],
    "helpers/model/fused.py": ["tests/model/test_fused.py", "tests/model/test_gpt.py"],
    "helpers/flash/costs.py": ["tests/flash/test_costs.py", "tests/flash/test_tiled.py"],
    "helpers/flash/profiling.py": ["tests/flash/test_profiling.py", "tests/flash/test_tiled.py"],
    "helpers/flash/triton_attention.py": ["tests/flash/test_triton_attention.py"],
    "helpers/scale/data_parallel.py": ["tests/scale/test_data_parallel.py"],
    "helpers/scale/tensor_parallel.py": ["tests/scale/test_tensor_parallel.py"],
    "helpers/scale/expert_parallel.py": ["tests/scale/test_expert_parallel.py"],
    "helpers/scale/parallelism.py": ["tests/scale/test_parallelism.py"],
    "helpers/scale/recompute.py": ["tests/scale/test_recompute.py"],
    "helpers/serve/batching.py": [
        "tests/serve/test_batching.py", "tests/serve/test_scheduler.py", "tests/serve/test_sampling.py",
    ],
    "helpers/serve/paged.py": ["tests/serve/test_paged.py"],
    "helpers/serve/quantize.py": ["tests/serve/test_quantize.py"],
    "helpers/serve/sampling.py": ["tests/serve/test_sampling.py"],
    "helpers/serve/scheduler.py": ["tests/serve/test_scheduler.py"],
    "helpers/serve/speculative.py": ["tests/serve/test_speculative.py"],
    "helpers/post/lora.py": ["tests/post/test_lora.py"],
    "helpers/post/dpo.py": ["tests/post/test_dpo.py"],
    "helpers/post/sft.py": ["tests/post/test_sft.py"],
    "helpers/post/grpo.py": ["tests/post/test_grpo.py"],
    "helpers/scale/fsdp.py": ["tests/scale/test_fsdp.py"],
    "helpers/scale/fsdp_module.py": ["tests/scale/test_fsdp_module.py"],
    "helpers/scale/zero.py": ["tests/scale/test_zero.py"],
    "helpers/scale/any_model.py": ["tests/scale/test_fsdp_module.py", "tests/scale/test_zero.py"],
    "helpers/training/resume.py": ["tests/training/test_resume.py"],
    "helpers/scale/pipeline.py": ["tests/scale/test_pipeline.py"],
    "helpers/scale/ring_attention.py": ["tests/scale/test_ring_attention.py"],
    "helpers/scale/workers.py": ["tests/scale/test_workers.py"],
    "helpers/scale/cell_functions.py": ["tests/scale/test_cell_functions.py"],
    "helpers/text/bpe.py": ["tests/text/test_bpe.py"],
    "helpers/text/chars.py": ["tests/text/test_chars.py"],
    "helpers/text/subword.py": ["tests/text/test_subword.py"],
    "helpers/text/gpt2_tokenizer.py": ["tests/text/test_gpt2_tokenizer.py"],
    "helpers/text/corpus.py": ["tests/text/test_corpus.py"],
    "helpers/text/corpus_rich.py": ["tests/text/test_corpus_rich.py"],
    "helpers/text/lexicon.py": ["tests/text/test_lexicon.py", "tests/text/test_corpus_rich.py"],
    "helpers/families/bottleneck.py": ["tests/families/test_bottleneck.py"],
    "helpers/families/mlm.py": ["tests/families/test_mlm.py", "tests/families/test_translation.py"],
    "helpers/families/rnn.py": ["tests/families/test_rnn.py"],
    "helpers/families/seq2seq.py": ["tests/families/test_seq2seq.py"],
    "helpers/families/translation.py": ["tests/families/test_translation.py"],
}

# What a reader of a module's score should know, printed under its heading in MUTATION.md.
MODULE_NOTES: dict[str, str] = {
    "helpers/scale/sharded.py": (
        "mutmut counts a test for a function only when the function runs in the pytest process: "
        "the two-rank tests run in worker processes (helpers.scale.workers) and count for nothing "
        "here, so the one-rank tests in test_properties_exact.py run the workers' code in-process "
        "(and one asserts the call of the cross-rank shape check). Open: which MLP layers are "
        "their own FSDP units changes when weights are gathered (memory), not any result."),
    "helpers/scale/data_parallel.py": (
        "mutmut counts only what runs in the pytest process, and a one-rank gloo group cannot tell "
        "rank 0's rows from rank 1's nor a sum over ranks from a copy: tests/scale/test_data_parallel.py "
        "runs two and three ranks as threads of torch's in-process 'threaded' process group "
        "(tests/ranks_in_threads.py), the workers' own code, against one process and torch's DDP. "
        "Its spawned-worker tests (marked `processes`) are left out of the run: they count for "
        "nothing here and their parent-side checks would run behind every mutant of make_model or "
        "loss_of. "
        "The one 'other' verdict, loss_of's F.mse_loss(None, targets), crashed mutmut's forked "
        "worker (exit -11); run directly with that mutant, the first test that calls loss_of fails "
        "(AttributeError), whatever the order."),
    "helpers/scale/tensor_parallel.py": (
        "Two to four ranks as threads of torch's in-process process group (tests/ranks_in_threads.py), "
        "each split module against the whole one forward and backward, and the hand-split MLP "
        "against torch.distributed.tensor.parallel's on the same threads; the spawned-worker tests "
        "(marked `processes`, counted for nothing) are left out of the run."),
    "helpers/scale/expert_parallel.py": (
        "One to four ranks as threads of torch's in-process process group (tests/ranks_in_threads.py): "
        "the split layer against the whole one, and each rank's received rows against a count made "
        "in the test from the router. tests/model/test_moe.py is left out of the map: its two-process "
        "run counts for nothing here and its benchmark test needs benchmarks/, not in the scratch copy."),
    'helpers/scale/fsdp.py': (
        "mutmut counts a test only when the mutated function runs in the pytest process, and the two-rank tests in tests/scale/test_fsdp.py run the workers in spawned processes: tests/scale/test_fsdp.py runs the same worker functions here, their ranks as threads (tests/ranks_in_threads.py) whose torch.distributed calls are simulated in Python (collectives in rank order, sends through queues, mismatches raise), one rank computing at a time so that the ranks draw from torch's global generator in a fixed order. On 2 and 3 ranks (3 pads every unit) FSDP by hand ends with one process's AdamW weights; on a one-rank gloo group it trains as PyTorch's FSDP2 fully_shard."),
    'helpers/scale/pipeline.py': (
        "mutmut counts a test only when the mutated function runs in the pytest process, and the two-rank tests in tests/scale/test_pipeline.py run the workers in spawned processes: tests/scale/test_pipeline.py runs the same worker functions here, their ranks as threads (tests/ranks_in_threads.py) whose torch.distributed calls are simulated in Python (collectives in rank order, sends through queues, mismatches raise), one rank computing at a time so that the ranks draw from torch's global generator in a fixed order. Each rank's sends and receives are checked against its schedule; busy and wall time are read on a fake clock. Timeouts: planted bugs that make timeline() loop forever."),
    'helpers/scale/ring_attention.py': (
        "mutmut counts a test only when the mutated function runs in the pytest process, and the two-rank tests in tests/scale/test_ring_attention.py run the workers in spawned processes: tests/scale/test_ring_attention.py runs the same worker functions here, their ranks as threads (tests/ranks_in_threads.py) whose torch.distributed calls are simulated in Python (collectives in rank order, sends through queues, mismatches raise), one rank computing at a time so that the ranks draw from torch's global generator in a fixed order. On 2 and 3 ranks forward and backward equal scaled_dot_product_attention, and each rank's messages go round the ring as they should."),
    'helpers/scale/workers.py': (
        "The spawned processes of tests/scale/test_cell_functions.py and test_distributed.py are invisible to mutmut: tests/scale/test_workers.py runs Workers on a fake multiprocessing context whose Process is a thread, its _serve loop included, with os faked (a quiet worker's dup2 is recorded, not done to pytest) and torch.distributed simulated (tests/ranks_in_threads.py); _collect, _first_failure and _stop on fake processes."),
    'helpers/scale/cell_functions.py': (
        'tests/scale/test_cell_functions.py sends cell functions to real processes; tests/scale/test_cell_functions.py checks in this process what ship() sends and that build() rebuilds it.'),
}

MODULE_NOTES["helpers/flash/triton_kernels.py"] = (
    "The @triton.jit kernels, which mutmut skips, mutated by benchmarks/mutation_kernels.py with "
    "mutmut's own operators and tested against tests/flash/test_triton_kernels.py, compiled on an H200 in "
    "two runs of one 15-minute GPU lease, in a random order (seed 0): the untested rest is not a "
    "choice. The second run's own unmutated check did not finish inside its 150 s limit (a cold "
    "compile cache shared by 15 processes); three mutants in that run passed the same 67 tests that "
    "the first run's unmutated kernels passed, so its verdicts are kept. The mutants that timed out "
    "on the H200 (compile time with 14 processes compiling, not hangs) were rerun under Triton's "
    "interpreter on the CPU, and three of their survivors again after two tests were added.")

# Tests left out of every run (--deselect): each costs tens of seconds per mutant it covers.
SLOW_TESTS = [
    "tests/training/test_speed.py::test_compiled_trainer_computes_the_same_loss_and_trains",  # torch.compile
]

# mutmut's exit-code verdicts, folded into the report's columns.
STATUS_COLUMN = {
    "killed": "killed", "caught by type check": "killed",
    "survived": "survived", "no tests": "survived",
    "timeout": "timeout",
}
COPIED = ("helpers", "tests", "data")


@dataclass
class Mutant:
    name: str           # mutmut's, e.g. helpers.flash.tiled.x_tile_step__mutmut_7
    status: str         # mutmut's verdict: killed, survived, no tests, timeout, suspicious, ...
    diff: str = ""      # unified diff of the mutated function (kept for mutants not killed)

    @property
    def function(self) -> str:
        return function_of(self.name)

    def changed_lines(self) -> tuple[str, str]:
        return changed_lines(self.diff)


@dataclass
class ModuleResult:
    module: str
    mutants: list[Mutant] = field(default_factory=list)
    seconds: float = 0.0
    tests: list[str] = field(default_factory=list)
    date: str = ""
    history: list[dict[str, object]] = field(default_factory=list)  # earlier runs' summary rows
    note: str = ""      # how the run was made, when not by `mutmut run` (mutation_kernels.py)


def function_of(mutant_name: str) -> str:
    """tile_step for helpers.flash.tiled.x_tile_step__mutmut_7; Class.method for a method."""
    last = mutant_name.rsplit(".", 1)[-1]
    last = re.sub(r"__mutmut_\d+$", "", last)
    if last.startswith("xǁ"):
        return ".".join(part for part in last[2:].split("ǁ") if part)
    return last[2:] if last.startswith("x_") else last


def changed_lines(diff: str) -> tuple[str, str]:
    """The removed and the added lines of a unified diff, stripped, each joined by newlines."""
    before, after = [], []
    for line in diff.splitlines():
        if line.startswith(("---", "+++", "@@")):
            continue
        if line.startswith("-"):
            before.append(line[1:].strip())
        elif line.startswith("+"):
            after.append(line[1:].strip())
    return "\n".join(before), "\n".join(after)


def load_equivalents(path: Path | None = None) -> list[dict[str, str]]:
    path = EQUIVALENT if path is None else path
    if not path.exists():
        return []
    if tomllib is None:
        raise RuntimeError(f"reading {path.name} needs Python 3.11 or newer (tomllib)")
    entries = tomllib.loads(path.read_text("utf-8")).get("equivalent", [])
    for i, entry in enumerate(entries):
        missing = {"module", "function", "before", "after", "reason"} - set(entry)
        if missing:
            raise ValueError(f"{path.name}: entry {i} lacks {sorted(missing)}; got {sorted(entry)}")
    return entries


def judged_equivalent(result: ModuleResult, equivalents: list[dict[str, str]]
                      ) -> tuple[dict[str, str], list[dict[str, str]]]:
    """{mutant name: reason} for the surviving mutants judged equivalent, and the stale entries."""
    survivors = [m for m in result.mutants if STATUS_COLUMN.get(m.status) != "killed"]
    found: dict[str, str] = {}
    used: set[int] = set()
    for i, entry in enumerate(equivalents):
        if entry["module"] != result.module:
            continue
        for mutant in survivors:
            before, after = mutant.changed_lines()
            if (mutant.function, before, after) == (entry["function"], entry["before"].strip(),
                                                    entry["after"].strip()):
                found[mutant.name] = entry["reason"]
                used.add(i)
    stale = [e for i, e in enumerate(equivalents) if e["module"] == result.module and i not in used]
    return found, stale


def summary(result: ModuleResult, equivalents: list[dict[str, str]]) -> dict[str, object]:
    counts = {"killed": 0, "survived": 0, "timeout": 0, "other": 0}
    for mutant in result.mutants:
        counts[STATUS_COLUMN.get(mutant.status, "other")] += 1
    found, stale = judged_equivalent(result, equivalents)
    total = len(result.mutants)
    scored = total - len(found)
    score = counts["killed"] / scored if scored else 1.0
    return {"total": total, **counts, "equivalent": len(found), "score": score,
            "equivalent_reasons": found, "stale": stale}


def history_row(result: ModuleResult, equivalents: list[dict[str, str]]) -> dict[str, object]:
    """The summary of a run, kept when a rerun replaces it (so the report shows before and after)."""
    s = summary(result, equivalents)
    row = {k: s[k] for k in ("total", "killed", "survived", "timeout", "other", "equivalent")}
    return {"date": result.date, **row, "score": round(s["score"], 4),
            "seconds": round(result.seconds, 1)}


def render_report(results: dict[str, ModuleResult], equivalents: list[dict[str, str]]) -> str:
    lines = [
        "# Mutation testing",
        "",
        "Written by `benchmarks/mutation.py` (mutmut 3) from `benchmarks/mutation_results.json`;",
        "equivalent mutants are judged in `benchmarks/mutation_equivalent.toml`.",
        "Score = killed / (total - equivalent); a timeout counts as neither.",
        "mutmut skips decorated functions: `@torch.no_grad()`, `@property` and `@contextmanager`",
        "are moved below the function in the scratch copy so their bodies are mutated (runs before",
        "2026-11-27 left them out); functions under other decorators are named per module.",
        "Time: wall time of the module's `mutmut run` (niced, on a shared machine: a rough size, not",
        "a benchmark). Timeouts: CPU time past (clean test time + constant) x multiplier x 2.",
        "",
        "| module | total | killed | survived | timeout | other | equivalent | score | time | run |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    summaries = {name: summary(result, equivalents) for name, result in sorted(results.items())}
    for name, s in summaries.items():
        result = results[name]
        lines.append(
            f"| `{name}` | {s['total']} | {s['killed']} | {s['survived']} | {s['timeout']} | "
            f"{s['other']} | {s['equivalent']} | {100 * s['score']:.1f} % | "
            f"{result.seconds / 60:.1f} min | {result.date} |")
    not_run = [name for name in MODULE_TESTS if name not in results]
    if not_run:
        lines += ["", "Mapped in MODULE_TESTS, not run yet: " + ", ".join(f"`{n}`" for n in not_run)
                  + ". The model, training, flash and scale modules without a map are not run yet "
                  "either: add their fast test files to MODULE_TESTS first."]
    earlier = [(name, row) for name, result in sorted(results.items()) for row in result.history]
    if earlier:
        lines += ["", "Earlier runs (replaced by the rows above; equivalents as judged then):", "",
                  "| module | total | killed | survived | timeout | other | equivalent | score | time | run |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
        lines += [f"| `{name}` | {r['total']} | {r['killed']} | {r['survived']} | {r['timeout']} | "
                  f"{r['other']} | {r['equivalent']} | {100 * r['score']:.1f} % | "
                  f"{r['seconds'] / 60:.1f} min | {r['date']} |" for name, r in earlier]
    for name, s in summaries.items():
        result = results[name]
        lines += ["", f"## `{name}`", "", "Tests: " + ", ".join(f"`{t}`" for t in result.tests)]
        if name in MODULE_NOTES:
            lines += ["", MODULE_NOTES[name]]
        if result.note:
            lines += ["", result.note]
        if (ROOT / name).exists():
            moved, kept = decorated_functions((ROOT / name).read_text("utf-8"))
            if moved:
                lines += ["", "Mutated undecorated (`f = decorator(f)` in the scratch copy): "
                          + ", ".join(f"`{n}`" for n in moved)]
            if kept and result.note:
                lines += ["", "Decorated functions (mutated by the run above, not by mutmut): "
                          + ", ".join(f"`{n}`" for n in kept)]
            elif kept:
                lines += ["", "Not mutated (mutmut skips decorated functions): "
                          + ", ".join(f"`{n}`" for n in kept)]
        reasons = s["equivalent_reasons"]
        if reasons:
            lines += ["", "Judged equivalent:", ""]
            for mutant in result.mutants:
                if mutant.name in reasons:
                    before, after = mutant.changed_lines()
                    lines.append(f"- `{mutant.name}`: `{before}` → `{after}`: {reasons[mutant.name]}")
        left = [m for m in result.mutants
                if m.name not in reasons and STATUS_COLUMN.get(m.status) != "killed"]
        if left:
            lines += ["", "Not killed and not judged equivalent:", ""]
            for mutant in left:
                before, after = mutant.changed_lines()
                lines.append(f"- `{mutant.name}` ({mutant.status}): `{before}` → `{after}`")
        if s["stale"]:
            lines += ["", "Stale judgements (match no surviving mutant):", ""]
            lines += [f"- `{e['function']}`: `{e['before']}` → `{e['after']}`" for e in s["stale"]]
    return "\n".join(lines) + "\n"


def load_results(path: Path | None = None) -> dict[str, ModuleResult]:
    path = RESULTS if path is None else path
    if not path.exists():
        return {}
    results = {}
    for name, entry in json.loads(path.read_text("utf-8")).items():
        stored = entry["mutants"]
        if isinstance(stored, list):  # the first format: one object per mutant
            mutants = [Mutant(**m) for m in stored]
        else:  # {name: status}, diffs apart (only mutants not killed have one)
            mutants = [Mutant(m, status, entry.get("diffs", {}).get(m, ""))
                       for m, status in stored.items()]
        results[name] = ModuleResult(module=name, mutants=mutants, seconds=entry["seconds"],
                                     tests=entry["tests"], date=entry["date"],
                                     history=entry.get("history", []),
                                     note=entry.get("note", ""))
    return results


def save_results(results: dict[str, ModuleResult], path: Path | None = None) -> None:
    """One line per mutant ({name: status}); the diffs of those not killed apart."""
    path = RESULTS if path is None else path
    stored = {}
    for name, r in sorted(results.items()):
        mutants = sorted(r.mutants, key=lambda m: m.name)
        stored[name] = {"seconds": round(r.seconds, 1), "tests": r.tests, "date": r.date,
                        "history": r.history, **({"note": r.note} if r.note else {}),
                        "mutants": {m.name: m.status for m in mutants},
                        "diffs": {m.name: m.diff for m in mutants if m.diff}}
    path.write_text(json.dumps(stored, indent=1, ensure_ascii=False) + "\n", "utf-8")


def write_report(results: dict[str, ModuleResult], report: Path | None = None,
                 equivalent: Path | None = None) -> str:
    report = REPORT if report is None else report
    text = render_report(results, load_equivalents(equivalent))
    report.write_text(text, "utf-8")
    return text


def mutmut_config(module: str, tests: list[str], timeout_multiplier: float,
                  timeout_constant: float) -> str:
    def toml_list(items: list[str]) -> str:
        return "[" + ", ".join(json.dumps(i) for i in items) + "]"

    return "\n".join([
        "", "[tool.mutmut]",
        'source_paths = ["helpers"]',
        f"only_mutate = {toml_list([module])}",
        'also_copy = ["data"]',
        f"pytest_add_cli_args_test_selection = {toml_list(tests)}",
        "pytest_add_cli_args = " + toml_list(
            ["-x", "-q", "-p", "no:cacheprovider", "--hypothesis-seed=0", "-m", "not processes"]
            + [arg for test in SLOW_TESTS for arg in ("--deselect", test)]),
        f"timeout_multiplier = {timeout_multiplier}",
        f"timeout_constant = {timeout_constant}",
        "use_git_change_detection = false",
        "",
    ])


# mutmut 3 leaves every decorated function unmutated (bar staticmethod and classmethod). In the
# scratch copy, a function whose one decorator is below is written undecorated and wrapped after
# its definition (`f = torch.no_grad()(f)`), which is the same function: mutmut then reaches its
# body. Other decorators (triton.jit, functools.cache, ...) are kept and named in the report.
REWRAPPED = ("torch.no_grad()", "torch.inference_mode()", "property", "contextmanager")


def decorated_functions(source: str) -> tuple[list[str], list[str]]:
    """The functions unwrap_decorators moves and those it leaves decorated, read with the
    standard library's ast (the report runs where libcst, mutmut's parser, is not installed)."""
    import ast

    moved: list[str] = []
    kept: list[str] = []

    def visit(body: list[ast.stmt], prefix: list[str]) -> None:
        for node in body:
            if isinstance(node, ast.ClassDef):
                visit(node.body, [*prefix, node.name])
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                decorators = [ast.unparse(d) for d in node.decorator_list]
                name = ".".join([*prefix, node.name])
                if decorators and decorators not in (["staticmethod"], ["classmethod"]):
                    (moved if len(decorators) == 1 and decorators[0] in REWRAPPED else kept).append(name)
                visit(node.body, [*prefix, node.name])
            elif isinstance(node, (ast.If, ast.Try, ast.With)):
                for part in (node.body, getattr(node, "orelse", []), getattr(node, "finalbody", [])):
                    visit(part, prefix)

    visit(ast.parse(source).body, [])
    return moved, kept


def unwrap_decorators(source: str) -> tuple[str, list[str], list[str]]:
    """`source` with REWRAPPED decorators moved below their functions; the names moved, the names
    still decorated (which mutmut will not mutate)."""
    import libcst as cst

    module = cst.parse_module(source)
    moved: list[str] = []
    kept: list[str] = []

    class Unwrap(cst.CSTTransformer):
        def __init__(self) -> None:
            self.classes: list[str] = []

        def visit_ClassDef(self, node: cst.ClassDef) -> None:
            self.classes.append(node.name.value)

        def leave_ClassDef(self, original: cst.ClassDef, updated: cst.ClassDef) -> cst.ClassDef:
            self.classes.pop()
            return updated

        def leave_FunctionDef(self, original: cst.FunctionDef, updated: cst.FunctionDef):
            name = ".".join([*self.classes, updated.name.value])
            decorators = [module.code_for_node(d.decorator) for d in updated.decorators]
            if not decorators or decorators in (["staticmethod"], ["classmethod"]):
                return updated
            if len(decorators) != 1 or decorators[0] not in REWRAPPED:
                kept.append(name)
                return updated
            moved.append(name)
            wrap = cst.parse_statement(
                f"{updated.name.value} = {decorators[0]}({updated.name.value})\n")
            return cst.FlattenSentinel([updated.with_changes(decorators=[]), wrap])

    return module.visit(Unwrap()).code, moved, kept


def prepare(module: str, tests: list[str], workdir: Path, timeout_multiplier: float,
            timeout_constant: float) -> Path:
    scratch = workdir / module.replace("/", "_").removesuffix(".py")
    if scratch.exists():
        shutil.rmtree(scratch)
    scratch.mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".hypothesis")
    for name in COPIED:
        shutil.copytree(ROOT / name, scratch / name, ignore=ignore)
    pyproject = (ROOT / "pyproject.toml").read_text("utf-8")
    if "[tool.mutmut]" in pyproject:
        raise ValueError("pyproject.toml has a [tool.mutmut] table; this script writes its own")
    (scratch / "pyproject.toml").write_text(
        pyproject + mutmut_config(module, tests, timeout_multiplier, timeout_constant), "utf-8")
    target = scratch / module
    source, _, _ = unwrap_decorators(target.read_text("utf-8"))
    target.write_text(source, "utf-8")
    return scratch


DIFFS = """
import json, sys
from mutmut.mutation.diff_apply import get_diff_for_mutant
path, names = sys.argv[1], sys.argv[2:]
print(json.dumps({n: get_diff_for_mutant(n, path=path) for n in names}))
"""


def read_verdicts(scratch: Path, module: str) -> list[Mutant]:
    from mutmut.stats import status_by_exit_code

    meta = json.loads((scratch / "mutants" / (module + ".meta")).read_text("utf-8"))
    mutants = [Mutant(name=name, status=status_by_exit_code[code])
               for name, code in meta["exit_code_by_key"].items()]
    open_ = [m for m in mutants if STATUS_COLUMN.get(m.status) != "killed"]
    if open_:
        out = subprocess.run([sys.executable, "-c", DIFFS, module, *[m.name for m in open_]],
                             cwd=scratch, capture_output=True, text=True, check=True)
        diffs = json.loads(out.stdout.strip().splitlines()[-1])
        for m in open_:
            m.diff = diffs[m.name]
    return mutants


def run_module(module: str, args: argparse.Namespace) -> ModuleResult:
    tests = [t for t in MODULE_TESTS[module] if (ROOT / t).exists()]
    scratch = prepare(module, tests, args.workdir, args.timeout_multiplier, args.timeout_constant)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    start = time.perf_counter()
    command = [sys.executable, "-m", "mutmut", "run", "--max-children", str(args.jobs)]
    done = subprocess.run(command, cwd=scratch, env=env,
                          preexec_fn=(lambda: os.nice(args.nice)) if args.nice else None)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"mutmut run on {module} exited with {done.returncode}; see {scratch}")
    return ModuleResult(module=module, mutants=read_verdicts(scratch, module), seconds=seconds,
                        tests=tests, date=time.strftime("%Y-%m-%d", time.gmtime()))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--module", nargs="+", default=[],
                        help=f"module(s) to mutate, among: {', '.join(MODULE_TESTS)}")
    parser.add_argument("--report-only", action="store_true",
                        help="rewrite MUTATION.md from the stored results; run nothing")
    parser.add_argument("--jobs", type=int, default=2, help="mutants tested at once")
    parser.add_argument("--timeout-multiplier", type=float, default=5.0)
    parser.add_argument("--timeout-constant", type=float, default=5.0, help="seconds")
    parser.add_argument("--nice", type=int, default=10, help="niceness of the mutmut run")
    parser.add_argument("--workdir", type=Path, default=WORKDIR)
    args = parser.parse_args(argv)
    unknown = [m for m in args.module if m not in MODULE_TESTS]
    if unknown:
        parser.error(f"--module: no test map for {unknown}; expected some of {list(MODULE_TESTS)}")
    if not args.module and not args.report_only:
        parser.error("--module: give at least one module, or --report-only")
    if args.module and args.report_only:
        parser.error("--report-only runs nothing; drop --module")
    if args.jobs < 1:
        parser.error(f"--jobs: expected at least 1, got {args.jobs}")
    if args.timeout_multiplier <= 0 or args.timeout_constant < 0:
        parser.error(f"--timeout-multiplier must be > 0 and --timeout-constant >= 0; got "
                     f"{args.timeout_multiplier} and {args.timeout_constant}")
    if not 0 <= args.nice <= 19:
        parser.error(f"--nice: expected 0 to 19, got {args.nice}")
    if ROOT in [args.workdir.resolve(), *args.workdir.resolve().parents]:
        parser.error(f"--workdir: must be outside the repository, got {args.workdir}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    for module in args.module:
        result = run_module(module, args)
        results = load_results()  # read again: another module's run may have finished meanwhile
        if module in results:
            old = results[module]
            result.history = [*old.history, history_row(old, load_equivalents())]
        results[module] = result
        save_results(results)
        print(f"{module}: {result.seconds / 60:.1f} min")
    print(write_report(load_results()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
