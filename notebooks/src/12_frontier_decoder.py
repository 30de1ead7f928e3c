# %% [markdown] slideshow={"slide_type": "slide"}
# # 12. The decoder of 2025-2026: mixture of experts, latent attention, sliding windows
#
# Notebook 9 ended at Llama 2 (2023). The open models students read about now (DeepSeek-V3,
# Qwen3, Gemma 3, gpt-oss, OLMo 3) keep that decoder and change where compute and memory go:
# a **mixture of experts** gives each token a few of many MLPs, **multi-head latent attention**
# caches one small vector per token instead of every head's keys and values, and **sliding
# windows** bound the cache of most layers. Each piece is built here in plain code, then proven
# equal to the helper, and the helpers are proven equal to `transformers`' own models.
#
# **After this notebook you can**
# - build a top-k router and a set of SwiGLU experts, as a loop and as one batched product, say
#   which models put the softmax before the top-k and which after, and what a capacity drops;
# - balance the experts with the Switch Transformer's auxiliary loss or DeepSeek-V3's bias, and
#   measure what happens without either (experts starve);
# - explain why DeepSeek caches a latent instead of keys and values, absorb the up-projections,
#   and size the KV cache of MHA, GQA, MQA and MLA from a config;
# - write a sliding-window cache as a ring buffer, size Gemma 3's local/global stack at 128k
#   tokens, and see what QK-norm and RoPE scaling change.
#
# **It assumes** notebooks 5 (GQA and the KV-cache size), 7 (training), 9 (RoPE, RMSNorm, SwiGLU)
# and 11 (worker processes).

# %% [setup]

# %% [markdown] slideshow={"slide_type": "notes"}
# **Opening.** Three ideas that separate a 2025 decoder from GPT-2, each about cost: mixture of
# experts (more parameters, same compute per token), latent attention (a smaller KV cache) and
# sliding windows (a cache that stops growing). Ask the room which of the three costs (compute,
# memory, cache) hurts most when serving a chat model to many users, and come back to it at the end.

# %% slideshow={"slide_type": "fragment"}
import importlib.util
import json

import ipywidgets as widgets
import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F

from helpers.lab.exercises import check
from helpers.lab.sections import catch_up

torch.set_num_threads(1)  # every tensor here is small: one thread beats coordinating several
HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 1. Mixture of experts (optional)
#
# A dense block sends every token through one MLP. A MoE block has `E` MLPs (the **experts**) and
# a **router**, a linear layer `D -> E` that scores every expert for every token; each token goes
# to its `k` best experts, and their outputs are summed with weights from the scores. The model
# holds `E` MLPs' parameters but each token pays for `k`: more parameters at the same compute.
#
# ### 1.1 The router: softmax before or after the top-k
#
# Two conventions, for the same logits:
# - **softmax over all `E`, then keep the top `k`** (Qwen1.5-MoE, Qwen2-MoE and DeepSeek-V2,
#   whose released configs set `norm_topk_prob=False`): the kept weights sum to less than 1;
# - **top `k` logits, then a softmax over those `k`** (Mixtral): the weights sum to 1.
#   `transformers`' `MixtralTopKRouter` computes it as softmax, top-k, divide by the sum, which is
#   the same numbers; Qwen3-MoE does exactly that too: its released configs (30B-A3B, 235B-A22B)
#   set `norm_topk_prob=True`, although `transformers`' `Qwen3MoeConfig` defaults to `False`.
#
# DeepSeek-V3 uses a third: a **sigmoid** per expert, top-k, renormalised.

# %% [markdown] slideshow={"slide_type": "notes"}
# A router picks k experts per token; only those run. Draw one token going to two of eight MLPs.
# The exercise (the MoE forward) is long: in a 75-minute lecture, show the reference and give it
# as homework. The "see it move" widget shows dropped tokens when capacity is too small: ask the
# room to predict which expert overflows before you move the slider.

# %% slideshow={"slide_type": "fragment"}
torch.manual_seed(0)
logits = torch.tensor([[2.0, 1.0, 0.5, -1.0]])        # one token, four experts
probs = torch.softmax(logits, dim=-1)
kept, chosen = probs.topk(2, dim=-1)
print("experts chosen:", chosen.tolist()[0])
print("softmax then top-2 (Qwen2-MoE):", [round(w, 4) for w in kept[0].tolist()],
      "sum", round(kept.sum().item(), 4))
mixtral = torch.softmax(logits.topk(2, dim=-1).values, dim=-1)
print("top-2 then softmax (Mixtral):  ", [round(w, 4) for w in mixtral[0].tolist()],
      "sum", round(mixtral.sum().item(), 4))
assert torch.allclose(mixtral, kept / kept.sum(-1, keepdim=True))  # transformers' way, same numbers

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### 1.2 The experts: a loop, then one batched product
#
# Each expert is a SwiGLU MLP (notebook 9). The plain form of the whole layer routes each token
# (section 1.1, Mixtral's convention), then loops over the experts: each expert runs only on the
# tokens that chose it, and its output comes back to them weighted by the router.
#
# ### Exercise: the MoE forward
#
# Write `moe_forward(x, logits, k, experts)`: `x` `(T, D)` the tokens, `logits` `(T, E)` the
# router's scores, `experts` a list of `E` functions `(n, D) -> (n, D)`. Route with Mixtral's
# convention (section 1.1), run each expert only on the tokens that chose it, and return `(T, D)`,
# each token's weighted sum of its `k` experts' outputs. The check compares with the helpers' MoE
# for one, two and three experts per token and with experts no token chose; the cells below run
# the MoE with your function once it passes.
#
# <details><summary>Hint 1: the idea</summary>
#
# Two steps. Route: each token keeps its `k` largest logits, and a softmax over those `k` gives
# weights that sum to 1 (the other experts get nothing). Dispatch and combine: for each expert,
# find the tokens that chose it (and as which of their `k` choices), run the expert on those rows
# only, and add its output, times each token's weight for it, into those tokens' rows.
# </details>
#
# <details><summary>Hint 2: the plan</summary>(1) Route: each token's k best experts, and their
# weights from a softmax over just those k logits. (2) Start the output at zero. (3) For each expert
# some token chose: run it on those tokens only, and add its output, times each token's weight for
# it, into their rows.</details>
#
# <details><summary>Hint 3: closer</summary>Where an expert's number stands in the table of choices
# gives the token (the row) and which of its k choices it was (the column, so which weight). A token
# receives rows from several experts, so accumulate with an indexed add.</details>

# %% slideshow={"slide_type": "fragment"}
def moe_forward(x: torch.Tensor, logits: torch.Tensor, k: int, experts: list) -> torch.Tensor:
    """x (T, D), logits (T, E), experts: E functions (n, D) -> (n, D). Returns (T, D)."""
    ### BEGIN SOLUTION
    # Route (Mixtral): the k best experts of each token, a softmax over their k logits only.
    values, chosen = logits.topk(k, dim=-1)                  # (T, k) each
    weights = torch.softmax(values, dim=-1)                  # (T, k), each row sums to 1
    # Dispatch and combine: each expert sees only the tokens that chose it.
    out = torch.zeros_like(x)
    for e, expert in enumerate(experts):
        token, slot = torch.where(chosen == e)               # who chose e, as which choice
        if len(token) == 0:
            continue                                         # no token chose e: it does no work
        y = expert(x[token])                                 # (n_e, D)
        out.index_add_(0, token, y * weights[token, slot, None])
    return out
    ### END SOLUTION


# %% slideshow={"slide_type": "fragment"}
check("frontier_decoder.moe_forward", moe_forward)

# %% [markdown] slideshow={"slide_type": "subslide"}
# Now four SwiGLU experts and a router's logits for 24 tokens. The layer's output comes from your
# `moe_forward` once it passes the check, and from the helpers' until then (the cell says which).

# %% slideshow={"slide_type": "fragment"}
from helpers.lab.exercises import yours_or
from helpers.lab.exercises.frontier_decoder import helper_moe_forward

T, D, E, K, HIDDEN = 24, 16, 4, 2, 32
torch.manual_seed(0)
x = torch.randn(T, D)
gate, up, down = (torch.randn(E, HIDDEN, D) * 0.2, torch.randn(E, HIDDEN, D) * 0.2,
                  torch.randn(E, D, HIDDEN) * 0.2)
