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

# The non-notebook test files that exercise each module (fast ones only: no notebook runs, no
# interpreted Triton kernels, no multi-process workers). mutmut narrows them further to the tests
# that call the mutated function.
MODULE_TESTS: dict[str, list[str]] = {
    "helpers/flash/tiled.py": [
        "tests/test_flash.py", "tests/test_properties.py", "tests/test_bad_input_newer.py",
        "tests/test_properties_exact.py",
    ],
    "helpers/model/attention.py": [
        "tests/test_attention.py", "tests/test_masking.py", "tests/test_multihead.py",
        "tests/test_flash.py",  # its checks are attention's (check_qkv, check_mask)
        "tests/test_properties.py", "tests/test_bad_input.py", "tests/test_bad_input_newer.py",
        "tests/test_properties_exact.py",
    ],
    "helpers/training/trainer.py": [
        "tests/test_train.py", "tests/test_properties.py", "tests/test_bad_input.py",
        "tests/test_bad_input_newer.py", "tests/test_properties_exact.py",
        "tests/test_by_hand.py",  # the plain loop step for step against Trainer.train_step
        "tests/test_trainer_mutants.py",
    ],
    "helpers/training/by_hand.py": [
        "tests/test_by_hand.py", "tests/test_gpt_checkers.py",  # the checker that it passes
        "tests/test_by_hand_mutants.py",
    ],
    "helpers/training/guards.py": [
        "tests/test_train.py", "tests/test_bad_input.py", "tests/test_bad_input_newer.py",
        "tests/test_properties.py", "tests/test_properties_exact.py", "tests/test_guards_mutants.py",
    ],
    "helpers/training/speed.py": [
        "tests/test_train.py", "tests/test_properties.py", "tests/test_bad_input.py",
        "tests/test_bad_input_newer.py", "tests/test_properties_exact.py",
        "tests/test_speed_mutants.py",
    ],
    "helpers/scale/sharded.py": [
        "tests/test_distributed.py", "tests/test_properties.py", "tests/test_bad_input_newer.py",
        "tests/test_properties_exact.py", "tests/test_sharded_mutants.py",
    ],
    # Mapped for the next runs (each file below runs in under 5 s here), not run yet:
    "helpers/model/multihead.py": [
        "tests/test_multihead.py", "tests/test_properties.py", "tests/test_bad_input.py",
        "tests/test_properties_exact.py", "tests/test_multihead_mutants.py",
    ],
    "helpers/model/layers.py": [
        "tests/test_norms_ffn.py", "tests/test_gpt.py", "tests/test_modern.py",
        "tests/test_bad_input.py", "tests/test_layers_mutants.py",
    ],
    "helpers/model/gpt.py": [
        "tests/test_gpt.py", "tests/test_properties.py", "tests/test_bad_input.py",
        "tests/test_bad_input_newer.py", "tests/test_properties_exact.py", "tests/test_gpt_mutants.py",
    ],
    "helpers/model/embeddings.py": [
        "tests/test_embeddings.py", "tests/test_bad_input.py", "tests/test_embeddings_mutants.py",
    ],
    "helpers/model/modern.py": [
        "tests/test_modern.py", "tests/test_properties.py", "tests/test_bad_input_newer.py",
        "tests/test_modern_mutants.py",
    ],
    # --- model-a (first runs 2026-11-27) ---
    "helpers/model/llama.py": [
        "tests/test_modern.py", "tests/test_bad_input_newer.py", "tests/test_llama_mutants.py",
    ],
    # Not test_bad_input_newer.py for gpt2.py and checkpoints.py: its two-process worker test ran
    # past its 60 s timeout on the shared machine and stopped a run in mutmut's clean-test phase;
    # its refusals of these two modules are repeated in the _mutants files.
    "helpers/model/gpt2.py": [
        "tests/test_gpt2.py", "tests/test_gpt2_mutants.py",
    ],
    "helpers/model/gemma.py": [
        "tests/test_gemma.py", "tests/test_gemma_mutants.py",
    ],
    "helpers/model/checkpoints.py": [  # not test_train.py: its two round trips train first (10 s
        # each on a busy machine); test_checkpoints_mutants.py round-trips both models in well under 1 s
        "tests/test_bad_input.py", "tests/test_checkpoints_mutants.py",
    ],
    # --- end model-a ---
    # --- model-b (first runs 2026-11-27) ---
    "helpers/model/deepseek.py": [
        "tests/test_mla.py", "tests/test_deepseek_mutants.py",
    ],
    "helpers/model/mla.py": [
        "tests/test_mla.py", "tests/test_mla_mutants.py",
    ],
    "helpers/model/moe.py": [
        "tests/test_moe.py", "tests/test_late_exercises.py", "tests/test_moe_mutants.py",
    ],
    "helpers/model/frontier.py": [
        "tests/test_moe.py", "tests/test_sliding.py", "tests/test_frontier_mutants.py",
    ],
    "helpers/model/sliding.py": [
        "tests/test_sliding.py", "tests/test_sliding_mutants.py",
    ],
    # --- end model-b ---
    # --- model-c (first runs 2026-11-27) ---
    "helpers/model/kv_cache.py": [
        "tests/test_gpt.py", "tests/test_modern.py", "tests/test_bad_input.py",
        "tests/test_bad_input_newer.py", "tests/test_properties.py", "tests/test_gpt_mutants.py",
        "tests/test_kv_cache_mutants.py",
    ],
    "helpers/model/generation.py": [
        "tests/test_gpt.py", "tests/test_sampling.py", "tests/test_bad_input.py",
        "tests/test_generation_mutants.py",
    ],
    "helpers/model/fused.py": [
        "tests/test_gpt.py", "tests/test_gpt_mutants.py", "tests/test_fused_mutants.py",
    ],
    # --- end model-c ---
    # --- flash (first runs 2026-11-27) ---
    "helpers/flash/costs.py": [
        "tests/test_flash.py", "tests/test_bad_input_newer.py", "tests/test_costs_mutants.py",
    ],
    "helpers/flash/profiling.py": [
        "tests/test_flash.py", "tests/test_bad_input_newer.py", "tests/test_profiling_mutants.py",
    ],
    "helpers/flash/triton_attention.py": [
        # the wrapper's checks and launch arguments with the kernels recorded, and tiny
        # interpreted runs (seconds); tests/test_flash_triton.py's interpreted sizes take minutes
        "tests/test_triton_attention_mutants.py",
    ],
    # --- end flash ---
    # --- scale-a (first runs 2026-11-27) ---
    # Not tests/test_distributed.py: its workers run in spawned processes (nothing counted) and
    # the parent's checks put them behind every mutant of make_model, loss_of, demo_block, ...
    "helpers/scale/data_parallel.py": [
        "tests/test_data_parallel_mutants.py", "tests/test_properties_exact.py",
        "tests/test_bad_input_newer.py",
    ],
    "helpers/scale/tensor_parallel.py": [
        "tests/test_tensor_parallel_mutants.py", "tests/test_properties_exact.py",
        "tests/test_bad_input_newer.py",
    ],
    # Not tests/test_moe.py: its two-process run counts for nothing, and its bench_moe test needs
    # benchmarks/, which the scratch copy leaves out (the clean run fails there).
    "helpers/scale/expert_parallel.py": [
        "tests/test_expert_parallel_mutants.py", "tests/test_properties_exact.py",
    ],
    # Not tests/test_distributed.py nor tests/test_pipeline.py: their in-process checks of the
    # formulas are repeated in test_parallelism_mutants.py, and their spawned-worker tests are slow
    # and, for the measured bubble, timing-dependent (one failed the clean run on a loaded machine).
    "helpers/scale/parallelism.py": [
        "tests/test_parallelism_mutants.py", "tests/test_properties_exact.py",
    ],
    "helpers/scale/recompute.py": [
        "tests/test_recompute.py", "tests/test_properties_exact.py",
        "tests/test_recompute_mutants.py",
    ],
    # --- end scale-a ---
    # --- serve-post (first runs 2026-11-27) ---
    "helpers/serve/batching.py": [
        "tests/test_scheduler.py", "tests/test_sampling.py", "tests/test_batching_mutants.py",
    ],
    "helpers/serve/paged.py": [
        "tests/test_paged.py", "tests/test_paged_mutants.py",
    ],
    "helpers/serve/quantize.py": [
        "tests/test_quantize.py", "tests/test_quantize_mutants.py",
    ],
    "helpers/serve/sampling.py": [
        "tests/test_sampling.py", "tests/test_sampling_mutants.py",
    ],
    "helpers/serve/scheduler.py": [
        "tests/test_scheduler.py", "tests/test_scheduler_mutants.py",
    ],
    "helpers/serve/speculative.py": [
        "tests/test_speculative.py", "tests/test_speculative_mutants.py",
    ],
    "helpers/post/lora.py": [
        "tests/test_lora.py", "tests/test_post_bad_input.py", "tests/test_lora_mutants.py",
    ],
    "helpers/post/dpo.py": [
        "tests/test_dpo.py", "tests/test_post_bad_input.py", "tests/test_dpo_mutants.py",
    ],
    "helpers/post/sft.py": [
        "tests/test_sft.py", "tests/test_post_bad_input.py", "tests/test_sft_mutants.py",
    ],
    "helpers/post/grpo.py": [
        "tests/test_grpo.py", "tests/test_post_bad_input.py", "tests/test_grpo_mutants.py",
    ],
    # --- end serve-post ---
    # --- scale-b (first runs 2026-11-27) ---
    # Only the *_mutants.py files: test_fsdp.py, test_pipeline.py, test_ring_attention.py and
    # test_workers_cell_functions.py spawn worker processes (seconds per mutant, and mutmut cannot
    # see the code they run); the *_mutants.py files run the same workers in this process, their
    # ranks as threads whose torch.distributed calls are simulated in Python (tests/thread_ranks.py).
    "helpers/scale/fsdp.py": ["tests/test_fsdp_mutants.py"],
    # The general wrappers' workers run in spawned processes too: only their in-process tests count.
    "helpers/scale/fsdp_module.py": ["tests/test_fsdp_module.py"],
    "helpers/scale/zero.py": ["tests/test_zero.py"],
    "helpers/scale/any_model.py": ["tests/test_fsdp_module.py", "tests/test_zero.py"],
    "helpers/training/resume.py": ["tests/test_resume.py"],
    "helpers/scale/pipeline.py": ["tests/test_pipeline_mutants.py"],
    "helpers/scale/ring_attention.py": ["tests/test_ring_attention_mutants.py"],
    "helpers/scale/workers.py": ["tests/test_workers_mutants.py"],
    "helpers/scale/cell_functions.py": ["tests/test_cell_functions_mutants.py"],
    # --- end scale-b ---
    # --- text-a (first runs 2026-11-27) ---
    # test_own_text.py is left out: its knob-cell tests read notebooks/src (not copied to the
    # scratch folder) and its GPT run takes 11 s; test_bpe.py covers what it calls of bpe.py.
    "helpers/text/bpe.py": ["tests/test_bpe.py", "tests/test_bpe_mutants.py"],
    # test_bpe.py is left out: its stream tests read an endless iterator (a stream_blocks mutant that
    # never yields runs to the timeout) and train corpus tokenizers; test_chars_mutants.py checks
    # stream_blocks against a plain search instead.
    "helpers/text/chars.py": ["tests/test_tokenizers.py", "tests/test_chars_mutants.py"],
    "helpers/text/subword.py": ["tests/test_subword.py", "tests/test_subword_mutants.py"],
    "helpers/text/gpt2_tokenizer.py": ["tests/test_gpt2_tokenizer.py", "tests/test_bad_input_newer.py",
                                       "tests/test_gpt2_tokenizer_mutants.py"],
    # --- end text-a ---
    # --- text-b (first runs 2026-11-27) ---
    "helpers/text/corpus.py": ["tests/test_corpus.py", "tests/test_corpus_mutants.py"],
    "helpers/text/corpus_rich.py": ["tests/test_corpus_rich.py", "tests/test_corpus_rich_mutants.py"],
    "helpers/text/lexicon.py": ["tests/test_corpus_rich.py", "tests/test_lexicon_mutants.py"],
    # --- end text-b ---
    # --- families (first runs 2026-11-27) ---
    # test_bottleneck.py's benchmark rerun imports benchmarks/, which the scratch copy lacks
    "helpers/families/bottleneck.py": ["tests/test_bottleneck_mutants.py"],
    "helpers/families/mlm.py": ["tests/test_families_bad_input.py", "tests/test_translation.py",
                                "tests/test_mlm_mutants.py"],
    "helpers/families/rnn.py": ["tests/test_families_bad_input.py", "tests/test_rnn_mutants.py"],
    "helpers/families/seq2seq.py": ["tests/test_seq2seq.py", "tests/test_families_bad_input.py",
                                    "tests/test_seq2seq_mutants.py"],
    "helpers/families/translation.py": ["tests/test_translation.py", "tests/test_families_bad_input.py",
                                        "tests/test_translation_mutants.py"],
    # --- end families ---
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
        "rank 0's rows from rank 1's nor a sum over ranks from a copy: test_data_parallel_mutants.py "
        "runs two and three ranks as threads of torch's in-process 'threaded' process group "
        "(tests/threaded_ranks.py), the workers' own code, against one process and torch's DDP. "
        "tests/test_distributed.py (spawned workers) is left out of the map: it counts for nothing "
        "here and its parent-side checks would run behind every mutant of make_model or loss_of. "
        "The one 'other' verdict, loss_of's F.mse_loss(None, targets), crashed mutmut's forked "
        "worker (exit -11); run directly with that mutant, the first test that calls loss_of fails "
        "(AttributeError), whatever the order."),
    "helpers/scale/tensor_parallel.py": (
        "Two to four ranks as threads of torch's in-process process group (tests/threaded_ranks.py), "
        "each split module against the whole one forward and backward, and the hand-split MLP "
        "against torch.distributed.tensor.parallel's on the same threads; tests/test_distributed.py "
        "(spawned workers, counted for nothing) is left out of the map."),
    "helpers/scale/expert_parallel.py": (
        "One to four ranks as threads of torch's in-process process group (tests/threaded_ranks.py): "
        "the split layer against the whole one, and each rank's received rows against a count made "
        "in the test from the router. tests/test_moe.py is left out of the map: its two-process "
        "run counts for nothing here and its benchmark test needs benchmarks/, not in the scratch copy."),
    'helpers/scale/fsdp.py': (
        "mutmut counts a test only when the mutated function runs in the pytest process, and the two-rank tests in test_fsdp.py run the workers in spawned processes: test_fsdp_mutants.py runs the same worker functions here, their ranks as threads (tests/thread_ranks.py) whose torch.distributed calls are simulated in Python (collectives in rank order, sends through queues, mismatches raise), one rank computing at a time so that the ranks draw from torch's global generator in a fixed order. On 2 and 3 ranks (3 pads every unit) FSDP by hand ends with one process's AdamW weights; on a one-rank gloo group it trains as PyTorch's FSDP2 fully_shard."),
    'helpers/scale/pipeline.py': (
        "mutmut counts a test only when the mutated function runs in the pytest process, and the two-rank tests in test_pipeline.py run the workers in spawned processes: test_pipeline_mutants.py runs the same worker functions here, their ranks as threads (tests/thread_ranks.py) whose torch.distributed calls are simulated in Python (collectives in rank order, sends through queues, mismatches raise), one rank computing at a time so that the ranks draw from torch's global generator in a fixed order. Each rank's sends and receives are checked against its schedule; busy and wall time are read on a fake clock. Timeouts: planted bugs that make timeline() loop forever."),
    'helpers/scale/ring_attention.py': (
        "mutmut counts a test only when the mutated function runs in the pytest process, and the two-rank tests in test_ring_attention.py run the workers in spawned processes: test_ring_attention_mutants.py runs the same worker functions here, their ranks as threads (tests/thread_ranks.py) whose torch.distributed calls are simulated in Python (collectives in rank order, sends through queues, mismatches raise), one rank computing at a time so that the ranks draw from torch's global generator in a fixed order. On 2 and 3 ranks forward and backward equal scaled_dot_product_attention, and each rank's messages go round the ring as they should."),
    'helpers/scale/workers.py': (
        "The spawned processes of test_workers_cell_functions.py and test_distributed.py are invisible to mutmut: test_workers_mutants.py runs Workers on a fake multiprocessing context whose Process is a thread, its _serve loop included, with os faked (a quiet worker's dup2 is recorded, not done to pytest) and torch.distributed simulated (tests/thread_ranks.py); _collect, _first_failure and _stop on fake processes."),
    'helpers/scale/cell_functions.py': (
        'test_workers_cell_functions.py sends cell functions to real processes; test_cell_functions_mutants.py checks in this process what ship() sends and that build() rebuilds it.'),
}

MODULE_NOTES["helpers/flash/triton_kernels.py"] = (
    "The @triton.jit kernels, which mutmut skips, mutated by benchmarks/mutation_kernels.py with "
    "mutmut's own operators and tested against tests/test_flash_triton.py, compiled on an H200 in "
    "two runs of one 15-minute GPU lease, in a random order (seed 0): the untested rest is not a "
    "choice. The second run's own unmutated check did not finish inside its 150 s limit (a cold "
    "compile cache shared by 15 processes); three mutants in that run passed the same 67 tests that "
    "the first run's unmutated kernels passed, so its verdicts are kept. The mutants that timed out "
    "on the H200 (compile time with 14 processes compiling, not hangs) were rerun under Triton's "
    "interpreter on the CPU, and three of their survivors again after two tests were added.")

# Tests left out of every run (--deselect): each costs tens of seconds per mutant it covers.
SLOW_TESTS = [
    "tests/test_train.py::test_compiled_trainer_computes_the_same_loss_and_trains",  # torch.compile
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
            ["-x", "-q", "-p", "no:cacheprovider", "--hypothesis-seed=0"]
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
