"""GRPO's mean reward over steps, 12 seeds, for three ways to normalise the loss.

    python benchmarks/bench_grpo.py            # 12 seeds x 3 methods x 40 steps -> data/grpo_rewards.json
    python benchmarks/bench_grpo.py --quick    # 1 seed x 3 x 3 steps on a barely trained model, writes nothing

Notebook 13 reads the JSON (section 6) rather than run 36 GRPO runs inside its minute. The model
is notebook 13's: helpers.post.recipe's setting, pretrained 300 steps and SFT 60 steps (seed 0);
the reference is the SFT model. Each run: per step 4 training questions, 8 sampled answers each
(temperature 1, 9 new tokens), reward 1 if the checker accepts the answer, 2 clipped AdamW
updates on the whole batch of 32 answers (lr 3e-4, epsilon 0.2, KL beta 0.04). The methods
(helpers.post.grpo's docstring has the formulas):

    sequence   each answer's tokens averaged, then the answers; advantages / group std  (GRPO)
    token      the mean over all tokens of the batch; advantages / group std            (DAPO)
    constant   the sum over tokens / (32 answers x 9 tokens); advantages not scaled     (Dr. GRPO)

All three runs of one seed draw the same first step's samples (same model, same generator).
Also recorded: greedy accuracy on the training and held-out questions after each run. Runs are
float32 on one thread: another CPU samples other answers after a few steps, so a rerun elsewhere
gives other per-seed numbers; the summary over seeds is what to compare.
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import time
from pathlib import Path

import torch

from helpers.post import grpo, recipe, sft

OUT = Path(__file__).resolve().parent.parent / "data" / "grpo_rewards.json"
METHODS = {"sequence": {"normalise": "sequence", "scale_rewards": True, "paper": "GRPO"},
           "token": {"normalise": "token", "scale_rewards": True, "paper": "DAPO"},
           "constant": {"normalise": "constant", "scale_rewards": False, "paper": "Dr. GRPO"}}


def run(steps: int, seeds: list[int], pretrain_steps: int = 300, sft_steps: int = 60) -> dict:
    torch.set_num_threads(1)
    setting = recipe.make_setting()
    model = recipe.pretrain(setting, steps=pretrain_steps, seed=0)
    sft.train_sft(model, recipe.sft_batches(setting), steps=sft_steps, lr=1e-3, seed=0)
    reference = copy.deepcopy(model).requires_grad_(False)
    result = {"command": "python benchmarks/bench_grpo.py", "steps": steps, "seeds": seeds,
              "methods": METHODS, "machine": platform.machine(), "torch": torch.__version__,
              "sft_accuracy": {"train": sft.greedy_accuracy(model, setting.tokenizer, setting.train_facts),
                               "held": sft.greedy_accuracy(model, setting.tokenizer, setting.held_facts)},
              "runs": {}}
    for seed in seeds:
        for name, method in METHODS.items():
            started = time.perf_counter()
            policy = copy.deepcopy(model)
            history = grpo.train_grpo(policy, reference, setting.tokenizer, setting.train_facts,
                                      steps=steps, prompts_per_step=4, group_size=8, lr=3e-4,
                                      normalise=method["normalise"],
                                      scale_rewards=method["scale_rewards"], seed=seed)
            result["runs"][f"{name}/{seed}"] = {
                "reward": [round(r, 4) for r in history["reward"]],
                "kl": [round(k, 5) for k in history["kl"]],
                "train_accuracy": sft.greedy_accuracy(policy, setting.tokenizer, setting.train_facts),
                "held_accuracy": sft.greedy_accuracy(policy, setting.tokenizer, setting.held_facts)}
            first, last = history["reward"][:5], history["reward"][-5:]
            print(f"{name:8} seed {seed:2}: mean reward of the first 5 steps "
                  f"{sum(first) / len(first):.2f}, last 5 {sum(last) / len(last):.2f} "
                  f"({time.perf_counter() - started:.0f} s)", flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 seed, 3 steps, no file written")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--seeds", type=int, default=12)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    if args.quick:
        run(steps=3, seeds=[0], pretrain_steps=10, sft_steps=5)
        return
    result = run(steps=args.steps, seeds=list(range(args.seeds)))
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print("wrote", args.out)


if __name__ == "__main__":
    main()
