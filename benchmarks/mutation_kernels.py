"""Mutation testing of the Triton kernels (helpers/flash/triton_kernels.py), which mutmut skips.

mutmut 3 leaves decorated functions alone, and every kernel is `@triton.jit`. This script makes
the mutants mutmut would make (its own operators, through `mutmut.mutation.file_mutation`) inside
the kernels' bodies and runs the kernel tests against each one: tests/flash/test_triton_kernels.py, less
the two tests that launch no kernel. On a CUDA GPU the kernels are compiled; without one they run
under Triton's interpreter, about 10 s per surviving mutant on a laptop core.

    python benchmarks/mutation_kernels.py make                 # write the mutants (needs mutmut)
    python benchmarks/mutation_kernels.py run --jobs 12        # test them (torch, triton, pytest)
    python benchmarks/mutation_kernels.py store                # verdicts -> mutation_results.json

`make` and `store` run where the `mutation` extra is installed; `run` needs only torch, triton
and pytest, so it can run on a GPU machine that has no mutmut: carry the folder `make` wrote.

Each worker process keeps torch and triton imported and tests one mutant after another: it
writes the mutant into its own copy of helpers/, forgets helpers.* and the test module, and runs
pytest in the same process (-x, so a killed mutant costs one failing test). Triton's on-disk
cache keeps every kernel the mutant leaves unchanged compiled. A worker silent past --timeout
seconds on one mutant is killed, the mutant counted a timeout, and a fresh worker goes on. The
unmutated kernels run first, and must pass, or nothing else runs.

`store` puts the verdicts into benchmarks/mutation_results.json under the module's name, with the
device they ran on, so mutation.py's report and equivalence judgements cover them as any module.

The runs behind the stored result are in benchmarks/kernel_mutation_runs/ (two on an H200, two
under the interpreter, in that order): `run --resume benchmarks/kernel_mutation_runs/*.json`
tests the mutants none of them reached, then their timeouts; `store --verdicts` takes them all.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODULE = "helpers/flash/triton_kernels.py"
TESTS = "tests/flash/test_triton_kernels.py"
DESELECT = [  # it launches no kernel: it imports without Triton
    "tests/flash/test_triton_kernels.py::test_module_imports_without_triton_and_fails_only_when_called",
]
DECORATOR = "    @triton.jit\n"
MARK = "    # @triton.jit (mutation_kernels.py)\n"
DEFAULT_DIR = ROOT / ".kernel-mutants"  # ignored by git; carried to the GPU machine by `run`


# ---------------------------------------------------------------- make (here, with mutmut)

def kernel_spans(module) -> dict[str, tuple[int, int]]:
    """{kernel name: (first, last) line of its body} for the functions marked as kernels."""
    import libcst as cst
    from libcst.metadata import MetadataWrapper, PositionProvider

    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    positions = wrapper.resolve(PositionProvider)
    spans = {}
    for node in positions:
        if isinstance(node, cst.FunctionDef) and any(
                "mutation_kernels.py" in line.comment.value
                for line in node.leading_lines if line.comment):
            body = positions[node.body]
            spans[node.name.value] = (body.start.line, body.end.line)
    return spans


def make_mutants(source: str) -> list[dict[str, str]]:
    """Every mutant of the kernels' bodies: [{name, function, source, diff}], in source order."""
    import libcst as cst
    from libcst.metadata import MetadataWrapper, PositionProvider
    from mutmut.mutation.file_mutation import create_mutations

    if source.count(DECORATOR) == 0:
        raise ValueError(f"{MODULE}: no '{DECORATOR.strip()}' kernels found")
    marked = source.replace(DECORATOR, MARK)
    with tempfile.TemporaryDirectory() as config_dir:  # mutmut reads its settings from the cwd
        Path(config_dir, "pyproject.toml").write_text('[tool.mutmut]\nsource_paths = ["helpers"]\n')
        here = Path.cwd()
        os.chdir(config_dir)
        try:
            module, mutations, _, _ = create_mutations(MODULE, marked)
        finally:
            os.chdir(here)
    spans = kernel_spans(module)
    positions = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
    counts: dict[str, int] = {}
    mutants = []
    for mutation in mutations:
        line = positions[mutation.original_node].start.line
        owner = [name for name, (first, last) in spans.items() if first <= line <= last]
        if not owner:
            continue  # module-level code (the imports, LOG2_E): not a kernel
        counts[owner[0]] = counts.get(owner[0], 0) + 1
        mutated = module.deep_replace(mutation.original_node, mutation.mutated_node)
        assert isinstance(mutated, cst.Module)
        text = mutated.code.replace(MARK, DECORATOR)
        diff = "".join(difflib.unified_diff(source.splitlines(True), text.splitlines(True),
                                            MODULE, MODULE, n=1))
        mutants.append({"name": f"helpers.flash.triton_kernels.x_{owner[0]}__mutmut_{counts[owner[0]]}",
                        "function": owner[0], "source": text, "diff": diff})
    return mutants


