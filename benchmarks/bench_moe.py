"""Dense against MoE, and three ways to balance a MoE, on the course corpus (notebook 12).

    python benchmarks/bench_moe.py --part models --steps 600 --seeds 5 --jobs 2
    python benchmarks/bench_moe.py --part balance --steps 200 --seeds 5 --jobs 2
    python benchmarks/bench_moe.py --steps 3 --seeds 1 --out /tmp/moe.json   # the test's short run

data/bench_moe.json holds both parts (each run updates its own part and keeps the other); the
committed file was written by the two commands above.

Every model is a `helpers.model.frontier.FrontierGPT` (2 layers, d_model 64, 4 heads, context
64, characters as tokens) trained by `helpers.training.trainer.Trainer` in float32 with the
same recipe, the same batches and the same number of steps. The MoE has 8 experts of width 64,
2 per token; "dense, equal active" has a SwiGLU of width 128 (the active experts' width), "dense,
equal total" one of width 512 (all eight experts'). Balancing runs: no balancing, the Switch
auxiliary loss (coefficient 0.01) and DeepSeek-V3's bias (rate 0.01); each records, every step,
the share of layer 0's assignments that each expert received.

Equal time. Before training, the models part times a training step of each model on one thread,
in turns (A, B, C, A, B, C, ...: a burst of load on the machine then slows every model alike),
and keeps the median of the turns. The ratio of the MoE's step time to the equal-active dense
model's gives "dense, equal active, equal time": that dense model trained for the MoE's steps
times the ratio, the steps it can take in the MoE's wall clock. Seconds depend on the machine and
its load (the JSON keeps the load average at the start); the notebook prints only ratios.

Every process runs on one thread (`--jobs` processes train different runs side by side; the
timing runs alone, before them). Validation losses are machine-independent to about 1e-3
(float32 round-off over a few hundred steps), so they are printed with 2 or 3 decimals.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch

from helpers.model.frontier import FrontierConfig, FrontierGPT, total_and_active_parameters
from helpers.text.chars import CharTokenizer
from helpers.text.corpus import load_corpus
from helpers.training.trainer import TrainConfig, Trainer, encode_text, learning_rate, split_stories

SIZES = dict(context_length=64, n_layers=2, n_heads=4, n_kv_heads=2, d_model=64)
MODELS = {
    "dense, equal active": dict(mlp_hidden=128),
    "dense, equal total": dict(mlp_hidden=512),
    "MoE 8 experts, top-2": dict(n_experts=8, top_k=2, expert_hidden=64, balance="bias", bias_rate=0.01),
}
BALANCE = {"none": dict(balance="none"), "aux_loss": dict(balance="aux_loss", aux_coef=0.01),
           "bias": dict(balance="bias", bias_rate=0.01)}
EQUAL_TIME = "dense, equal active, equal time"
BATCH = 12
_DATA = None  # the corpus ids, loaded once per process


def corpus_ids(n_chars: int = 300_000):
    train_text, val_text = split_stories(load_corpus()[:n_chars])
    tokenizer = CharTokenizer(sorted(set(train_text + val_text)))
    return len(tokenizer.chars), encode_text(tokenizer, train_text), encode_text(tokenizer, val_text)


def _data():
    global _DATA
    if _DATA is None:
        torch.set_num_threads(1)  # one thread per process, worker processes included
        _DATA = corpus_ids()
    return _DATA


def make_trainer(extra: dict, seed: int, steps: int) -> tuple[FrontierGPT, Trainer, TrainConfig]:
    vocab, train_ids, val_ids = _data()
    torch.manual_seed(seed)
    model = FrontierGPT(FrontierConfig(vocab_size=vocab, **SIZES, **extra))
    config = TrainConfig(batch_size=BATCH, learning_rate=3e-3, precision="fp32", fast=False,
                         eval_every=steps, eval_batches=16, seed=seed)
    return model, Trainer(model, train_ids, val_ids, config), config


def train(extra: dict, seed: int, steps: int, record_load: bool = False) -> dict:
    """Train one FrontierGPT for `steps`; returns val loss, parameters and per-step shares."""
    model, trainer, config = make_trainer(extra, seed, steps)
    shares = []
    for step in range(steps):
        trainer.train_step(learning_rate((step + 1) / steps, config.learning_rate, config.warmup,
                                         config.min_lr_ratio))
        if record_load:
            load = model.moe_layers()[0].last_load
            shares.append((load / load.sum()).tolist())
    total, active = total_and_active_parameters(model)
    return {"val_loss": trainer.evaluate()["val"], "total_params": total, "active_params": active,
            "shares": shares, "steps": steps}


def _train_job(job: tuple) -> dict:
    return train(*job)


def step_seconds(turns: int = 10, steps_per_turn: int = 20, warmup: int = 10) -> dict[str, list[float]]:
    """Seconds per training step of each model in MODELS, on one thread, measured in turns.

    Each turn times `steps_per_turn` steps of every model, one model after the other, so that
    a change of load on the machine touches all of them; returns each model's per-turn times."""
    torch.set_num_threads(1)
    trainers = {}
    for name, extra in MODELS.items():
        _, trainer, _ = make_trainer(extra, 0, turns * steps_per_turn + warmup)
        for _ in range(warmup):
            trainer.train_step(1e-3)
        trainers[name] = trainer
    times = {name: [] for name in MODELS}
    for _ in range(turns):
        for name, trainer in trainers.items():
            started = time.perf_counter()
            for _ in range(steps_per_turn):
                trainer.train_step(1e-3)
            times[name].append((time.perf_counter() - started) / steps_per_turn)
    return times


