"""Dense against MoE, and three ways to balance a MoE, on the course corpus (notebook 12).

    python benchmarks/bench_moe.py --part models --steps 600   # dense vs MoE, 3 seeds (~10 min quiet)
    python benchmarks/bench_moe.py --part balance --steps 200  # the three balancings, 3 seeds
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

tokens/s depends on the machine: the JSON keeps it, and the notebook prints it only through
`format_duration` or as a ratio with wide bounds. Validation losses are machine-independent to
about 1e-3 (float32 round-off over a few hundred steps), so they are printed with 2 decimals.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
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


def corpus_ids(n_chars: int = 300_000):
    train_text, val_text = split_stories(load_corpus()[:n_chars])
    tokenizer = CharTokenizer(sorted(set(train_text + val_text)))
    return len(tokenizer.chars), encode_text(tokenizer, train_text), encode_text(tokenizer, val_text)


def train(extra: dict, seed: int, steps: int, data, record_load: bool = False) -> dict:
    """Train one FrontierGPT for `steps`; returns val loss, tokens/s, parameters, per-step shares."""
    vocab, train_ids, val_ids = data
    torch.manual_seed(seed)
    model = FrontierGPT(FrontierConfig(vocab_size=vocab, **SIZES, **extra))
    config = TrainConfig(batch_size=12, learning_rate=3e-3, precision="fp32", fast=False,
                         eval_every=steps, eval_batches=16, seed=seed)
    trainer = Trainer(model, train_ids, val_ids, config)
    shares, started = [], time.perf_counter()
    for step in range(steps):
        trainer.train_step(learning_rate((step + 1) / steps, config.learning_rate, config.warmup,
                                         config.min_lr_ratio))
        if record_load:
            load = model.moe_layers()[0].last_load
            shares.append((load / load.sum()).tolist())
    seconds = time.perf_counter() - started
    total, active = total_and_active_parameters(model)
    return {"val_loss": trainer.evaluate()["val"], "tokens_per_s": steps * 12 * 64 / seconds,
            "total_params": total, "active_params": active, "shares": shares}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--part", choices=("all", "models", "balance"), default="all")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "data" / "bench_moe.json"))
    args = parser.parse_args()
    data = corpus_ids()
    out = Path(args.out)
    result = json.loads(out.read_text()) if args.part != "all" and out.exists() else {}
    result["seeds"] = list(range(args.seeds))
    if args.part in ("all", "models"):
        result["models"], result["model_steps"] = {}, args.steps
        run_models(result, args.steps, args.seeds, data)
    if args.part in ("all", "balance"):
        result["balance"], result["balance_steps"] = {}, args.steps
        run_balance(result, args.steps, args.seeds, data)
    out.write_text(json.dumps(result))
    print(f"wrote {out}")


def run_models(result: dict, steps: int, seeds: int, data) -> None:
    for name, extra in MODELS.items():
        runs = [train(extra, seed, steps, data) for seed in range(seeds)]
        result["models"][name] = {key: [run[key] for run in runs]
                                  for key in ("val_loss", "tokens_per_s", "total_params", "active_params")}
        losses = result["models"][name]["val_loss"]
        print(f"{name:24s} val {statistics.mean(losses):.3f} ({', '.join(f'{x:.3f}' for x in losses)})")


def run_balance(result: dict, steps: int, seeds: int, data) -> None:
    moe = MODELS["MoE 8 experts, top-2"]
    for name, extra in BALANCE.items():
        runs = [train(moe | extra, seed, steps, data, record_load=True) for seed in range(seeds)]
        result["balance"][name] = {"val_loss": [run["val_loss"] for run in runs],
                                   "shares": [[[round(s, 4) for s in step] for step in run["shares"]]
                                              for run in runs]}
        late = [max(map(statistics.mean, zip(*run["shares"][-50:], strict=True))) for run in runs]
        print(f"balance {name:9s} largest share over the last 50 steps {late}")


if __name__ == "__main__":
    main()
