# %% [markdown] slideshow={"slide_type": "slide"}
# # 14. Serving the model: an inference engine, with proofs
#
# Training made a model; serving answers many people at once with it. This is the third stage of
# the DS 246 notes' lifecycle (pretraining, post-training, inference and serving), and it is where
# today's engines (vLLM, SGLang, llama.cpp) live. This notebook builds the pieces of such an
# engine on the course's GPT, and proves that every speed trick leaves the answer unchanged, or
# says exactly how much it changes it.
#
# **After this notebook you can**
# - write temperature, top-k, top-p and min-p as transformations of the next-token distribution,
#   and check them against `transformers`' logits processors;
# - generate for prompts of different lengths in one batch (left padding, attention mask,
#   position ids) with the same tokens as one prompt at a time;
# - store the KV cache in pages (blocks, block tables, a free pool) and measure the memory that
#   contiguous preallocation wastes; share a common prompt's blocks with copy on write;
# - schedule requests with continuous batching and measure its throughput and latency against
#   static batching;
# - speed generation up with speculative decoding, and prove that its output distribution is the
#   target model's, exactly;
# - quantize weights to int8 per channel and int4 per group, and measure the error and the memory.
#
# **It assumes** notebook 7 (the GPT, `generate`, the KV cache) and notebook 9 (GQA's smaller cache).

# %% [setup]

# %% slideshow={"slide_type": "fragment"}
import math
import time

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F

from helpers.lab.exercises import check, yours_or
from helpers.timing import format_duration
from helpers.lab.sections import catch_up

torch.set_num_threads(1)  # every tensor here is small: one thread beats coordinating several

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 1. Sampling, exactly (core)
#
# A model gives logits; a *sampling rule* turns them into the distribution the next token is drawn
# from. Each rule below is a function from a distribution to a distribution, so we can print the
# exact probabilities on a small vocabulary of six made-up words.
#
# - **temperature** `T`: softmax(logits / T). Below 1 the distribution sharpens, above 1 it flattens.
# - **top-k**: keep the `k` most likely tokens, renormalise.
# - **top-p** (nucleus, Holtzman et al. 2020): keep the smallest set of most likely tokens whose
#   probability reaches `p`. Its size adapts: one token when the model is sure, many when it is not.
# - **min-p**: keep the tokens at least `min_p` times as likely as the most likely one.

# %% slideshow={"slide_type": "fragment"}
words = ["the", "cat", "dog", "sat", "ran", "slept"]
logits = torch.tensor([2.0, 1.5, 1.0, 0.2, -0.5, -1.0])


