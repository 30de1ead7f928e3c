"""Issue 42's recipe, one change at a time, at equal training time: what beats nanoGPT's 60 s loss.

    python benchmarks/bench_recipe.py                 # seeds 0 1 2 -> data/recipe_ablation.json (~30 min)
    python benchmarks/bench_recipe.py --quick --out /tmp/recipe.json   # a smoke run (~2 min)

The setting is benchmarks/bench_race.py's: the same GPT (n_layers=4, n_heads=4, d_model=128,
window 64, batch 12), the course corpus one character per token, the same split, the same 16
validation batches, float32, one thread, and for seed s the same initial weights and windows as
the race's seed s. Only the recipe (and, in the last rows, the model) changes.

The race gives every recipe seconds on a clock; this machine is shared (2 cores, other work
running), so its clock would measure the others. Instead, in three parts:

    step costs   each kind of step (nanoGPT's, the course's AdamW step, its Muon step, each
                 model change) is timed in turns (A, B, C, A, B, C, ...), one thread; its cost is
                 the median over the rounds of its ratio to nanoGPT's step in the same round,
                 which load changes far less than it changes seconds. A learning rate or a
                 warm-up does not change what a step costs: variants that differ only there
                 share one cost.
    budgets      nanoGPT's recipe took N_60 steps in 60 s in the committed quiet race
                 (data/race_fp32_1thread.json, the median over its seeds); a variant whose step
                 costs r times nanoGPT's gets round(N_60 / 2 / r) steps: 30 s on that machine.
                 Its schedule (warm-up, cosine to 10 %) spans exactly those steps.
    curves       each variant trains its steps for each seed; its validation loss is taken at
                 --points evenly spaced steps. Step for step these curves are deterministic
                 (same seed, same machine: the same numbers), so load does not touch them.

The target of a seed is nanoGPT's validation loss at the end of its 60 s in the committed race
(the same seed, the same batches; --quick recomputes it for its short budget). Each variant's row: its steps,
its final loss, the step at which its curve first reaches the target (linear between evaluations),
and that step's share of its budget (below 1: it beats nanoGPT's 60 s loss within 30 s).

The rows, in three stages (each run for every seed; "best" is the lowest median final loss):
    1. rates      the course's AdamW defaults (peak 2e-3) and AdamW at 6e-3; Muon at 0.02
                  (TrainConfig's default when this ran) and at 0.04 and 0.08 (AdamW's part 2e-3)
    2. warm-ups   around each optimizer's best rate: AdamW with 10 % warm-up, Muon with none
                  (TrainConfig's is 5 %)
    3. the model  on top of the best Muon row: ReLU^2 for GELU, a wider and shallower shape
                  (3 layers of width 160), and Newton-Schulz with 3 steps, not 5; one is kept
                  only if it beats that row (`beats`: a lower median final loss and a lower loss
                  on most seeds), and the JSON's "course_best" is the recipe to race
                  (QK-norm is not among them: the course's GPT has none, and its fused attention
                  path, helpers/model/fused.py, would need one)
The grid is small so that it runs in about half an hour of a shared 2-core machine (2 workers).
Each change pays for itself or not at its own step cost: one that costs more per step gets
fewer steps. Per step against per second: a row that reaches the target at an earlier step
than another but costs more per step may still reach it later in time (step x step cost).
Measured on a shared 2-core machine: the step costs are ratios measured in turns, the curves per
step; the JSON says so.
"""

from __future__ import annotations

import argparse
import functools
import json
import multiprocessing
import platform
import statistics
import sys
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch
from torch import Tensor, nn

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench_race, bench_train

from bench_race import nanogpt_lr  # noqa: E402
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

from helpers.model.gpt import GPT, GPTConfig  # noqa: E402
from helpers.text.chars import CharTokenizer  # noqa: E402
from helpers.text.corpus import load_corpus  # noqa: E402
from helpers.timing import times_in_turns  # noqa: E402
from helpers.training.trainer import (  # noqa: E402
    TrainConfig,
    Trainer,
    encode_text,
    evaluate_loss,
    learning_rate,
    random_batch,
    split_train_val,
)