def command_make(args: argparse.Namespace) -> int:
    source = (ROOT / MODULE).read_text("utf-8")
    mutants = make_mutants(source)
    if args.dir.exists():
        shutil.rmtree(args.dir)
    (args.dir / "mutants").mkdir(parents=True)
    for i, mutant in enumerate(mutants):
        (args.dir / "mutants" / f"{i}.py").write_text(mutant["source"], "utf-8")
    index = [{k: m[k] for k in ("name", "function", "diff")} for m in mutants]
    (args.dir / "index.json").write_text(json.dumps(index, indent=1), "utf-8")
    (args.dir / "original.py").write_text(source, "utf-8")
    by_function: dict[str, int] = {}
    for m in mutants:
        by_function[m["function"]] = by_function.get(m["function"], 0) + 1
    print(f"{len(mutants)} mutants in {args.dir}: " + ", ".join(f"{k} {v}" for k, v in by_function.items()))
    return 0


# ---------------------------------------------------------------- run (torch, triton, pytest)

class _Counter:
    """A pytest plugin that counts the tests that passed, failed and were skipped."""

    def __init__(self) -> None:
        self.passed = self.failed = self.skipped = 0

    def pytest_runtest_logreport(self, report) -> None:  # noqa: ANN001 (pytest's TestReport)
        if report.when == "call" and report.passed:
            self.passed += 1
        elif report.failed:
            self.failed += 1
        elif report.skipped:
            self.skipped += 1


def worker(scratch: Path, log: Path) -> None:
    """Test the mutants whose numbers arrive on stdin; append 'START i' and 'DONE i verdict
    passed failed seconds' lines to `log` (stdout belongs to pytest)."""
    import pytest

    os.chdir(scratch)
    sys.path.insert(0, str(scratch))
    target = scratch / MODULE
    with log.open("a", encoding="utf-8") as out:
        for line in sys.stdin:
            number = line.strip()
            if not number:
                continue
            source = scratch.parent.parent / "mutants" / f"{number}.py"
            if number == "original":
                source = scratch.parent.parent / "original.py"
            out.write(f"START {number}\n")
            out.flush()
            start = time.perf_counter()
            shutil.copyfile(source, target)
            for name in [n for n in sys.modules
                         if n.split(".")[0] in ("helpers", "conftest", "test_flash_triton", "tests")]:
                del sys.modules[name]
            counter = _Counter()
            code = pytest.main(["-x", "-q", "-p", "no:cacheprovider", "--rootdir", str(scratch),
                                TESTS,
                                *[a for test in DESELECT for a in ("--deselect", test)]],
                               plugins=[counter])
            verdict = "survived" if code == 0 else "killed" if code in (1, 2) else f"error{int(code)}"
            out.write(f"DONE {number} {verdict} {counter.passed} {counter.failed} "
                      f"{time.perf_counter() - start:.1f}\n")
            out.flush()


