"""The race of issue 42: nanoGPT's recipe against the course's recipes, to the same validation loss.

    python benchmarks/bench_race.py --out data/race_fp32_1thread.json            # 60 s each, seeds 0 1 2
    python benchmarks/bench_race.py --threads 2 --out data/race_fp32_2threads.json
    python benchmarks/bench_race.py --precision bf16 --out data/race_bf16.json   # a CPU with native bf16
    python benchmarks/bench_race.py --course-seconds 30 --out data/race_fp32_1thread_30s.json
    python benchmarks/bench_race.py --seconds 3 --seeds 0 --out /tmp/race.json   # a smoke test
    python benchmarks/bench_race.py --add-fitted data/race_fp32_1thread.json --out data/race_fp32_1thread.json

The last adds nanogpt-fitted to a stored race without racing again (add_fitted: it replays
nanoGPT's steps, whose losses do not depend on the machine's load). The stored races ran
`settings["recipes"]` with `settings["muon_lr"]` (each JSON says); the two one-thread float32
races carry nanogpt-fitted added that way (`settings["nanogpt_fitted"]`), the two-thread and
bf16 races do not yet (a two-thread replay needs two quiet cores: a replay on another thread
count is not the stored race's arithmetic).

Every contestant trains the same GPT (n_layers=4, n_heads=4, d_model=128, window 64, batch 12:
nanoGPT's README CPU example) on the course corpus, one character per token, the split and the
validation batches of benchmarks/bench_train.py, from the same initial weights and the same
windows in the same order (a seed sets both). Only the recipe differs:

    nanogpt      nanoGPT's model and train.py step on a CPU (bench_train.NanoGPTLoop, float32)
                 with its shakespeare_char schedule over the README's 2,000-step horizon: AdamW,
                 peak 1e-3 after 100 warm-up steps, cosine to 1e-4 at step 2,000, then 1e-4.
                 In 60 s on one thread it does about 1,000 steps, so its cosine is cut halfway
    nanogpt-fitted  the same model, step, optimizer, weights and windows, with nanoGPT's schedule
                 fitted to its own budget (fitted_nanogpt_lr): the same shape, warm-up for the
                 first 5 % (nanoGPT's 100 of 2,000 steps), cosine to 1e-4 at the end of the budget,
                 by elapsed training time as the course's schedules are. It says how much of
                 the course's lead over `nanogpt` is only annealing to the end
    course       helpers.training.trainer.Trainer with TrainConfig's defaults (AdamW, peak 2e-3,
                 5 % warm-up, cosine to 10 % over the time budget), in --precision
    course-muon  the same with TrainConfig(optimizer="muon"): Muon for the hidden matrices
                 (peak --muon-lr), AdamW for embeddings, head, biases and gains
    course-best  the best recipe of benchmarks/bench_recipe.py's ablation (data/recipe_ablation.json,
                 COURSE_BEST below): TrainConfig(**COURSE_BEST["train"]) on a GPT built with
                 GPTConfig(**COURSE_BEST["model"]), from the seed (the race's weights where the
                 shapes are the race's)

The contestants take turns (slices of --slice seconds, the order rotated each round), so that
anything else running on the machine slows them alike, and each counts only its own training
time: a step's wall-clock seconds, evaluations left out. Every --seconds / --points of that
time each one is evaluated on the fixed validation batches (float32, the same yardstick for all).

The target is the validation loss nanoGPT's recipe reaches at the end of its budget; for each
course recipe the script reports when its curve first reaches it (linear between evaluations)
and the speed-up, budget / that time, per seed and their median; and the same against the
fitted schedule's final loss (`fitted_target`, `speedup_vs_fitted`) where nanogpt-fitted ran. The course's schedules know
their budget (they decay to their floor at its end), so a curve of a 60 s run is not the curve
of a 30 s run: with --course-seconds 30 the course's recipes train 30 s, schedules over 30 s, and
a final loss at or below nanoGPT's 60 s loss is the issue's "2x" (speed-up >= 2). The JSON (--out) holds the
settings, the machine, every curve and the summary. Measure on a quiet machine: --threads 1
and 2 in float32 (the laptop path), and bf16 on a CPU that has it natively; wall-clock numbers
from a machine shared with other work are contention, not the recipes.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench_train, also when imported by a test

from bench_train import (  # noqa: E402
    BATCH,
    BLOCK,
    N_EMBD,
    N_HEAD,
    N_LAYER,
    NanoGPTLoop,
    NanoGPTModel,
    nanogpt_loss,
)

from helpers import checks  # noqa: E402
from helpers.model.gpt import GPT, GPTConfig  # noqa: E402
from helpers.text.chars import CharTokenizer  # noqa: E402
from helpers.text.corpus import load_corpus  # noqa: E402
from helpers.training.speed import cpu_has_native_bf16  # noqa: E402
from helpers.training.trainer import (  # noqa: E402
    TrainConfig,
    Trainer,
    encode_text,
    evaluate_loss,
    learning_rate,
    random_batch,
    split_train_val,
)

RECIPES = ("nanogpt", "nanogpt-fitted", "course", "course-muon", "course-best")
NANOGPTS = ("nanogpt", "nanogpt-fitted")  # nanoGPT's model and step; the course's recipes are the rest
# data/recipe_ablation.json's "course_best" (tests/benchmarks/test_bench_recipe.py checks that this is its row):
# TrainConfig fields, and GPTConfig fields other than the race's sizes. Muon at 0.04 beat 0.02 on
# 3 of 3 seeds, no warm-up beat 5 % on 2 of 3; no model change beat it at equal time.
COURSE_BEST = {"name": "muon 0.04 warm-up 0%",
               "train": {"optimizer": "muon", "muon_learning_rate": 0.04, "warmup": 0.0},
               "model": {}}
NANO_PEAK, NANO_MIN, NANO_WARMUP, NANO_HORIZON = 1e-3, 1e-4, 100, 2000


def nanogpt_lr(step: int) -> float:
    """nanoGPT's get_lr at iteration `step` (from 0): linear warm-up, cosine, then the floor."""
    if step < NANO_WARMUP:
        return NANO_PEAK * (step + 1) / (NANO_WARMUP + 1)
    if step > NANO_HORIZON:
        return NANO_MIN
    decay = (step - NANO_WARMUP) / (NANO_HORIZON - NANO_WARMUP)
    return NANO_MIN + 0.5 * (1.0 + math.cos(math.pi * decay)) * (NANO_PEAK - NANO_MIN)