ROOT = Path(__file__).resolve().parent.parent
RACE_JSON = ROOT / "data" / "race_fp32_1thread.json"
DEFAULT_OUT = ROOT / "data" / "recipe_ablation.json"
BUDGET_SHARE = 0.5  # 30 s of nanoGPT's 60 s


@dataclass(frozen=True)
class Variant:
    """One row: a recipe (optimizer, peak rates, warm-up) and a model (GPT sizes, activation)."""

    name: str
    optimizer: str = "adamw"
    learning_rate: float = 2e-3          # AdamW's peak (with Muon: the embeddings', head's, gains')
    warmup: float = 0.05
    muon_learning_rate: float = 0.02
    ns_steps: int = 5
    n_layers: int = N_LAYER
    d_model: int = N_EMBD
    activation: str = "gelu"             # "gelu", "relu" or "relu2" (ReLU squared, set here)
    bias: bool = True
    stage: str = "recipe"                # "recipe": optimizer rows; "model": on top of the best

    @property
    def cost_key(self) -> str:
        """What a step costs depends on these alone, not on a rate or a warm-up."""
        return (f"{self.optimizer}-L{self.n_layers}-D{self.d_model}-{self.activation}-bias{self.bias}"
                + (f"-ns{self.ns_steps}" if self.optimizer == "muon" else ""))


ADAMW_RATES = [Variant("adamw (course defaults)"),
               Variant("adamw lr 6e-3", learning_rate=6e-3)]
MUON_RATES = [Variant("muon 0.02 (the first default)", optimizer="muon"),
              Variant("muon 0.04", optimizer="muon", muon_learning_rate=0.04),
              Variant("muon 0.08", optimizer="muon", muon_learning_rate=0.08)]
ADAMW_WARMUPS = (0.10,)              # around AdamW's best rate (5 % is TrainConfig's)
MUON_WARMUPS = (0.0,)                # around Muon's best rate
MODEL_CHANGES = {  # applied to the best Muon row
    "relu^2": {"activation": "relu2"},
    "wider, shallower (L3 D160)": {"n_layers": 3, "d_model": 160},
    "newton-schulz 3 steps": {"ns_steps": 3},
}


def second_stage(best_adamw: Variant, best_muon: Variant) -> list[Variant]:
    """Warm-ups around each optimizer's best rate."""
    rows = [replace(best_adamw, name=f"{best_adamw.name} warm-up {w:.0%}", warmup=w) for w in ADAMW_WARMUPS]
    return rows + [replace(best_muon, name=f"{best_muon.name} warm-up {w:.0%}", warmup=w) for w in MUON_WARMUPS]


def model_stage(best: Variant) -> list[Variant]:
    return [replace(best, name=f"{best.name} + {change}", stage="model", **fields)
            for change, fields in MODEL_CHANGES.items()]


class ReLUSquared(nn.Module):
    """relu(z)^2 (the modded-nanogpt speedrun's MLP activation)."""

    def forward(self, z: Tensor) -> Tensor:
        return torch.relu(z).square()


def build_model(variant: Variant, vocab_size: int, seed: int) -> GPT:
    """The variant's GPT, initialised by `seed` (the race's weights for the race's shape)."""
    torch.manual_seed(seed)
    config = GPTConfig(vocab_size=vocab_size, context_length=BLOCK, n_layers=variant.n_layers,
                       n_heads=N_HEAD, d_model=variant.d_model, bias=variant.bias,
                       activation="relu" if variant.activation == "relu2" else variant.activation)
    model = GPT(config)
    if variant.activation == "relu2":
        for block in model.blocks:
            block.mlp.activation = ReLUSquared()
    return model


def make_trainer(variant: Variant, vocab_size: int, train_ids: Tensor, val_ids: Tensor, seed: int) -> Trainer:
    model = build_model(variant, vocab_size, seed)
    config = TrainConfig(batch_size=BATCH, context_length=BLOCK, precision="fp32", seed=seed,
                         optimizer=variant.optimizer, learning_rate=variant.learning_rate,
                         warmup=variant.warmup, muon_learning_rate=variant.muon_learning_rate)
    trainer = Trainer(model, train_ids, val_ids, config)
    if variant.optimizer == "muon":
        trainer.optimizer.muon.param_groups[0]["steps"] = variant.ns_steps
    return trainer