router_logits = torch.randn(T, E)
values, experts = router_logits.topk(K, dim=-1)
weights = values.softmax(-1)                                   # Mixtral's weights, (T, K)


def swiglu_expert(e: int):
    """Expert e as a function (n, D) -> (n, D)."""
    return lambda rows: (F.silu(rows @ gate[e].T) * (rows @ up[e].T)) @ down[e].T


forward = yours_or("frontier_decoder.moe_forward", moe_forward, helper_moe_forward)
looped = forward(x, router_logits, K, [swiglu_expert(e) for e in range(E)])
print("tokens per expert:", torch.bincount(experts.flatten(), minlength=E).tolist())

# %% [markdown] slideshow={"slide_type": "subslide"}
# A loop of `E` small products is slow on a GPU (and `E` is 256 in DeepSeek-V3). The batched form
# **sorts** the `T · k` assignments by expert, gives each one a row in its expert's buffer
# `(E, C, D)`, runs all experts as three batched products, and scatters the rows back.
# `C` is the largest load here, so nothing is dropped.

# %% slideshow={"slide_type": "fragment"}
def moe_sorted(x: torch.Tensor, weights: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
    flat = experts.flatten()                                   # (T k,) expert of each assignment
    order = torch.argsort(flat, stable=True)                   # assignments grouped by expert
    counts = torch.bincount(flat, minlength=E)
    first_row = torch.cumsum(counts, 0) - counts               # where each expert's group starts
    row = torch.arange(len(flat)) - first_row[flat[order]]     # row inside its expert's buffer
    token = order // K
    buffer = torch.zeros(E, int(counts.max()), D)              # (E, C, D)
    buffer[flat[order], row] = x[token]
    h = F.silu(buffer @ gate.transpose(1, 2)) * (buffer @ up.transpose(1, 2))
    y = (h @ down.transpose(1, 2))[flat[order], row]           # back to one row per assignment
    return torch.zeros_like(x).index_add(0, token, y * weights.flatten()[order, None])


batched = moe_sorted(x, weights, experts)
print(f"loop vs batched: max difference < 1e-5: {(looped - batched).abs().max().item() < 1e-5}")
assert torch.allclose(looped, batched, atol=1e-5)

# %% [markdown] slideshow={"slide_type": "subslide"}
# The same two forms live in `helpers.model.moe` (`Experts.loop`, `Experts.sorted`), with the
# router (`route`, all three conventions) and the whole layer (`MoELayer`). From here on we use them.

# %% slideshow={"slide_type": "fragment"}
from helpers.model.moe import Experts, expert_capacity, expert_load, route

helper = Experts(E, D, HIDDEN)
with torch.no_grad():
    helper.gate.copy_(gate), helper.up.copy_(up), helper.down.copy_(down)
    from_helper, dropped = helper.sorted(x, weights, experts)
    assert torch.allclose(from_helper, looped, atol=1e-5) and dropped == 0
    assert torch.allclose(helper.loop(x, weights, experts), looped, atol=1e-5)
print("helpers.model.moe agrees with the two forms above")

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### 1.3 The shared expert
#
# DeepSeek (and Qwen2-MoE) add one **shared expert** that every token passes through, beside the
# routed ones: common knowledge lives there once instead of being copied into every expert.
# `MoELayer(shared_hidden=...)` adds it; it counts fully towards the active parameters. To count
# them in a whole model we use `helpers.model.frontier.FrontierGPT`, notebook 9's decoder with a
# `MoELayer` for its MLP (section 1.5 describes it and proves it equal to `transformers`' Qwen3-MoE);
# its `mlp_hidden` is the shared expert's width when it has experts.

# %% slideshow={"slide_type": "fragment"}
from helpers.model.frontier import FrontierConfig, FrontierGPT, total_and_active_parameters

for shared in (0, 64):
    total, active = total_and_active_parameters(FrontierGPT(FrontierConfig(
        n_experts=8, top_k=2, expert_hidden=64, mlp_hidden=shared, n_layers=2, d_model=64)))
    print(f"shared width {shared:3d}: {total:,} parameters, {active:,} active per token")

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### 1.4 Capacity: dropped tokens or dropless
#
# On a GPU each expert's buffer has a fixed size, the **capacity** `C = ceil(factor · T · k / E)`
# (factor 1 is a fair share). Assignments past it are **dropped**: that token skips that expert and
# keeps only its residual path. GShard and Switch drop; recent models (Mixtral, DeepSeek-V3,
# Qwen3) are **dropless**: they run the experts as one **grouped GEMM** (General Matrix Multiply),
# a single kernel that does one matrix product per expert, each on however many rows that expert
# received, so no buffer has a fixed size. A skewed router drops a lot:

# %% slideshow={"slide_type": "fragment"}
torch.manual_seed(1)
skewed_logits = torch.randn(64, 8) + torch.tensor([2.0, 1.0, 0.5, 0, 0, 0, 0,
                                                   0])  # experts 0-2 favoured
w8, e8 = route(skewed_logits, 2)
layer_experts = Experts(8, D, HIDDEN)
x64 = torch.randn(64, D)
print("load per expert:", expert_load(e8, 8).int().tolist(), "of", 64 * 2, "assignments")
for factor in (0.5, 1.0, 1.25, 2.0):
    capacity = expert_capacity(64, 2, 8, factor)
    _, lost = layer_experts.sorted(x64, w8, e8, capacity)
    print(f"capacity factor {factor:4}: C = {capacity:3d} slots per expert, {lost:3d} assignments "
          f"dropped")
_, lost = layer_experts.sorted(x64, w8, e8)
print(f"dropless:              C = {int(expert_load(e8, 8).max()):3d} (the largest load), {lost} "
      f"dropped")

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### See it move: top-k, capacity and each expert's load
#
# The bars are each expert's load for the skewed router above; the dashed line is the capacity.
# Raise `k`: every token sends more assignments, the loads and the capacity grow together.
# Lower the factor: the line drops and the red part (dropped) grows. First a still figure.

# %% slideshow={"slide_type": "fragment"}
def draw_load(top_k: int = 2, capacity_factor: float = 1.0) -> dict:
    _, chosen = route(skewed_logits, top_k)
    load = expert_load(chosen, 8)
    capacity = expert_capacity(64, top_k, 8, capacity_factor)
    kept = load.clamp(max=capacity)
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.bar(range(8), kept, color="tab:blue", label="processed")
    ax.bar(range(8), load - kept, bottom=kept, color="tab:red", label="dropped")
    ax.axhline(capacity, color="black", linestyle="--", label=f"capacity C = {capacity}")
    ax.set(xlabel="expert", ylabel="assignments", ylim=(0, 64),
           title=f"64 tokens, top-{top_k}, capacity factor {capacity_factor}: "
                 f"{int((load - kept).sum())} dropped")
    ax.legend(loc="upper right")
    return {"dropped": int((load - kept).sum()), "capacity": capacity}


draw_load()
plt.show()

# %% slideshow={"slide_type": "fragment"}
# NBVAL_IGNORE_OUTPUT
# The widget's output holds model ids that change on every run; the figure above is the same
# drawing.
from helpers.lab.widgets import Explorer

load_explorer = Explorer(
    draw_load,
    top_k=widgets.IntSlider(value=2, min=1, max=8, description="top-k"),
    capacity_factor=widgets.FloatSlider(value=1.0, min=0.25, max=4.0, step=0.25,
                                        description="capacity factor"),
)
load_explorer

# %% slideshow={"slide_type": "fragment"}
first = load_explorer.reset()
roomier = load_explorer.set(capacity_factor=2.0)
assert roomier["capacity"] > first["capacity"] and roomier["dropped"] < first["dropped"]
print("redraws so far:", load_explorer.redraws)

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### 1.5 Equal to `transformers`' Qwen3-MoE
#
# `helpers.model.frontier.FrontierGPT` (section 1.3 counted its parameters) is notebook 9's
# decoder with a `MoELayer` for its MLP and QK-norm (section 4). A tiny Qwen3-MoE built from a
# config (random weights, nothing downloaded) loads into it with `from_qwen3_moe` and gives the
# same logits. Its `norm_topk_prob=True` is
# the released models' setting (section 1.1); tests/model/test_moe.py checks `False` as well.

# %% slideshow={"slide_type": "fragment"}
if HAS_TRANSFORMERS:
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    from helpers.model.frontier import config_from_qwen3_moe, from_qwen3_moe

    torch.manual_seed(0)
    qwen_config = Qwen3MoeConfig(
        vocab_size=50,
        hidden_size=32,
        intermediate_size=64,
        moe_intermediate_size=16,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        num_experts=6,
        num_experts_per_tok=2,
        max_position_embeddings=32,
        norm_topk_prob=True,
    )  # as the released Qwen3-MoE configs
    qwen = Qwen3MoeForCausalLM(qwen_config).eval()

# %% slideshow={"slide_type": "fragment"}
if HAS_TRANSFORMERS:
    with torch.no_grad():
        for p in qwen.parameters():  # their init leaves the router at 0: give every weight a value
            p.normal_(0, 0.2) if p.dim() > 1 else p.normal_(1, 0.1)
        ids = torch.randint(0, 50, (2, 12))
        ours = from_qwen3_moe(qwen.state_dict(), config_from_qwen3_moe(qwen_config)).eval()
        gap = (ours(ids) - qwen(ids).logits).abs().max().item()
    print(f"Qwen3-MoE logits vs ours: max difference < 1e-5: {gap < 1e-5}")
    assert gap < 1e-5
else:
    print("transformers is not installed: tests/model/test_moe.py runs this comparison where it is")

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### 1.6 Balancing the experts
#
# Nothing in the language-model loss asks the router to spread the tokens. Early in training a
# few experts get slightly better, so they are chosen more, so they learn more: the textbook fear
# is that the router **collapses** onto them, and the experts it stops choosing waste their
# parameters (below we measure which of the two actually happens here). Two cures:
#
# - the **Switch Transformer's auxiliary loss** `E · Σ_i f_i · P_i`, where `f_i` is the share of
#   assignments expert `i` received (not differentiable) and `P_i` the mean router probability of
#   `i` (differentiable): it is `k` for a uniform router and grows as the router concentrates;
# - **DeepSeek-V3's loss-free bias**: a per-expert number `b_i` added to the scores *only to choose*
#   the experts, nudged after each step, `b_i += γ · sign(mean load - load_i)`. No gradient, and
#   the weights of the chosen experts stay the router's own. (DeepSeek-V3 keeps a tiny
#   auxiliary loss beside it, computed within each sequence, with a coefficient of 1e-4, against
#   one sequence sending all its tokens to a few experts; `balance="bias"` here is the bias alone.)

# %% [markdown] slideshow={"slide_type": "notes"}
# Without balancing, the router collapses onto a few experts. Two cures: the Switch auxiliary
# loss, and DeepSeek-V3's bias that is nudged outside the gradient. Run the seeds cell and let the
# room read the spread of loads with and without balancing.

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### Exercise: the Switch loss
#
# Write `switch_loss(logits, experts, n_experts)`: `logits` `(T, E)`, `experts` `(T, k)` the
# chosen experts; return the scalar `E · Σ_i f_i P_i` with `f_i` = assignments to `i` / `T`. It
# must carry a gradient to the logits (through `P`).
#
# This exercise stands alone: no later cell runs on your answer (the training below uses the loss
# inside the course's `MoELayer`).
#
# <details><summary>Hint 1: the idea</summary>
#
# Two vectors of length `E`: how often each expert was chosen (counts, divided by `T`), and
# how much probability the router gave it on average. Their dot product, times `E`.
# </details>
#
# <details><summary>Hint 2: the plan</summary>(1) The router's probabilities. (2) Per expert, f: the
# share of the assignments it received, and P: the router probability it got on average. (3) The
# number of experts times the dot product of f and P.</details>

# %% slideshow={"slide_type": "fragment"}
def switch_loss(logits: torch.Tensor, experts: torch.Tensor, n_experts: int) -> torch.Tensor:
    """The Switch Transformer's auxiliary loss, a scalar tensor with a gradient to `logits`."""
    ### BEGIN SOLUTION
    probs = logits.softmax(-1)                    # (T, E), the router's probabilities
    total = 0.0
    for i in range(n_experts):
        f_i = (experts == i).sum() / len(logits)  # share of the assignments expert i got
        P_i = probs[:, i].mean()                  # its mean router probability, with a gradient
        total = total + f_i * P_i
    return n_experts * total
    ### END SOLUTION


# %% slideshow={"slide_type": "fragment"}
check("frontier_decoder.switch_loss", switch_loss)

# %% [markdown] slideshow={"slide_type": "subslide"}
# `MoELayer(balance="aux_loss")` adds this loss the way DeepSeek-V2's code does: an autograd
# function (`AddAuxLoss`) that returns the layer's output unchanged and, in backward, adds the
# loss's gradient. Any trainer that backpropagates the language-model loss then trains the
# router to balance too. `balance="bias"` applies DeepSeek-V3's rule after each training forward.
#
# Now train: a 2-layer MoE (8 experts, top-2) on the course corpus, characters as tokens, three
# ways, and record the share of layer 0's assignments each expert gets at every step. A fair
# share is `1/8`. `BALANCE_STEPS` is the knob.

# %% slideshow={"slide_type": "fragment"}
from helpers.text.chars import CharTokenizer
from helpers.text.corpus import load_corpus
from helpers.training.trainer import TrainConfig, Trainer, encode_text, learning_rate, split_stories

BALANCE_STEPS = 40  # the knob: 200 is what the benchmark below runs
BATCH_ROWS, CONTEXT, TOP_K = 12, 64, 2
# per training step: every token of the batch, 2 experts each
ASSIGNMENTS = BATCH_ROWS * CONTEXT * TOP_K
train_text, val_text = split_stories(load_corpus()[:300_000])
tokenizer = CharTokenizer(sorted(set(train_text + val_text)))
train_ids, val_ids = encode_text(tokenizer, train_text), encode_text(tokenizer, val_text)
SIZES = dict(vocab_size=len(tokenizer.chars), context_length=CONTEXT, n_layers=2, n_heads=4,
             n_kv_heads=2, d_model=64)


# %% slideshow={"slide_type": "fragment"}
def train_steps(config: FrontierConfig, steps: int, lr: float = 3e-3, seed: int = 0,
                after_step=None) -> tuple[FrontierGPT, Trainer]:
    """A FrontierGPT trained by notebook 7's Trainer, in float32; after_step(model) after each
    step."""
    torch.manual_seed(seed)
    model = FrontierGPT(config)
    trainer = Trainer(
        model,
        train_ids,
        val_ids,
        TrainConfig(
            batch_size=BATCH_ROWS,
            learning_rate=lr,
            precision="fp32",
            fast=False,
            eval_batches=8,
            seed=seed,
        ),
    )
    for step in range(steps):
        trainer.train_step(learning_rate((step + 1) / steps, lr))
        if after_step is not None:
            after_step(model)
    return model, trainer


# %% slideshow={"slide_type": "fragment"}
shares = {}
for balance in ("none", "aux_loss", "bias"):
    record = []
    train_steps(FrontierConfig(**SIZES, n_experts=8, top_k=TOP_K, expert_hidden=64, balance=balance,
                               aux_coef=0.01, bias_rate=0.01), BALANCE_STEPS,
                after_step=lambda m, r=record: r.append(m.moe_layers()[0].last_load / ASSIGNMENTS))
    shares[balance] = torch.stack(record)                       # (steps, E)
print("steps recorded per run:", {balance: len(share) for balance, share in shares.items()})

# %% slideshow={"slide_type": "fragment"}
fig, axes = plt.subplots(1, 3, figsize=(15, 4), sharey=True)
for ax, (balance, share) in zip(axes, shares.items(), strict=True):
    ax.stackplot(range(1, len(share) + 1), share.T.numpy(), labels=[f"expert {e}"
                                                                    for e in range(8)])
    ax.set(title=f"balance = {balance!r}", xlabel="training step", ylim=(0, 1))
axes[0].set_ylabel("share of layer 0's assignments")
axes[2].legend(loc="center left", bbox_to_anchor=(1, 0.5))
plt.tight_layout()
plt.show()

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### Balanced or not, measured over seeds
#
# Routing decisions are discrete, so a run's exact shares can differ between CPUs; the measured
# numbers come from `python benchmarks/bench_moe.py --part balance --steps 200 --seeds 5`, which
# ran the same three models for 200 steps with five seeds and wrote `data/bench_moe.json`. For
# each run: each expert's mean share over the first 20 steps and over the last 50, and from those
# the busiest and the least-used expert (fair: 0.125; the most possible with top-2: 0.5):

# %% slideshow={"slide_type": "fragment"}
from helpers.text.corpus import data_dir

bench = json.loads((data_dir() / "bench_moe.json").read_text())
FAIR = 1 / 8
# balance -> (seeds, 2, E): each expert's mean share over steps 1-20 and the last 50
window_shares = {}
print(f"{bench['balance_steps']} steps, seeds {bench['seeds']}, fair share {FAIR}")
for balance, runs in bench["balance"].items():
    per_step = torch.tensor(runs["shares"])                               # (seeds, steps, E)
    window_shares[balance] = torch.stack([per_step[:, :20].mean(1), per_step[:, -50:].mean(1)], 1)
    early, late = window_shares[balance].unbind(1)                        # (seeds, E) each
    print(f"{balance}:\n  busiest expert, steps 1-20 -> last 50: "
          + ", ".join(f"{a:.2f} -> {b:.2f}" for a, b in zip(early.amax(1), late.amax(1),
                                                            strict=True))
          + "\n  least-used expert over the last 50:   "
          + ", ".join(f"{s:.3f}" for s in late.amin(1))
          + "\n  val loss:                             "
          + ", ".join(f"{v:.2f}" for v in runs["val_loss"]))

# %% slideshow={"slide_type": "fragment"}
early, late = window_shares["none"].unbind(1)
falls = int((late.amax(1) < early.amax(1)).sum())
print(f"no balancing: the busiest share falls from steps 1-20 to the last 50 on {falls} of "
      f"{len(bench['seeds'])} seeds")
for balance, shares_ in window_shares.items():
    least, busiest_early = shares_[:, 1].amin(1), shares_[:, 0].amax(1)
    print(f"{balance:8s} least-used share over the last 50 steps: {least.min():.3f} to "
          f"{least.max():.3f} "
          f"(fair {FAIR}); busiest over steps 1-20: {busiest_early.min():.2f} to "
          f"{busiest_early.max():.2f}")


# %% [markdown] slideshow={"slide_type": "subslide"}
# The busiest and the least-used expert at every step (a mean over 10 steps) for every seed:

# %% slideshow={"slide_type": "fragment"}
def moving_average(values: torch.Tensor, width: int = 10) -> torch.Tensor:
    """(..., steps) -> (..., steps - width + 1): the mean of each run of `width` steps."""
    return values.unfold(-1, width, 1).mean(-1)


fig, axes = plt.subplots(1, 3, figsize=(15, 4), sharey=True)
for ax, (balance, runs) in zip(axes, bench["balance"].items(), strict=True):
    per_step = torch.tensor(runs["shares"])                               # (seeds, steps, E)
    for seed, run in enumerate(per_step):
        steps = range(10, len(run) + 1)
        ax.plot(steps, moving_average(run.amax(1)), color="tab:red", alpha=0.6,
                label="busiest expert" if seed == 0 else None)
        ax.plot(steps, moving_average(run.amin(1)), color="tab:blue", alpha=0.6,
                label="least-used expert" if seed == 0 else None)
    ax.axhline(FAIR, color="black", linestyle="--", label="fair share 1/8")
    ax.set(title=f"balance = {balance!r}, {len(per_step)} seeds", xlabel="training step", ylim=(0,
            0.55))
axes[0].set_ylabel("share of layer 0's assignments\n(mean of 10 steps)")
axes[0].legend()
plt.tight_layout()
plt.show()

# %% [markdown] slideshow={"slide_type": "subslide"}
# What the runs show is not the textbook collapse. Without balancing, the busiest expert's share
# *falls* as training goes on (from steps 1-20 to the last 50, on every seed printed above): the
# router does not end with one expert doing the work. What happens instead is **starvation**: the
# least-used expert gets between a tenth and a half of a fair share (0.013 to 0.062 printed for
# `'none'`, against 0.125), so on most seeds it barely trains and its parameters are mostly
# wasted. The Switch loss lifts the least-used expert to between half and most of a fair share;
# the bias brings every expert's 50-step mean to within a hair of it (its per-step lines in the
# figure still swing around 1/8, because the rule corrects one step's imbalance over the next
# steps). The three do not start alike: over steps 1-20 the busiest expert holds 0.34 to 0.43
# of the assignments without balancing, 0.15 to 0.19 with the Switch loss and 0.18 to 0.29 with
# the bias (printed above). The loss, which acts through the gradient from the first step, keeps
# any expert from taking much of the load; the bias, which only reacts to imbalance already
# seen, lets it happen for a while and then evens it out.

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### 1.7 Dense against MoE, at equal steps and at equal time
#
# Same benchmark file (`--part models --steps 600 --seeds 5`): models trained with the same recipe
# and the same batches, seeds 0-4. The MoE (8 experts of width 64, top-2, bias balancing) against a
# dense SwiGLU of width 128 (**equal active** parameters: what one token pays) and one of width 512
# (**equal total**: what the model stores), all for the same number of steps; and the equal-active
# dense model once more, given the MoE's *wall-clock time* instead of its steps:

# %% slideshow={"slide_type": "fragment"}
import statistics

print(f"{'model':32s} {'total':>8s} {'active':>8s} {'steps':>6s}   val loss, seeds "
      f"{bench['seeds']}   mean")
for name, runs in bench["models"].items():
    losses = runs["val_loss"]
    print(f"{name:32s} {runs['total_params'][0]:8,d} {runs['active_params'][0]:8,d} "
          f"{runs['steps'][0]:6d}   "
          f"{', '.join(f'{v:.3f}' for v in losses)}   {statistics.mean(losses):.3f}")
for balance, runs in bench["balance"].items():
    print(f"MoE balanced by {balance!r:10s} val loss mean {statistics.mean(runs['val_loss']):.3f} "
          f"after {bench['balance_steps']} steps")

# %% [markdown] slideshow={"slide_type": "subslide"}
# How many steps is "the MoE's time"? The benchmark timed a training step of each model on one
# thread, in turns (a burst of steps of each model, then the next model's, round after round, so
# that the load of whatever else runs on the machine falls on all of them alike), and kept each
# model's median. The seconds depend on the machine and its load; their ratios travel better:

# %% slideshow={"slide_type": "fragment"}
moe = "MoE 8 experts, top-2"
step_time = {name: statistics.median(times) for name,
             times in bench["speed"]["seconds_per_step"].items()}
print(f"{len(bench['speed']['seconds_per_step'][moe])} rounds, {bench['speed']['threads']} thread")
for name, seconds in step_time.items():
    print(f"{name:22s} one training step: {seconds / step_time['dense, equal active']:.2f}x "
          f"the equal-active dense model's")
print(f"so in the MoE's {bench['model_steps']} steps' time the equal-active dense model takes "
      f"{bench['models']['dense, equal active, equal time']['steps'][0]} steps")

# %% slideshow={"slide_type": "fragment"}
loss = {name: runs["val_loss"] for name, runs in bench["models"].items()}


def seeds_below(a: str, b: str) -> str:
    """How many seeds give model a a lower validation loss than model b."""
    return f"{sum(x < y for x, y in zip(loss[a], loss[b], strict=True))} of {len(loss[a])} seeds"


print("equal steps: MoE below dense, equal active on", seeds_below(moe, "dense, equal active"))
print("equal steps: MoE below dense, equal total on ", seeds_below(moe, "dense, equal total"))
print("equal time:  dense, equal active below MoE on ",
      seeds_below("dense, equal active, equal time", moe))

# %% [markdown] slideshow={"slide_type": "subslide"}
# At equal steps the MoE beats the dense model with the same active parameters on every seed, and
# mostly loses to the dense model with the same total parameters (its mean is between the two): it
# stores more than it computes, and the extra experts help per step. But a MoE step costs more
# time than the equal-active dense step on this CPU (the ratio above): the router, the sort, the
# scatter and eight small products cost more than one product of the same work. Given the MoE's
# wall clock, the equal-active dense model takes the extra steps and ends *below* the MoE on every
# seed: at equal time the MoE's advantage does not merely shrink, it reverses. Balancing did not
# buy loss in the 200-step runs either (the balance lines): it buys experts that all learn, which
# pays when the model is large and trained long. MoE wins on time when the MLP's products dominate
# the step and run as grouped GEMMs (section 1.4) on accelerators, with the experts spread over many
# devices (next section) and enough tokens per expert to keep each busy; none of that holds for a
# 2-layer model of width 64 on one CPU thread.

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### 1.8 Expert parallelism: the all-to-all
#
# DeepSeek-V3 has 256 experts per layer; no device holds them all. With expert parallelism each
# of `W` ranks holds `E / W` experts and its own tokens. A MoE layer then runs in four steps:
# route locally; **all-to-all** every assignment's token vector to the rank that holds its expert;
# run the local experts; **all-to-all** the results back and sum them per token.
# `helpers.scale.expert_parallel.expert_parallel_step` does exactly that inside two real worker
# processes (notebook 11's `Workers`), and compares with the whole layer run in one process.

# %% slideshow={"slide_type": "fragment"}
from helpers.scale.expert_parallel import expert_parallel_step
from helpers.scale.workers import Workers

with Workers(world_size=2, timeout=120.0) as workers:
    results = workers.run(expert_parallel_step)
for rank, result in enumerate(results):
    print(f"rank {rank}: sent {result['rows_sent']} rows, computed {result['rows_computed']}, "
          f"max difference from one process < 1e-6: {result['max_error'] < 1e-6}")
assert all(r["max_error"] < 1e-6 for r in results)
assert sum(r["rows_computed"] for r in results) == 2 * 16 * 2   # every assignment computed once

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 2. Multi-head latent attention (DeepSeek-V2, V3) (core)
#
# Notebook 5 counted the KV cache: every layer stores every head's key and value for every
# token. GQA and MQA shrink it by sharing heads. DeepSeek's **MLA** instead compresses: each token
# is projected to one latent `c = RMSNorm(W_DKV x)` of rank `r` (512 in DeepSeek-V3, against a
# width of 7168), and every head's key and value are rebuilt from it, `k_h = W_UK_h c`,
# `v_h = W_UV_h c`. The cache holds `c` only, plus a small **decoupled RoPE key** (64 numbers,
# shared by all heads), because a rotation depends on the position and cannot be folded into a
# fixed matrix. So each head's query and key have two parts: a rotated part of `rope_dim`
# numbers, and a part with no rotation that DeepSeek's code calls **nope** ("no position
# embedding", `qk_nope_head_dim`, 128 in V3), the part rebuilt from the latent.
#
# ### 2.1 Naive, then absorbed
#
# The naive form rebuilds every head's keys from the cache at every step: no memory saved in
# compute. The trick is in the score: `q_h · (W_UK_h c) = (W_UK_hᵀ q_h) · c`. Multiply the query
# by `W_UK_hᵀ` once, and it meets the latents directly. On the output side, `Σ_j a_j W_UV_h c_j =
# W_UV_h Σ_j a_j c_j`: sum the latents first, project once. By hand, for one head:

# %% [markdown] slideshow={"slide_type": "notes"}
# **Core.** The cache holds one small latent per token, not every head's keys and values.
# The trick on the board: q . (W_UK c) = (W_UK^T q) . c, so the key up-projection can be absorbed
# into the query. Live-code the absorb exercise (`python3 course.py blank 12 absorb_query`).
# Then the bytes-per-token table: ask the room to guess the ratio to
# plain multi-head attention before the cell prints it.

# %% slideshow={"slide_type": "fragment"}
catch_up("12_frontier_decoder", "2.")  # started here after a restart? this runs the sections above

# %% slideshow={"slide_type": "fragment"}
torch.manual_seed(0)
r, d_nope, n_keys = 6, 4, 5
q = torch.randn(d_nope)                  # one head's query (its non-rotated part)
w_uk = torch.randn(d_nope, r)            # that head's key up-projection
latents = torch.randn(n_keys, r)         # the cache: one latent per earlier token
naive_scores = (latents @ w_uk.T) @ q    # rebuild every key, then dot with q
absorbed_scores = latents @ (w_uk.T @ q) # absorb W_UK into the query, dot with the latents
print(f"naive vs absorbed scores: max difference < 1e-5: "
      f"{(naive_scores - absorbed_scores).abs().max() < 1e-5}")
assert torch.allclose(naive_scores, absorbed_scores, atol=1e-5)

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### Exercise: absorb the key up-projection
#
# For all heads at once: `q_nope` `(B, H, N, d_nope)` and `w_uk` `(H, d_nope, r)`; write
# `absorb_query(q_nope, w_uk)` returning the queries in the latent space, `(B, H, N, r)`. The
# check also scores them against cached latents and compares with the scores against the keys
# built in full.
#
# This exercise stands alone: no later cell runs on your answer (the cells below use the course's
# `LatentAttention`).
#
# <details><summary>Hint 1: the idea</summary>
#
# Head `h`'s query is multiplied by head `h`'s matrix: the head index is shared, `d_nope` is summed.
# </details>
#
# <details><summary>Hint 2: the plan</summary>Each head's query is multiplied by that head's own
# matrix, summing over the features the two share; the batch, head and position axes stay as they
# are.</details>
#
# <details><summary>Hint 3: closer</summary>Name the axes in an Einstein sum, or use a matrix
# product and let broadcasting pair the head axis of the weights with the head axis of the
# queries.</details>

# %% slideshow={"slide_type": "fragment"}
def absorb_query(q_nope: torch.Tensor, w_uk: torch.Tensor) -> torch.Tensor:
    """q_nope (B, H, N, d_nope), w_uk (H, d_nope, r) -> W_UK_h^T q for every head, (B, H, N, r)."""
    ### BEGIN SOLUTION
    return torch.einsum("bhnd,hdr->bhnr", q_nope, w_uk)
    ### END SOLUTION


# %% slideshow={"slide_type": "fragment"}
check("frontier_decoder.absorb_query", absorb_query)

# %% [markdown] slideshow={"slide_type": "subslide"}
# `helpers.model.mla.LatentAttention` holds the whole layer with DeepSeek's names: `forward` is
# the naive form, `forward_absorbed` the absorbed one, which also grows the latent cache token by
# token. Its sizes: `kv_rank` the latent's rank `r`, `rope_dim` and `nope_dim` the two parts of a
# head's query and key, `v_dim` a head's value, and `q_rank` the rank of a second latent that
# DeepSeek passes the *query* through (`q_lora_rank`, 1536 in V3): it saves parameters and
# activation memory in training and is never cached (`q_rank=0` projects the query directly).
# Both forms agree, and the token-by-token cache agrees with a full pass:

# %% slideshow={"slide_type": "fragment"}
from helpers.model.mla import DEEPSEEK_V3, LatentAttention, cache_values_per_token
from helpers.model.modern import RopeTable

torch.manual_seed(0)
mla = LatentAttention(d_model=64, n_heads=4, kv_rank=16, rope_dim=8, nope_dim=16, v_dim=16,
                      q_rank=32)
table = RopeTable.build(8, 32)
x_mla = torch.randn(2, 10, 64)
with torch.no_grad():
    naive = mla(x_mla, table)
    absorbed, (c_cache, k_rope_cache) = mla.forward_absorbed(x_mla, table)
    cache, steps = None, []
    for t in range(10):
        out, cache = mla.forward_absorbed(x_mla[:, t:t + 1], table, cache)
        steps.append(out)
print(f"naive vs absorbed: max difference < 1e-5: {(naive - absorbed).abs().max() < 1e-5}")
print(f"token by token with the latent cache vs full pass < 1e-5: "
      f"{(torch.cat(steps, 1) - naive).abs().max() < 1e-5}")
print("cached per token:", c_cache.shape[-1], "latent +", k_rope_cache.shape[-1], "RoPE key =",
      c_cache.shape[-1] + k_rope_cache.shape[-1], "numbers; MHA with these heads would cache",
      2 * 4 * 16)
assert torch.allclose(naive, absorbed, atol=1e-5) and torch.allclose(torch.cat(steps, 1), naive,
                                                                     atol=1e-5)

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### 2.2 Cache bytes per token at DeepSeek-V3's sizes
#
# DeepSeek-V3's config: 61 layers, 128 heads of 128, `kv_lora_rank` 512, `qk_rope_head_dim` 64.
# DeepSeek-V2's paper (table 1) compares, per token and layer: MHA `2 n_h d_h`, GQA `2 n_g d_h`,
# MQA `2 d_h`, MLA `d_c + d_R`, which it writes as `9/2 d_h`. In bf16 (2 bytes), over all layers:

# %% slideshow={"slide_type": "fragment"}
print(f"{'attention':22s} {'numbers/token':>14s} {'bytes/token':>12s} {'GiB at 128k tokens':>19s}")
for kind, label in (("mha", "MHA, 128 heads"), ("gqa", "GQA, 8 groups"), ("mqa", "MQA"),
                    ("mla", "MLA, r=512 + 64")):
    values = cache_values_per_token(kind, DEEPSEEK_V3)
    print(f"{label:22s} {values:14,d} {2 * values:12,d} {2 * values * 131072 / 2**30:19.1f}")
ratio = cache_values_per_token("mha", DEEPSEEK_V3) / cache_values_per_token("mla", DEEPSEEK_V3)
gqa_ratio = cache_values_per_token("gqa", DEEPSEEK_V3) / cache_values_per_token("mla", DEEPSEEK_V3)
print(f"MLA caches {ratio:.1f}x less than MHA, and {gqa_ratio:.2f}x less than GQA with 8 groups")

# %% [markdown] slideshow={"slide_type": "subslide"}
# MLA caches less than GQA with 8 groups and a bit more than twice MQA's 256 numbers per layer,
# while every head still gets its own key and value. The price: the up-projections' products at every step,
# which the absorbed form turns into products in the latent space.
#
# ### 2.3 Equal to `transformers`' DeepSeek-V3
#
# `helpers.model.deepseek.DeepSeekGPT` puts `LatentAttention` and a sigmoid-routed `MoELayer`
# with a shared expert together. Its routed experts' weighted sum is multiplied by a constant,
# `routed_scaling_factor` (2.5 in V3): the renormalised sigmoid weights sum to 1, and the factor
# sets how loud the routed experts are beside the shared one; its first layer is dense, as
# DeepSeek-V3's first three are. Its router also limits each token to a few **groups** of
# experts (V3: 8 groups, one per node of GPUs, of which a token reaches 4), so that a hidden state
# travels to at most 4 nodes; a group's score is the sum of its two best experts'. A tiny
# `DeepseekV3ForCausalLM` with 3 groups of 2 experts, 2 reached, loads into it, naive and absorbed:

# %% slideshow={"slide_type": "fragment"}
if HAS_TRANSFORMERS:
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    from helpers.model.deepseek import config_from_deepseek_v3, from_deepseek_v3

    torch.manual_seed(0)
    ds_config = DeepseekV3Config(
        vocab_size=50, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, n_routed_experts=6,
        n_shared_experts=1, num_experts_per_tok=2, n_group=3, topk_group=2, first_k_dense_replace=1,
        kv_lora_rank=12, q_lora_rank=24, qk_rope_head_dim=4, qk_nope_head_dim=8, v_head_dim=8,
        max_position_embeddings=32)
    deepseek = DeepseekV3ForCausalLM(ds_config).eval()
    with torch.no_grad():
        for p in deepseek.parameters():
            p.normal_(0, 0.2) if p.dim() > 1 else p.normal_(1, 0.1)
        ids = torch.randint(0, 50, (2, 12))
        ours = from_deepseek_v3(deepseek.state_dict(), config_from_deepseek_v3(ds_config)).eval()
        reference = deepseek(ids).logits
        gaps = [(ours(ids, absorbed=a) - reference).abs().max().item() for a in (False, True)]
    print(f"DeepSeek-V3 logits vs ours, naive < 1e-5: {gaps[0] < 1e-5}, absorbed < 1e-5: "
          f"{gaps[1] < 1e-5}")
    assert max(gaps) < 1e-5
else:
    print("transformers is not installed: tests/model/test_mla.py runs this comparison where it is")

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 3. Sliding windows and a ring-buffer cache (core)
#
# A **sliding-window** layer lets each query see only the last `W` keys (its own included):
# notebook 4's local mask, as a band. Its cache then never needs more than `W` tokens. Write them
# in a **ring buffer** of `W` slots: token `t` goes to slot `t mod W`, overwriting token `t - W`,
# which no later query can see anyway.

# %% [markdown] slideshow={"slide_type": "notes"}
# **Core.** Each local layer sees only the last W tokens, so its cache is a ring buffer of W slots
# that overwrites the oldest. The read-order exercise is short enough to do together on the board
# first. Gemma 3 mixes five local layers with one global: the global layer keeps long-range reading
# possible while most layers stay cheap.

# %% slideshow={"slide_type": "fragment"}
catch_up("12_frontier_decoder", "3.")  # started here after a restart? this runs the sections above

# %% slideshow={"slide_type": "fragment"}
from helpers.model.sliding import (
    RingKVCache,
    banded_mask,
    layer_kinds,
    pattern_cache_bytes,
    ring_slot,
)

print(banded_mask(6, 3).int())
print("slots of tokens 0..9 in a ring of 4:", [ring_slot(t, 4) for t in range(10)])

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### Exercise: the ring buffer's read order
#
# After `length` tokens have been written into a ring of `window` slots, which slots hold the
# visible tokens, oldest first? Write `ring_order(length, window)` returning that list of slots
# (`RingKVCache.append` reads them in this order).
#
# This exercise stands alone: no later cell runs on your answer (the next exercise writes the
# whole ring-buffer decoding loop).
#
# <details><summary>Hint 1: the idea</summary>
#
# The visible tokens are the last ones, never more than the window; each lives at its position
# modulo the window.
# </details>
#
# <details><summary>Hint 2: the plan</summary>
#
# Take the smaller of the length and the window: that many tokens are visible. Go through their
# positions, from the oldest visible one up to the newest (the one at length minus one), and list
# each position's slot.
# </details>

# %% slideshow={"slide_type": "fragment"}
def ring_order(length: int, window: int) -> list[int]:
    """The slots of the last min(length, window) tokens, oldest first."""
    ### BEGIN SOLUTION
    n = min(length, window)
    return [t % window for t in range(length - n, length)]
    ### END SOLUTION


# %% slideshow={"slide_type": "fragment"}
check("frontier_decoder.ring_order", ring_order)

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### Exercise: decode through a sliding-window cache
#
# Now the whole decoding loop of one sliding-window layer: write `sliding_decode(q, k, v,
# window)`, with `q`, `k`, `v` `(B, H, T, D_H)` the queries, keys and values of `T` tokens
# arriving one by one. Keep the keys and values in two ring buffers of `window` slots each,
# `(B, H, window, D_H)`; at step `t` write token `t` into its slot, then let query `t` attend
# (scaled dot product and softmax, notebook 3) to the slots written so far. Return the `T`
# outputs, `(B, H, T, D_H)`. The check compares with banded attention (each query sees the last
# `window` tokens, itself included) for windows shorter than, equal to and longer than the
# sequence; the cell after it decodes with your function once it passes.
#
# <details><summary>Hint 1: the idea</summary>
#
# The ring holds exactly the tokens the query may see, so attention over its filled slots is
# the banded attention. The slots are not in time order once the ring has wrapped, and that is
# fine: attention sums over its keys, whatever their order.
# </details>
#
# <details><summary>Hint 2: the plan</summary>(1) Two ring buffers of window slots, for the keys and
# the values. (2) For each step: its key and value into its slot, over the one that left the window.
# (3) Its query attends to the slots written so far, in whatever order they sit. (4) The steps'
# outputs joined along the token axis.</details>
#
# <details><summary>Hint 3: closer</summary>Token t's slot is t modulo the window; t + 1 slots are
# written, at most the window. The scores are scaled by the square root of the head size.</details>

# %% slideshow={"slide_type": "fragment"}
def sliding_decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int) -> torch.Tensor:
    """q, k, v (B, H, T, D_H) -> (B, H, T, D_H): query t attends to the last `window` tokens."""
    ### BEGIN SOLUTION
    batch, heads, steps, head_dim = q.shape
    keys = q.new_zeros(batch, heads, window, head_dim)         # the ring: window slots
    values = torch.zeros_like(keys)
    outs = []
    for t in range(steps):
        slot = t % window                                       # overwrites token t - window
        keys[:, :, slot] = k[:, :, t]
        values[:, :, slot] = v[:, :, t]
        filled = min(t + 1, window)                             # slots written so far
        scores = q[:, :, t:t + 1] @ keys[:, :, :filled].transpose(-2, -1) / head_dim ** 0.5
        outs.append(torch.softmax(scores, dim=-1) @ values[:, :, :filled])
    return torch.cat(outs, dim=2)
    ### END SOLUTION