def run_jobs(jobs: list[tuple], n_processes: int) -> list[dict]:
    if n_processes <= 1:
        return [train(*job) for job in jobs]
    with ProcessPoolExecutor(n_processes) as pool:
        return list(pool.map(_train_job, jobs))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=1, help="processes training side by side")
    parser.add_argument("--part", choices=("all", "models", "balance"), default="all")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "data" / "bench_moe.json"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    out = Path(args.out)
    result = json.loads(out.read_text()) if args.part != "all" and out.exists() else {}
    result["seeds"] = list(range(args.seeds))
    if args.part in ("all", "models"):
        run_models(result, args.steps, args.seeds, args.jobs)
    if args.part in ("all", "balance"):
        run_balance(result, args.steps, args.seeds, args.jobs)
    out.write_text(json.dumps(result))
    print(f"wrote {out}")


def run_models(result: dict, steps: int, seeds: int, n_processes: int) -> None:
    load = os.getloadavg()
    times = step_seconds()
    median = {name: statistics.median(t) for name, t in times.items()}
    ratio = median["MoE 8 experts, top-2"] / median["dense, equal active"]
    equal_time_steps = max(1, round(steps * ratio))
    result["speed"] = {"seconds_per_step": times, "threads": 1, "load_average_at_start": load,
                       "moe_over_dense_active": ratio, "cpu_count": os.cpu_count()}
    print(f"seconds per step (median of turns): {median}; MoE / dense equal active {ratio:.2f}")
    settings = {name: (extra, steps) for name, extra in MODELS.items()}
    settings[EQUAL_TIME] = (MODELS["dense, equal active"], equal_time_steps)
    jobs = [(extra, seed, n) for extra, n in settings.values() for seed in range(seeds)]
    runs = iter(run_jobs(jobs, n_processes))
    result["models"], result["model_steps"] = {}, steps
    for name in settings:
        mine = [next(runs) for _ in range(seeds)]
        result["models"][name] = {key: [run[key] for run in mine]
                                  for key in ("val_loss", "total_params", "active_params", "steps")}
        losses = result["models"][name]["val_loss"]
        print(f"{name:32s} {mine[0]['steps']:5d} steps, val {statistics.mean(losses):.3f} "
              f"({', '.join(f'{x:.3f}' for x in losses)})")


def run_balance(result: dict, steps: int, seeds: int, n_processes: int) -> None:
    moe = MODELS["MoE 8 experts, top-2"]
    jobs = [(moe | extra, seed, steps, True) for extra in BALANCE.values() for seed in range(seeds)]
    runs = iter(run_jobs(jobs, n_processes))
    result["balance"], result["balance_steps"] = {}, steps
    for name in BALANCE:
        mine = [next(runs) for _ in range(seeds)]
        result["balance"][name] = {"val_loss": [run["val_loss"] for run in mine],
                                   "shares": [[[round(s, 4) for s in step] for step in run["shares"]]
                                              for run in mine]}
        late = [sorted(map(statistics.mean, zip(*run["shares"][-50:], strict=True))) for run in mine]
        print(f"balance {name:9s} over the last 50 steps, least used "
              f"{[round(s[0], 3) for s in late]}, busiest {[round(s[-1], 3) for s in late]}")


if __name__ == "__main__":
    main()
