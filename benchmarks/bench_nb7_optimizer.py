"""Notebook 7's training run with AdamW (its default) against Muon, at equal wall-clock time.

    python benchmarks/bench_nb7_optimizer.py --out data/nb7_optimizer.json          # float32, seeds 0 1 2
    python benchmarks/bench_nb7_optimizer.py --precision auto --out /tmp/nb7_bf16.json
    python benchmarks/bench_nb7_optimizer.py --steps 30 --seeds 0 --out /tmp/nb7.json  # a smoke test

Notebook 7 trained its GPT (n_layers=2, n_heads=4, d_model=128, window 64) on the rich corpus,
one character per token, for TRAIN_STEPS = 600 steps of TrainConfig(batch_size=16,
learning_rate=5e-3), AdamW, one thread; after this comparison it trains with Muon for 400. It counts steps, and a Muon step costs more than an AdamW step
(Newton-Schulz: five rounds of matrix products per hidden matrix), so equal steps would favour
Muon. The script therefore first measures the two steps' durations in turns (blocks of steps,
A, B, A, B ..., one thread, medians) and gives Muon the steps that fit in AdamW's time:
round(steps x t_adamw / t_muon). Each seed then trains both (the same first weights and
batches), each over its own schedule, and compares the final validation loss on notebook 7's
fixed validation batches. Muon's variants: --muon-lr (its peak rate; AdamW's 5e-3 stays for the
embeddings, head, gains and biases). --adamw-lr adds AdamW at other peak rates (an attempt to
overturn the result: perhaps notebook 7's rate is not AdamW's best).

Measured on a shared 2-core machine: the seconds are contention, only their ratio is used, and
the losses do not depend on the timing (each run is a fixed number of steps).
"""

from __future__ import annotations

import argparse
import functools
import json
import platform
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from helpers.model.gpt import GPT, GPTConfig  # noqa: E402
from helpers.text.chars import CharTokenizer  # noqa: E402
from helpers.text.corpus_rich import load_rich_corpus  # noqa: E402
from helpers.timing import times_in_turns  # noqa: E402
from helpers.training.trainer import TrainConfig, Trainer, encode_text, split_stories  # noqa: E402

NB7_STEPS, NB7_BATCH, NB7_LR = 600, 16, 5e-3


def nb7_data() -> tuple[int, torch.Tensor, torch.Tensor]:
    """Notebook 7's vocabulary size and its training and validation token ids."""
    text = load_rich_corpus()
    tokenizer = CharTokenizer.train(text)
    train_text, val_text = split_stories(text, val_fraction=0.1)
    return tokenizer.vocab_size, encode_text(tokenizer, train_text), encode_text(tokenizer, val_text)


def make_trainer(vocab_size: int, train_ids: torch.Tensor, val_ids: torch.Tensor, seed: int,
                 precision: str, optimizer: str, muon_lr: float = 0.02, adamw_lr: float = NB7_LR) -> Trainer:
    """Notebook 7's GPT (initialised by `seed`) and its TrainConfig, with `optimizer`."""
    torch.manual_seed(seed)
    model = GPT(GPTConfig(vocab_size=vocab_size, context_length=64, n_layers=2, n_heads=4, d_model=128))
    config = TrainConfig(batch_size=NB7_BATCH, learning_rate=adamw_lr, eval_every=100, precision=precision,
                         seed=seed, optimizer=optimizer, muon_learning_rate=muon_lr)
    return Trainer(model, train_ids, val_ids, config)


def step_seconds(trainers: dict[str, Trainer], rounds: int, block: int) -> dict[str, float]:
    """Median seconds per step of each trainer, timed in turns: `rounds` x `block` steps each."""
    times = times_in_turns({name: functools.partial(trainer.train_step, 1e-3) for name, trainer in trainers.items()},
                           rounds, block)
    return {name: statistics.median(values) for name, values in times.items()}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=NB7_STEPS, help="AdamW's steps (notebook 7's TRAIN_STEPS)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--precision", choices=("auto", "fp32", "bf16"), default="fp32")
    parser.add_argument("--muon-lr", type=float, nargs="+", default=[0.02])
    parser.add_argument("--adamw-lr", type=float, nargs="*", default=[],
                        help="AdamW at other peak rates as well (notebook 7's 5e-3 always runs), same steps")
    parser.add_argument("--rounds", type=int, default=8, help="timing rounds (blocks per optimiser)")
    parser.add_argument("--block", type=int, default=10, help="steps per timed block")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # notebook 7 trains on one thread

    vocab_size, train_ids, val_ids = nb7_data()
    timing = step_seconds({name: make_trainer(vocab_size, train_ids, val_ids, 0, args.precision, name)
                           for name in ("adamw", "muon")}, args.rounds, args.block)
    ratio = timing["muon"] / timing["adamw"]
    muon_steps = round(args.steps / ratio)
    print(f"seconds per step: adamw {timing['adamw']:.4f}, muon {timing['muon']:.4f} (ratio {ratio:.2f}); "
          f"muon gets {muon_steps} steps for adamw's {args.steps}", flush=True)
    runs = []
    for seed in args.seeds:
        row = {"seed": seed}
        variants = [("adamw", "adamw", 0.02, NB7_LR, args.steps)] + [
            (f"muon lr {lr:g}", "muon", lr, NB7_LR, muon_steps) for lr in args.muon_lr] + [
            (f"adamw lr {lr:g}", "adamw", 0.02, lr, args.steps) for lr in args.adamw_lr]
        for name, optimizer, muon_lr, adamw_lr, steps in variants:
            trainer = make_trainer(vocab_size, train_ids, val_ids, seed, args.precision, optimizer, muon_lr, adamw_lr)
            history = trainer.fit(steps=steps, progress_bar=False)
            row[name] = {"steps": steps, "val_loss": history.val_losses[-1],
                         "train_loss": history.train_losses[-1], "train_seconds": history.train_seconds}
        runs.append(row)
        print(f"seed {seed}: " + ", ".join(f"{name} {row[name]['val_loss']:.4f} ({row[name]['steps']} steps, "
                                          f"{row[name]['train_seconds']:.1f} s)" for name, *_ in variants), flush=True)
    summary = {}
    for name in [key for key in runs[0] if key.startswith("muon")]:
        gaps = [run[name]["val_loss"] - run["adamw"]["val_loss"] for run in runs]
        best = [min(run[key]["val_loss"] for key in run if key.startswith("adamw")) for run in runs]
        summary[name] = {"val_loss_minus_adamw": gaps, "wins_every_seed": all(gap < 0 for gap in gaps),
                         "median_gap": statistics.median(gaps),
                         "beats_every_adamw_rate_on_every_seed": all(
                             run[name]["val_loss"] < b for run, b in zip(runs, best, strict=True))}
        print(f"{name} - adamw, validation loss per seed: {[round(g, 4) for g in gaps]}", flush=True)
    settings = {key: (str(value) if isinstance(value, Path) else value) for key, value in vars(args).items()}
    machine = {"torch": torch.__version__, "processor": platform.processor() or platform.machine(),
               "threads": 1, "note": "a shared 2-core machine: seconds are contention, only the ratio is used"}
    args.out.write_text(json.dumps({"settings": settings, "machine": machine,
                                    "step_seconds": timing, "step_ratio": ratio, "muon_steps": muon_steps,
                                    "runs": runs, "summary": summary}, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