def by_temperature(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    return torch.softmax(logits / temperature, dim=-1)


def by_top_k(logits: torch.Tensor, k: int) -> torch.Tensor:
    kth = logits.topk(k).values[-1]
    return torch.softmax(logits.masked_fill(logits < kth, -math.inf), dim=-1)


# %% slideshow={"slide_type": "fragment"}
def by_min_p(logits: torch.Tensor, min_p: float) -> torch.Tensor:
    probs = torch.softmax(logits, dim=-1)
    return torch.softmax(logits.masked_fill(probs < min_p * probs.max(), -math.inf), dim=-1)


# %% [markdown] slideshow={"slide_type": "subslide"}
# ### Exercise: top-p
#
# The fourth rule is yours. Write `my_top_p(logits, p)` for one row of logits (V,): return the
# logits with every token outside the nucleus set to `-inf`, the others unchanged. The nucleus is
# the smallest set of most likely tokens whose probability reaches `p`; the next cell turns your
# rule into a distribution and prints all the rules side by side.
#
# <details><summary>Hint 1: the idea</summary>Rank the tokens from most to least likely. A token
# belongs to the nucleus when the tokens ranked above it hold less than p of the probability: that
# way the token that crosses p is kept, and the most likely token always is.</details>
#
# <details><summary>Hint 2: the plan</summary>(1) The probabilities, ranked from most to least
# likely. (2) For each ranked token, the mass ranked above it; the token stays when that is below p.
# (3) The verdicts back in the tokens' own order, and every other logit sent to minus
# infinity.</details>
#
# <details><summary>Hint 3: closer</summary>The mass above a token is the running sum up to it minus
# its own probability. The order the ranking returns says where each verdict goes back.</details>

# %% slideshow={"slide_type": "fragment"}
def my_top_p(logits: torch.Tensor, p: float) -> torch.Tensor:
    """logits (V,) -> (V,): -inf outside the smallest most-likely set whose mass reaches p."""
    ### BEGIN SOLUTION
    ranked, order = logits.softmax(-1).sort(descending=True)
    mass_above = ranked.cumsum(0) - ranked            # what the more likely tokens hold
    in_nucleus = torch.empty_like(mass_above, dtype=torch.bool)
    in_nucleus[order] = mass_above < p                # back in the tokens' own order
    return logits.where(in_nucleus, float("-inf"))
    ### END SOLUTION


# %% slideshow={"slide_type": "fragment"}
check("serving.top_p", my_top_p)

# %% slideshow={"slide_type": "fragment"}
from helpers.lab.exercises.serving import helper_top_p

top_p_rule = yours_or("serving.top_p", my_top_p, helper_top_p)
rules = {
    "softmax": torch.softmax(logits, -1),
    "T = 0.5": by_temperature(logits, 0.5),
    "T = 2": by_temperature(logits, 2.0),
    "top-k 2": by_top_k(logits, 2),
    "top-p 0.8": torch.softmax(top_p_rule(logits, 0.8), -1),
    "min-p 0.1": by_min_p(logits, 0.1),
}
print(f"{'':>10}" + "".join(f"{w:>7}" for w in words))
for name, probs in rules.items():
    print(f"{name:>10}" + "".join(f"{x:7.3f}" for x in probs.tolist()))

# %% [markdown] slideshow={"slide_type": "subslide"}
# Read the top-p row: the softmax gives 0.440, 0.267 and 0.162 to the three most likely words.
# The first two hold 0.707, less than 0.8, so the third is still needed; with it the mass is
# 0.869 and the nucleus stops. min-p 0.1 keeps every word at least 0.1 x 0.440 = 0.044 likely:
# four of them. Each rule renormalises what it keeps. The same rules live in
# `helpers.serve.sampling`, in float64 and for a batch of rows; they agree (the numbers quoted
# here are printed below):

# %% slideshow={"slide_type": "fragment"}
from helpers.serve import sampling

ours = {"T = 0.5": sampling.distribution(logits, temperature=0.5),
        "top-k 2": sampling.distribution(logits, top_k=2),
        "top-p 0.8": sampling.distribution(logits, top_p=0.8),
        "min-p 0.1": sampling.distribution(logits, min_p=0.1)}
worst = max((ours[name][0].float() - rules[name]).abs().max().item() for name in ours)
assert worst < 1e-6
print("helper vs the plain rules above: largest difference < 1e-6 (all four rules)")
probs = torch.softmax(logits, -1)
print(f"top two hold {probs[:2].sum():.3f}, top three {probs[:3].sum():.3f}; "
      f"min-p threshold 0.1 x {probs.max():.3f} = {0.1 * probs.max():.3f}")

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### The same as `transformers`
#
# Hugging Face's `generate` applies its logits processors in the order temperature, top-k,
# top-p, min-p. On random logits of a 50-token vocabulary, ours keep the same tokens with the
# same probabilities (`tests/serve/test_sampling.py` checks more seeds and combinations). Random logits
# never tie; when several tokens tie at the edge of top-p's nucleus, both keep as many of them
# with the same probabilities, but not always the same ones (ours the lowest ids). The cell is
# guarded: without `transformers` it says so and moves on.

# %% slideshow={"slide_type": "fragment"}
try:
    from transformers import (
        MinPLogitsWarper,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )
except ImportError:
    print("transformers is not installed: skipped (pip install transformers to run this check)")
else:
    scores = torch.randn(8, 50, generator=torch.Generator().manual_seed(0)) * 3
    theirs = scores.clone()
    for warper in (TemperatureLogitsWarper(0.8), TopKLogitsWarper(20), TopPLogitsWarper(0.9),
                   MinPLogitsWarper(0.05)):
        theirs = warper(None, theirs)
    theirs = torch.softmax(theirs.double(), dim=-1)
    mine = sampling.distribution(scores, temperature=0.8, top_k=20, top_p=0.9, min_p=0.05)
    assert torch.equal(mine > 0, theirs > 0) and (mine - theirs).abs().max() < 1e-6
    print(f"tokens kept per row: {(mine > 0).sum(-1).tolist()} (the same in both); "
          "largest probability difference < 1e-6")

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### Randomness the caller owns
#
# A server runs many requests at once, so a global seed cannot make one of them repeatable. Each
# request carries its own `torch.Generator`: the same seed gives the same tokens, whatever else
# the process draws in between. Temperature 0 is greedy and needs no randomness at all.

# %% slideshow={"slide_type": "fragment"}
batch_logits = logits.repeat(3, 1)
first = sampling.sample(batch_logits, top_p=0.9, generator=torch.Generator().manual_seed(7))
torch.rand(1000)  # someone else uses the global generator in between
again = sampling.sample(batch_logits, top_p=0.9, generator=torch.Generator().manual_seed(7))
assert torch.equal(first, again)
print("seed 7, drawn twice:", [words[i] for i in first.tolist()], "and", [words[i]
                                                                          for i in again.tolist()])
print("greedy:", [words[i] for i in sampling.sample(batch_logits, temperature=0).tolist()])

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 2. Two models to serve (optional)
#
# The rest of the notebook serves a **target** model (2 blocks, d = 64) and, for speculative
# decoding, a much smaller **draft** (1 block, d = 32: 6.5 times fewer parameters, printed
# below), both character-level GPTs trained here on the course corpus with notebook 7's
# `Trainer`, in float32. A few seconds each; raise `TRAIN_STEPS` for better models (the cells
# below run at either value).

# %% slideshow={"slide_type": "fragment"}
catch_up("14_serving", "2.")  # started here after a restart? this runs the sections above

# %% slideshow={"slide_type": "fragment"}
from helpers.model.gpt import GPT, GPTConfig
from helpers.text.chars import CharTokenizer
from helpers.text.corpus import load_corpus
from helpers.training.trainer import TrainConfig, Trainer, encode_text, split_stories

TRAIN_STEPS = 200  # the knob: 1000 for better models (about 5x longer)

text = load_corpus()[:200_000]
tokenizer = CharTokenizer.train(text)
train_text, val_text = split_stories(text)
train_ids, val_ids = encode_text(tokenizer, train_text), encode_text(tokenizer, val_text)
vocab = len(tokenizer.chars)


def train(config: GPTConfig) -> tuple[GPT, float]:
    torch.manual_seed(0)
    model = GPT(config)
    trainer = Trainer(model, train_ids, val_ids, TrainConfig(batch_size=16, learning_rate=5e-3,
                                                             eval_every=100, precision="fp32"))
    history = trainer.fit(steps=TRAIN_STEPS, progress_bar=False)
    return model.eval(), history.val_losses[-1]


# %% slideshow={"slide_type": "fragment"}
start = time.perf_counter()
target, target_loss = train(GPTConfig(vocab_size=vocab, context_length=64, n_layers=2, n_heads=4,
                                      d_model=64))
draft, draft_loss = train(GPTConfig(vocab_size=vocab, context_length=64, n_layers=1, n_heads=2,
                                    d_model=32))
n_target, n_draft = (sum(p.numel() for p in m.parameters()) for m in (target, draft))
assert target_loss < 2.4 and draft_loss < 2.6 and target_loss < draft_loss
print(f"vocabulary: {vocab} characters; both trained, "
      f"{format_duration(time.perf_counter() - start)}")
print(f"target: {n_target:,} parameters, validation loss {target_loss:.1f}")
print(f"draft:  {n_draft:,} parameters, validation loss {draft_loss:.1f}")
print(f"the draft has {n_target / n_draft:.1f} times fewer parameters than the target")

# %% [markdown] slideshow={"slide_type": "subslide"}
# The target's next-character distribution after a prompt, with the rules of section 1 drawn on
# it: the bars in colour are the tokens each rule keeps.

# %% slideshow={"slide_type": "fragment"}
prompt_text = "Once upon a time, the "
prompt_ids = tokenizer.encode(prompt_text)
with torch.no_grad():
    next_logits = target(torch.tensor([prompt_ids]))[0, -1]


# %% slideshow={"slide_type": "fragment"}
def draw_rule(temperature: float = 1.0, top_p: float = 0.9, shown: int = 12) -> dict:
    """Bars of the top `shown` tokens: before (grey) and after temperature and top-p (colour)."""
    before = torch.softmax(next_logits.double(), -1)
    after = sampling.distribution(next_logits, temperature=temperature, top_p=top_p)[0]
    order = before.argsort(descending=True)[:shown]
    labels = [repr(tokenizer.decode([int(i)])) for i in order]
    fig, ax = plt.subplots(figsize=(9, 3.5))
    x = torch.arange(shown)
    ax.bar(x - 0.2, before[order], width=0.4, color="lightgrey", label="softmax")
    ax.bar(x + 0.2, after[order], width=0.4, color="tab:blue",
           label=f"T={temperature:g}, top-p={top_p:g}")
    ax.set(xticks=x.tolist(), xlabel="next character", ylabel="probability",
           title=f"after {prompt_text!r}: {int((after > 0).sum())} tokens kept")
    ax.set_xticklabels(labels)
    ax.legend()
    return {"kept": int((after > 0).sum()), "top": float(after.max())}


draw_rule()
plt.show()

# %% slideshow={"slide_type": "fragment"}
# NBVAL_IGNORE_OUTPUT
# The widget's output holds model ids that change on every run; the figure above is the same
# drawing.
import ipywidgets as widgets

from helpers.lab.widgets import Explorer

explorer = Explorer(
    draw_rule,
    temperature=widgets.FloatSlider(value=1.0, min=0.1, max=3.0, step=0.1,
                                    description="temperature"),
    top_p=widgets.FloatSlider(value=0.9, min=0.05, max=1.0, step=0.05, description="top_p"),
)
explorer

# %% [markdown] slideshow={"slide_type": "subslide"}
# Moving the sliders really redraws: a smaller top-p keeps fewer tokens, a higher temperature
# lowers the top token's probability.

# %% slideshow={"slide_type": "fragment"}
start_view = explorer.reset()
narrow = explorer.set(top_p=0.3)
hot = explorer.set(temperature=2.5, top_p=1.0)
assert narrow["kept"] < start_view["kept"] and hot["top"] < start_view["top"]
print("redraws so far:", explorer.redraws)

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 3. Many prompts in one batch (optional)
#
# A batch is a rectangle, prompts are not. We **pad on the left**, so that every row's next token
# lands in the same (last) column, and give the model two more things:
# - an **attention mask**: real tokens never attend to pads;
# - **position ids**: each prompt's first real token is position 0, as it would be alone.

# %% slideshow={"slide_type": "fragment"}
catch_up("14_serving", "3.")  # started here after a restart? this runs the sections above

# %% slideshow={"slide_type": "fragment"}
from helpers.serve.batching import forward_rows, generate_batch, left_pad, position_ids

prompts = [tokenizer.encode(s) for s in ("The dog ", "Once upon a time, a little ", "A")]
ids, real = left_pad(prompts)
print("ids:\n", ids)
print("attention mask:\n", real.int())
print("position ids:\n", position_ids(real))

# %% [markdown] slideshow={"slide_type": "subslide"}
# Proof: greedy generation of the three prompts together gives, token for token, what notebook
# 7's `generate` gives each prompt alone.

# %% slideshow={"slide_type": "fragment"}
from helpers.model.generation import generate

together = generate_batch(target, prompts, 24)
for prompt, row in zip(prompts, together, strict=True):
    alone = generate(target, torch.tensor([prompt]), 24, temperature=0)[0, len(prompt):].tolist()
    assert row == alone
    print(repr(tokenizer.decode(prompt) + tokenizer.decode(row)))
print("batched == alone for all three prompts")

# %% [markdown] slideshow={"slide_type": "subslide"}
# Both extras are needed. Without the position ids (positions counted from the left edge, pads
# included) or without the mask (pads attended to), the short prompts' logits change.
#
# The right mask below is the causal mask and the padding mask combined with `&`, then
# `| torch.eye(n)`: every position may also see itself. Without that, a pad's row would be empty
# (a pad before the prompt sees no real token), and a plain softmax over a row of nothing but
# `-inf` is 0/0 = NaN (printed below). The next layer would carry the NaN into the real tokens
# even though they give the pad weight 0, since 0 x NaN = NaN. The course's attention (and
# PyTorch's fused one, in recent versions) returns zeros for an empty row, but the mask should
# not depend on that: with the diagonal no row is empty, and the pads' outputs are meaningless
# but finite numbers that no real token reads.

# %% slideshow={"slide_type": "fragment"}
n = ids.shape[1]
causal = torch.ones(n, n, dtype=torch.bool).tril()
right = forward_rows(target, ids, position_ids(real), causal & real.unsqueeze(1) | torch.eye(n,
        dtype=torch.bool), None)
no_positions = forward_rows(target, ids, torch.arange(n).expand_as(ids),
                            causal & real.unsqueeze(1) | torch.eye(n, dtype=torch.bool), None)
no_mask = forward_rows(target, ids, position_ids(real), causal.expand(len(prompts), n, n), None)
for name, wrong in (("without position ids", no_positions), ("without the mask", no_mask)):
    gap = (wrong[:, -1] - right[:, -1]).abs().amax(-1)
    print(f"{name:>21}: largest logit change per prompt {[round(x, 1) for x in gap.tolist()]}")
    assert gap[0] > 0.01 and gap[1] < 1e-5 * right.abs().max()  # the longest has no pads: round-off
print("softmax of a row that sees nothing:", torch.softmax(torch.full((3,), -math.inf),
                                                           dim=0).tolist())

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 4. A paged KV cache (core)
#
# Notebook 7's cache preallocates `context_length` slots per sequence. A server does not know how
# long an answer will be, so it must reserve the maximum, and most of it stays empty. vLLM's
# PagedAttention (Kwon et al. 2023) borrows the operating system's answer, **pages**:
# - the keys and values live in a pool of fixed-size **blocks** of `block_size` token slots;
# - each sequence has a **block table**, the list of its blocks; token `t` lives in block
#   `table[t // block_size]`, slot `t % block_size`;
# - a sequence takes a block from the **free pool** only when its last block is full, and gives
#   all of them back when it finishes.
#
# ### Exercise: the block-table lookup
#
# Write `my_lookup(block_table, position, block_size)`: where token `position` of a sequence
# lives, as (the block of the pool, the slot within that block). A later cell reads a key from
# the pool with it.
#
# <details><summary>Hint 1: the idea</summary>The block table maps a sequence's *logical* block
# (its first, second, third block ...) to a *physical* block of the pool; the slot is the same in
# both.</details>
#
# <details><summary>Hint 2: the plan</summary>Divide the position by the block size, rounding
# down: that is the logical block, and its entry in the table is the block of the pool. The
# remainder of the same division is the slot.</details>

# %% slideshow={"slide_type": "fragment"}
catch_up("14_serving", "4.")  # started here after a restart? this runs the sections above

# %% slideshow={"slide_type": "fragment"}
def my_lookup(block_table: list[int], position: int, block_size: int) -> tuple[int, int]:
    """Where token `position` of a sequence lives: (block id, slot within the block)."""
    ### BEGIN SOLUTION
    logical_block, slot = divmod(position, block_size)   # the sequence's own numbering
    return block_table[logical_block], slot
    ### END SOLUTION


# %% slideshow={"slide_type": "fragment"}
check("serving.block_lookup", my_lookup)

# %% [markdown] slideshow={"slide_type": "subslide"}
# `helpers.serve.paged.PagedKVCache` holds the pool, `(L, n_blocks, H_KV, block_size, D_H)` for
# the keys and the same for the values, the block tables and the free pool. Its `store_hook` is
# the `kv_store` that every attention layer already calls (notebook 7): it writes the new keys
# into their slots and gathers each sequence's blocks back in order. Three prompts go in one at a
# time, then decode together; the logits equal notebook 7's contiguous cache, one per prompt.

# %% slideshow={"slide_type": "fragment"}
from helpers.model.kv_cache import KVCache
from helpers.serve.paged import PagedKVCache

paged = PagedKVCache.for_model(target, block_size=4, n_blocks=32)
contiguous = [KVCache.for_model(target, 1) for _ in prompts]
worst = 0.0
for i, prompt in enumerate(prompts):
    paged.add_sequence(i)
    got = paged.forward(target, [i], torch.tensor([prompt]))
    worst = max(worst, (got - target.forward_cached(torch.tensor([prompt]),
                                                    contiguous[i])).abs().max().item())
step_ids = torch.tensor([[row[0]] for row in together])
got = paged.forward(target, [0, 1, 2], step_ids)  # one decode step for all three
for i, cache in enumerate(contiguous):
    worst = max(worst, (got[i] - target.forward_cached(step_ids[i:i + 1],
                                                       cache)[0]).abs().max().item())
peak = got.abs().max().item()  # round-off grows with the logits' size: bound it relative to them
assert worst < 1e-5 * peak
print("block tables:", paged.tables)
print(f"paged vs contiguous logits: largest difference < 1e-5 x the largest |logit| (round-off); "
      f"blocks in use {paged.blocks_in_use()} of {paged.n_blocks}")

# %% [markdown] slideshow={"slide_type": "subslide"}
# Your lookup (the helper's until yours passes) finds a token's key in the pool: token 9 of
# prompt 1, layer 0, equals the contiguous cache's key for it.

# %% slideshow={"slide_type": "fragment"}
from helpers.serve.paged import lookup

find = yours_or("serving.block_lookup", my_lookup, lookup)
block, slot = find(paged.tables[1], 9, paged.block_size)
key = contiguous[1].keys[0, 0, :, 9]
assert (paged.keys[0, block, :, slot] - key).abs().max() < 1e-5 * key.abs().max()
print(f"token 9 of prompt 1 lives in block {block}, slot {slot}: the same key as the contiguous "
      f"cache "
      "(to < 1e-5 of its largest entry)")

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### The memory that preallocation wastes
#
# Count token slots reserved but never used, for a mix of request lengths: first the twelve
# requests served in section 5 (each reserving this model's context, 64 tokens), then 1,000
# requests of GPT-2's context (1,024), their lengths drawn uniformly from 20 to 1,024.

# %% slideshow={"slide_type": "fragment"}
from helpers.serve.paged import contiguous_waste, paged_waste
import random

rng = random.Random(0)
workload = [(rng.randint(6, 24), rng.randint(4, 36)) for _ in range(12)]  # (prompt, new tokens)
mixes = {"12 requests, context 64": ([p + n for p, n in workload], 64),
         "1,000 requests, context 1,024": ([rng.randint(20, 1024) for _ in range(1000)], 1024)}
for name, (lengths, context) in mixes.items():
    used = sum(lengths)
    print(f"{name}: {used:,} slots used")
    print(
        f"  contiguous: {contiguous_waste(lengths, context):>8,} slots wasted "
        f"({contiguous_waste(lengths, context) / (used + contiguous_waste(lengths, context)):.0%} "
        f"of what it reserves)"
    )
    for size in (4, 16, 64):
        waste = paged_waste(lengths, size)
        print(f"  blocks of {size:>2}: {waste:>7,} slots wasted ({waste / (used + waste):.1%})")
bytes_per_token = 2 * len(target.blocks) * target.config.d_model * 4
print(f"one slot of this model = {bytes_per_token:,} bytes (keys and values, {len(target.blocks)} "
      f"layers, float32)")

# %% [markdown] slideshow={"slide_type": "slide"}
# Contiguous preallocation wastes about half of what it reserves (a uniform length averages half
# the context); pages waste at most one partly filled block per request, about half a block on
# average. That memory is what lets a paged server run more requests at once.
#
# ## 5. Continuous batching (optional)
#
# **Static batching** gathers `B` requests, runs them until the longest is done, then takes the
# next `B`: a finished request's row idles while the others go on, and a request that arrives just
# after a batch starts waits for the whole batch. **Continuous batching** (Orca, Yu et al. 2022)
# decides again at every step: finished requests leave, waiting ones join. Our `Scheduler` keeps
# vLLM's two queues, *waiting* and *running*. Each step it admits arrived requests while the
# running batch has fewer than `max_batch` and the free pool can hold them (their prompt is
# prefilled in one pass, giving their first token), then gives every other running request one
# token in one batched pass over the paged cache.
#
# The workload: the twelve requests above, prompts cut from the validation stories, one arriving
# every two steps. A *step* is one round in which every running request gets one token.

# %% slideshow={"slide_type": "fragment"}
catch_up("14_serving", "5.")  # started here after a restart? this runs the sections above

# %% slideshow={"slide_type": "fragment"}
from helpers.serve.scheduler import Request, serve_continuous, serve_static

stories = val_text.split("\n\n")
requests = [Request(i, tuple(tokenizer.encode(stories[i][:p])), n, arrival=2 * i)
            for i, (p, n) in enumerate(workload)]
continuous, scheduler = serve_continuous(target, requests, max_batch=4, block_size=4, n_blocks=64)
static = serve_static(target, requests, batch_size=4)
for served in (continuous, static):
    for one in served:
        alone = generate(target, torch.tensor([list(one.request.prompt)]),
                         one.request.max_new_tokens,
                         temperature=0)[0, len(one.request.prompt):].tolist()
        assert one.tokens == alone
print("every request's tokens, continuous and static, equal serving it alone")

# %% [markdown] slideshow={"slide_type": "subslide"}
# Counting the steps and the forward passes (deterministic: they depend only on the arrivals and
# lengths). Tokens per *step* is the throughput this section is about; tokens per *second* comes
# after the timeline.

# %% slideshow={"slide_type": "fragment"}
tokens = sum(r.max_new_tokens for r in requests)
rows = {"static": static, "continuous": continuous}
finish = {name: max(s.finished for s in served) + 1 for name, served in rows.items()}
latency = {name: sum(s.latency for s in served) / len(served) for name, served in rows.items()}
first = {name: sum(s.first_token - s.request.arrival for s in served) / len(served) for name,
         served in rows.items()}
for name in rows:
    print(f"{name:>10}: {tokens} tokens in {finish[name]} steps = {tokens / finish[name]:.2f} "
          f"tokens/step; "
          f"mean latency {latency[name]:.1f} steps, mean wait for the first token "
          f"{first[name]:.1f} steps")
assert finish["continuous"] < finish["static"] and latency["continuous"] < latency["static"]
batches = [requests[i:i + 4] for i in range(0, len(requests),
                                            4)]  # static: one pass per step of a batch
passes = {"static": sum(max(r.max_new_tokens for r in batch) for batch in batches),
          "continuous": scheduler.forward_passes}
print(f"forward passes: static {passes['static']}, continuous {passes['continuous']} "
      f"(of which {len(requests)} prefill one admitted prompt each)")

# %% [markdown] slideshow={"slide_type": "subslide"}
# The timeline shows why: each row is a request, its bar spans arrival (light) to the last token;
# static batches wait for their last member and run as long as their longest.

# %% slideshow={"slide_type": "fragment"}
fig, axes = plt.subplots(1, 2, figsize=(12, 4), sharey=True)
for ax, (name, served) in zip(axes, rows.items(), strict=True):
    for s in served:
        ax.barh(s.request.id, s.first_token - s.request.arrival, left=s.request.arrival,
                color="lightgrey")
        ax.barh(s.request.id, s.finished - s.first_token + 1, left=s.first_token, color="tab:blue")
    ax.set(title=f"{name} batching: done at step {finish[name]}", xlabel="step",
           ylabel="request (grey: waiting, blue: generating)")
axes[0].invert_yaxis()
plt.tight_layout()
plt.show()

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### Per second, on this CPU
#
# Fewer steps is not the same as more tokens per second. `benchmarks/bench_serve.py` serves three
# workloads of 24 requests (workload seeds 0, 1, 2) both ways with one thread, static and
# continuous timed in turns, nine times each, and stores every time in `data/bench_serve.json`.
# Arrivals are counted in steps, so the seconds are compute only; a latency in seconds is the
# latency in steps times that scheme's seconds per step. The best of the nine runs (the least
# disturbed by other programs on this shared machine):

# %% slideshow={"slide_type": "fragment"}
import json

from helpers.text.corpus import data_dir

bench = json.loads((data_dir() / "bench_serve.json").read_text(encoding="utf-8"))
assert bench["repeats"] == 9 and bench["threads"] == 1
for seed, run in bench["batching"].items():
    best = {name: min(run[name]["seconds"]) for name in ("static", "continuous")}
    print(f"workload {seed}:")
    for name, seconds in best.items():
        r = run[name]
        print(f"  {name:>10}: {r['steps']} steps, {r['forward_passes']} passes, "
              f"{run['tokens'] / seconds:4.0f} tokens/s, "
              f"{seconds / r['forward_passes'] * 1e3:.2f} ms per pass, mean latency "
              f"{r['mean_latency_steps']:.1f} steps "
              f"= {r['mean_latency_steps'] * seconds / r['steps'] * 1e3:.0f} ms")
    ratio = {key: run["continuous"][key] / run["static"][key] for key in ("steps", "forward_passes",
                                                                          "mean_latency_steps")}
    seconds = best["continuous"] / best["static"]
    print(f"  continuous / static: steps {ratio['steps']:.2f}, passes "
          f"{ratio['forward_passes']:.2f}, time per pass "
          f"{seconds / ratio['forward_passes']:.2f}, seconds {seconds:.2f} (tokens/s x "
          f"{1 / seconds:.2f}); "
          f"mean latency {ratio['mean_latency_steps']:.2f} in steps, "
          f"{ratio['mean_latency_steps'] * seconds / ratio['steps']:.2f} in seconds")

# %% [markdown] slideshow={"slide_type": "subslide"}
# Continuous batching needs fewer steps (0.69-0.82 of static's), and its mean latency is
# 0.46-0.63 of static's in steps and 0.68-0.80 in seconds. Its tokens per second do not rise:
# 0.98-1.03 times static's, equal within the noise. A second buys forward passes, not steps.
# Continuous batching prefills each admitted prompt in a pass of its own, so it saves fewer passes
# than steps (0.86-0.98), and each of its passes costs more (1.04-1.18 times as long): at this
# size a pass is mostly fixed overhead (Python, many small kernels) around a little arithmetic,
# and the paged cache adds its own, gathering every sequence's blocks in every layer at every
# pass. The two cancel. This notebook's twelve requests take 86 passes static and 87 continuous
# (printed above), so timing them once could only show that noise, and no time of them is
# printed here. On a GPU serving a large model, a decode pass costs about the same for one row or
# many (it is bound by reading the weights), so keeping the batch full turns the saved steps
# into throughput too; the latency gain is there at any size.

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 6. Prefix sharing with copy on write (optional)
#
# Requests often begin with the same text (a system prompt, a few-shot preamble). With pages they
# can share its blocks: the prefix is prefilled once, then each request is a `fork` whose block
# table points at the same blocks, each block's reference count says how many tables hold it.
# The first time a request writes into a shared, partly filled block, the cache **copies it on
# write**, so the other requests never see the write.

# %% slideshow={"slide_type": "fragment"}
catch_up("14_serving", "6.")  # started here after a restart? this runs the sections above

# %% slideshow={"slide_type": "fragment"}
prefix = tokenizer.encode(stories[20][:42])
suffixes = [tokenizer.encode(s) for s in (" The", " A", " Then", " Once", " It", " He")]
new_tokens = 10


def prefill(cache: PagedKVCache, share: bool) -> tuple[list[torch.Tensor], int]:
    """Prefill prefix + each suffix into `cache`, the prefix once and forked when `share`;
    return each sequence's last logits (V,) and the tokens prefilled."""
    prefilled, logits = 0, []
    if share:
        cache.add_sequence("prefix")
        cache.forward(target, ["prefix"], torch.tensor([prefix]))
        prefilled += len(prefix)
    for i, suffix in enumerate(suffixes):
        own = suffix if share else prefix + suffix
        cache.fork("prefix", i) if share else cache.add_sequence(i)
        logits.append(cache.forward(target, [i], torch.tensor([own]))[0, -1])
        prefilled += len(own)
    return logits, prefilled


# %% slideshow={"slide_type": "fragment"}
def serve_shared(share: bool, block_size: int = 4) -> tuple[list[list[int]], int, int, int]:
    """Greedy answers of prefix + each suffix: the answers, the blocks held at the end, the
    tokens prefilled and the blocks copied on write."""
    cache = PagedKVCache.for_model(target, block_size, n_blocks=200)
    logits, prefilled = prefill(cache, share)
    answers = [[int(row.argmax())] for row in logits]
    for _ in range(new_tokens - 1):
        step = cache.forward(target, list(range(len(suffixes))), torch.tensor([[a[-1]]
                                                                               for a in answers]))
        for a, row in zip(answers, step[:, -1], strict=True):
            a.append(int(row.argmax()))
    return answers, cache.blocks_in_use(), prefilled, cache.copies


# %% slideshow={"slide_type": "fragment"}
shared, shared_blocks, shared_prefill, copies = serve_shared(True)
apart, apart_blocks, apart_prefill, _ = serve_shared(False)
assert shared == apart
for suffix, answer in zip(suffixes[:3], shared[:3], strict=True):
    print(repr("..." + tokenizer.decode(prefix[-12:] + suffix + answer)))
print(f"prefix of {len(prefix)} tokens = {len(prefix) // 4} full blocks of 4 and {len(prefix) % 4} "
      f"tokens in "
      f"one more; {len(suffixes)} requests, {new_tokens} new tokens each: the same answers shared "
      f"or not")
print(f"blocks held at the end: {apart_blocks} without sharing, {shared_blocks} with "
      f"({1 - shared_blocks / apart_blocks:.0%} fewer); tokens prefilled {apart_prefill} vs "
      f"{shared_prefill}; "
      f"{copies} blocks copied on write")
assert shared_blocks < apart_blocks and copies == len(suffixes)

# %% [markdown] slideshow={"slide_type": "slide"}
# The prefix is stored once instead of six times; each request copied only the partly filled
# block it wrote into.
#
# ## 7. Speculative decoding: faster, with the same distribution (optional)
#
# A generation step of a large model is slow mostly because it reads all the weights to produce
# one token. Speculative decoding (Leviathan et al. 2023; Chen et al. 2023) lets a small **draft**
# model propose `k` tokens, one by one (cheap), then runs the **target** once on all `k` (one pass
# gives the target's distribution at every one of those positions). Drafted token `x`, which the
# draft proposed with probability `q(x)` where the target gives `p(x)`:
# - is **accepted** with probability `min(1, p(x) / q(x))`;
# - if rejected, it is replaced by a draw from the **residual** `norm(max(0, p - q))`, and the round
#   ends; if all `k` are accepted, the target's distribution after them gives one more token free.
#
# Why this is exact: the chance of producing `x` in one position is
# `q(x) min(1, p(x)/q(x)) + P(reject) r(x) = min(p, q)(x) + max(0, p - q)(x) = p(x)`,
# since `P(reject) = 1 - sum_y min(p, q)(y)` is exactly the residual's normaliser.
#
# ### Exercise: the accept/reject step
#
# Write the target's check of one round: `my_accept_or_reject(p, q, drafted, generator)` with
# `p` `(k + 1, V)` the target's distributions at the `k` drafted positions and one after, `q`
# `(k, V)` the draft's, and `drafted` the `k` drafted tokens. Return the tokens the round emits
# (a list of ints, 1 to `k + 1` of them), drawing every random number from `generator`. Once it
# passes, the speculative decoding below runs with your function.
#
# <details><summary>Hint 1: the idea</summary>Go through the drafted tokens in order and keep each
# with the acceptance probability above, by comparing a uniform draw with it. The first rejected
# token is replaced by a draw from the part of the target's distribution that the draft
# under-proposed, and the round ends there. If no token was rejected, the target's distribution
# after the last one gives a bonus token.</details>
#
# <details><summary>Hint 2: the plan</summary>(1) Walk through the drafted tokens in order,
# accepting each with the acceptance probability above, by a uniform draw from the generator. (2) At
# the first rejection: draw the replacement from the residual distribution, and stop. (3) If every
# token was accepted: one bonus token from the target's last row. Return plain ints.</details>
#
# <details><summary>Hint 3: closer</summary>The residual distribution is the target's row minus the
# draft's, negatives set to zero, normalised. The check replays the generator: one uniform per
# visited token, then one draw of a token from a distribution.</details>

# %% slideshow={"slide_type": "fragment"}
catch_up("14_serving", "7.")  # started here after a restart? this runs the sections above

# %% slideshow={"slide_type": "fragment"}
def my_accept_or_reject(p: torch.Tensor, q: torch.Tensor, drafted: list[int],
                        generator: torch.Generator | None = None) -> list[int]:
    """p (k + 1, V), q (k, V), drafted: k token ids -> the round's tokens (1 to k + 1 ints)."""
    ### BEGIN SOLUTION
    emitted = []
    for position, proposal in enumerate(drafted):
        uniform = torch.rand((), generator=generator, dtype=torch.float64).item()
        acceptance = min(1.0, (p[position, proposal] / q[position, proposal]).item())
        if uniform < acceptance:
            emitted.append(proposal)                      # accepted: on to the next one
            continue
        # Rejected: redraw from what the draft under-proposed, norm(max(0, p - q)); round over.
        residual = torch.clamp(p[position] - q[position], min=0.0)
        redrawn = torch.multinomial(residual / residual.sum(), 1, generator=generator).item()
        return emitted + [redrawn]
    # All k kept: the target's distribution after them gives one more token for free.
    bonus = torch.multinomial(p[-1], 1, generator=generator).item()
    return emitted + [bonus]
    ### END SOLUTION


# %% slideshow={"slide_type": "fragment"}
check("serving.accept_or_reject", my_accept_or_reject)

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### Proof by enumeration
#
# On a tiny vocabulary we can follow every path: each drafted token, accepted or rejected, each
# residual draw, each bonus token, over as many rounds as it takes. `exact_distribution` does
# this with the helper's own `acceptance_probability` and `residual`, and gives the probability of
# every 3-token output. The target and draft here are made-up conditionals of 3 tokens (a
# different random distribution after every prefix); the result must equal sampling the target
# one token at a time, for every `k`.

# %% slideshow={"slide_type": "fragment"}
import functools

from helpers.serve.speculative import autoregressive_distribution, exact_distribution


def toy(salt: int, vocab: int = 3, spread: float = 2.0):
    """A made-up conditional: prefix -> probabilities (vocab,), softmax of random logits x
    spread."""
    @functools.cache
    def probs(prefix: tuple[int, ...]) -> torch.Tensor:
        gen = torch.Generator().manual_seed(hash((salt, prefix)) % 2**31)
        return torch.softmax(torch.randn(vocab, generator=gen, dtype=torch.float64) * spread, dim=0)
    return probs


toy_target, toy_draft = toy(0), toy(1)
plain = autoregressive_distribution(toy_target, (0,), n_tokens=3)
for k in (1, 2, 3):
    spec = exact_distribution(toy_target, toy_draft, (0,), k=k, n_tokens=3)
    gap = max(abs(spec[path] - plain[path]) for path in plain)
    assert gap < 1e-12 and len(spec) == 27
    print(f"k = {k}: 27 outputs, largest difference from the target's distribution < 1e-12")
print("for example P(0, 2, 1) =", f"{plain[(0, 2, 1)]:.6f}")

# %% [markdown] slideshow={"slide_type": "subslide"}
# A wrong rule fails this proof. Two tempting ones: accept every drafted token (no rejection at
# all: the output follows the draft), or after a rejection redraw from the target's `p` itself
# instead of the residual `max(0, p - q)` (then a token the draft over-proposes comes out too
# often, once through acceptance and again through the redraw, and the others too rarely).
# `swap_in` replaces one of the module's functions for the length of a `with` block: the rule's
# bodies `_acceptance` and `_residual`, which the module's loops run after checking `p` and `q`
# once (the public `acceptance_probability` and `residual` check them, then call the same bodies):

# %% slideshow={"slide_type": "fragment"}
import contextlib

import helpers.serve.speculative as speculative


@contextlib.contextmanager
def swap_in(**rules):
    """Replace functions of helpers.serve.speculative (by name) inside a with block."""
    saved = {name: getattr(speculative, name) for name in rules}
    for name, rule in rules.items():
        setattr(speculative, name, rule)
    try:
        yield
    finally:
        for name, rule in saved.items():
            setattr(speculative, name, rule)


WRONG = {"always accept": {"_acceptance": lambda p, q, x: 1.0},
         "redraw from p": {"_residual": lambda p, q: p.clone()}}
for name, rules in WRONG.items():
    with swap_in(**rules):
        bad = exact_distribution(toy_target, toy_draft, (0,), k=2, n_tokens=3)
    print(f"{name}: largest difference from the target's distribution "
          f"{max(abs(bad[x] - plain[x]) for x in plain):.3f}")

# %% [markdown] slideshow={"slide_type": "subslide"}
# The same enumeration works on the course models for the first output token (52 drafted tokens,
# each accepted or replaced): its distribution is the target's softmax.

# %% slideshow={"slide_type": "fragment"}
def conditional(model: GPT):
    @functools.cache
    def probs(prefix: tuple[int, ...]) -> torch.Tensor:
        with torch.no_grad():
            return torch.softmax(model(torch.tensor([prefix]))[0, -1].double(), dim=-1)
    return probs


course_prefix = tuple(tokenizer.encode("The cat "))
spec = exact_distribution(conditional(target), conditional(draft), course_prefix, k=1, n_tokens=1)
truth = conditional(target)(course_prefix)
gap = max(abs(spec.get((x,), 0.0) - float(truth[x])) for x in range(vocab))
assert gap < 1e-12
print(f"course models, first token: largest difference from the target < 1e-12 over {vocab} tokens")

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### On the course models: greedy tokens
#
# `speculative_generate` runs the loop with two KV caches. Each holds every token but the last;
# after a rejection the cache is rolled back by setting its length (the stale slots are simply
# overwritten later). Each round's check is a function of `(p, q, drafted, generator)`: your
# `my_accept_or_reject` once it passes the check, the helpers' `verify_round` until then (the
# cell says which). At temperature 0 it must give exactly the target's greedy tokens:

# %% slideshow={"slide_type": "fragment"}
from helpers.lab.exercises import yours_or
from helpers.serve.speculative import speculative_generate, verify_round

verify = yours_or("serving.accept_or_reject", my_accept_or_reject, verify_round)
for k in (1, 4):
    fast, stats = speculative_generate(target, draft, prompt_ids, 30, k=k, temperature=0,
                                       verify=verify)
    assert fast == generate(target, torch.tensor([prompt_ids]), 30, temperature=0)[0,
            len(prompt_ids):].tolist()
print(repr(prompt_text + tokenizer.decode(fast)))
print("speculative greedy == target greedy for k = 1 and 4")

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### A sampled test that can fail
#
# The enumeration checks the helper's `acceptance_probability` and `residual`; your
# `my_accept_or_reject` is another function, and a function that draws random numbers is checked
# by running it, with a check that has power. The redraw-from-p rule moves no output's
# probability by more than 0.047 on the 3-token toy above, and by 0.064 on the 4-token toy
# tested here (printed below), about what a few hundred draws scatter, so "the sampled
# frequencies look about right" cannot catch it. A test that fails both wrong rules is
# **Pearson's chi-square**: on a vocabulary of 4 tokens, draw `SAMPLES`
# two-token outputs of speculative decoding (k = 2) through the rule under test, count each of
# the 16 possible outputs, and compare with the exact probabilities:
# `X2 = sum over outputs of (observed - expected)^2 / expected`. For a right rule X2 follows a
# chi-square distribution with 15 degrees of freedom (every expected count is at least 5, printed
# below), so its **p-value**, the chance that a right rule lands this far off, is known. We fail
# a rule at p < 0.01: a right rule fails one run in a hundred whatever its draws. The draws are
# seeded, so the printed bounds repeat.

# %% slideshow={"slide_type": "fragment"}
from collections.abc import Callable

from helpers.serve.speculative import chi_square, sample_outputs

SAMPLES = 1000  # the knob: 2000 gives the wrong rules still smaller p-values (about 2x longer)
small_target, small_draft = toy(0, vocab=4, spread=1.0), toy(1, vocab=4, spread=1.0)
exact_small = autoregressive_distribution(small_target, (0,), n_tokens=2)
print(f"{len(exact_small)} outputs, smallest expected count "
      f"{SAMPLES * min(exact_small.values()):.1f}")
with swap_in(**WRONG["redraw from p"]):
    redrawn = exact_distribution(small_target, small_draft, (0,), k=2, n_tokens=2)
print(f"redraw from p on this toy: largest difference from the target's distribution "
      f"{max(abs(redrawn[x] - exact_small[x]) for x in exact_small):.3f}")


def chi_square_of(rule: Callable, seed: int = 0) -> float:
    """p-value of SAMPLES outputs drawn through `rule` (p, q, drafted, generator) -> tokens."""
    counts = sample_outputs(small_target, small_draft, (0,), k=2, n_tokens=2, n_samples=SAMPLES,
                            verify=rule, generator=torch.Generator().manual_seed(seed))
    return chi_square(counts, exact_small)[1]

# %% slideshow={"slide_type": "fragment"}
right_p = chi_square_of(verify)
assert right_p > 0.01
print(f"the rule in use ({'yours' if verify is my_accept_or_reject else 'the helper'}): p > 0.01, "
      f"passes")
for name, rules in WRONG.items():
    with swap_in(**rules):
        wrong_p = chi_square_of(speculative.verify_round)
    assert wrong_p < 1e-6
    print(f"{name}: p < 1e-6, fails")

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### Acceptance rate and speed-up against k
#
# The cost we can count: **target forward passes per token**. Plain decoding needs one per token;
# speculative decoding needs one per round, and a round yields between 1 and k + 1 tokens. Two
# rates answer different questions. The **per-token acceptance** `a` is the share of the drafted
# tokens the target checked that it kept (after a rejection the rest of the round is never
# checked); the **all-k share** is the share of rounds in which all k drafted tokens were kept.
# If each token were kept independently with probability `a`, a round would keep all k with
# probability `a^k` and yield `(1 - a^(k+1)) / (1 - a)` tokens on average (Leviathan et al.).
# Measured greedily on three prompts, 40 tokens each, with the accept/reject rule in use (yours
# once it passes):

# %% slideshow={"slide_type": "fragment"}
sweep_prompts = [tokenizer.encode(s) for s in ("Once upon a time, ", "The little dog ",
                                               "She said ")]
sweep, NEW = {}, 40
for k in range(1, 7):
    runs = [speculative_generate(target, draft, p, NEW, k=k, temperature=0, verify=verify)[1]
            for p in sweep_prompts]
    accepted, checked = sum(r.accepted for r in runs), sum(r.accepted + r.rejected for r in runs)
    passes, full = sum(r.target_passes for r in runs), sum(r.full_rounds for r in runs)
    rate = accepted / checked
    sweep[k] = {"rate": rate, "all k": full / passes, "per pass": 3 * NEW / passes}
    print(f"k = {k}: per-token acceptance {rate:.2f}, all k kept in {full / passes:.0%} of rounds "
          f"(a^k: {rate ** k:.0%}); tokens per target pass {3 * NEW / passes:.2f} "
          f"(formula: {(1 - rate ** (k + 1)) / (1 - rate):.2f}), draft passes per token "
          f"{k * passes / (3 * NEW):.2f}")
assert all(s["per pass"] > 1 for s in sweep.values()) and sweep[6]["all k"] < sweep[1]["all k"]

# %% [markdown] slideshow={"slide_type": "subslide"}
# Tokens per target pass grow with `k`. The per-token acceptance does **not** fall with `k`: here
# it rises, from 0.67 at k = 1 to 0.73 at k = 6. What falls is the all-k share, from 67 % to 14 %:
# the more guesses a round makes, the less often every one of them is right, and each extra
# drafted token costs a draft pass. (The per-token rate can rise because a token late in a round
# is checked only when every guess before it was right, so the late tokens that get checked sit
# where the draft already agrees with the target, such as the rest of a common word.)
#
# One pair of models is one seed. `benchmarks/bench_serve.py` repeats the sweep on three pairs
# (training seeds 0, 1, 2, 200 steps each, as here) and adds a third model: the same draft
# trained 1,000 steps. It stores the counts in `data/bench_serve.json`:

# %% slideshow={"slide_type": "fragment"}
spec_runs = bench["speculative"]
for seed, run in spec_runs["seeds"].items():
    print(f"seed {seed}: validation loss target {run['target_loss']:.2f}, draft "
          f"{run['draft_loss']:.2f}, "
          f"draft after {spec_runs['long_steps']:,} steps {run['long_draft_loss']:.2f}")
    for name, label in (("draft", "draft"), ("long_draft", "longer draft")):
        row = run[name]
        print(f"  {label:>12}: per-token acceptance " + " ".join(f"{row[k]['per_token']:.2f}"
                                                                 for k in row)
              + "; all k kept " + " ".join(f"{row[k]['all_k_kept']:4.0%}"
                                           for k in row) + "  (k = 1 ... 6)")
runs = list(spec_runs["seeds"].values())
assert all(r["draft"]["6"]["per_token"] > r["draft"]["1"]["per_token"] for r in runs)
assert all(r["draft"]["6"]["all_k_kept"] < r["draft"]["1"]["all_k_kept"] for r in runs)
assert all(r["long_draft_loss"] < r["target_loss"] < r["draft_loss"] for r in runs)
short, longer = ([v["per_token"] for r in runs for v in r[name].values()] for name in ("draft",
        "long_draft"))
assert all(r["long_draft"][k]["per_token"] < r["draft"][k]["per_token"] for r in runs
           for k in r["draft"])
print(f"per-token acceptance over all seeds and k: draft {min(short):.2f}-{max(short):.2f}, "
      f"draft trained longer {min(longer):.2f}-{max(longer):.2f}")

# %% [markdown] slideshow={"slide_type": "subslide"}
# On all three seeds the per-token rate at k = 6 is above that at k = 1, and the all-k share
# falls. The draft trained longer predicts the text better than the target itself (a lower
# validation loss on every seed), yet the target accepts its guesses **less** often, at every k
# on every seed (0.43-0.56 against 0.55-0.78). Acceptance does not measure how good the draft is
# but how well it imitates the target: greedily, a drafted token is kept only when it is the
# target's own choice, and a draft that has learned more than the target disagrees with it more.
# That is why a real draft is trained to match its target's distribution (distilled from it), not
# just to be a good model of the text.
#
# The stored wall-clock times (seed 0's pair, one thread, every setting timed in turns, best of
# nine runs) give the speed-up over the target alone:

# %% slideshow={"slide_type": "fragment"}
best = {name: min(times) for name, times in spec_runs["seconds"].items()}
print(
    "speed-up over the target alone: "
    + ", ".join(
        f"{name} {best['target alone'] / seconds:.2f}x"
        for name, seconds in best.items()
        if name != "target alone"
    )
)

# %% [markdown] slideshow={"slide_type": "slide"}
# Below 1 at every k: slower. On a GPU, where a large target's pass is bound by reading its
# weights, fewer target passes is most of the speed-up. On this CPU, with models this small, each
# pass costs about the same fixed overhead whatever the model, so the draft's passes eat the gain.
#
# ## 8. Quantization: fewer bytes per weight (optional)
#
# Generation reads every weight once per token, so a smaller weight is a faster step (where memory
# bandwidth is the limit) and a bigger model in the same memory. **Weight-only** quantization
# keeps activations in float and stores weights as small integers:
# - **int8 per channel** (symmetric): each output row gets a scale `max|w| / 127`,
#   `q = round(w / scale)` in [-127, 127], `w ~ q x scale`;
# - **int4 per group** (asymmetric): each group of 32 weights of a row maps its [min, max] to
#   0 ... 15 with a scale and a **zero point**, `w ~ (q - zero) x scale`, and two 4-bit values are
#   **packed** into one byte. AWQ's and GPTQ's checkpoints store such zero points too, and both
#   usually take groups of 128 weights (32 here, in a model of width 64). What differs is how the
#   integers are chosen: this notebook's int4 is plain **round-to-nearest**, each weight on its
#   nearest step; AWQ first rescales the channels that matter most to the activations, and GPTQ
#   rounds one column at a time and corrects the columns not yet rounded for the error, using
#   calibration data; both aim to keep the model's outputs closer than round-to-nearest does.
#
# ### Exercise: int8 per channel
#
# Write `my_quantize_int8(w)` for a weight matrix w (out, in): the integers q (out, in) as
# `torch.int8` and one scale per row, (out,), by the int8 rule above. The next cell quantizes one
# of the target's matrices with it.
#
# <details><summary>Hint 1: the idea</summary>Each row (output channel) gets its own step size, so
# that the row's largest absolute weight lands on 127 and every other weight on the nearest
# integer step.</details>
#
# <details><summary>Hint 2: the plan</summary>(1) One scale per row, so that the row's largest
# absolute weight maps to 127. (2) Every weight divided by its row's scale and rounded, kept within
# plus and minus 127. (3) Return the integers as int8 and the scales.</details>

# %% slideshow={"slide_type": "fragment"}
catch_up("14_serving", "8.")  # started here after a restart? this runs the sections above

# %% slideshow={"slide_type": "fragment"}
def my_quantize_int8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w (out, in) float -> q (out, in) torch.int8 and scale (out,): w ~ q * scale[:, None]."""
    ### BEGIN SOLUTION
    channel_peak = w.abs().amax(dim=1, keepdim=True)        # (out, 1): each row's largest |w|
    channel_step = channel_peak / 127
    integer_levels = torch.round(w / channel_step).clamp(-127, 127)
    return integer_levels.to(torch.int8), channel_step.flatten()
    ### END SOLUTION


# %% slideshow={"slide_type": "fragment"}
check("serving.quantize_int8_rows", my_quantize_int8)

# %% [markdown] slideshow={"slide_type": "subslide"}
# Your int8 (the helper's until yours passes) on the first MLP matrix of the target: the same
# integers as `helpers.serve.quantize.quantize_int8`, and every weight within half a step of its
# dequantized value.

# %% slideshow={"slide_type": "fragment"}
from helpers.serve.quantize import quantize_int8

quantize8 = yours_or("serving.quantize_int8_rows", my_quantize_int8, quantize_int8)
w = target.blocks[0].mlp.up.weight.detach()  # (256, 64): the first MLP matrix
q8_w, s8_w = quantize8(w)
assert torch.equal(q8_w, quantize_int8(w)[0])
error8 = (q8_w.float() * s8_w[:, None] - w).abs()
assert (error8 <= s8_w[:, None] / 2 + 1e-7).all()
print(f"{tuple(w.shape)} weights: the helper's integers; largest error {error8.max():.4f}, "
      f"within half of its row's step everywhere")

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### Exercise: int4 per group
#
# Write `my_quantize_int4(w, group_size)` for w (out, in): cut every row into groups of
# `group_size` consecutive weights; each group maps its range, stretched to include 0 so that 0
# stays exact, onto 0 ... 15 with a scale (range / 15) and a zero point (where 0 lands, rounded);
# each weight becomes its own number of steps (the weight over the scale, rounded) plus the zero
# point, within 0 ... 15. A group whose range is 0 gets
# a scale of 1. Return the values packed two per byte, `torch.uint8` (out, in / 2), value 2j in
# the low 4 bits of byte j and value 2j + 1 in the high 4 bits, with the scales and zero points,
# each (out, in / group_size). The next cell takes one group of the target's matrix apart with it.
#
# <details><summary>Hint 1: the idea</summary>Per group: a step size and an offset (the zero
# point) turn the group's floats into 16 integer levels with 0 exactly on one of them; then two
# 4-bit numbers fit in one byte.</details>
#
# <details><summary>Hint 2: the plan</summary>(1) Cut every row into groups of consecutive weights.
# (2) Per group, a scale and a zero point from its range stretched to include 0, in 15 steps. (3)
# Every weight as its rounded number of steps plus the zero point, kept within the 16 levels. (4)
# Two 4-bit values per byte, the even column in the low half.</details>
#
# <details><summary>Hint 3: closer</summary>A group of zeros has range 0: give it scale 1. The zero
# point is minus the group's (capped) minimum over the scale, rounded. Shift the odd column's value
# up by 4 bits and combine it with the even one's by a bitwise or.</details>

# %% slideshow={"slide_type": "fragment"}
def my_quantize_int4(w: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor,
                                                                torch.Tensor]:
    """w (out, in) float -> packed (out, in / 2) uint8, scale and zero (out, in / group_size)."""
    ### BEGIN SOLUTION
    out, n_in = w.shape
    groups = w.reshape(out, n_in // group_size, group_size)
    low = groups.amin(dim=-1).clamp(max=0)                  # 0 must be in every group's range
    high = groups.amax(dim=-1).clamp(min=0)
    scale = (high - low) / 15                               # 16 levels, 15 steps
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))  # a group of zeros
    zero = torch.round(-low / scale)                        # the level that stands for 0
    q = (torch.round(groups / scale[..., None]) + zero[..., None]).clamp(0, 15)
    q = q.to(torch.uint8).reshape(out, n_in)
    packed = q[:, 0::2] | (q[:, 1::2] << 4)                 # value 2j low, 2j + 1 high
    return packed, scale, zero
    ### END SOLUTION


# %% slideshow={"slide_type": "fragment"}
check("serving.quantize_int4_groups", my_quantize_int4)

# %% [markdown] slideshow={"slide_type": "subslide"}
# Your int4 (the helper's until yours passes) on the same matrix, groups of 32: the first group's
# scale, zero point and packed bytes, and its rounding error, at most half a step.

# %% slideshow={"slide_type": "fragment"}
from helpers.serve.quantize import dequantize_int4, quantize_int4, unpack_int4

quantize4 = yours_or("serving.quantize_int4_groups", my_quantize_int4, quantize_int4)
packed_w, scale_w, zero_w = quantize4(w, 32)
assert all(torch.equal(mine.float(), helper.float()) for mine, helper in zip((packed_w, scale_w,
                                                                              zero_w),
                                                                             quantize_int4(w,
                                                                                 32), strict=True))
group, scale, zero = w[0, :32], scale_w[0, 0].item(), int(zero_w[0, 0])
q = unpack_int4(packed_w[0, :16])
back = dequantize_int4(packed_w, scale_w, zero_w)[0, :32]
assert (back - group).abs().max() <= scale / 2 + 1e-6
low, high = min(group.min().item(), 0.0), max(group.max().item(), 0.0)
print(f"group of 32 weights in [{low:.3f}, {high:.3f}]: scale {scale:.4f}, zero point {zero}")
print(f"first values {q[:4].tolist()} -> packed bytes {packed_w[0, :2].tolist()} = "
      f"{q[0].item()} + 16 x {q[1].item()}, {q[2].item()} + 16 x {q[3].item()}")
print(f"32 weights: {group.numel() * 4} bytes in float32, 16 bytes packed "
      f"+ a scale and a zero point; largest error {(back - group).abs().max():.4f} <= scale / 2")

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### The whole model, quantized
#
# `helpers.serve.quantize` does the same for whole matrices, and `quantize_model` swaps every
# Linear of the blocks for a `QuantizedLinear` that keeps the integers and dequantizes when
# called. The token embedding (which is also the output matrix) stays in float32. Below,
# `quantize_model_with` has its integers, scales and zero points made by your int8 and int4 (its
# `quantize` argument; the helper's until yours pass). The error on the target, on validation
# windows:

# %% slideshow={"slide_type": "fragment"}
from helpers.serve.quantize import QuantizedLinear, quantize_model, weight_bytes
from helpers.training.trainer import random_batch

x_val, y_val = random_batch(val_ids, 32, 64, generator=torch.Generator().manual_seed(1))


def quantize_model_with(model: GPT, bits: int) -> GPT:
    """quantize_model's copy of `model`, each Linear's integers, scales (and zero points) made
    by quantize8 or quantize4 (yours once it passes), groups of 32."""
    return quantize_model(model, bits, 32, quantize8 if bits == 8 else quantize4)


def loss_and_logits(model: GPT) -> tuple[float, torch.Tensor]:
    with torch.no_grad():
        out = model(x_val)
    return F.cross_entropy(out.flatten(0, 1), y_val.flatten()).item(), out

# %% slideshow={"slide_type": "fragment"}
def linear_bytes(model: GPT) -> tuple[int, int]:
    """Bytes of the blocks' Linear weights: (the weights or integers, the scales and zero
    points)."""
    payload = extra = 0
    for m in model.blocks.modules():
        if isinstance(m, QuantizedLinear):
            payload += m.q.numel()
            extra += sum(t.numel() * 4 for t in (m.scale, getattr(m, "zero", torch.empty(0))))
        elif isinstance(m, torch.nn.Linear):
            payload += m.weight.numel() * 4
    return payload, extra


# %% slideshow={"slide_type": "fragment"}
base_loss, base_logits = loss_and_logits(target)
assert base_loss < 2.4
print(f"float32: validation loss < 2.4; the blocks' Linear weights {linear_bytes(target)[0]:,} "
      f"bytes, "
      f"the whole model {weight_bytes(target):,}")
# (loss change, logit change as a share of the largest |logit|): the logits grow with training
quantized, bounds = {}, {8: (0.01, 0.05), 4: (0.05, 0.5)}
peak = base_logits.abs().max().item()
for bits in (8, 4):
    quantized[bits] = quantize_model_with(target, bits)
    loss, out = loss_and_logits(quantized[bits])
    change = (out - base_logits).abs().max().item()
    assert abs(loss - base_loss) < bounds[bits][0] and change < bounds[bits][1] * peak
    payload, extra = linear_bytes(quantized[bits])
    print(f"int{bits}: validation loss change < {bounds[bits][0]}, largest logit change "
          f"< {bounds[bits][1]:.0%} of the largest |logit|; "
          f"Linear weights {payload:,} bytes + {extra:,} of "
          f"scales{' and zero points' if bits == 4 else ''}, "
          f"the whole model {weight_bytes(quantized[bits]):,}")

# %% [markdown] slideshow={"slide_type": "subslide"}
# int8 costs almost nothing; int4 per group costs a little more. The integers take a quarter and
# an eighth of the float32 bytes, but the extras matter: with a float32 scale and zero point per
# group of 32 weights, int4 adds 8 bytes per 16 bytes of integers. Real formats store them in 16
# bits (or share them over larger groups). The token embedding stays in float32.

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### PyTorch's own int8 kernel
#
# PyTorch has a CPU kernel for exactly this scheme, weight-only int8 with one scale per output
# channel: `torch._weight_int8pack_mm(x, q, scales)` (the kernel `torchao` calls). It gives our
# dequantized product; `benchmarks/bench_serve.py` times it, and `torch.ao`'s dynamic quantization,
# against float32.

# %% slideshow={"slide_type": "fragment"}
from helpers.serve.quantize import dequantize_int8

big = torch.randn(1024, 1024, generator=torch.Generator().manual_seed(0))
q8, s8 = quantize_int8(big)
x1 = torch.randn(4, 1024, generator=torch.Generator().manual_seed(1))
if hasattr(torch, "_weight_int8pack_mm"):
    kernel = torch._weight_int8pack_mm(x1, q8, s8)
    ours8 = x1 @ dequantize_int8(q8, s8).T
    assert (kernel - ours8).abs().max() < 1e-3
    start = time.perf_counter()
    for _ in range(20):
        torch._weight_int8pack_mm(x1, q8, s8)
    print(f"int8 kernel == our dequantized product (largest difference < 1e-3); 20 calls "
          f"{format_duration(time.perf_counter() - start)}")
else:
    print("this torch has no torch._weight_int8pack_mm: skipped")
print(f"1024 x 1024 weights: {big.numel() * 4:,} bytes in float32, {q8.numel() + s8.numel() * 4:,} "
      f"in int8")

# %% [markdown] slideshow={"slide_type": "slide"}
# ## Check your understanding (optional)
#
# 1. Top-p 0.8 on the six words of section 1 kept three words. For which top-p does it keep four?
#
# <details><summary>Answer</summary>
#
# The top three hold 0.869 (printed below): any top-p above 0.869 needs the fourth word (and up
# to the top four's mass, 0.942, no more than four).
# </details>
#
# 2. Why does a batch pad on the left for generation, and what goes wrong with padding on the right?
#
# <details><summary>Answer</summary>
#
# Each step appends one token per row in the same column. With right padding, a short prompt's
# next token would come after its pads: the model would read pads as part of the text (or the
# code would have to track a different "last real token" per row). Left padding puts every row's
# last real token in the last column.
# </details>

# %% slideshow={"slide_type": "fragment"}
catch_up("14_serving", "Check")  # started here after a restart? this runs the sections above

# %% [markdown] slideshow={"slide_type": "subslide"}
# 3. A request of 1,000 tokens in blocks of 16: how many blocks, and how many slots are wasted?
#
# <details><summary>Answer</summary>
#
# 63 blocks (1,008 slots), 8 wasted (computed below). Contiguous preallocation for a 1,024-token
# context would waste 24.
# </details>
#
# 4. Speculative decoding with a draft identical to the target: what is the acceptance rate, and
#    how many tokens does each target pass give with k = 4?
#
# <details><summary>Answer</summary>
#
# Every drafted token is accepted (p = q, so min(1, p/q) = 1), and each pass gives k + 1 = 5
# tokens (checked below). The speed-up is then limited only by the draft's own cost.
# </details>
#
# 5. Why is int8 quantization per output channel rather than one scale for the whole matrix?
#
# <details><summary>Answer</summary>
#
# One large row would set the scale for all of them, and the other rows' weights would round to a
# few levels or to 0. Per channel, each row uses all 255 levels (the error measured below).
# </details>

# %% slideshow={"slide_type": "fragment"}
from helpers.serve.paged import lookup

probs = torch.softmax(logits, -1)
print(f"1. top three hold {probs[:3].sum():.3f}, top four {probs[:4].sum():.3f}: "
      f"top-p 0.9 keeps {int((sampling.distribution(logits, top_p=0.9) > 0).sum())} words")
print(f"3. {math.ceil(1000 / 16)} blocks, {paged_waste([1000], 16)} slots wasted (contiguous: "
      f"{contiguous_waste([1000], 1024)})")
_, same = speculative_generate(target, target, prompt_ids, 20, k=4,
                               generator=torch.Generator().manual_seed(0))
print(f"4. acceptance {same.acceptance_rate:.2f}, tokens per target pass "
      f"{20 / same.target_passes:.1f}")
rows_w = torch.randn(8, 64, generator=torch.Generator().manual_seed(0))
rows_w[0] *= 100
one_scale = rows_w.abs().max() / 127
per_tensor = (torch.round(rows_w / one_scale) * one_scale - rows_w)[1:].abs().mean()
q_rows, s_rows = quantize_int8(rows_w)
per_channel = (dequantize_int8(q_rows, s_rows) - rows_w)[1:].abs().mean()
print(f"5. one row 100x larger: mean error of the other rows {per_tensor:.3f} with one scale, "
      f"{per_channel:.4f} per channel")