def fitted_nanogpt_lr(elapsed: float, budget: float, warmup: float) -> float:
    """nanoGPT's schedule fitted to a budget: the learning rate after `elapsed` of `budget`.

    Linear warm-up from 0 to nanoGPT's peak (1e-3) over the first `warmup`, half a cosine down to
    its floor (1e-4) at `budget`, the floor after that. `elapsed`, `budget` and `warmup` share
    one unit: the race passes fractions of the budget (budget 1.0, warmup 100 / 2,000 = 0.05),
    so the schedule is nanoGPT's 2,000-step one stretched or squeezed to end when the budget does.

    By elapsed training time rather than by a step count measured beforehand: the steps that fit
    in 60 s depend on the machine and its load (about 1,000 on one thread and 1,100-1,400 on two
    in the stored races), so a count measured on one run ends the cosine early or late on the
    next; elapsed time ends it at the budget, as the course's `learning_rate(progress, ...)` does.
    """
    budget = checks.number_in("budget", budget, 0.0, math.inf, low_open=True, high_open=True,
                              expected="a positive, finite length of training")
    warmup = checks.number_in("warmup", warmup, 0.0, budget, high_open=True,
                              expected=f"a warm-up from 0 up to, not including, the budget ({budget:g})")
    elapsed = checks.number_in("elapsed", elapsed, 0.0, math.inf, high_open=True,
                               expected="a time trained, >= 0")
    if elapsed < warmup:
        return NANO_PEAK * elapsed / warmup
    if elapsed >= budget:
        return NANO_MIN
    decay = (elapsed - warmup) / (budget - warmup)
    return NANO_MIN + 0.5 * (1.0 + math.cos(math.pi * decay)) * (NANO_PEAK - NANO_MIN)


@dataclass
class Contestant:
    """One recipe in the race: its step, its schedule, its yardstick, and the curve it drew."""

    name: str
    step: Callable[[float], float]                  # lr -> the batch's loss
    schedule: Callable[[int, float], float]         # (steps done, progress in [0, 1]) -> lr
    val_loss: Callable[[], float]
    budget: float = 0.0                             # its training time; 0: the race's
    seconds: float = 0.0
    steps: int = 0
    last: float = 0.0                               # the last step's duration
    curve: dict[str, list[float]] = field(default_factory=lambda: {"seconds": [], "steps": [], "val_loss": []})

    def record(self) -> None:
        self.curve["seconds"].append(self.seconds)
        self.curve["steps"].append(self.steps)
        self.curve["val_loss"].append(self.val_loss())

    def run_until(self, end: float, budget: float) -> None:
        """Train until this contestant's training time reaches `end`."""
        while self.seconds < end:
            lr = self.schedule(self.steps, (self.seconds + self.last) / budget)
            started = time.perf_counter()
            self.step(lr)
            self.last = time.perf_counter() - started
            self.seconds += self.last
            self.steps += 1


