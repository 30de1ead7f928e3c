"""GRPO's mean reward over steps, three seeds, per-sequence against per-token normalisation.

    python benchmarks/bench_grpo.py            # 3 seeds x 2 normalisations x 40 steps -> data/grpo_rewards.json
    python benchmarks/bench_grpo.py --quick    # 1 seed x 2 x 3 steps on a barely trained model, writes nothing

Notebook 13 reads the JSON (section 6) rather than run six GRPO runs inside its minute. The model
is notebook 13's: helpers.post.recipe's setting, pretrained 300 steps and SFT 60 steps (seed 0);
the reference is the SFT model. Each run: per step 4 training questions, 8 sampled answers each
(temperature 1), reward 1 if the checker accepts the answer, 2 clipped AdamW updates (lr 3e-4,
epsilon 0.2, KL beta 0.04). "sequence" averages each answer's tokens then the answers (GRPO);
"token" averages all tokens of a group together (DAPO), so long answers weigh more.
Also recorded: greedy accuracy on the training and held-out questions after each run.
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from pathlib import Path

import torch

from helpers.post import grpo, recipe, sft

OUT = Path(__file__).resolve().parent.parent / "data" / "grpo_rewards.json"


def run(steps: int, seeds: list[int], pretrain_steps: int = 300, sft_steps: int = 60) -> dict:
    torch.set_num_threads(1)
    setting = recipe.make_setting()
    model = recipe.pretrain(setting, steps=pretrain_steps, seed=0)
    sft.train_sft(model, recipe.sft_batches(setting), steps=sft_steps, lr=1e-3, seed=0)
    reference = copy.deepcopy(model).requires_grad_(False)
    result = {"command": "python benchmarks/bench_grpo.py", "steps": steps, "seeds": seeds,
              "sft_accuracy": {"train": sft.greedy_accuracy(model, setting.tokenizer, setting.train_facts),
                               "held": sft.greedy_accuracy(model, setting.tokenizer, setting.held_facts)},
              "runs": {}}
    for normalise in ("sequence", "token"):
        for seed in seeds:
            started = time.perf_counter()
            policy = copy.deepcopy(model)
            history = grpo.train_grpo(policy, reference, setting.tokenizer, setting.train_facts,
                                      steps=steps, prompts_per_step=4, group_size=8, lr=3e-4,
                                      normalise=normalise, seed=seed)
            result["runs"][f"{normalise}/{seed}"] = {
                "reward": [round(r, 4) for r in history["reward"]],
                "kl": [round(k, 5) for k in history["kl"]],
                "train_accuracy": sft.greedy_accuracy(policy, setting.tokenizer, setting.train_facts),
                "held_accuracy": sft.greedy_accuracy(policy, setting.tokenizer, setting.held_facts)}
            first, last = history["reward"][:5], history["reward"][-5:]
            print(f"{normalise:8} seed {seed}: mean reward of the first 5 steps "
                  f"{sum(first) / len(first):.2f}, last 5 {sum(last) / len(last):.2f} "
                  f"({time.perf_counter() - started:.0f} s)", flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 seed, 3 steps, no file written")
    args = parser.parse_args()
    if args.quick:
        run(steps=3, seeds=[0], pretrain_steps=10, sft_steps=5)
        return
    result = run(steps=40, seeds=[0, 1, 2])
    OUT.write_text(json.dumps(result, indent=1) + "\n")
    print("wrote", OUT)


if __name__ == "__main__":
    main()