# %% slideshow={"slide_type": "fragment"}
check("frontier_decoder.sliding_decode", sliding_decode)

# %% [markdown] slideshow={"slide_type": "subslide"}
# Decoding token by token through a ring buffer (your `sliding_decode` once it passes, else the
# helpers' `RingKVCache`) gives the same outputs as full attention with the banded mask, while
# the cache stays at `W` slots:

# %% slideshow={"slide_type": "fragment"}
from helpers.lab.exercises.frontier_decoder import helper_sliding_decode

decode = yours_or("frontier_decoder.sliding_decode", sliding_decode, helper_sliding_decode)
torch.manual_seed(0)
WINDOW, STEPS = 4, 12
q, k, v = (torch.randn(1, 2, STEPS, 8) for _ in range(3))
scores = (q @ k.transpose(-2, -1) / 8 ** 0.5).masked_fill(~banded_mask(STEPS, WINDOW),
                                                          float("-inf"))
banded = torch.softmax(scores, -1) @ v
decoded = decode(q, k, v, WINDOW)
print(f"ring buffer vs banded mask: max difference < 1e-6: {(decoded - banded).abs().max() < 1e-6}")
assert torch.allclose(decoded, banded, atol=1e-6)
ring = RingKVCache(1, 2, WINDOW, 8)
for t in range(STEPS):
    ring.append(k[:, :, t:t + 1], v[:, :, t:t + 1])
