# %% [markdown] slideshow={"slide_type": "slide"}
# # 13. After pretraining: finetuning, LoRA, instruction tuning, DPO and GRPO
#
# The DS 246 notes open with the lifecycle of a language model: **pre-training**, then
# **fine-tuning**, then inference ("GPT training stages"). Notebook 7 did the first stage. This
# notebook does the second, on a laptop CPU, with a task whose every answer is checked exactly.
#
# **After this notebook you can**
# - finetune a pretrained GPT as a classifier, training all weights, the last block or the head;
# - write LoRA by hand (lora_A, lora_B, scaling = alpha / r), prove it starts as the base model
#   and merges exactly, and recognise the same pieces in `peft`;
# - teach a model a chat format with an answer-only loss;
# - push it towards preferred answers with DPO and towards verifiably correct ones with GRPO,
#   measuring each step on the same held-out questions.
#
# **It assumes** notebook 7 (the GPT, its training loop, sampling).

# %% [setup]

# %% slideshow={"slide_type": "fragment"}
import copy
import time

import ipywidgets as widgets
import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from torch import nn

from helpers.lab.exercises import check, yours_or
from helpers.model.generation import generate
from helpers.post import classify, dpo, grpo, lora, recipe, sft, tasks
from helpers.timing import format_duration
from helpers.lab.sections import catch_up

torch.set_num_threads(1)  # every tensor here is small: one thread beats coordinating several
NOTEBOOK_START, NOTEBOOK_CPU = time.perf_counter(), time.process_time()

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 1. A task with an exact checker, and a small pretrained GPT (optional)
#
# Arithmetic in words: "what is three plus four?" has one right answer, "seven", and a checker
# that compares words decides it, so every accuracy below is counted, never judged by eye. We
# use the sums of two numbers from zero to five (36 facts) and keep 30 % of them apart: the
# **held-out** questions, never seen in the chat format.
#
# The pretraining text states every fact in plain prose, as a statement or as a question
# followed by its answer. It never contains the chat template we teach later.

# %% slideshow={"slide_type": "fragment"}
facts = tasks.all_facts(largest=5)
train_facts, held_facts = tasks.split_facts(facts, held_out=0.3, seed=0)
text = tasks.pretraining_text(facts, n_sentences=3000, seed=0)
print(f"{len(facts)} facts: {len(train_facts)} for training, {len(held_facts)} held out")
print(text[:100])
fact = tasks.Fact(3, "plus", 2)
print(repr(fact.question()), "->", repr(fact.answer()),
      "| checker:", tasks.is_correct("five", fact), tasks.is_correct("six", fact))

# %% [markdown] slideshow={"slide_type": "subslide"}
# A character tokenizer with four special tokens for the chat template, and a GPT of two blocks
# (d = 64), pretrained with notebook 7's `Trainer` in float32. `PRETRAIN_STEPS` is the knob for
# a longer run. `helpers.post.recipe` holds these same lines so that the benchmark of section 6
# can rebuild this model.

# %% slideshow={"slide_type": "fragment"}
PRETRAIN_STEPS = 300
setting = recipe.make_setting(largest=5, held_out=0.3, sentences=3000, seed=0)
assert setting.text == text and setting.held_facts == held_facts
tokenizer = setting.tokenizer
print("vocabulary:", tokenizer.vocab_size, "tokens; special:", list(tokenizer.special_tokens))
started = time.perf_counter()
pretrained = recipe.pretrain(setting, steps=PRETRAIN_STEPS, seed=0)
print(f"pretrained {PRETRAIN_STEPS} steps, {format_duration(time.perf_counter() - started)}")


# %% [markdown] slideshow={"slide_type": "subslide"}
# What does it know? Asked in prose ("what is three plus two? "), it completes with the answer
# for many facts, held-out ones included: the knowledge is in the weights. Asked in the chat
# template it has never seen, it does not answer at all.

# %% slideshow={"slide_type": "fragment"}
def prose_accuracy(model: nn.Module, facts: list) -> float:
    """Greedy completion of 'what is a plus b? ' checked up to the first '.'."""
    right = 0
    for f in facts:
        prompt = torch.tensor([tokenizer.encode(f.question() + " ")])
        completion = tokenizer.decode(generate(model, prompt, 9, top_k=1)[0,
                prompt.shape[1]:].tolist())
        right += tasks.is_correct(completion.split(".")[0], f)
    return right / len(facts)


prose = {"train": prose_accuracy(pretrained, train_facts), "held": prose_accuracy(pretrained,
                                                                                  held_facts)}
assert prose["held"] == recipe.prose_accuracy(pretrained, tokenizer, held_facts)  # the helper's
chat_before = {"train": sft.greedy_accuracy(pretrained, tokenizer, train_facts),
               "held": sft.greedy_accuracy(pretrained, tokenizer, held_facts)}
assert prose["train"] > chat_before["train"] + 0.2

# %% slideshow={"slide_type": "fragment"}
# NBVAL_IGNORE_OUTPUT
# A model trained in float32 can answer one question differently on another CPU; the cell above
# asserts the claim.
print("chat answer of the pretrained model:", sft.greedy_answers(pretrained, tokenizer,
                                                                 [fact.question()]))
print(f"prose accuracy: train {prose['train']:.2f}, held-out {prose['held']:.2f}")
print(f"chat accuracy:  train {chat_before['train']:.2f}, held-out {chat_before['held']:.2f}")

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 2. Classification finetuning: a head on the last token (optional)
#
# The first kind of finetuning: reuse the pretrained body, add a linear head, and train it on
# labelled examples. Task: is a sentence well formed? "three plus two is five" is, "plus two is
# three five" is not; the grammar's own checker (`tasks.is_well_formed`) gives the labels. In a causal
# model only the **last** token has seen the whole sentence, so the head reads the last token's
# final hidden state. We train all weights, only the last block (and the final LayerNorm), or
# only the head, three seeds each, and test on the statements about held-out facts.

# %% slideshow={"slide_type": "fragment"}
catch_up("13_post_training", "2.")  # started here after a restart? this runs the sections above

# %% slideshow={"slide_type": "fragment"}
train_texts, train_labels = tasks.well_formed_statements(train_facts, seed=0)
test_texts, test_labels = tasks.well_formed_statements(held_facts, seed=1)
train_x, train_len = classify.encode_texts(tokenizer, train_texts, setting.pad_id)
test_x, test_len = classify.encode_texts(tokenizer, test_texts, setting.pad_id)
train_y, test_y = torch.tensor(train_labels), torch.tensor(test_labels)
print(train_texts[:2], train_labels[:2], "|", len(train_texts), "train,", len(test_texts), "test")