def make_contestants(names: Sequence[str], vocab_size: int, train_ids: torch.Tensor, val_ids: torch.Tensor,
                     val_batches: list, seed: int, precision: str, muon_lr: float,
                     course_seconds: float = 0.0) -> list[Contestant]:
    """The recipes `names`, each on its own copy of one GPT initialised with `seed`; the course's
    recipes train `course_seconds` (0: as long as nanoGPT), their schedules spread over that."""
    torch.manual_seed(seed)
    config = GPTConfig(vocab_size=vocab_size, context_length=BLOCK, n_layers=N_LAYER, n_heads=N_HEAD,
                       d_model=N_EMBD)
    start = GPT(config)
    contestants = []
    for name in names:
        if name in NANOGPTS:  # both train the race's full budget: nanogpt-fitted's schedule spans it
            nano = NanoGPTModel(start)
            if name == "nanogpt":
                schedule = lambda steps, _: nanogpt_lr(steps)  # noqa: E731
            else:
                schedule = lambda _, progress: fitted_nanogpt_lr(progress, 1.0, NANO_WARMUP / NANO_HORIZON)  # noqa: E731
            contestants.append(Contestant(name, NanoGPTLoop(nano, train_ids, seed).train_step, schedule,
                                          lambda nano=nano: nanogpt_loss(nano, val_batches)))
            continue
        if name == "course-best":
            torch.manual_seed(seed)  # as bench_recipe builds it: the race's weights for the race's shapes
            model = GPT(replace(config, **COURSE_BEST["model"]))
            train_config = TrainConfig(batch_size=BATCH, context_length=BLOCK, precision=precision, seed=seed,
                                       **COURSE_BEST["train"])
        else:
            model = GPT(config)
            model.load_state_dict(start.state_dict())
            train_config = TrainConfig(batch_size=BATCH, context_length=BLOCK, precision=precision, seed=seed,
                                       optimizer="muon" if name == "course-muon" else "adamw",
                                       muon_learning_rate=muon_lr)
        trainer = Trainer(model, train_ids, val_ids, train_config)
        contestants.append(Contestant(
            name, trainer.train_step,
            lambda _, progress, c=train_config: learning_rate(progress, c.learning_rate, c.warmup, c.min_lr_ratio),
            lambda model=model: evaluate_loss(model, val_batches), budget=course_seconds))
    return contestants


def race(contestants: list[Contestant], budget: float, points: int, slice_seconds: float) -> None:
    """Take turns until every contestant has trained its budget (`budget` seconds unless it has
    its own), evaluating each at 0 and every budget / points seconds of its own training time."""
    marks = {}
    for contestant in contestants:
        contestant.budget = contestant.budget or budget
        marks[contestant.name] = [contestant.budget * i / points for i in range(1, points + 1)]
        contestant.record()
    round_ = 0
    while any(c.seconds < c.budget for c in contestants):
        order = contestants[round_ % len(contestants):] + contestants[:round_ % len(contestants)]
        for contestant in order:
            end = min(contestant.budget, contestant.seconds + slice_seconds)
            while contestant.seconds < end:
                mark = next(m for m in marks[contestant.name] if m > contestant.curve["seconds"][-1])
                contestant.run_until(min(end, mark), contestant.budget)
                if contestant.seconds >= mark:
                    contestant.record()
        round_ += 1


def time_to_reach(curve: dict[str, list[float]], target: float) -> float | None:
    """The training time at which `curve` first reaches `target` (linear between evaluations),
    or None if it never does."""
    seconds, losses = curve["seconds"], curve["val_loss"]
    for i, loss in enumerate(losses):
        if loss <= target:
            if i == 0:
                return seconds[0]
            fraction = (losses[i - 1] - target) / (losses[i - 1] - loss)
            return seconds[i - 1] + fraction * (seconds[i] - seconds[i - 1])
    return None


def _against(curve: dict[str, list[float]], target: float, budget: float) -> tuple[float | None, float | None]:
    """When `curve` reaches `target`, and budget / that time (None, None if it never does)."""
    reached = time_to_reach(curve, target)
    return reached, (budget / reached if reached else None)