print(f"RingKVCache after {STEPS} tokens: {ring.keys.shape[2]} slots, {ring.nbytes} bytes")

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### 3.1 Gemma 3: five local layers for one global
#
# A model of sliding layers only cannot see past `W · L` tokens. Gemma 3 interleaves: five local
# layers (window 1024), then one global layer that sees everything. Gemma 3 4B has 34 layers,
# 4 key/value heads of 256. Its cache at 128k tokens, against all-global layers:

# %% slideshow={"slide_type": "fragment"}
GEMMA3_4B = dict(n_layers=34, n_kv_heads=4, head_dim=256, window=1024)
kinds = layer_kinds(GEMMA3_4B["n_layers"], local_per_global=5)
print("layers:", "".join("G" if kind == "global" else "l" for kind in kinds),
      f"({kinds.count('global')} global)")
for n_tokens in (4096, 32768, 131072):
    mixed = pattern_cache_bytes(kinds, n_tokens, GEMMA3_4B["window"], 4, 256)
    full = pattern_cache_bytes(["global"] * 34, n_tokens, GEMMA3_4B["window"], 4, 256)
    print(f"{n_tokens:7,d} tokens: all global {full / 2**30:5.2f} GiB, 5:1 pattern "
          f"{mixed / 2**30:5.2f} GiB ({full / mixed:.1f}x less)")

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### See it move: window and pattern against the cache
#
# Cache size of one 128k-token sequence for Gemma 3 4B's sizes as the window and the number of
# local layers per global change. A window of 0 is refused (a query must see itself).