@dataclass
class Data:
    vocab_size: int
    train_ids: Tensor
    val_ids: Tensor
    val_batches: list = field(default_factory=list)


def load_data() -> Data:
    """bench_race's corpus, split and 16 validation batches."""
    text = load_corpus()
    tokenizer = CharTokenizer.train(text)
    train_ids, val_ids = split_train_val(encode_text(tokenizer, text))
    generator = torch.Generator().manual_seed(1)
    val_batches = [tuple(t.contiguous() for t in random_batch(val_ids, 32, BLOCK, generator)) for _ in range(16)]
    return Data(tokenizer.vocab_size, train_ids, val_ids, val_batches)


# --- part 1: step costs in turns -----------------------------------------------------------

def step_costs(variants: list[Variant], data: Data, rounds: int, steps_per_turn: int) -> dict[str, dict]:
    """Seconds per step of nanoGPT's step and of each distinct variant step, timed in turns on one
    thread (the order rotated each round): their medians, and the median over rounds of each
    one's ratio to nanoGPT's step in the same round."""
    torch.manual_seed(0)
    start = GPT(GPTConfig(vocab_size=data.vocab_size, context_length=BLOCK, n_layers=N_LAYER,
                          n_heads=N_HEAD, d_model=N_EMBD))
    nano = NanoGPTLoop(NanoGPTModel(start), data.train_ids, 0)
    steppers = {"nanogpt": nano.train_step}
    for variant in variants:
        if variant.cost_key not in steppers:
            trainer = make_trainer(variant, data.vocab_size, data.train_ids, data.val_ids, 0)
            steppers[variant.cost_key] = trainer.train_step
    seconds = times_in_turns({key: functools.partial(step, 1e-4) for key, step in steppers.items()},
                             rounds, steps_per_turn, warmup=2)
    # The ratio within each round (its turns seconds apart), then the median over rounds: a burst
    # of load on the shared machine slows one round's turns alike and leaves its ratios.
    ratios = {key: [s / n for s, n in zip(values, seconds["nanogpt"], strict=True)] for key, values in seconds.items()}
    return {key: {"median_seconds": statistics.median(values), "ratio_to_nanogpt": statistics.median(ratios[key]),
                  "rounds": [round(s, 5) for s in values]} for key, values in seconds.items()}


# --- part 2: curves per step ---------------------------------------------------------------

def eval_steps(steps: int, points: int) -> list[int]:
    """0, then `points` evenly spaced steps ending at `steps`."""
    return sorted({0} | {round(steps * i / points) for i in range(1, points + 1)})


def train_variant(job: tuple) -> dict:
    """Train one variant for one seed over its budget of steps; its validation curve."""
    variant, seed, steps, points, data = job
    torch.set_num_threads(1)
    trainer = make_trainer(variant, data.vocab_size, data.train_ids, data.val_ids, seed)
    marks = eval_steps(steps, points)
    curve = {"steps": [0], "val_loss": [evaluate_loss(trainer.model, data.val_batches)]}
    train_losses = []
    for i in range(steps):
        lr = learning_rate((i + 1) / steps, variant.learning_rate, variant.warmup, 0.1)
        train_losses.append(round(trainer.train_step(lr), 4))
        if i + 1 in marks:
            curve["steps"].append(i + 1)
            curve["val_loss"].append(evaluate_loss(trainer.model, data.val_batches))
    return {"variant": variant.name, "seed": seed, "steps": steps, "curve": curve, "train_losses": train_losses}


