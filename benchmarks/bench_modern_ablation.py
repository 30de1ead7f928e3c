"""Notebook 9's ablation: GPT-2's block turned into the modern block one change at a time.

    python benchmarks/bench_modern_ablation.py                  # 300 steps, seeds 0 1 2 -> data/modern_ablation.json
    python benchmarks/bench_modern_ablation.py --steps 900 --seeds 3 4 5 --rows 0 1 4 5 \\
        --out data/modern_ablation_long.json                     # the attempt to overturn it

Every model: 2 layers, width 64, 4 query heads, context 64, the course corpus at the character
level, tied output matrix, float32, one thread. Each row adds one change to the row above it
(cumulative), and the "alone" rows add one change to GPT-2's block; the last row trains GQA for
real (2 KV heads for 4 query heads).

Equal parameters: every change moves the parameter count (RoPE drops the 64 x 64 position
table, RMSNorm drops LayerNorm's bias, no-biases drops every bias, GQA drops half of W_K and
W_V), so the MLP's hidden width absorbs the difference: each model has the GPT-2 block's count to
within 0.5 %.

Equal initialisation: GPT-2's (`helpers.model.layers.init_gpt2_`) for every model, so the
rows differ only by what they name: every Linear and Embedding weight ~ N(0, 0.02), biases 0,
the two projections that write into the residual stream (W_O and the MLP's last matrix)
~ N(0, 0.02 / sqrt(2 * n_layers)), norm gains 1.

Equal data and compute: AdamW (lr 3e-3), batches of 16 windows, the same windows in the same
order for every model of a seed; the seed sets both the initialisation and the windows. The
validation loss is on 64 windows of held-out stories, the same for every model.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from helpers.model.layers import FeedForward, LayerNorm, SwiGLUFeedForward, init_gpt2_
from helpers.model.modern import RMSNorm, RopeTable, rope_rotate_half
from helpers.model.multihead import MultiHeadAttention, split_heads
from helpers.text.chars import CharTokenizer
from helpers.text.corpus import load_corpus
from helpers.training.trainer import encode_text, random_batch, split_stories

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "data" / "modern_ablation.json"
D_MODEL, N_HEADS, N_LAYERS, CONTEXT, BATCH, LR = 64, 4, 2, 64, 16, 3e-3


@dataclass(frozen=True)
class Variant:
    """One row of the ablation: how the block knows positions, normalises, mixes, and shares heads."""

    name: str
    positions: str = "learned"  # "learned" (GPT-2's table) or "rope"
    norm: str = "layer"         # "layer" or "rms"
    mlp: str = "gelu"           # "gelu" (two matrices) or "swiglu" (three)
    bias: bool = True
    n_kv_heads: int = N_HEADS


GPT2 = Variant("GPT-2 block")
CUMULATIVE = [GPT2,
              replace(GPT2, name="+ RoPE", positions="rope"),
              replace(GPT2, name="+ RMSNorm", positions="rope", norm="rms"),
              replace(GPT2, name="+ SwiGLU", positions="rope", norm="rms", mlp="swiglu"),
              replace(GPT2, name="+ no biases (modern block)", positions="rope", norm="rms",
                      mlp="swiglu", bias=False),
              replace(GPT2, name="+ GQA, 2 KV heads", positions="rope", norm="rms", mlp="swiglu",
                      bias=False, n_kv_heads=2)]
ALONE = [replace(GPT2, name="GPT-2 + RMSNorm alone", norm="rms"),
         replace(GPT2, name="GPT-2 + SwiGLU alone", mlp="swiglu"),
         replace(GPT2, name="GPT-2 + no biases alone", bias=False),
         replace(GPT2, name="GPT-2 + GQA alone", n_kv_heads=2)]
VARIANTS = CUMULATIVE + ALONE


class AblationBlock(nn.Module):
    """Pre-norm block: x + attn(norm(x)), x + mlp(norm(x)), its parts chosen by `variant`."""

    def __init__(self, variant: Variant, hidden: int, rope: RopeTable | None) -> None:
        super().__init__()
        norm = LayerNorm if variant.norm == "layer" else RMSNorm
        self.norm1, self.norm2 = norm(D_MODEL), norm(D_MODEL)
        self.attn = MultiHeadAttention(D_MODEL, N_HEADS, variant.n_kv_heads, bias=variant.bias)
        self.mlp = (FeedForward(D_MODEL, hidden, bias=variant.bias) if variant.mlp == "gelu"
                    else SwiGLUFeedForward(D_MODEL, hidden, bias=variant.bias))
        self.rope = rope

    def forward(self, x: Tensor) -> Tensor:
        """x: (B, N, D) -> (B, N, D)."""
        h = self.norm1(x)
        q = split_heads(self.attn.q_proj(h), N_HEADS)  # (B, H, N, D_H)
        k, v = self.attn.project_keys_values(h)        # (B, H_KV, N, D_H)
        if self.rope is not None:
            q, k = rope_rotate_half(q, self.rope), rope_rotate_half(k, self.rope)
        x = x + self.attn.attend(q, k, v, causal=True)
        return x + self.mlp(self.norm2(x))


class AblationGPT(nn.Module):
    """Embedding (+ learned positions or none) -> blocks -> final norm -> tied output (B, N, V)."""

    def __init__(self, variant: Variant, vocab_size: int, hidden: int) -> None:
        super().__init__()
        rope = RopeTable.build(D_MODEL // N_HEADS, CONTEXT) if variant.positions == "rope" else None
        self.embed = nn.Embedding(vocab_size, D_MODEL)
        self.positions = nn.Embedding(CONTEXT, D_MODEL) if rope is None else None
        self.blocks = nn.ModuleList(AblationBlock(variant, hidden, rope) for _ in range(N_LAYERS))
        self.norm = LayerNorm(D_MODEL) if variant.norm == "layer" else RMSNorm(D_MODEL)
        self.head = nn.Linear(D_MODEL, vocab_size, bias=False)
        init_gpt2_(self, N_LAYERS)
        self.head.weight = self.embed.weight  # tied, as GPT-2

    def forward(self, ids: Tensor) -> Tensor:
        """ids: (B, N) -> logits (B, N, V)."""
        x = self.embed(ids)
        if self.positions is not None:
            x = x + self.positions(torch.arange(ids.shape[1]))
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def equal_size_hidden(variant: Variant, vocab_size: int, target: int) -> int:
    """The MLP width that brings `variant` closest to `target` parameters (the count is linear in it)."""
    one, two = (n_params(AblationGPT(variant, vocab_size, h)) for h in (1, 2))
    return max(1, round(1 + (target - one) / (two - one)))


def load_data() -> tuple[int, Tensor, Tensor]:
    """Vocabulary size and the train / validation ids of the course corpus's first 300k characters."""
    train_text, val_text = split_stories(load_corpus()[:300_000])
    tokenizer = CharTokenizer(sorted(set(train_text + val_text)))
    return len(tokenizer.chars), encode_text(tokenizer, train_text), encode_text(tokenizer, val_text)