# %% slideshow={"slide_type": "fragment"}
def draw_cache(window: int = 1024, local_per_global: int = 5) -> dict:
    lengths = torch.linspace(1024, 131072, 64).int().tolist()
    kinds = layer_kinds(34, local_per_global)
    mixed = [pattern_cache_bytes(kinds, n, window, 4, 256) / 2**30 for n in lengths]
    full = [pattern_cache_bytes(["global"] * 34, n, window, 4, 256) / 2**30 for n in lengths]
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.plot(lengths, full, label="all 34 layers global")
    ax.plot(lengths, mixed, label=f"{local_per_global} local (window {window}) per global")
    ax.set(xlabel="tokens in the sequence", ylabel="KV cache (GiB, bf16)",
           title=f"Gemma 3 4B's sizes: {mixed[-1]:.2f} GiB at 128k tokens")
    ax.legend()
    return {"at_128k": mixed[-1]}


draw_cache()
plt.show()

# %% slideshow={"slide_type": "fragment"}
# NBVAL_IGNORE_OUTPUT
# The widget's output holds model ids that change on every run; the figure above is the same
# drawing.
cache_explorer = Explorer(
    draw_cache,
    window=widgets.IntSlider(value=1024, min=128, max=8192, step=128, description="window"),
    local_per_global=widgets.IntSlider(value=5, min=0, max=11, description="local per global"),
)
cache_explorer