# %% slideshow={"slide_type": "fragment"}
def finetune_classifier(which: str, seed: int, steps: int = 12, lr: float = 2e-3) -> dict:
    torch.manual_seed(seed)
    model = classify.Classifier(copy.deepcopy(pretrained), n_classes=2)
    trainable = classify.freeze_for(model, which)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    started = time.perf_counter()
    for _ in range(steps):
        loss = F.cross_entropy(model(train_x, train_len), train_y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    seconds = time.perf_counter() - started
    with torch.no_grad():
        accuracy = (model(test_x, test_len).argmax(-1) == test_y).float().mean().item()
    return {"accuracy": accuracy, "seconds": seconds, "trainable": trainable}


# %% slideshow={"slide_type": "fragment"}
runs = {which: [finetune_classifier(which, seed) for seed in (0, 1, 2)] for which in classify.WHICH}
for which, results in runs.items():
    print(f"{which:>4}: {results[0]['trainable']:>7,} trainable parameters")
mean_acc = {w: sum(r["accuracy"] for r in rs) / 3 for w, rs in runs.items()}
assert all(0.0 <= a <= 1.0 for a in mean_acc.values())

# %% slideshow={"slide_type": "fragment"}
# NBVAL_IGNORE_OUTPUT
# Trained accuracies can move by one test statement from one CPU to another, and times vary.
for which, results in runs.items():
    accs = ", ".join(f"{r['accuracy']:.2f}" for r in results)
    seconds = sum(r["seconds"] for r in results) / 3
    print(f"{which:>4}: test accuracy (seeds 0, 1, 2) {accs} | mean {mean_acc[which]:.2f} | "
          f"{format_duration(seconds)} per run")

# %% [markdown] slideshow={"slide_type": "subslide"}
# One pretrained model and a few dozen test statements make this table fragile. The benchmark
# `python benchmarks/bench_post_seeds.py` repeats it for several pretraining seeds (the same
# facts and text, another initialisation and batch order), three finetuning seeds each, and
# writes `data/post_seeds.json` (tests/benchmarks/test_bench_post_seeds.py reruns a short version):

# %% slideshow={"slide_type": "fragment"}
import json

from helpers.text.corpus import data_dir

post_seeds = json.loads((data_dir() / "post_seeds.json").read_text())
n_test = post_seeds["n_test_statements"]
rows = {"all": "all", "last": "last", "head": "head", "all_lr_5e-4": "all, lr 5e-4"}
assert set(rows) == set(post_seeds["ladder_rows"])
print(f"test accuracy, mean of finetuning seeds {post_seeds['finetune_seeds']} ({n_test} test "
      f"statements; "
      "lr 2e-3 unless said)")
print("pretraining seed | " + " | ".join(f"{name:>12}" for name in rows.values()))
ladder = {}
for p_seed in post_seeds["pretrain_seeds"]:
    ladder[p_seed] = {r: sum(post_seeds["ladder"][f"{p_seed}/{r}"]) / 3 for r in rows}
    print(f"{p_seed:16} | " + " | ".join(f"{ladder[p_seed][r]:12.2f}" for r in rows))

# %% slideshow={"slide_type": "fragment"}
n_p = len(ladder)
for r, name in rows.items():
    mean = sum(a[r] for a in ladder.values()) / n_p
    print(f"{name:>12}: mean {mean:.2f} ({mean * n_test:.1f} of {n_test} statements)")
order = sum(a["last"] > a["head"] > a["all"] for a in ladder.values())
slow_all = sum(a["all_lr_5e-4"] > a["all"] for a in ladder.values())
slow_head = sum(a["all_lr_5e-4"] > a["head"] for a in ladder.values())
print(f"at lr 2e-3: last block > head > all weights on {order} of {n_p} pretraining seeds")
print(f"all weights at lr 5e-4: above all weights at 2e-3 on {slow_all} of {n_p}, above the head "
      f"on {slow_head} of {n_p}")
assert order > n_p / 2 and slow_all == n_p  # the two claims of the next paragraph

# %% [markdown] slideshow={"slide_type": "slide"}
# What the seeds show. At the notebook's learning rate, the same for all three, the last block
# beats the head and the head beats all weights on most pretraining seeds. That order is the
# learning rate's doing more than the weights': all weights trained at a quarter of the rate
# beat their own runs at the full rate on every seed, and match the last block on average.
# Updating every weight of the body at a rate chosen for a few of them disturbs what
# pretraining built; more trainable weights usually want a smaller rate, and a fair comparison
# tunes the rate for each choice. What stays true: the head alone is the cheapest per step and
# is limited to what the frozen body already computes at the last token.
#
# ## 3. LoRA by hand (core)
#
# Full finetuning updates every weight and AdamW keeps two more numbers per weight. LoRA (Hu et
# al., 2021) freezes a layer's W (out x in) and learns a low-rank update instead:
#
#     y = W x + (alpha / r) * B A x,     A: (r, in),  B: (out, r),  r << min(in, out)
#
# A starts random, **B starts at zero**, so B A = 0: the model starts exactly as pretrained.
# The scale alpha / r keeps the update's size comparable when r changes. First in plain code:

# %% slideshow={"slide_type": "fragment"}
catch_up("13_post_training", "3.")  # started here after a restart? this runs the sections above

# %% slideshow={"slide_type": "fragment"}
torch.manual_seed(0)
layer = pretrained.blocks[0].attn.q_proj  # an nn.Linear 64 -> 64
r, alpha = 4, 8.0
A = torch.randn(r, layer.in_features) / layer.in_features ** 0.5
B = torch.zeros(layer.out_features, r)
x = torch.randn(3, layer.in_features)
by_hand = layer(x) + (alpha / r) * (x @ A.T) @ B.T
print("B = 0, so the output is the base layer's:", torch.equal(by_hand, layer(x)))
B_trained = torch.randn(layer.out_features, r) * 0.1
delta = (alpha / r) * B_trained @ A  # (out, in): rank at most r
print("rank of the update:", torch.linalg.matrix_rank(delta).item(), "| its shape:",
      tuple(delta.shape))


# %% [markdown] slideshow={"slide_type": "subslide"}
# ### Exercise: a LoRA layer
#
# Write the layer as a module, `MyLoRALinear(base, r, alpha)`, around an `nn.Linear` `base`:
# - freeze every parameter of `base`;
# - `lora_A`, from `in` features down to `r`, and `lora_B`, from `r` up to `out`, each an
#   `nn.Linear` without bias (peft's names); `lora_A` keeps its random start, `lora_B` starts at
#   zero; `scaling` is alpha / r;
# - `forward(x)` returns the formula above, x (..., in) -> (..., out);
# - `merge()` folds the update into the base weight, W <- W + scaling * B A, after which
#   `forward` is the base layer alone.
#
# The cell after the check wraps a layer of the pretrained model with your class.
#
# <details><summary>Hint 1: the idea</summary>The only trainable parameters are the two small
# layers; the frozen layer's output plus their scaled product is the whole forward, and merging
# moves that product into the frozen weight once, for good.</details>
#
# <details><summary>Hint 2: the plan</summary>(1) Constructor: keep the base layer frozen, add the
# two small bias-free layers (down to r, back up), start the second at zero, keep the scaling and a
# not-merged flag. (2) Forward: the base output plus, unless merged, the scaled low-rank path. (3)
# Merge, without gradients: fold the scaled product of the two weights into the base weight once,
# and set the flag.</details>

# %% slideshow={"slide_type": "fragment"}
class MyLoRALinear(nn.Module):
    """A frozen nn.Linear `base` plus a rank-r update: y = base(x) + (alpha / r) * B A x."""

    def __init__(self, base: nn.Linear, r: int, alpha: float) -> None:
        super().__init__()
        ### BEGIN SOLUTION
        self.base = base
        for p in base.parameters():
            p.requires_grad_(False)                                   # W stays as pretrained
        self.lora_A = nn.Linear(base.in_features, r, bias=False)      # weight (r, in), random
        self.lora_B = nn.Linear(r, base.out_features, bias=False)     # weight (out, r)
        nn.init.zeros_(self.lora_B.weight)                            # B A = 0 at the start
        self.scaling = alpha / r
        self.merged = False
        ### END SOLUTION

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (..., in) -> (..., out)."""
        ### BEGIN SOLUTION
        out = self.base(x)
        if not self.merged:
            out = out + self.lora_B(self.lora_A(x)) * self.scaling
        return out
        ### END SOLUTION

    @torch.no_grad()
    def merge(self) -> None:
        """W <- W + scaling * B A; afterwards forward is the base layer alone."""
        ### BEGIN SOLUTION
        self.base.weight += self.scaling * (self.lora_B.weight @ self.lora_A.weight)
        self.merged = True
        ### END SOLUTION


# %% slideshow={"slide_type": "fragment"}
check("post_training.lora_layer", MyLoRALinear)

# %% [markdown] slideshow={"slide_type": "subslide"}
# Your layer (or `helpers.post.lora.LoRALinear` until yours passes) around the query projection,
# loaded with the A and trained-looking B of the plain code above: the same output as the
# formula, then merged into a plain weight with the same output again. The helper has peft's
# names too, and gives the same numbers.

# %% slideshow={"slide_type": "fragment"}
LoRA = yours_or("post_training.lora_layer", MyLoRALinear, lora.LoRALinear)
wrapped = LoRA(copy.deepcopy(layer), r, alpha)
with torch.no_grad():
    assert torch.equal(wrapped(x), layer(x))  # B = 0: the base layer
    wrapped.lora_A.weight.copy_(A)
    wrapped.lora_B.weight.copy_(B_trained)
    formula = layer(x) + (alpha / r) * (x @ A.T) @ B_trained.T
    gap = (wrapped(x) - formula).abs().max().item()
    helper_layer = lora.LoRALinear(copy.deepcopy(layer), r=r, alpha=alpha)
    helper_layer.lora_A.weight.copy_(A)
    helper_layer.lora_B.weight.copy_(B_trained)
    helper_gap = (wrapped(x) - helper_layer(x)).abs().max().item()
    wrapped.merge()
    merged_gap = (wrapped(x) - formula).abs().max().item()
assert gap < 1e-5 and helper_gap < 1e-5 and merged_gap < 1e-5
print(f"{type(wrapped).__name__}: vs the formula, vs the helper, and merged vs the formula: "
      f"max differences < 1e-5 (scaling = {wrapped.scaling})")

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### LoRA on the whole model
#
# `add_lora` wraps every layer named like the targets (peft's rule), here the query and value
# projections, with the helper's layer (which the model's fused attention path can also read).

# %% slideshow={"slide_type": "fragment"}
adapted = copy.deepcopy(pretrained)
targets = lora.add_lora(adapted, ["q_proj", "v_proj"], r=4, alpha=8.0)
probe = torch.tensor([tokenizer.encode(train_facts[0].question())])
print("wrapped:", targets)
print("at the start the adapted model IS the pretrained one:", torch.equal(adapted(probe),
                                                                           pretrained(probe)))
full, trainable = sum(p.numel() for p in pretrained.parameters()), lora.trainable_count(adapted)
print(f"trainable parameters: {trainable:,} of {full:,} ({100 * trainable / full:.1f} %)")
print(f"AdamW state (2 float32 per trainable weight): {2 * 4 * trainable / 1024:.1f} KiB with LoRA "
      f"vs {2 * 4 * full / 1024:.1f} KiB for all weights")

# %% [markdown] slideshow={"slide_type": "subslide"}
# Train the adapters for a few SFT steps (section 4 explains the loss), then **merge**: W <- W +
# scaling * B A. The merged model is a plain GPT again, with no extra cost at inference, and it
# gives the adapter's outputs.

# %% slideshow={"slide_type": "fragment"}
batches = recipe.sft_batches(setting, n_batches=20, batch_size=16, seed=0)
sft.train_sft(adapted, batches, steps=20, lr=3e-3, seed=0)
moved = (adapted(probe) - pretrained(probe)).abs().max().item()
before_merge = adapted(probe)
print("adapters merged:", lora.merge_lora(adapted))
merge_gap = (adapted(probe) - before_merge).abs().max().item()
assert moved > 1e-3 and merge_gap < 1e-4
print("the adapters changed the logits (by more than 1e-3); merged vs adapter: max difference < "
      "1e-4")

# %% [markdown] slideshow={"slide_type": "subslide"}
# The library practitioners use is `peft`. Loaded with the same A and B, its LoRA layers give the
# same outputs (tests/post/test_lora.py proves it on every run of the tests; this cell runs where
# `peft` is installed, and is skipped elsewhere).

# %% slideshow={"slide_type": "fragment"}
try:
    import peft
except ImportError:
    peft = None
    print("peft is not installed: skipping (pip install peft to run this cell)")
if peft is not None:
    ours = copy.deepcopy(pretrained)
    lora.add_lora(ours, ["q_proj", "v_proj"], r=4, alpha=8.0)
    theirs = peft.inject_adapter_in_model(
        peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"]),
        copy.deepcopy(pretrained))
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, module in ours.named_modules():
            if isinstance(module, lora.LoRALinear):
                module.lora_B.weight.normal_(0, 0.1, generator=generator)  # a trained-looking B
                theirs.get_submodule(name).lora_A["default"].weight.copy_(module.lora_A.weight)
                theirs.get_submodule(name).lora_B["default"].weight.copy_(module.lora_B.weight)
    peft_gap = (theirs(probe) - ours(probe)).abs().max().item()
    assert peft_gap < 1e-5
    print("peft's LoRA vs ours, same A and B: max difference < 1e-5")

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 4. Instruction tuning (SFT): a chat template and a loss on the answer only (optional)
#
# A chat model reads a **template**: special tokens mark who speaks, and one marks the end of the
# answer so that generation knows when to stop. Each special token is one id, never spelled out.

# %% slideshow={"slide_type": "fragment"}
catch_up("13_post_training", "4.")  # started here after a restart? this runs the sections above

# %% slideshow={"slide_type": "fragment"}
ids, mask = sft.encode_example(tokenizer, fact.question(), fact.answer())
print(tokenizer.decode(ids.tolist()))
print("tokens:", len(ids), "| answer tokens (mask = 1):",
      repr(tokenizer.decode(ids[mask.bool()].tolist())))


# %% [markdown] slideshow={"slide_type": "subslide"}
# ### Exercise: the answer-only loss
#
# The loss counts only the answer (and the end token): the model should learn to **answer**, not
# to predict the user's question. Write `answer_only_loss(logits, ids, mask)`: `logits` (B, N, V)
# from the model on `ids` (B, N), `mask` (B, N) 1 on the answer tokens as above. Position t
# predicts token t + 1, so a position counts when its **target** is an answer token; the loss is
# the mean cross-entropy over the positions that count, in the whole batch. Take the
# log-softmax with PyTorch's `log_softmax` and build the cross-entropy from it yourself (the check
# refuses `F.cross_entropy`). The next cell computes the loss of a batch with it and shows where
# its gradient goes.
#
# <details><summary>Hint 1: the idea</summary>Shift by one: the logits of every position but the
# last are scored against the tokens from the second on, and the mask of those target tokens
# says which scores count.</details>
#
# <details><summary>Hint 2: the plan</summary>(1) Shift by one: each position's logits score the
# token after it. (2) Each position's log-probability of its target. (3) Minus their average over
# the positions whose target is an answer token, over the whole batch together.</details>
#
# <details><summary>Hint 3: closer</summary>The targets' mask is the mask from the second position
# on; as floats it weights the log-probabilities, and its sum counts the positions.</details>

# %% slideshow={"slide_type": "fragment"}
def answer_only_loss(logits: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """logits (B, N, V), ids (B, N), mask (B, N) -> the mean loss over answer targets (0-dim)."""
    ### BEGIN SOLUTION
    log_probs = logits[:, :-1].log_softmax(dim=-1)                    # position t predicts t + 1
    picked = log_probs.gather(-1, ids[:, 1:, None]).squeeze(-1)     # (B, N - 1)
    counts = mask[:, 1:].to(picked.dtype)                           # is the target an answer token?
    return -(picked * counts).sum() / counts.sum()
    ### END SOLUTION


# %% slideshow={"slide_type": "fragment"}
check("post_training.answer_only_loss", answer_only_loss)

# %% [markdown] slideshow={"slide_type": "subslide"}
# Your loss (the helpers' `sft.answer_only_loss` until yours passes) on a batch of the training
# questions, against `F.cross_entropy` on the positions that predict an answer token. Proof that
# the prompt gets no gradient: the gradient of the loss on the logits is exactly zero at every
# position that predicts a prompt token.

# %% slideshow={"slide_type": "fragment"}
batch_ids, batch_mask = batches[0]
logits = pretrained(batch_ids).detach().requires_grad_(True)
targets_answer = batch_mask[:, 1:].bool()  # (B, N - 1): does position t predict an answer token?
by_hand = F.cross_entropy(logits[:, :-1][targets_answer], batch_ids[:, 1:][targets_answer])
sft_loss_fn = yours_or("post_training.answer_only_loss", answer_only_loss, sft.answer_only_loss)
loss = sft_loss_fn(logits, batch_ids, batch_mask)
loss.backward()
assert abs(loss.item() - by_hand.item()) < 1e-5
zero = logits.grad[:, :-1][~targets_answer].abs().max().item()
nonzero = logits.grad[:, :-1][targets_answer].abs().amin(dim=-1).min().item()
assert zero == 0.0 and nonzero > 0
print(f"largest gradient at a prompt position: {zero} | every answer position has a gradient")
print("the loss equals F.cross_entropy on the answer positions (difference < 1e-5)")

# %% [markdown] slideshow={"slide_type": "subslide"}
# Now SFT on the training questions: 60 AdamW steps of 16 questions, all weights.

# %% slideshow={"slide_type": "fragment"}
SFT_STEPS = 60
sft_model = copy.deepcopy(pretrained)
started = time.perf_counter()
sft_losses = sft.train_sft(sft_model, batches, steps=SFT_STEPS, lr=1e-3, seed=0)
sft_seconds = time.perf_counter() - started
chat_sft = {"train": sft.greedy_accuracy(sft_model, tokenizer, train_facts),
            "held": sft.greedy_accuracy(sft_model, tokenizer, held_facts)}
assert chat_sft["train"] > chat_before["train"] + 0.3 and sft_losses[-1] < sft_losses[0]
print(f"SFT {SFT_STEPS} steps, {format_duration(sft_seconds)}")

# %% slideshow={"slide_type": "fragment"}
# NBVAL_IGNORE_OUTPUT
# Trained accuracies can move by one question from one CPU to another; the cell above asserts the
# claim.
print(f"answer-only loss: {sft_losses[0]:.2f} -> {sft_losses[-1]:.2f}")
print(f"chat accuracy before SFT: train {chat_before['train']:.2f}, held-out "
      f"{chat_before['held']:.2f}")
print(f"chat accuracy after SFT:  train {chat_sft['train']:.2f}, held-out {chat_sft['held']:.2f}")
print("held-out answers:", sft.greedy_answers(sft_model, tokenizer, [f.question()
                                                                     for f in held_facts[:6]]))
print("right answers:   ", [f.answer() for f in held_facts[:6]])

# %% [markdown] slideshow={"slide_type": "slide"}
# The template is learned: the model now answers with a number word and stops. On the training
# questions it is mostly right. On the held-out ones it is mostly wrong, although it knew many of
# them in prose (section 1): a model this small, finetuned this briefly, learns the training
# answers in the new format rather than how to route every fact it knows into it. Larger models
# transfer far better; here we keep measuring both sets.
#
# ## 5. DPO: prefer the right answer (core)
#
# Preference data comes as pairs: for one prompt a **chosen** answer and a **rejected** one
# (here: the right number word and a near miss). DPO (Rafailov et al., 2023) trains the policy
# pi directly on the pairs, measured against a frozen **reference** model pi_ref (the SFT model):
#
#     loss = -log sigmoid( beta * [ (log pi(chosen) - log pi_ref(chosen))
#                                 - (log pi(rejected) - log pi_ref(rejected)) ] )
#
# Each log pi is an answer's log-probability, summed over its tokens. beta * log(pi / pi_ref) is
# the **implicit reward**; the loss asks the chosen answer's reward to exceed the rejected one's.

# %% slideshow={"slide_type": "fragment"}
catch_up("13_post_training", "5.")  # started here after a restart? this runs the sections above

# %% slideshow={"slide_type": "fragment"}
reference = copy.deepcopy(sft_model).requires_grad_(False)
pairs = dpo.preference_batch(tokenizer, train_facts, setting.pad_id, seed=0)
chosen_ids, chosen_mask, rejected_ids, rejected_mask = pairs
print("chosen:  ", tokenizer.decode([t for t in chosen_ids[0].tolist() if t != setting.pad_id]))
print("rejected:", tokenizer.decode([t for t in rejected_ids[0].tolist() if t != setting.pad_id]))

policy = copy.deepcopy(sft_model)
with torch.no_grad():
    ref_chosen = sft.sequence_logps(reference, chosen_ids, chosen_mask)
    ref_rejected = sft.sequence_logps(reference, rejected_ids, rejected_mask)
policy_chosen = sft.sequence_logps(policy, chosen_ids, chosen_mask)
policy_rejected = sft.sequence_logps(policy, rejected_ids, rejected_mask)
beta = 0.1
same = torch.allclose(policy_chosen, ref_chosen, atol=1e-4) and torch.allclose(policy_rejected,
        ref_rejected, atol=1e-4)
assert same
print(f"{len(policy_chosen)} pairs; at the start the policy is the reference, with the same "
      f"log-probabilities: {same}")


# %% [markdown] slideshow={"slide_type": "subslide"}
# ### Exercise: the DPO loss
#
# Write `dpo_loss(policy_chosen, policy_rejected, ref_chosen, ref_rejected, beta)`: the loss of
# each pair from its four log-probabilities (each (B,)), with the implicit rewards beside it (what
# TRL logs): return the losses (B,), the chosen answers' rewards (B,) and the rejected answers'
# (B,). The cell after the check takes one DPO step with your loss.
#
# <details><summary>Hint 1: the idea</summary>Measure each answer against the reference: how much
# more likely the policy makes it, a log-ratio, since these are log-probabilities. An answer's
# reward is beta times its log-ratio; the loss is a logistic loss asking the chosen answer's
# reward to beat the rejected one's. The rewards are only reported, so no gradient flows through
# them.</details>
#
# <details><summary>Hint 2: the plan</summary>(1) Each answer's log-ratio of policy to reference,
# for the chosen and for the rejected. (2) One loss per pair: the logistic loss of beta times the
# chosen's log-ratio beyond the rejected's, computed stably. (3) The rewards, for reporting only:
# beta times each log-ratio, with no gradient.</details>
#
# <details><summary>Hint 3: closer</summary>The stable form of minus the log of a sigmoid is one
# PyTorch function; detach the rewards.</details>

# %% slideshow={"slide_type": "fragment"}
def dpo_loss(policy_chosen: torch.Tensor, policy_rejected: torch.Tensor, ref_chosen: torch.Tensor,
             ref_rejected: torch.Tensor, beta: float) -> tuple[torch.Tensor, torch.Tensor,
                                                               torch.Tensor]:
    """Each argument (B,): an answer's log-probability, summed over its tokens.
    Returns the losses (B,), the chosen answers' rewards (B,) and the rejected answers' (B,)."""
    ### BEGIN SOLUTION
    # How much more likely the policy makes each answer than the reference does.
    chosen_logratios = policy_chosen - ref_chosen
    rejected_logratios = policy_rejected - ref_rejected
    # Logistic (Bradley-Terry) loss on the difference; logsigmoid is the stable log(sigmoid).
    margin = beta * (chosen_logratios - rejected_logratios)
    losses = -F.logsigmoid(margin)
    # The implicit rewards, for reporting only: no gradient flows through them.
    chosen_rewards = beta * chosen_logratios.detach()
    rejected_rewards = beta * rejected_logratios.detach()
    return losses, chosen_rewards, rejected_rewards
    ### END SOLUTION


# %% slideshow={"slide_type": "fragment"}
check("post_training.dpo_loss", dpo_loss)

# %% [markdown] slideshow={"slide_type": "subslide"}
# One DPO step with your loss (the helpers' until yours passes the check): at the start the policy
# is the reference, so every reward is 0 and every loss log 2. The gradient of the mean loss
# raises each chosen answer's log-probability and lowers each rejected one's; one AdamW step on
# the policy's weights (at the learning rate of the training below) then opens a margin between
# the rewards.

# %% slideshow={"slide_type": "fragment"}
import math

from helpers.lab.exercises.post_training import helper_dpo_loss

loss_fn = yours_or("post_training.dpo_loss", dpo_loss, helper_dpo_loss)
step_policy = copy.deepcopy(sft_model)
logps = [sft.sequence_logps(step_policy, ids, mask) for ids, mask in
         ((chosen_ids, chosen_mask), (rejected_ids, rejected_mask))]
for logp in logps:
    logp.retain_grad()
losses, chosen_rewards, rejected_rewards = loss_fn(*logps, ref_chosen, ref_rejected, beta)
losses.mean().backward()
assert (logps[0].grad < 0).all() and (logps[1].grad > 0).all()
print(f"at the start: mean loss {losses.mean().item():.4f} (log 2 = {math.log(2):.4f}), "
      f"largest |reward| < 1e-6: "
      f"{max(chosen_rewards.abs().max(), rejected_rewards.abs().max()).item() < 1e-6}")
print("the gradient raises every chosen answer and lowers every rejected one")

# %% slideshow={"slide_type": "fragment"}
torch.optim.AdamW(step_policy.parameters(), lr=3e-5,
                  weight_decay=0.0).step()  # the lr trained with below
with torch.no_grad():
    after = loss_fn(sft.sequence_logps(step_policy, chosen_ids, chosen_mask),
                    sft.sequence_logps(step_policy, rejected_ids,
                                       rejected_mask), ref_chosen, ref_rejected, beta)
margin = (after[1] - after[2]).mean().item()
assert after[0].mean() < losses.mean() and margin > 0
print(f"after one AdamW step: mean loss below log 2, mean reward margin > 0: {margin > 0}")


# %% [markdown] slideshow={"slide_type": "subslide"}
# `helpers.post.dpo.dpo_loss` is this formula with TRL's names; tests/post/test_dpo.py runs TRL's
# own `DPOTrainer` loss code on the same log-probabilities and gets the same number. Now we
# train, for several beta, 20 full-batch steps each, and measure on the training pairs the
# **preference accuracy** (chosen reward above rejected), the **reward margin**, and the
# **KL to the reference** (exact over the vocabulary, per answer token).

# %% slideshow={"slide_type": "fragment"}
BETAS = (0.1, 0.3, 1.0)
DPO_STEPS = 20
dpo_runs = {}
for b in BETAS:
    model_b = copy.deepcopy(sft_model)
    history = dpo.train_dpo(model_b, reference, pairs, beta=b, steps=DPO_STEPS, lr=3e-5)
    dpo_runs[b] = {"model": model_b, "accuracy": history["accuracy"][-1],
                   # in nats of log-ratio, comparable across beta
                   "margin": history["margin"][-1] / b,
                   "kl": dpo.answer_kl(model_b, reference, chosen_ids, chosen_mask)}
kls = [dpo_runs[b]["kl"] for b in BETAS]
assert all(dpo_runs[b]["kl"] > 0 for b in BETAS) and kls[0] > 2 * kls[-1]

# %% slideshow={"slide_type": "fragment"}
# NBVAL_IGNORE_OUTPUT
# Trained values differ in the last digits from one CPU to another.
print(" beta | pref. accuracy | log-ratio margin | KL to reference per token")
for b in BETAS:
    run = dpo_runs[b]
    print(f"{b:5} | {run['accuracy']:14.2f} | {run['margin']:16.1f} | {run['kl']:.2f}")


# %% [markdown] slideshow={"slide_type": "subslide"}
# ### Reading the margin
#
# The margin is shown as the difference of log-ratios (the reward divided by beta), so that the
# runs compare. With AdamW the step size barely depends on the loss's scale, so a small beta does
# not move the model less: it asks for a larger log-ratio before the loss is satisfied, and the
# model travels further from the reference. beta is the strength of the leash.

# %% slideshow={"slide_type": "fragment"}
def draw_dpo(beta: float) -> dict:
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6))
    margins = [dpo_runs[b]["margin"] for b in BETAS]
    left.plot(BETAS, margins, "o-")
    right.plot(BETAS, kls, "o-", color="tab:red")
    for ax in (left, right):
        ax.axvline(beta, color="gray", linestyle="--")
        ax.set_xscale("log")
        ax.set_xlabel("beta")
    left.set(title="margin after DPO", ylabel="log-ratio margin (nats)")
    right.set(title="KL(policy || reference) per answer token", ylabel="KL (nats)")
    fig.suptitle(f"DPO, {DPO_STEPS} steps: beta = {beta}")
    fig.tight_layout()
    return {"margin": dpo_runs[beta]["margin"], "kl": dpo_runs[beta]["kl"]}


draw_dpo(0.1)
plt.show()

# %% slideshow={"slide_type": "fragment"}
# NBVAL_IGNORE_OUTPUT
# The widget's output holds model ids that change on every run; the figure above is the same
# drawing.
from helpers.lab.widgets import Explorer

explorer = Explorer(draw_dpo, beta=widgets.SelectionSlider(options=BETAS, value=0.1,
                                                           description="beta"))
explorer

# %% slideshow={"slide_type": "fragment"}
first = explorer.reset()
moved = explorer.set(beta=1.0)
assert moved["kl"] != first["kl"]
print("redraws so far:", explorer.redraws)

# %% [markdown] slideshow={"slide_type": "subslide"}
# We keep beta = 0.3 for the next stage. DPO only asks the chosen answer to gain on the
# rejected one, **relative** to the reference; it does not ask the chosen answer to become more
# likely. Measured: how the log-probabilities of both answers moved.

# %% slideshow={"slide_type": "fragment"}
dpo_model = dpo_runs[0.3]["model"]
with torch.no_grad():
    moved_chosen = (sft.sequence_logps(dpo_model, chosen_ids, chosen_mask)
                    - ref_chosen).mean().item()
    moved_rejected = (sft.sequence_logps(dpo_model, rejected_ids, rejected_mask)
                      - ref_rejected).mean().item()
chat_dpo = {"train": sft.greedy_accuracy(dpo_model, tokenizer, train_facts),
            "held": sft.greedy_accuracy(dpo_model, tokenizer, held_facts)}
assert moved_rejected < moved_chosen

# %% slideshow={"slide_type": "fragment"}
# NBVAL_IGNORE_OUTPUT
# Trained values differ in the last digits from one CPU to another; the cell above asserts the
# order.
print(f"mean change of log pi(chosen): {moved_chosen:+.2f} nats, of log pi(rejected): "
      f"{moved_rejected:+.2f} nats")
print(f"greedy chat accuracy: SFT train {chat_sft['train']:.2f} -> DPO train "
      f"{chat_dpo['train']:.2f}")

# %% [markdown] slideshow={"slide_type": "subslide"}
# If both numbers are negative, the model has learned to prefer by making **both** answers
# less likely, and the probability freed goes elsewhere: a known failure of DPO ("likelihood
# displacement"); it is why practitioners often add the SFT loss on the chosen answers (TRL's
# `loss_type=["sigmoid", "sft"]`), and why greedy accuracy can fall while preference accuracy
# rises. The closing table shows what happened here.

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 6. GRPO: reward only what the checker accepts (optional)
#
# DPO needs pairs someone ranked. With a **verifiable reward** we need nothing but the checker:
# sample a **group** of G answers to each prompt, reward 1 for a right answer and 0 otherwise,
# and score each answer against its own group (Shao et al., 2024):
#
#     advantage_i = (r_i - mean(r)) / (std(r) + eps)
#
# Above the group's mean: push its tokens up; below: push them down. The group mean is the
# baseline a value model would otherwise have to learn.

# %% slideshow={"slide_type": "fragment"}
catch_up("13_post_training", "6.")  # started here after a restart? this runs the sections above

# %% slideshow={"slide_type": "fragment"}
# NBVAL_IGNORE_OUTPUT
# Sampled answers of a trained model can differ from one CPU to another; the assertion keeps the
# claim.
generator = torch.Generator().manual_seed(0)
group_ids, group_mask, rewards = grpo.rollout(
    dpo_model,
    tokenizer,
    train_facts[0],
    group_size=8,
    max_new_tokens=9,
    temperature=1.0,
    generator=generator,
)
prompt_len = len(tokenizer.encode(sft.chat_prompt(train_facts[0].question())))
end_id = tokenizer.special_tokens[sft.END]
print(train_facts[0].question(), "->", train_facts[0].answer())
for row, reward in zip(group_ids.tolist(), rewards.tolist(), strict=True):
    answer = sft.answer_text(tokenizer, row[prompt_len:], end_id)
    assert reward == float(tasks.is_correct(answer, train_facts[0]))
    print(f"  reward {reward:.0f}: {answer!r}")


# %% [markdown] slideshow={"slide_type": "subslide"}
# ### Exercise: group-normalised advantages
#
# Write `group_advantages(rewards, eps)` for rewards of shape (P prompts, G answers): each answer's
# advantage, by the formula above, as a tensor of the same shape.
#
# <details><summary>Hint 1: the idea</summary>Each row is one prompt's group: it has its own mean
# and its own standard deviation, and only its own answers are compared with them.</details>
#
# <details><summary>Hint 2: the plan</summary>(1) Each row's own statistics over its answers: the
# mean and the standard deviation. (2) Every reward standardised by its own row's statistics, eps
# added to the spread.</details>
#
# <details><summary>Hint 3: closer</summary>Reduce along the answers and keep that axis, so that the
# statistics line up with the rows.</details>

# %% slideshow={"slide_type": "fragment"}
def group_advantages(rewards: torch.Tensor, eps: float) -> torch.Tensor:
    """rewards (P, G) -> advantages (P, G), normalised within each row."""
    ### BEGIN SOLUTION
    mean = rewards.mean(dim=1, keepdim=True)
    return (rewards - mean) / (rewards.std(dim=1, keepdim=True) + eps)
    ### END SOLUTION


# %% slideshow={"slide_type": "fragment"}
check("post_training.group_advantages", group_advantages)

# %% [markdown] slideshow={"slide_type": "subslide"}
# GRPO keeps the loss of **PPO** (proximal policy optimisation, Schulman et al., 2017), the
# reinforcement-learning algorithm of the first chat models. Each batch of samples is used for
# several updates, so after the first update the policy being trained, pi, is no longer the
# policy that sampled the answers; call that one **pi_old** (a frozen copy taken at sampling
# time). Per sampled token, ratio = pi(token) / pi_old(token) says how far the update has moved
# that token's probability. PPO clips the ratio to [1 - eps, 1 + eps] so that updates on old
# samples cannot move the policy far from the one that produced them: a **trust region**, the
# neighbourhood of pi_old in which its samples are still a fair guide. Add a KL penalty to the
# reference, estimated per token by **k3** = exp(ref - logp) - (ref - logp) - 1, and the loss
# per answer token t is
#
#     loss_t = -min(ratio * A, clip(ratio, 1 - eps, 1 + eps) * A) + beta * k3_t
#
# k3 is never negative, and its mean is exactly KL(pi || pi_ref) when the tokens are sampled
# from pi itself: true at the first update (pi = pi_old), only approximately at the later ones.
# GRPO averages each answer's loss over its own tokens, then over the answers of the batch.
#
# ### Exercise: the GRPO loss
#
# Write `my_grpo_loss(logps, old_logps, ref_logps, advantages, mask, epsilon, beta)`: `logps`,
# `old_logps` and `ref_logps` (B, T) are the sampled tokens' log-probabilities under the policy
# being trained, the policy that sampled them and the reference; `advantages` (B,) is one number
# per answer; `mask` (B, T) is 1 on each answer's tokens. Return the loss, a 0-dim tensor that
# carries the gradient to `logps`. The cell after the check computes its gradient on a sampled
# group and compares it with the gradient derived by hand.
#
# <details><summary>Hint 1: the idea</summary>Per token, PPO's pessimistic clipped objective
# (the smaller of the ratio and the clipped ratio, each times the answer's advantage), negated,
# plus beta times k3; then a masked mean per answer and a plain mean over the answers.</details>
#
# <details><summary>Hint 2: the plan</summary>(1) Per token, the probability ratio to the policy
# that sampled the answer, and a clipped copy. (2) The pessimistic objective with the answer's
# advantage, negated, plus beta times k3. (3) A masked mean over each answer's own tokens, then a
# plain mean over the answers.</details>
#
# <details><summary>Hint 3: closer</summary>The ratio is e to the power of the log-probability
# difference to the old policy; clip it to 1 plus or minus epsilon. Each answer's advantage must
# reach every token of its row. Pessimistic: the smaller of the two products. k3 comes from the
# reference's log-probability minus the policy's, by the formula above.</details>

# %% slideshow={"slide_type": "fragment"}
def my_grpo_loss(logps: torch.Tensor, old_logps: torch.Tensor, ref_logps: torch.Tensor,
                 advantages: torch.Tensor, mask: torch.Tensor, epsilon: float,
                 beta: float) -> torch.Tensor:
    """logps, old_logps, ref_logps, mask (B, T); advantages (B,) -> the loss (a 0-dim tensor)."""
    ### BEGIN SOLUTION
    # The probability ratio to the policy that sampled the answers, and its clipped twin.
    ratio = torch.exp(logps - old_logps)
    clipped = ratio.clamp(1 - epsilon, 1 + epsilon)
    a = advantages[:, None]                                  # (B, 1): one advantage per answer
    # Pessimistic: the smaller of the two objectives, negated to make a loss.
    surrogate = -torch.min(ratio * a, clipped * a)
    # k3 estimate of KL(pi || pi_ref) per token: never negative, zero where pi = pi_ref.
    log_ratio = ref_logps - logps
    k3 = log_ratio.exp() - log_ratio - 1
    per_token = surrogate + beta * k3
    # Mean over each answer's own tokens, then over the answers.
    mask = mask.to(per_token.dtype)
    per_answer = (per_token * mask).sum(dim=1) / mask.sum(dim=1)
    return per_answer.mean()
    ### END SOLUTION


# %% slideshow={"slide_type": "fragment"}
check("post_training.grpo_loss", my_grpo_loss)

# %% [markdown] slideshow={"slide_type": "subslide"}
# One step, checked by hand: on-policy the ratio is 1 and nothing is clipped, so the gradient
# on a sampled token's log-probability is w_t (-A + beta (1 - exp(ref - logp))), with w_t = 1 /
# (tokens of the answer x G) for the per-sequence mean; through the softmax, the gradient on the
# logits is that times (one-hot - softmax). The loss is yours once it passes the check (the
# helpers' `grpo.grpo_loss` until then).

# %% slideshow={"slide_type": "fragment"}
from helpers.lab.exercises.post_training import helper_grpo_loss

grpo_loss_fn = yours_or("post_training.grpo_loss", my_grpo_loss, helper_grpo_loss)
advantages_fn = yours_or("post_training.group_advantages", group_advantages, grpo.group_advantages)
advantages = advantages_fn(rewards[None], 1e-4)[0]
logits = dpo_model(group_ids).detach().double().requires_grad_(True)
logps = sft.token_logps(logits, group_ids)
with torch.no_grad():
    ref_logps = sft.token_logps(reference(group_ids).double(), group_ids)
answer_mask_t = group_mask[:, 1:].double()
loss = grpo_loss_fn(logps, logps.detach(), ref_logps, advantages.double(), answer_mask_t, 0.2, 0.04)
loss.backward()
weight = answer_mask_t / answer_mask_t.sum(1, keepdim=True) / len(advantages)
g = weight * (-advantages.double()[:, None] + 0.04 * (1 - (ref_logps - logps.detach()).exp()))
probs = logits.detach()[:, :-1].softmax(-1)
onehot = F.one_hot(group_ids[:, 1:], tokenizer.vocab_size).double()
by_hand = torch.zeros_like(logits)
by_hand[:, :-1] = g[..., None] * (onehot - probs)
gap = (logits.grad - by_hand).abs().max().item()
assert gap < 1e-12
print("autograd vs hand-computed gradient on the logits: max difference < 1e-12")

# %% [markdown] slideshow={"slide_type": "subslide"}
# Now the loop (`helpers.post.grpo.train_grpo`): each step samples G = 8 answers to 4 training
# questions, rewards them with the checker, and makes 2 clipped updates. The curve is the mean
# reward of the sampled answers, step by step (temperature 1, so below the greedy accuracy).

# %% slideshow={"slide_type": "fragment"}
GRPO_STEPS = 20
started = time.perf_counter()
grpo_model = copy.deepcopy(dpo_model)
grpo_history = grpo.train_grpo(grpo_model, reference, tokenizer, train_facts, steps=GRPO_STEPS,
                               prompts_per_step=4, group_size=8, lr=3e-4, seed=0)
print(f"GRPO {GRPO_STEPS} steps, {format_duration(time.perf_counter() - started)}")
chat_grpo = {"train": sft.greedy_accuracy(grpo_model, tokenizer, train_facts),
             "held": sft.greedy_accuracy(grpo_model, tokenizer, held_facts)}
assert len(grpo_history["reward"]) == GRPO_STEPS

# %% slideshow={"slide_type": "fragment"}
fig, ax = plt.subplots(figsize=(7, 3.6))
steps_axis = range(1, GRPO_STEPS + 1)
ax.plot(steps_axis, grpo_history["reward"], alpha=0.4, label="mean reward per step")
window = 5
smooth = [sum(grpo_history["reward"][max(0, i - window + 1):i
        + 1]) / len(grpo_history["reward"][max(0, i - window + 1):i + 1])
          for i in range(GRPO_STEPS)]
ax.plot(steps_axis, smooth, label=f"mean of the last {window} steps")
ax.set(xlabel="GRPO step", ylabel="mean reward of 32 samples",
       title="GRPO on the training questions (seed 0)")
ax.legend()
plt.show()

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### Twelve seeds, three normalisations
#
# One run of 20 steps on 32 samples per step is noisy. How the loss is averaged over tokens is
# the subject of two papers, and the loop takes it as a knob (`normalise`):
#
# - **GRPO** ("sequence") averages each answer's loss over its own tokens, then over the
#   answers, so a token of a short answer weighs more than a token of a long one.
# - **DAPO** (Yu et al., 2025; "token") averages over all the tokens of the batch at once, so
#   every token weighs the same.
# - **Dr. GRPO** (Liu et al., 2025; "constant") sums over the tokens and divides by a constant,
#   the number of answers times the generation budget (9 tokens here), and also drops the
#   division by the group's std (`scale_rewards=False`), which gives a group whose answers are
#   nearly all right or all wrong a larger advantage than one split evenly.
#
# Twelve seeds of the three take longer than this notebook's minute: `python
# benchmarks/bench_grpo.py` runs them from the SFT model of section 4 (same recipe, reference =
# that model), 40 steps each, and writes `data/grpo_rewards.json`, which we read here
# (tests/benchmarks/test_bench_grpo.py reruns a short version). The three runs of one seed sample the same
# first step.

# %% slideshow={"slide_type": "fragment"}
bench = json.loads((data_dir() / "grpo_rewards.json").read_text())
methods = list(bench["methods"])
print("written by:", bench["command"], "|", bench["steps"], "steps, seeds", bench["seeds"])
fig, axes = plt.subplots(1, len(methods), figsize=(13, 3.4), sharey=True)
change = {}  # (method, seed) -> mean reward of the last 5 steps minus that of the first 5
for ax, method in zip(axes, methods, strict=True):
    curves = torch.tensor([bench["runs"][f"{method}/{seed}"]["reward"] for seed in bench["seeds"]])
    smooth_s = curves.unfold(1, 5, 1).mean(-1)  # (seeds, steps - 4): mean of 5 steps
    x = range(5, curves.shape[1] + 1)
    for row in smooth_s:
        ax.plot(x, row, color="gray", alpha=0.3, linewidth=0.8)
    ax.plot(x, smooth_s.mean(0), color="tab:blue", linewidth=2, label="mean of the seeds")
    for seed, row in zip(bench["seeds"], curves, strict=True):
        change[method, seed] = (row[-5:].mean() - row[:5].mean()).item()
    ax.set(title=f"{bench['methods'][method]['paper']} ({method})", xlabel="GRPO step")
    ax.legend()
axes[0].set_ylabel("mean reward of the last 5 steps")
fig.tight_layout()
plt.show()


# %% slideshow={"slide_type": "fragment"}
def mean_and_halfwidth(values: list[float]) -> tuple[float, float]:
    """The mean and the half-width of its 95 % Student-t interval (n - 1 = 2..15 degrees of
    freedom)."""
    t_975 = {2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262,
             10: 2.228, 11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131}[len(values) - 1]
    t = torch.tensor(values, dtype=torch.float64)
    return t.mean().item(), t_975 * (t.std() / len(values) ** 0.5).item()


seeds_b = bench["seeds"]
print("change of the mean reward, last 5 steps minus first 5")
print("seed | " + " | ".join(f"{m:>8}" for m in methods))
for seed in seeds_b:
    print(f"{seed:4} | " + " | ".join(f"{change[m, seed]:+8.2f}" for m in methods))

# %% slideshow={"slide_type": "fragment"}
summary_b = {}
for m in methods:
    mean, half = mean_and_halfwidth([change[m, s] for s in seeds_b])
    rose_n = sum(change[m, s] > 0 for s in seeds_b)
    train_acc = sum(bench["runs"][f"{m}/{s}"]["train_accuracy"] for s in seeds_b) / len(seeds_b)
    held_acc = sum(bench["runs"][f"{m}/{s}"]["held_accuracy"] for s in seeds_b) / len(seeds_b)
    summary_b[m] = (mean, half)
    print(f"{m:>8}: rose in {rose_n:2} of {len(seeds_b)} seeds, mean change {mean:+.3f} ± "
          f"{half:.3f} (95 %) "
          f"| greedy accuracy after: train {train_acc:.2f}, held-out {held_acc:.2f}")
paired = {}
for m in methods[1:]:
    paired[m] = mean_and_halfwidth([change[m, s] - change[methods[0], s] for s in seeds_b])
    print(
        f"{m} minus {methods[0]}, paired by seed: {paired[m][0]:+.3f} ± {paired[m][1]:.3f} (95 %)"
    )
print(f"SFT model before GRPO: greedy accuracy train {bench['sft_accuracy']['train']:.2f}, "
      f"held-out {bench['sft_accuracy']['held']:.2f}")
# the claims of the next paragraph: each rises on average, no difference is measurable
assert all(summary_b[m][0] - summary_b[m][1] > 0 for m in methods)
assert all(abs(paired[m][0]) < paired[m][1] for m in methods[1:])
assert all(sum(bench["runs"][f"{m}/{s}"]["train_accuracy"] for s in seeds_b) / len(seeds_b)
           < bench["sft_accuracy"]["train"] for m in methods)

# %% [markdown] slideshow={"slide_type": "subslide"}
# What the twelve seeds show: under each of the three normalisations the sampled reward rose in
# most seeds, and each mean change has a 95 % interval above zero; the paired differences
# between the methods (same seed, same first step) have intervals that contain zero. At this
# scale the normalisation makes no difference we can measure. That is no verdict on the papers:
# the bias that Dr. GRPO and DAPO remove grows with the spread of answer lengths, and ours are
# one number word each, a few characters apart, where theirs are chains of reasoning thousands
# of tokens apart. Two more readings of the table: the greedy accuracy on the training questions
# after GRPO is below the SFT model's under every method (the reward that rises is the sampled
# one, at temperature 1), and a rerun on another CPU samples other answers after a few steps and
# so gives other per-seed numbers: the summary over seeds is the claim, not any one row.

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 7. The same held-out questions after each stage (optional)

# %% slideshow={"slide_type": "fragment"}
catch_up("13_post_training", "7.")  # started here after a restart? this runs the sections above

# %% slideshow={"slide_type": "fragment"}
# NBVAL_IGNORE_OUTPUT
# Trained accuracies can move by one question from one CPU to another.
print("stage          | train questions | held-out questions")
for stage, acc in (("pretrained", chat_before), ("SFT", chat_sft), ("DPO", chat_dpo), ("GRPO",
                                                                                       chat_grpo)):
    print(f"{stage:14} | {acc['train']:15.2f} | {acc['held']:.2f}")
print(f"(chat template; {len(train_facts)} training and {len(held_facts)} held-out questions, "
      f"greedy answers; "
      f"a GPT of {sum(p.numel() for p in pretrained.parameters()):,} parameters)")
print(f"the whole notebook: {format_duration(time.perf_counter() - NOTEBOOK_START)} "
      f"(processor time: {format_duration(time.process_time() - NOTEBOOK_CPU)})")

# %% [markdown] slideshow={"slide_type": "subslide"}
# The same pipeline over the benchmark's pretraining seeds (`data/post_seeds.json`, section 2),
# counted in questions rather than fractions, with the pretrained model's prose answers beside:

# %% slideshow={"slide_type": "fragment"}
n_train_q, n_held_q = post_seeds["n_train_questions"], post_seeds["n_held_questions"]
columns = ("prose", "pretrained", "sft", "dpo", "grpo")
print(f"right answers, greedy; {n_train_q} training and {n_held_q} held-out questions (train / "
      f"held-out)")
print("pretraining seed | " + " | ".join(f"{c:>10}" for c in columns))
counts = {}
for p_seed, stages in post_seeds["stages"].items():
    counts[p_seed] = {c: (round(stages[c]["train"] * n_train_q), round(stages[c]["held"]
                                                                       * n_held_q))
                      for c in columns}
    print(f"{p_seed:>16} | " + " | ".join(f"{counts[p_seed][c][0]:4} / {counts[p_seed][c][1]:3}"
                                          for c in columns))

# %% slideshow={"slide_type": "fragment"}
n_p = len(counts)
for c in columns:
    held = [counts[p][c][1] for p in counts]
    print(f"{c:>10}: held-out right answers {min(held)}-{max(held)} of {n_held_q}, "
          f"mean {sum(held) / n_p:.1f}; training {sum(counts[p][c][0] for p in counts) / n_p:.1f} "
          f"of {n_train_q}")
sft_up = sum(counts[p]["sft"][1] > counts[p]["pretrained"][1] for p in counts)
rl_up = sum(counts[p]["grpo"][1] > counts[p]["sft"][1] for p in counts)
rl_down = sum(counts[p]["grpo"][1] < counts[p]["sft"][1] for p in counts)
print(f"held-out: SFT above the pretrained model on {sft_up} of {n_p} seeds; "
      f"DPO + GRPO above SFT on {rl_up}, below on {rl_down}")
mean_of = {c: [sum(counts[p][c][i] for p in counts) / n_p for i in (0, 1)] for c in columns}
# the claims of the next paragraph
assert all(counts[p]["sft"][0] > counts[p]["pretrained"][0] for p in counts)
assert mean_of["sft"][1] < mean_of["prose"][1] and mean_of["grpo"][0] < mean_of["sft"][0]

# %% [markdown] slideshow={"slide_type": "subslide"}
# What the seeds show, for a model of about 105 thousand parameters (printed above) trained for
# seconds. The pretrained model answers nothing in the chat template, and in prose it answers
# some held-out questions. SFT teaches the template and most training answers; on the held-out
# questions it answers a few at most, fewer on average than the same model knew in prose: at
# this scale SFT mostly stores the training answers in the new format rather than routing what
# the model knows into it. DPO and GRPO, at these budgets, lower the training accuracy on
# average and move the held-out count by at most two questions, up on some seeds and down on
# another (counted above): too small and too mixed to claim a gain. Each raises what it optimises (the preference accuracy and margin of
# section 5, the sampled reward of section 6), and greedy accuracy is another number. Every
# stage is a few lines around a loss, and the knobs (`PRETRAIN_STEPS`, `SFT_STEPS`, `DPO_STEPS`,
# `GRPO_STEPS`, the benchmarks' steps and seeds) are there to find out how much of this is the
# budget.

# %% [markdown] slideshow={"slide_type": "slide"}
# ## Check your understanding (optional)
#
# **1. Why does DPO (and GRPO) need a reference model?**
#
# <details><summary>Answer</summary>
#
# The loss only compares log-probabilities; without a reference, the cheapest way to raise
# log pi(chosen) - log pi(rejected) is to push the rejected answer's probability towards zero and
# drift anywhere else, forgetting what pretraining and SFT taught. Measuring each answer as a
# ratio to the frozen reference makes the reward "better than before", and the DPO derivation
# shows this is the optimum of reward maximisation with a KL penalty to that reference. In
# section 5 the KL to the reference grew as beta shrank.
# </details>
#
# **2. Why does LoRA's B start at zero?**
#
# <details><summary>Answer</summary>
#
# Then B A = 0 and the adapted model is exactly the pretrained one at step 0 (section 3 printed
# `True` for equal outputs). Finetuning starts from what was learned instead of from a random
# perturbation of it. A cannot also be zero: the gradient of B is (gradient of y) times A x, so
# with both zero neither would ever move.
# </details>

# %% [markdown] slideshow={"slide_type": "subslide"}
# **3. What does the KL term prevent?**
#
# <details><summary>Answer</summary>
#
# Reward hacking and collapse: without it the policy can move wherever the reward (or the
# preference loss) is satisfied, losing fluency and diversity, e.g. collapsing to one answer per
# prompt. The penalty beta * KL(pi || pi_ref) keeps it near the reference; k3 estimates that KL
# from the sampled tokens alone, without a sum over the vocabulary.
# </details>
#
# **4. Why does GRPO need no value model?**
#
# <details><summary>Answer</summary>
#
# PPO learns a value function to know what reward is "normal" for a prompt, and scores each
# answer against it. GRPO samples G answers to the same prompt and uses their mean (and std) as
# that baseline: the advantage is the answer's reward relative to its group. The price is G
# samples per prompt, and a group whose answers all get the same reward teaches nothing
# (advantages all zero), as the test of `group_advantages` shows.
# </details>