def train_one(variant: Variant, seed: int, steps: int, data: tuple[int, Tensor, Tensor],
              target: int) -> dict:
    """Train one variant from `seed`; returns its size, width, validation loss and seconds."""
    vocab_size, train_ids, val_ids = data
    hidden = equal_size_hidden(variant, vocab_size, target)
    torch.manual_seed(seed)
    model = AblationGPT(variant, vocab_size, hidden)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    windows = torch.Generator().manual_seed(1000 + seed)
    start = time.perf_counter()
    for _ in range(steps):
        x, y = random_batch(train_ids, BATCH, CONTEXT, generator=windows)
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    seconds = time.perf_counter() - start
    x, y = random_batch(val_ids, 64, CONTEXT, generator=torch.Generator().manual_seed(12345))
    with torch.no_grad():
        val = float(F.cross_entropy(model.eval()(x).flatten(0, 1), y.flatten()))
    return {"params": n_params(model), "hidden": hidden, "val_loss": val, "seconds": seconds}


def run(steps: int, seeds: list[int], variants: list[Variant] = VARIANTS,
        out: Path | None = None) -> dict:
    """Every variant at every seed; returns the JSON-ready table, also written to `out` (if given)
    after every row, so that a long run interrupted keeps the rows it finished."""
    torch.set_num_threads(1)
    data = load_data()
    target = n_params(AblationGPT(GPT2, data[0], 4 * D_MODEL))
    rows = []
    for variant in variants:
        runs = [train_one(variant, seed, steps, data, target) for seed in seeds]
        losses = [r["val_loss"] for r in runs]
        rows.append({"name": variant.name, "variant": variant.__dict__, "params": runs[0]["params"],
                     "hidden": runs[0]["hidden"], "val_loss": losses,
                     "mean": statistics.fmean(losses), "seconds": [r["seconds"] for r in runs]})
        if out is not None:
            out.write_text(json.dumps(_table(steps, seeds, rows, target), indent=1) + "\n", encoding="utf-8")
        print(f"{variant.name:28s} {runs[0]['params']:>7,} params, MLP width {runs[0]['hidden']:>3}: "
              + " ".join(f"{v:.3f}" for v in losses) + f"  mean {rows[-1]['mean']:.3f}", flush=True)
    return _table(steps, seeds, rows, target)


def _table(steps: int, seeds: list[int], rows: list[dict], target: int) -> dict:
    return {"steps": steps, "seeds": seeds, "gpt2_params": target, "d_model": D_MODEL,
            "n_heads": N_HEADS, "n_layers": N_LAYERS, "context": CONTEXT, "batch": BATCH, "lr": LR,
            "command": f"python benchmarks/bench_modern_ablation.py --steps {steps} --seeds "
                       + " ".join(map(str, seeds)) + " --rows "
                       + " ".join(str(VARIANTS.index(Variant(**r["variant"]))) for r in rows),
            "rows": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--rows", type=int, nargs="+", default=None,
                        help="indices into VARIANTS (default: all ten)")
    args = parser.parse_args(argv)
    if args.steps < 1 or not args.seeds:
        parser.error(f"--steps is {args.steps} and --seeds {args.seeds}: expected steps >= 1, one seed or more")
    if args.rows is not None and not all(0 <= i < len(VARIANTS) for i in args.rows):
        parser.error(f"--rows is {args.rows}, expected indices from 0 to {len(VARIANTS) - 1}")
    table = run(args.steps, args.seeds, VARIANTS if args.rows is None else [VARIANTS[i] for i in args.rows],
                args.out)
    assert all(math.isfinite(v) for row in table["rows"] for v in row["val_loss"])
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