# %% slideshow={"slide_type": "fragment"}
before = cache_explorer.reset()
after = cache_explorer.set(window=4096)
assert after["at_128k"] > before["at_128k"]
print("redraws so far:", cache_explorer.redraws)
try:
    banded_mask(8, 0)
except ValueError as error:
    print("window 0:", error)

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 4. QK-norm and RoPE scaling (optional)
#
# ### 4.1 QK-norm
#
# Nothing bounds a score `q · k / sqrt(D_H)`: as the weights grow during training, the logits
# grow, the softmax saturates (notebook 3) and training can diverge. Gemma 2 capped the logits
# with `c · tanh(s / c)`; Qwen3 and Gemma 3 instead apply an RMSNorm to every query and key head
# before RoPE (**QK-norm**), which bounds `|q · k| / sqrt(D_H)` by the norms' learned gains. (OLMo 2
# normalises the whole query projection and the whole key projection, all heads together, before
# splitting them into heads; the helper here is the per-head form.)
# Two dense models, same seed and a high learning rate, with and without it; we record each
# step's largest attention logit:

# %% [markdown] slideshow={"slide_type": "notes"}
# Optional. QK-norm keeps attention logits from growing (the saturation of notebook 3 again);
# RoPE scaling stretches positions so a model trained short can read longer. If time is short,
# show only the train-at-64, read-at-512 plot.