def summarise(runs: list[dict], budget: float) -> dict:
    """Per seed: nanoGPT's final loss (the target), each other recipe's final loss, the time it
    reached the target and budget / that time; then the median speed-up of each recipe (0 for a
    seed where it never reached the target).

    Where the race had nanogpt-fitted, each seed's row also holds its final loss
    (`fitted_target`), and each course recipe when it reached that loss and the speed-up against
    it (`reaches_fitted_target_at_s`, `speedup_vs_fitted`), with their medians in
    `median_speedup_vs_fitted`. nanogpt-fitted itself is measured against `nanogpt`'s target.
    """
    checks.positive_float("budget", budget)
    if not isinstance(runs, list) or not runs:
        raise ValueError(f"runs is {runs!r:.80}, expected a non-empty list of races")
    for index, run in enumerate(runs):
        if "nanogpt" not in run.get("curves", {}):
            raise ValueError(f"runs[{index}] has curves {sorted(run.get('curves', {}))}, expected one "
                             f"named 'nanogpt': its final loss is the target")
    per_seed, speedups, fitted_speedups = [], {}, {}
    for run in runs:
        curves = run["curves"]
        row = {"seed": run["seed"], "target": curves["nanogpt"]["val_loss"][-1]}
        if "nanogpt-fitted" in curves:
            row["fitted_target"] = curves["nanogpt-fitted"]["val_loss"][-1]
        for name, curve in curves.items():
            if name == "nanogpt":
                continue
            reached, speedup = _against(curve, row["target"], budget)
            row[name] = {"final_val_loss": curve["val_loss"][-1], "reaches_target_at_s": reached,
                         "speedup": speedup}
            speedups.setdefault(name, []).append(speedup or 0.0)
            if "fitted_target" in row and name not in NANOGPTS:
                reached, speedup = _against(curve, row["fitted_target"], budget)
                row[name].update(reaches_fitted_target_at_s=reached, speedup_vs_fitted=speedup)
                fitted_speedups.setdefault(name, []).append(speedup or 0.0)
        per_seed.append(row)
    summary = {"per_seed": per_seed,
               "median_speedup": {name: statistics.median(values) for name, values in speedups.items()}}
    if fitted_speedups:
        summary["median_speedup_vs_fitted"] = {name: statistics.median(values)
                                               for name, values in fitted_speedups.items()}
    return summary