def nanogpt_target(job: tuple) -> dict:
    """nanoGPT's recipe (bench_race's contestant) for `steps` steps: its final validation loss."""
    seed, steps, data = job
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    start = GPT(GPTConfig(vocab_size=data.vocab_size, context_length=BLOCK, n_layers=N_LAYER,
                          n_heads=N_HEAD, d_model=N_EMBD))
    nano = NanoGPTModel(start)
    loop = NanoGPTLoop(nano, data.train_ids, seed)
    for step in range(steps):
        loop.train_step(nanogpt_lr(step))
    return {"seed": seed, "steps": steps, "val_loss": nanogpt_loss(nano, data.val_batches)}


def run_jobs(function, jobs: list, workers: int) -> list:
    if workers == 1:
        return [function(job) for job in jobs]
    # spawn, not fork: Windows has no fork, and macOS's is unsafe with threads; every job
    # carries its data and sets its own thread count, so nothing relies on a forked copy.
    with multiprocessing.get_context("spawn").Pool(workers) as pool:
        return pool.map(function, jobs, chunksize=1)


# --- part 3: the summary -------------------------------------------------------------------

def step_to_reach(curve: dict[str, list], target: float) -> float | None:
    """The step at which `curve` first reaches `target` (linear between evaluations), or None."""
    steps, losses = curve["steps"], curve["val_loss"]
    for i, loss in enumerate(losses):
        if loss <= target:
            if i == 0:
                return float(steps[0])
            fraction = (losses[i - 1] - target) / (losses[i - 1] - loss)
            return steps[i - 1] + fraction * (steps[i] - steps[i - 1])
    return None


def summarise(runs: list[dict], targets: dict[int, float], names: list[str]) -> dict:
    """Per variant: per seed (final loss, the step reaching the target, that step / budget), then
    the median final loss and how many seeds beat the target within the budget."""
    table = {}
    for name in names:
        rows = []
        for run in (r for r in runs if r["variant"] == name):
            reached = step_to_reach(run["curve"], targets[run["seed"]])
            rows.append({"seed": run["seed"], "steps": run["steps"], "final_val_loss": run["curve"]["val_loss"][-1],
                         "target": targets[run["seed"]], "reaches_target_at_step": reached,
                         "share_of_budget": reached / run["steps"] if reached is not None else None})
        table[name] = {"per_seed": rows,
                       "median_final_val_loss": statistics.median(r["final_val_loss"] for r in rows),
                       "seeds_beating_target": sum(r["reaches_target_at_step"] is not None for r in rows)}
    return table


def best_of(summary: dict, variants: list[Variant]) -> Variant:
    """The variant with the lowest median final validation loss."""
    return min(variants, key=lambda v: summary[v.name]["median_final_val_loss"])


def beats(summary: dict, name: str, other: str) -> bool:
    """Whether row `name` beats row `other` at equal time: a lower median final loss, and a lower
    final loss on more than half of the seeds (a tie is no win)."""
    mine = {row["seed"]: row["final_val_loss"] for row in summary[name]["per_seed"]}
    theirs = {row["seed"]: row["final_val_loss"] for row in summary[other]["per_seed"]}
    wins = sum(mine[seed] < theirs[seed] for seed in mine)
    return (summary[name]["median_final_val_loss"] < summary[other]["median_final_val_loss"]
            and wins > len(mine) / 2)