# %% slideshow={"slide_type": "fragment"}
catch_up("12_frontier_decoder", "4.")  # started here after a restart? this runs the sections above

# %% slideshow={"slide_type": "fragment"}
QK_STEPS = 60  # the knob
logit_growth = {}
for qk_norm in (False, True):
    record = []
    train_steps(FrontierConfig(**SIZES, mlp_hidden=128, qk_norm=qk_norm), QK_STEPS, lr=2e-2,
                after_step=lambda m, r=record: r.append(max(b.attn.last_max_logit
                                                            for b in m.blocks)))
    logit_growth[qk_norm] = record
    print(f"qk_norm={qk_norm!s:5s} largest |logit| at step 1 below 5: {record[0] < 5}, "
          f"at the last step {'above' if record[-1] > 10 else 'below'} 10")

# %% slideshow={"slide_type": "fragment"}
fig, ax = plt.subplots(figsize=(8, 4))
for qk_norm, record in logit_growth.items():
    ax.plot(range(1, len(record) + 1), record, label=f"QK-norm {'on' if qk_norm else 'off'}")
ax.set(xlabel="training step", ylabel="largest |q·k| / sqrt(D_H)", yscale="log",
       title="Attention logits during training (learning rate 2e-2)")
ax.legend()
plt.show()

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### 4.2 RoPE scaling: train at 64, read at 512
#
# Notebook 9 found RoPE breaks past its training length: the slow pairs reach angles they never
# saw. **Llama 3.1** divides the frequencies of the slow pairs by a factor (fast pairs unchanged, a
# blend between); **YaRN** does the same with a ramp and also multiplies every query and every
# key by an *attention factor* `0.1 ln(factor) + 1`, so the logits `q · k` grow by its square.
# Both are normally followed by a short finetune at the longer length; here we only swap the
# table of a model trained at 64 tokens (factor 8, so 512 = 8 × 64) and measure the loss of the
# last 64 positions at each length. `helpers.model.sliding` holds both (`llama3_inv_freq`,
# `yarn_inv_freq`, equal to `transformers`' in tests/model/test_sliding.py); `rope_table` folds YaRN's
# factor into the cos and sin it rotates q and k with, so each carries it once:

# %% slideshow={"slide_type": "fragment"}
import dataclasses
import math

from helpers.model.frontier import rope_table

yarn_config = FrontierConfig(**SIZES, mlp_hidden=128, rope_scaling="yarn", rope_factor=8.0,
                             original_context=64)
yarn_table = rope_table(yarn_config, 4)
per_vector = 0.1 * math.log(8.0) + 1
logit_scale = (yarn_table.cos ** 2 + yarn_table.sin ** 2)[0,
        0].item()  # q and k each rotated by the table
print(f"YaRN at factor 8: q and k each x {per_vector:.3f}, so the logits x {logit_scale:.3f}")
assert abs(logit_scale - per_vector ** 2) < 1e-5

