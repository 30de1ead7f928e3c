"""The RNN bottleneck, three seeds: notebook 10 reads the JSON this writes.

    python benchmarks/bench_bottleneck.py                 # the committed data/bottleneck.json
    python benchmarks/bench_bottleneck.py --steps 40 --seeds 0 --out /tmp/b.json   # a quick look

For each seed, a plain GRU, a GRU with Bahdanau's attention and an encoder-decoder Transformer
learn the same joined-sentence examples (helpers.families.bottleneck) for the same number of
steps of the same batches; each is decoded greedily on the test examples at half the steps and
at the end, and the Transformer's beam search is compared with its greedy decoding.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch

from helpers.families.bottleneck import MODELS, JoinedPairs, beam_against_greedy, run_bottleneck
from helpers.families.translation import TranslationData, sentence_splits


def run_seed(args: argparse.Namespace, seed: int) -> dict:
    """One seed: the three models on that seed's examples, and the Transformer's beam search."""
    torch.set_num_threads(1)
    data = TranslationData.from_corpus()
    train_ids, _, test_ids = sentence_splits(len(data.sentences))
    train = JoinedPairs(data, train_ids, args.train_examples, args.max_sentences, seed=seed)
    test = JoinedPairs(data, test_ids, args.test_examples, args.max_sentences, seed=1000 + seed)
    models: dict = {}
    result = run_bottleneck(data, train, test, seed, args.steps, args.hidden, args.batch_size,
                            models=args.models, keep=models)
    if "transformer" in models and args.beam_examples:
        result["transformer"]["beam"] = beam_against_greedy(models["transformer"], test, args.beam_examples)
    print(f"seed {seed}: " + ", ".join(
        f"{name} exact {sum(r['end']['exact']) / len(r['end']['exact']):.2f} "
        f"(half {sum(r['half']['exact']) / len(r['half']['exact']):.2f})" for name, r in result.items()),
        flush=True)
    return {"seed": seed, "models": result}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=800)
    parser.add_argument("--hidden", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-sentences", type=int, default=3)
    parser.add_argument("--train-examples", type=int, default=4000)
    parser.add_argument("--test-examples", type=int, default=150)
    parser.add_argument("--beam-examples", type=int, default=30)
    parser.add_argument("--jobs", type=int, default=1, help="seeds run side by side, one process each")
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "data" / "bottleneck.json")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    if args.jobs > 1:
        with ProcessPoolExecutor(args.jobs) as pool:
            runs = list(pool.map(run_seed, [args] * len(args.seeds), args.seeds))
    else:
        runs = [run_seed(args, seed) for seed in args.seeds]
    report = {"command": "python benchmarks/bench_bottleneck.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
              "machine": f"{platform.machine()}, torch {torch.__version__}, 1 thread, float32",
              "seconds": time.perf_counter() - started, "runs": runs}
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {args.out} in {report['seconds']:.0f} s")
    return report


if __name__ == "__main__":
    main()