class Worker:
    def __init__(self, number: int, args: argparse.Namespace) -> None:
        self.scratch = args.dir / "work" / f"w{number}"
        if not self.scratch.exists():
            self.scratch.mkdir(parents=True)
            for name in ("helpers", "tests"):
                shutil.copytree(ROOT / name, self.scratch / name,
                                ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        self.log = args.dir / "work" / f"w{number}.log"
        self.log.write_text("", "utf-8")
        self.read = 0
        output = (args.dir / "work" / f"w{number}.out").open("a")
        self.process = subprocess.Popen(
            [sys.executable, __file__, "worker", str(self.scratch), str(self.log)],
            stdin=subprocess.PIPE, stdout=output, stderr=subprocess.STDOUT, text=True,
            env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
        self.current: str | None = None
        self.since = 0.0

    def send(self, number: str) -> None:
        self.current, self.since = number, time.monotonic()
        assert self.process.stdin is not None
        self.process.stdin.write(number + "\n")
        self.process.stdin.flush()

    def finished(self) -> list[list[str]]:
        text = self.log.read_text("utf-8")
        lines, self.read = text[self.read:], len(text)
        done = [line.split() for line in lines.splitlines() if line.startswith("DONE ")]
        if done:
            self.current = None
        return done

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()


def run_all(numbers: list[str], args: argparse.Namespace, deadline: float,
            save: Callable[[dict[str, dict[str, object]]], None] = lambda verdicts: None
            ) -> dict[str, dict[str, object]]:
    """Verdicts {number: {status, passed, failed, seconds}} of the mutants, `args.jobs` at a time;
    `save` gets the verdicts so far every 10 s (a run cut short keeps them)."""
    queue = list(numbers)
    workers = [Worker(i, args) for i in range(min(args.jobs, len(queue)))]
    verdicts: dict[str, dict[str, object]] = {}
    next_report = time.monotonic() + 10
    try:
        while queue or any(w.current is not None for w in workers):
            for i, w in enumerate(workers):
                for _, number, status, passed, failed, seconds in w.finished():
                    verdicts[number] = {"status": status, "passed": int(passed),
                                        "failed": int(failed), "seconds": float(seconds)}
                if w.current is not None and w.process.poll() is not None:
                    # The test process died (an interpreted out-of-bounds store aborts it): the
                    # tests failed to pass, so the mutant is killed, and marked as a crash.
                    verdicts[w.current] = {"status": "killed", "passed": 0, "failed": 0,
                                           "seconds": round(time.monotonic() - w.since, 1),
                                           "crashed": w.process.returncode}
                    workers[i] = w = Worker(i, args)
                if w.current is not None and time.monotonic() - w.since > args.timeout:
                    verdicts[w.current] = {"status": "timeout", "passed": 0, "failed": 0,
                                           "seconds": args.timeout}
                    w.stop()
                    workers[i] = w = Worker(i, args)
                if w.current is None and w.process.poll() is not None:
                    workers[i] = w = Worker(i, args)  # died between mutants: start another
                if w.current is None and queue and time.monotonic() < deadline:
                    w.send(queue.pop(0))
            if time.monotonic() >= deadline and not any(w.current is not None for w in workers):
                break
            if time.monotonic() > next_report:
                print(f"  {len(verdicts)} of {len(numbers)} done", flush=True)
                save(verdicts)
                next_report += 10
            time.sleep(0.2)
    finally:
        for w in workers:
            w.stop()
    save(verdicts)
    return verdicts


def command_run(args: argparse.Namespace) -> int:
    index = json.loads((args.dir / "index.json").read_text("utf-8"))
    numbers = [str(i) for i in range(len(index))]
    random.Random(args.seed).shuffle(numbers)  # stopped by --budget, the tested ones are a sample
    done: dict[str, str] = {}
    for path in args.resume:  # earlier runs: skip their verdicts, retry their timeouts last
        for name, verdict in json.loads(path.read_text("utf-8"))["verdicts"].items():
            done[name] = str(verdict["status"])
    position = {m["name"]: str(i) for i, m in enumerate(index)}
    fresh = [n for n in numbers if index[int(n)]["name"] not in done]
    retry = [position[name] for name, status in done.items() if status == "timeout"]
    numbers = retry if args.retry_only else fresh + retry
    if args.only:
        unknown = [name for name in args.only if name not in position]
        if unknown:
            raise SystemExit(f"--only: no mutant named {unknown[0]!r} in {args.dir / 'index.json'}")
        numbers = [position[name] for name in args.only]
    if args.limit:
        numbers = numbers[:args.limit]
    device = describe_device()
    start = time.monotonic()

    def save(verdicts: dict[str, dict[str, object]]) -> None:
        out = {"device": device, "baseline": verdicts.get("original", {}), "seed": args.seed,
               "date": time.strftime("%Y-%m-%d", time.gmtime()),
               "seconds": round(time.monotonic() - start, 1),
               "verdicts": {index[int(n)]["name"]: v for n, v in verdicts.items()
                            if n != "original"}}
        for path in [args.dir / "verdicts.json", *([args.out] if args.out else [])]:
            path.write_text(json.dumps(out, indent=1), "utf-8")

    # The unmutated kernels run first, beside the first mutants; if they fail, nothing counts.
    verdicts = run_all(["original", *numbers], args, start + args.budget, save)
    base = verdicts.pop("original", {})
    print(f"unmutated kernels: {base}")
    if base.get("status") != "survived" or int(base.get("passed", 0)) < args.min_passed:
        print(f"the unmutated kernels must pass at least {args.min_passed} tests: no verdict counts")
        return 1
    counts: dict[str, int] = {}
    for v in verdicts.values():
        counts[str(v["status"])] = counts.get(str(v["status"]), 0) + 1
    print(f"{device}: {len(verdicts)} of {len(numbers)} mutants tested in "
          f"{time.monotonic() - start:.0f} s: {counts}")
    return 0


def describe_device() -> str:
    import torch
    import triton

    if torch.cuda.is_available():
        return f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}"
    return f"Triton's interpreter on the CPU, torch {torch.__version__}, triton {triton.__version__}"


# ---------------------------------------------------------------- store (here)

def command_store(args: argparse.Namespace) -> int:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import mutation

    runs = [json.loads(path.read_text("utf-8"))
            for path in (args.verdicts or [args.dir / "verdicts.json"])]
    found = {**runs[-1], "verdicts": {}, "seconds": sum(float(r["seconds"]) for r in runs)}
    origin: dict[str, str] = {}
    for run in runs:  # a later run's verdict replaces an earlier one (a retried timeout)
        found["verdicts"].update(run["verdicts"])
        origin.update(dict.fromkeys(run["verdicts"], run["device"]))
    devices = sorted(set(origin.values()))
    found["device"] = "; ".join(
        f"{d} ({list(origin.values()).count(d)} final verdicts)" for d in devices)
    index = {m["name"]: m for m in json.loads((args.dir / "index.json").read_text("utf-8"))}
    mutants = []
    for name, verdict in sorted(found["verdicts"].items()):
        status = str(verdict["status"])
        if status not in mutation.STATUS_COLUMN:
            status = "suspicious"  # an error code: counted under "other"
        diff = "" if status == "killed" else index[name]["diff"]
        mutants.append(mutation.Mutant(name, status, diff))
    result = mutation.ModuleResult(
        module=MODULE, mutants=mutants, seconds=float(found["seconds"]),
        tests=[TESTS + " (less the two tests that launch no kernel)"], date=found["date"],
        note=f"Run by benchmarks/mutation_kernels.py on {found['device']}; "
             f"{len(mutants)} of {len(index)} mutants tested (a random sample where fewer; "
             f"seed {found.get('seed', 0)}).")
    results = mutation.load_results(args.results)
    if MODULE in results:
        old = results[MODULE]
        result.history = [*old.history,
                          mutation.history_row(old, mutation.load_equivalents(args.equivalent))]
    results[MODULE] = result
    mutation.save_results(results, args.results)
    report = mutation.write_report(mutation.load_results(args.results), args.report, args.equivalent)
    print(report.split("\n## ")[0])
    return 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("make", "run", "store"):
        p = sub.add_parser(name)
        p.add_argument("--dir", type=Path, default=DEFAULT_DIR, help="where the mutants are")
        if name == "store":
            p.add_argument("--verdicts", type=Path, nargs="*", default=[],
                           help="verdicts.json of one or more runs (default: the one in --dir)")
            p.add_argument("--results", type=Path, default=None,
                           help="the results JSON (default: benchmarks/mutation_results.json)")
            p.add_argument("--report", type=Path, default=None,
                           help="the report (default: benchmarks/MUTATION.md)")
            p.add_argument("--equivalent", type=Path, default=None,
                           help="the judgements (default: benchmarks/mutation_equivalent.toml)")
        if name == "run":
            p.add_argument("--jobs", type=int, default=2, help="worker processes")
            p.add_argument("--timeout", type=float, default=300.0, help="seconds per mutant")
            p.add_argument("--budget", type=float, default=3600.0,
                           help="seconds after which no new mutant is started")
            p.add_argument("--limit", type=int, default=0, help="test a random sample of N only")
            p.add_argument("--seed", type=int, default=0, help="the order the mutants are tested in")
            p.add_argument("--min-passed", type=int, default=60,
                           help="tests the unmutated kernels must pass")
            p.add_argument("--out", type=Path, default=None, help="also write verdicts.json here")
            p.add_argument("--resume", type=Path, nargs="*", default=[],
                           help="verdicts of earlier runs: test only the rest, and their timeouts")
            p.add_argument("--retry-only", action="store_true",
                           help="with --resume: test only the earlier runs' timeouts")
            p.add_argument("--only", nargs="*", default=[],
                           help="test these mutants (by name) and no other, e.g. after a new test")
    w = sub.add_parser("worker")
    w.add_argument("scratch", type=Path)
    w.add_argument("log", type=Path)
    args = parser.parse_args(argv)
    if args.command == "run":
        for name in ("jobs", "timeout", "budget"):
            if getattr(args, name) <= 0:
                parser.error(f"--{name}: expected a positive number, got {getattr(args, name)}")
        if args.limit < 0:
            parser.error(f"--limit: expected 0 (all) or more, got {args.limit}")
        if not (args.dir / "index.json").is_file():
            parser.error(f"--dir: no index.json in {args.dir}; run `make` first")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.command == "worker":
        worker(args.scratch.resolve(), args.log.resolve())
        return 0
    args.dir = args.dir.resolve()
    return {"make": command_make, "run": command_run, "store": command_store}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