# %% slideshow={"slide_type": "fragment"}
ROPE_STEPS = 400  # the knob: much fewer steps blur the comparison at 512 tokens
base_config = FrontierConfig(**SIZES, mlp_hidden=128, qk_norm=True)
rope_model, _ = train_steps(base_config, ROPE_STEPS)
rope_model.eval()
generator = torch.Generator().manual_seed(123)
starts = torch.randint(0, len(val_ids) - 513, (16,), generator=generator)
rope_losses = {}
for scaling in (None, "llama3", "yarn"):
    config = dataclasses.replace(base_config, rope_scaling=scaling, rope_factor=8.0,
                                 original_context=64)
    scaled = FrontierGPT(config)
    scaled.load_state_dict(rope_model.state_dict())
    scaled.eval()
    for length in (64, 128, 256, 512):
        xs = torch.stack([val_ids[s:s + length] for s in starts])
        ys = torch.stack([val_ids[s + 1:s + length + 1] for s in starts])
        with torch.no_grad():
            logits = scaled(xs)[:, -64:]
        rope_losses[(scaling, length)] = F.cross_entropy(logits.flatten(0, 1), ys[:,
                -64:].flatten()).item()

# %% slideshow={"slide_type": "fragment"}
print(f"{'RoPE':8s}" + "".join(f"{n:>8d}" for n in (64, 128, 256, 512)))
for scaling in (None, "llama3", "yarn"):
    print(f"{scaling or 'plain':8s}" + "".join(f"{rope_losses[(scaling, n)]:8.1f}" for n in (64,
            128, 256, 512)))
moved = {s: rope_losses[(s, 512)] - rope_losses[(s, 64)] for s in (None, "llama3", "yarn")}
print("loss rise from 64 to 512 tokens, plain RoPE larger than with Llama 3 scaling:",
      moved[None] > moved["llama3"])
print("lowest loss at 512 tokens:", min((None, "llama3", "yarn"), key=lambda s: rope_losses[(s,
                                                                                             512)]))

# %% [markdown] slideshow={"slide_type": "subslide"}
# Without scaling, the loss climbs as the window grows past the 64 tokens the model was trained
# at. Swapping the table without any finetuning flattens that climb (the slow pairs stay inside
# the angles they saw; YaRN ends lowest at 512 in this one-seed run), but it also changes the
# angles the model learned at 64, so the short-context loss rises: this is why Llama 3.1 and YaRN
# finetune briefly after the swap, which this small run does not.

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### 4.3 Equal to `transformers`' Gemma 3
#
# Gemma 3 puts these pieces together with a few changes of its own: the embedding is scaled
# by `sqrt(D)` and tied to the output layer; each RMSNorm stores its gain as an offset from 1;
# each block has a norm after attention and after the MLP as well as before; the MLP is GeGLU
# (GELU where SwiGLU has SiLU); the scores are divided by `sqrt(query_pre_attn_scalar)`; local
# layers use a RoPE base of 10,000 and global layers 1,000,000 (with "linear" scaling, positions
# divided by 8, in Gemma 3 4B). `helpers.model.gemma` writes each of these as one line; a tiny
# Gemma 3 with a window of 4 (shorter than the 12 tokens, so the band matters) and 5 local
# layers per global one gives the same logits.

# %% slideshow={"slide_type": "fragment"}
if HAS_TRANSFORMERS:
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    from helpers.model.gemma import config_from_gemma3, from_gemma3

    torch.manual_seed(0)
    gemma_config = Gemma3TextConfig(
        vocab_size=50,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=6,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        query_pre_attn_scalar=8,
        sliding_window=4,
        max_position_embeddings=32,
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
        },
    )
    gemma = Gemma3ForCausalLM(gemma_config).eval()

# %% slideshow={"slide_type": "fragment"}
if HAS_TRANSFORMERS:
    with torch.no_grad():
        for p in gemma.parameters():  # their norms' offsets start at 0: move every weight
            p.normal_(0, 0.2)
        ids = torch.randint(0, 50, (2, 12))
        ours = from_gemma3(gemma.state_dict(), config_from_gemma3(gemma_config)).eval()
        gap = (ours(ids) - gemma(ids).logits).abs().max().item()
    print("layers:", "".join("G" if k == "global" else "l" for k in ours.config.kinds))
    print(f"Gemma 3 logits vs ours: max difference < 1e-5: {gap < 1e-5}")
    assert gap < 1e-5
else:
    print("transformers is not installed: tests/model/test_gemma.py runs this comparison where it "
          "is")

# %% [markdown] slideshow={"slide_type": "slide"}
# ## Check your understanding (optional)
#
# **1. Mixtral and Qwen2-MoE route the same logits to the same experts. Do they give them the same
# weights? And Qwen3-MoE?**
#
# <details><summary>Answer</summary>
#
# Not Qwen2-MoE. Mixtral takes a softmax over the `k` chosen logits, so its weights sum to 1;
# Qwen2-MoE (`norm_topk_prob=False`, like Qwen1.5-MoE and DeepSeek-V2) keeps the softmax over all
# `E` experts, so they sum to less (section 1.1 printed 1.0 against 0.8337 for the same token).
# The chosen experts are the same because the softmax keeps the order of the logits. Qwen3-MoE's
# released models set `norm_topk_prob=True`: they divide the kept weights by their sum, which
# gives Mixtral's weights exactly.
# </details>
#
# **2. What goes wrong without balancing, and how do the two cures differ?**
#
# <details><summary>Answer</summary>
#
# The experts chosen early get the gradient, improve, and are chosen more: a rich-get-richer loop.
# In section 1.6's runs it does not end in one expert doing everything (the busiest share falls
# after the first steps); it ends in starvation, the least-used expert receiving a tenth to a half of a fair
# share and so barely training. The Switch loss adds a gradient that pushes probability away from
# busy experts, which also disturbs the language model's own gradient; DeepSeek-V3's bias only
# shifts which experts are chosen, with no gradient, and leaves the weights of the chosen ones
# untouched (V3 adds only a tiny per-sequence auxiliary loss beside it).
# </details>

# %% [markdown] slideshow={"slide_type": "notes"}
# Return to the opening question: which cost does each idea cut? MoE cuts compute per parameter,
# latent attention and sliding windows cut the cache. Pick two questions for a closing poll.

# %% [markdown] slideshow={"slide_type": "subslide"}
# **3. A MoE with 8 experts, top-2, has about the active parameters of a dense model of width
# 128 and the total of one of width 512. Which does it beat, on this CPU?**
#
# <details><summary>Answer</summary>
#
# At equal steps it beats the equal-active dense model on every seed and mostly loses to the
# equal-total one (section 1.7). At equal *time* the equal-active dense model beats it: a MoE step
# is slower than the equal-active dense step on a CPU (routing, sorting and many small products
# cost more than one large product), and the dense model given the MoE's wall clock takes enough
# extra steps to end below it on every seed. MoE pays at scale, on accelerators with grouped GEMMs and many devices.
# </details>

# %% [markdown] slideshow={"slide_type": "subslide"}
# **4. Why does DeepSeek cache a latent instead of keys and values, and why is there a separate RoPE key?**
#
# <details><summary>Answer</summary>
#
# Every head's key and value are linear functions of the latent, so the cache only needs the
# latent (512 numbers per layer in DeepSeek-V3, against 32,768 for 128 heads of keys and values),
# and the up-projections can be absorbed into the query and the output. A rotation depends on
# the position, so it cannot be absorbed into a fixed matrix: a small key of 64 numbers carries
# RoPE separately, shared by all heads. Section 2.2 printed the ratio to MHA.
# </details>

# %% [markdown] slideshow={"slide_type": "subslide"}
# **5. What does a ring buffer of `W` slots store after `t > W` tokens, and why is that enough?**
#
# <details><summary>Answer</summary>
#
# The last `W` tokens, token `s` in slot `s mod W`. A sliding-window layer's query at `t` sees keys
# `t - W + 1 ... t` only, so older tokens can be overwritten; section 3 proved decoding through
# the ring equal to the banded mask.
# </details>
#
# **6. What parallelises in a MoE layer, and what has to travel?** (the USF notes' question on what
# parallelises, for the newest layer)
#
# <details><summary>Answer</summary>
#
# The experts are independent: each rank can hold some of them (expert parallelism). The tokens
# then travel twice per layer, in an all-to-all to their experts' ranks and back; section 1.8
# proved the two-process result equal to one process.
# </details>