def course_best(summary: dict, best_muon: str, model_rows: list[str]) -> str:
    """The recipe to race: the best Muon row, or the best model change on top of it if one
    beats it (`beats`); a change that does not is not kept."""
    kept = [name for name in model_rows if beats(summary, name, best_muon)]
    return min(kept, key=lambda name: summary[name]["median_final_val_loss"]) if kept else best_muon


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--points", type=int, default=5, help="evaluations per curve after step 0")
    parser.add_argument("--rounds", type=int, default=30, help="rounds of turns for the step costs")
    parser.add_argument("--turn-steps", type=int, default=2, help="steps per turn when timing")
    parser.add_argument("--workers", type=int, default=2, help="processes training curves side by side")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 1 seed, tiny budgets")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    race = json.loads(RACE_JSON.read_text(encoding="utf-8"))
    nano_steps_60 = round(statistics.median(run["curves"]["nanogpt"]["steps"][-1] for run in race["runs"]))
    scale = 1.0
    if args.quick:
        args.seeds, args.points, args.rounds, args.turn_steps, scale = args.seeds[:1], 3, 2, 2, 0.03
    data = load_data()

    print("timing steps in turns ...", flush=True)
    costs = step_costs(ADAMW_RATES + MUON_RATES + model_stage(MUON_RATES[0]), data, args.rounds, args.turn_steps)
    for key, cost in costs.items():
        print(f"  {key:40s} {cost['ratio_to_nanogpt']:.3f} x nanoGPT's step", flush=True)

    def budget(variant: Variant) -> int:
        return max(1, round(scale * nano_steps_60 * BUDGET_SHARE / costs[variant.cost_key]["ratio_to_nanogpt"]))

    if args.quick:  # no stored target for a short budget: nanoGPT's loss after its scaled steps
        target_steps = max(1, round(scale * nano_steps_60))
        targets = {t["seed"]: t["val_loss"]
                   for t in run_jobs(nanogpt_target, [(seed, target_steps, data) for seed in args.seeds], args.workers)}
    else:  # the committed quiet race: nanoGPT's validation loss at the end of its 60 s, per seed
        target_steps = None
        targets = {run["seed"]: run["curves"]["nanogpt"]["val_loss"][-1] for run in race["runs"]
                   if run["seed"] in args.seeds}
        if set(targets) != set(args.seeds):
            parser.error(f"--seeds {args.seeds}: {RACE_JSON.name} has nanoGPT's 60 s loss for seeds {sorted(targets)} only")
    print(f"nanoGPT's targets: {targets}", flush=True)

    variants, runs = [], []

    def run_stage(stage: list[Variant], steps: dict[str, int] | None = None) -> dict:
        variants.extend(stage)
        steps = steps or {}
        runs.extend(run_jobs(train_variant, [(v, s, steps.get(v.name, budget(v)), args.points, data)
                                             for v in stage for s in args.seeds], args.workers))
        summary = summarise(runs, targets, [v.name for v in variants])
        for v in stage:
            row = summary[v.name]
            print(f"{v.name:50s} {row['per_seed'][0]['steps']:4d} steps  final {row['median_final_val_loss']:.3f}  "
                  f"beats the target on {row['seeds_beating_target']}/{len(args.seeds)} seeds", flush=True)
        return summary

    summary = run_stage(ADAMW_RATES + MUON_RATES)
    summary = run_stage(second_stage(best_of(summary, ADAMW_RATES), best_of(summary, MUON_RATES)))
    best = best_of(summary, [v for v in variants if v.optimizer == "muon"])
    print(f"best Muon recipe: {best.name}", flush=True)
    changes = model_stage(best)
    summary = run_stage(changes)
    print(f"the recipe to race (course-best): {course_best(summary, best.name, [v.name for v in changes])}")
    record = {
        "settings": {"seeds": args.seeds, "points": args.points, "rounds": args.rounds, "turn_steps": args.turn_steps,
                     "quick": args.quick, "precision": "fp32", "threads": 1, "budget_share": BUDGET_SHARE,
                     "nanogpt_steps_60s": nano_steps_60, "nanogpt_steps_60s_from": str(RACE_JSON.relative_to(ROOT)),
                     "target_steps": target_steps, "lr_floor": 0.1, "budget_scale": scale},
        "note": ("Measured on a shared 2-core machine. Step costs: medians of seconds per step timed in turns on "
                 "one thread, used only as ratios to nanoGPT's step; budgets: round(nanogpt_steps_60s * "
                 "budget_share * budget_scale / ratio). Curves: validation loss per step, deterministic for a "
                 "seed on one machine, so load changes the step costs only."),
        "machine": {"torch": torch.__version__, "processor": platform.processor() or platform.machine()},
        "variants": [asdict(v) | {"cost_key": v.cost_key} for v in variants],
        "best_muon": best.name,
        "course_best": course_best(summary, best.name, [v.name for v in changes]),
        "step_costs": costs,
        "targets": {str(seed): value for seed, value in targets.items()},
        "runs": runs,
        "summary": summary,
    }
    args.out.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
