"""What a Muon step costs next to an AdamW step, with Newton-Schulz per matrix and batched.

    python benchmarks/bench_muon_step.py                  # fp32 and bf16 -> data/muon_step_cost.json
    python benchmarks/bench_muon_step.py --rounds 2 --out /tmp/muon_step.json   # a smoke run

Three Trainers on notebook 7's GPT in the race's setting (n_layers=4, n_heads=4, d_model=128,
window 64, batch 12), one thread, taking turns (A, B, C, A, B, C, ..., the order rotated each
round), `--steps` training steps per turn; each step's cost is the median over the rounds of
its ratio to AdamW's step in the same round:

    adamw         TrainConfig's defaults: the fused AdamW step
    muon-loop     TrainConfig(optimizer="muon") with the step Muon took before: `muon_update`
                  (Newton-Schulz of one matrix at a time, in a Python loop over the 24 matrices)
    muon          the same with Muon.step as it is: every matrix of one shape at once, as one
                  stack (`newton_schulz` of (K, A, B)), the MLP's 128 x 512 matrices on their Gram matrix

in float32 (Newton-Schulz in float32, the laptop path) and bfloat16 (Newton-Schulz in bfloat16:
fast on a CPU with native bf16, as the one of the stored JSON, whose "machine" says which; emulated
and slow without). Measured on a shared 2-core machine: the ratios to AdamW's step are the
result, the seconds are contention.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_train import BATCH, BLOCK, N_EMBD, N_HEAD, N_LAYER  # noqa: E402

from helpers.model.gpt import GPT, GPTConfig  # noqa: E402
from helpers.training.muon import Muon, muon_update  # noqa: E402
from helpers.training.speed import cpu_has_native_bf16  # noqa: E402
from helpers.training.trainer import TrainConfig, Trainer  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


class PerMatrixMuon(Muon):
    """Muon with the step it took before the batched one: `muon_update` on each matrix in turn."""

    @torch.no_grad()
    def step(self, closure=None):  # noqa: ANN001, ANN201 (torch's signature)
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                buf = state.get("momentum_buffer", torch.zeros_like(p.grad))
                new_p, state["momentum_buffer"] = muon_update(
                    p, p.grad, buf, group["lr"], group["momentum"], group["nesterov"], group["weight_decay"],
                    group["rule"], group["ns_dtype"])
                p.copy_(new_p)


def make_trainer(kind: str, precision: str, vocab_size: int, ids: torch.Tensor) -> Trainer:
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=vocab_size, context_length=BLOCK, n_layers=N_LAYER, n_heads=N_HEAD,
                          d_model=N_EMBD))
    config = TrainConfig(batch_size=BATCH, context_length=BLOCK, precision=precision,
                         optimizer="adamw" if kind == "adamw" else "muon")
    trainer = Trainer(model, ids[: len(ids) * 9 // 10], ids[len(ids) * 9 // 10:], config)
    if kind == "muon-loop":
        trainer.optimizer.muon.__class__ = PerMatrixMuon
    return trainer


def measure(precision: str, rounds: int, steps: int) -> dict:
    ids = torch.randint(0, 65, (100_000,), generator=torch.Generator().manual_seed(0))
    trainers = {kind: make_trainer(kind, precision, 65, ids) for kind in ("adamw", "muon-loop", "muon")}
    for trainer in trainers.values():
        trainer.train_step(1e-3)  # first steps allocate
    seconds = {kind: [] for kind in trainers}
    kinds = list(trainers)
    for round_ in range(rounds):
        for kind in kinds[round_ % 3:] + kinds[:round_ % 3]:
            started = time.perf_counter()
            for _ in range(steps):
                trainers[kind].train_step(1e-3)
            seconds[kind].append((time.perf_counter() - started) / steps)
    # The ratio within each round (turns seconds apart), then the median over rounds: a burst of
    # load on the shared machine slows one round's turns alike and leaves its ratios.
    ratios = {kind: statistics.median(s / a for s, a in zip(values, seconds["adamw"], strict=True))
              for kind, values in seconds.items()}
    return {"median_seconds": {kind: statistics.median(values) for kind, values in seconds.items()},
            "ratio_to_adamw": ratios, "rounds": {k: [round(s, 5) for s in v] for k, v in seconds.items()}}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--steps", type=int, default=4, help="training steps per turn")
    parser.add_argument("--precisions", nargs="+", choices=("fp32", "bf16"), default=["fp32", "bf16"])
    parser.add_argument("--out", type=Path, default=ROOT / "data" / "muon_step_cost.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    results = {}
    for precision in args.precisions:
        results[precision] = measure(precision, args.rounds if precision == "fp32" else max(2, args.rounds // 3),
                                     args.steps)
        ratios = results[precision]["ratio_to_adamw"]
        print(f"{precision}: Muon per matrix {ratios['muon-loop']:.2f}x AdamW's step, batched "
              f"{ratios['muon']:.2f}x", flush=True)
    record = {"settings": vars(args) | {"out": str(args.out)},
              "note": "Measured on a shared 2-core machine, one thread, in turns: the ratios are the result.",
              "machine": {"torch": torch.__version__, "processor": platform.processor() or platform.machine(),
                          "native_bf16": cpu_has_native_bf16()},
              "results": results}
    args.out.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