def add_fitted(race_json: dict, vocab_size: int, train_ids: torch.Tensor, val_ids: torch.Tensor,
               val_batches: list) -> dict:
    """A stored race with nanogpt-fitted added by replaying nanoGPT's steps, and its summary redone.

    nanogpt-fitted runs nanoGPT's step on nanoGPT's weights and windows, so a step costs what
    nanogpt's does: only the learning rate differs. Each seed replays as many steps as nanogpt
    did in that race, with the schedule fitted to that count (fitted_nanogpt_lr by steps:
    warm-up 5 % of them, cosine to the floor at the last), evaluated at nanogpt's evaluation
    steps and placed at nanogpt's seconds. That needs no quiet machine: the losses per step do
    not depend on the load. First it replays nanogpt itself up to its first evaluation and
    records how far that loss is from the stored one (`replay_error`: 0 when the replay is the
    stored race's arithmetic).
    """
    checks.instance("race_json", race_json, dict, "a race read from data/race_*.json")
    settings = race_json["settings"]
    runs, checked = [], {}
    for run in race_json["runs"]:
        nano_curve = run["curves"]["nanogpt"]
        total = nano_curve["steps"][-1]
        contestants = make_contestants(["nanogpt", "nanogpt-fitted"], vocab_size, train_ids, val_ids, val_batches,
                                       run["seed"], settings["precision"], settings["muon_lr"])
        nano, fitted = contestants
        first = nano_curve["steps"][1]
        for step in range(first):
            nano.step(nanogpt_lr(step))
        checked[str(run["seed"])] = abs(nano.val_loss() - nano_curve["val_loss"][1])
        curve = {"seconds": list(nano_curve["seconds"]), "steps": list(nano_curve["steps"]),
                 "val_loss": [fitted.val_loss()]}
        for step in range(total):
            fitted.step(fitted_nanogpt_lr(step + 1, total, total * NANO_WARMUP / NANO_HORIZON))
            if step + 1 in nano_curve["steps"][1:]:
                curve["val_loss"].append(fitted.val_loss())
        curves = dict(run["curves"])
        curves["nanogpt-fitted"] = curve
        runs.append({"seed": run["seed"], "curves": curves})
        print(f"seed {run['seed']}: nanogpt-fitted {curve['val_loss'][-1]:.3f} ({total} steps, as nanogpt; "
              f"nanogpt {nano_curve['val_loss'][-1]:.3f}), replay error {checked[str(run['seed'])]:.1e}", flush=True)
    fitted_note = {"by": "replay", "replay_error": checked,
                   "how": "nanogpt's step count per seed, schedule fitted to it, at nanogpt's seconds"}
    return {**race_json, "settings": {**settings, "nanogpt_fitted": fitted_note}, "runs": runs,
            "summary": summarise(runs, settings["seconds"])}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="training time per contestant")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--threads", type=int, default=1, help="CPU threads for PyTorch (default 1)")
    parser.add_argument("--precision", choices=("auto", "fp32", "bf16"), default="fp32",
                        help="the course trainer's TrainConfig(precision=...) (nanoGPT's is float32 on a CPU)")
    parser.add_argument("--recipes", nargs="+", choices=RECIPES, default=list(RECIPES))
    parser.add_argument("--muon-lr", type=float, default=TrainConfig.muon_learning_rate)
    parser.add_argument("--course-seconds", type=float, default=0.0,
                        help="the course recipes' own budget (default: --seconds); e.g. 30 asks whether "
                             "a schedule that ends at 30 s reaches nanoGPT's 60 s loss")
    parser.add_argument("--points", type=int, default=20, help="evaluations per curve, after the one at 0 s")
    parser.add_argument("--slice", type=float, default=2.0, help="seconds per turn")
    parser.add_argument("--out", type=Path, required=True, help="the JSON to write (data/race_*.json)")
    parser.add_argument("--add-fitted", type=Path, default=None,
                        help="a stored race (data/race_*.json) to add nanogpt-fitted to by replaying "
                             "nanogpt's steps (add_fitted), on that race's threads; no race is run")
    args = parser.parse_args(argv)
    if "nanogpt" not in args.recipes:
        parser.error("--recipes must include nanogpt: its final loss is the target")
    torch.set_num_threads(args.threads)

    text = load_corpus()
    tokenizer = CharTokenizer.train(text)
    train_ids, val_ids = split_train_val(encode_text(tokenizer, text))
    generator = torch.Generator().manual_seed(1)  # bench_train's validation batches
    val_batches = [tuple(t.contiguous() for t in random_batch(val_ids, 32, BLOCK, generator))
                   for _ in range(16)]  # contiguous: nanoGPT's forward views its targets
    if args.add_fitted is not None:
        stored = json.loads(args.add_fitted.read_text(encoding="utf-8"))
        torch.set_num_threads(stored["settings"]["threads"])
        extended = add_fitted(stored, tokenizer.vocab_size, train_ids, val_ids, val_batches)
        args.out.write_text(json.dumps(extended, indent=1) + "\n", encoding="utf-8")
        print(f"replay error per seed: {extended['settings']['nanogpt_fitted']['replay_error']}")
        print(f"wrote {args.out}")
        return 0
    runs = []
    for seed in args.seeds:
        contestants = make_contestants(args.recipes, tokenizer.vocab_size, train_ids, val_ids, val_batches,
                                       seed, args.precision, args.muon_lr, args.course_seconds)
        race(contestants, args.seconds, args.points, args.slice)
        runs.append({"seed": seed, "curves": {c.name: c.curve for c in contestants}})
        print(f"seed {seed}: " + ", ".join(f"{c.name} {c.curve['val_loss'][-1]:.3f} ({c.steps} steps)"
                                           for c in contestants))
    summary = summarise(runs, args.seconds)
    for key, target in (("median_speedup", "nanoGPT's"), ("median_speedup_vs_fitted", "nanogpt-fitted's")):
        for name, speedup in summary.get(key, {}).items():
            print(f"{name}: reaches {target} {args.seconds:g} s loss {speedup:.2f}x as fast (median of "
                  f"{len(runs)} seeds; 0 = never)")
    settings = {key: (str(value) if isinstance(value, Path) else value) for key, value in vars(args).items()}
    machine = {"torch": torch.__version__, "processor": platform.processor() or platform.machine(),
               "native_bf16": cpu_has_native_bf16(), "threads": torch.get_num_threads()}
    args.out.write_text(json.dumps({"settings": settings, "machine": machine, "runs": runs,
                                    "summary": summary}, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
