"""Exercises of notebook 7 (the full GPT): count its parameters exactly, the next-token loss,
AdamW on one weight and on a whole model, sampling with temperature and top-k, and a cached
attention step."""

from __future__ import annotations

from collections.abc import Callable

import torch

from helpers.lab.exercises import (
    ExerciseFailed,
    exercise,
    expect_count,
    hidden_round,
    reseed,
    seeded,
)
from helpers.lab.exercises._gpt_runs import (
    HAND_BETAS,
    FixedLogits,
    adamw_mistake,
    adamw_reference,
    call_sampler,
    hand_adamw_run,
    sampling_probabilities,
    student_adamw,
    weights,
)
from helpers.model import gpt

CONFIGS = [  # (n_layers, d_model, vocab_size, context_length)
    (12, 768, 50257, 1024),  # GPT-2 small
    (2, 128, 52, 64),        # the notebook's character model
    (1, 8, 12, 4),           # the Matrix Magic notes' toy
    (24, 1024, 50257, 1024),  # GPT-2 medium
]


def _parameter_slip(got: int, n_layers: int, d: int, vocab: int, context: int,
                    expected: int) -> tuple[str, str]:
    """(what a wrong count left out or added, how to close the gap in words), from the gap's size."""
    slips = {
        vocab * d: ("the output matrix is tied to the token embedding, yet you counted it twice",
                    "count the shared token table once: the output layer adds no parameters of its own."),
        -context * d: ("the position table (context_length x d_model) is missing",
                       "add one learned vector of d_model numbers per position of the context."),
        -2 * d: ("the final LayerNorm (a gain and a bias of d_model each) is missing",
                 "add the final LayerNorm after the last block: a gain and a bias of d_model numbers."),
        -n_layers * 9 * d: ("the biases are missing (4 x d_model in attention, 5 x d_model in the MLP, per block)",
                            "every linear layer of a block has a bias as long as its output: add them, "
                            "once per block."),
        -n_layers * 4 * d: ("the two LayerNorms of each block (4 x d_model) are missing",
                            "each block has two LayerNorms, each a gain and a bias of d_model numbers."),
        -(n_layers * 13 * d + context * d + 2 * d): (
            "that is only 12 N d^2 + V d, the big matrices",
            "add the small pieces the rule of thumb leaves out: the biases and LayerNorms of every "
            "block, the position table and the final LayerNorm."),
    }
    return slips.get(got - expected, (
        f"the gap is {got - expected:+,} parameters",
        "go through the model piece by piece (embedding tables, each block's attention, MLP and "
        "LayerNorms, the final LayerNorm) and count every tensor once."))


@exercise(task="Write gpt_parameters(n_layers, d_model, vocab_size, context_length) returning the exact "
               "count of a GPT-2-style model. The check tries GPT-2 small and medium, the course's models "
               "and a toy, and names the piece a wrong count seems to miss.",
          hint="Count every tensor once: per block the four attention matrices with their biases, "
               "the two MLP matrices with their biases and two LayerNorms; then the token table "
               "(shared with the output layer), the position table and the final LayerNorm.")
def exact_parameters(student: Callable[[int, int, int, int], int]) -> str:
    configs = CONFIGS
    if hidden_round():  # a model of sizes drawn from the hidden seed, a context of one token included
        draw = seeded(42)
        n_layers, d_over_8, vocab, context = (int(torch.randint(low, high, (), generator=draw))
                                              for low, high in ((1, 10), (1, 41), (2, 300), (1, 300)))
        configs = [(n_layers, 8 * d_over_8, vocab, context), (3, 16, 5, 1)] + CONFIGS
    for n_layers, d, vocab, context in configs:
        config = gpt.GPTConfig(vocab_size=vocab, context_length=context, n_layers=n_layers,
                               n_heads=1, d_model=d)
        expected = gpt.exact_parameters(config)
        got = expect_count(student(n_layers, d, vocab, context),
                           f"the count for n_layers={n_layers}, d_model={d}")
        if got != expected:
            what, fix = _parameter_slip(got, n_layers, d, vocab, context, expected)
            raise ExerciseFailed(
                f"for n_layers={n_layers}, d_model={d}, vocab_size={vocab}, context_length={context} "
                f"you counted {got:,}, expected {expected:,}: {what}.", fix=fix)
    return "GPT-2 small: 124,439,808, to the last parameter."


def _small_model(seed: int) -> gpt.GPT:
    reseed(seed)
    return gpt.GPT(gpt.GPTConfig(vocab_size=11, context_length=8, n_layers=1, n_heads=2, d_model=8)).eval()


def _expected_next_token_loss(model: gpt.GPT, ids: torch.Tensor) -> torch.Tensor:
    logits = model(ids[:, :-1])
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten())


def _as_number(value: object, what: str) -> float:
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ExerciseFailed(f"{what} has shape {tuple(value.shape)}, not one number",
                                 fix="average over every position of every row, so that one number remains.")
        return value.item()
    if isinstance(value, (int, float)):
        return float(value)
    raise ExerciseFailed(f"{what} is a {type(value).__name__}, expected a tensor with one number",
                         fix="return the loss as a tensor (keep it a tensor, so that backward can run on it).")


@exercise(task="Write next_token_loss(gpt, ids) for windows ids (B, N + 1): the mean next-token "
               "cross-entropy, a scalar tensor, without F.cross_entropy. The check compares with "
               "F.cross_entropy on three models.",
          hint="The model reads every token but the last; the targets are every token but the first. "
               "Score each position by the log-probability it gives its target, computed stably from "
               "the logits, and return minus the mean over every position of every row.",
          forbidden=("torch.nn.functional.cross_entropy", "torch.nn.functional.nll_loss"),
          points=4)
def next_token_loss(student: Callable[[gpt.GPT, torch.Tensor], torch.Tensor]) -> str:
    generator = seeded(1)
    for seed, (batch, length) in enumerate([(3, 9), (1, 4), (2, 6)]):
        model = _small_model(seed)
        ids = torch.randint(0, 11, (batch, length), generator=generator)
        with torch.no_grad():
            expected = _expected_next_token_loss(model, ids).item()
            try:
                answer = student(model, ids)
            except ValueError as error:
                if "context_length" in str(error):
                    raise ExerciseFailed(f"ids of shape {tuple(ids.shape)} hold {length - 1} inputs and "
                                         f"{length - 1} targets, but your model read all {length} tokens",
                                         fix="run the model on ids[:, :-1] only: the last token is "
                                             "a target, never an input.") from None
                raise
            got = _as_number(answer, f"the loss for ids of shape {tuple(ids.shape)}")
            logits = model(ids[:, :-1])
            log_probs = logits.log_softmax(-1)
            picked = log_probs.gather(-1, ids[:, 1:, None])
            inputs = ids[:, :-1]  # predicting each input itself, a shift forgotten
            unshifted = -logits.log_softmax(-1).gather(-1, inputs[..., None]).mean().item()
            mistakes = {  # (what is wrong, how to fix it): the value that slip gives
                ("you scored each position on its own token",
                 "the target of position i is the token at i + 1: compare the predictions for "
                 "ids[:, :-1] with ids[:, 1:]."): unshifted,
                ("the loss is the mean, not the sum, over the positions",
                 "average the picked log-probabilities over every position of every row."): -picked.sum().item(),
                ("the sign: a loss is minus the mean log-probability of the targets (a positive number)",
                 "put a minus sign in front of the mean."): picked.mean().item(),
                ("you averaged probabilities, not log-probabilities",
                 "take the log of the softmax (log-softmax) before picking the targets."):
                    -log_probs.exp().gather(-1, ids[:, 1:, None]).mean().item(),
            }
        if abs(got - expected) > 1e-4 * max(1.0, abs(expected)):
            for (message, fix), value in mistakes.items():
                if abs(got - value) <= 1e-4 * max(1.0, abs(value)):
                    raise ExerciseFailed(message, fix=fix)
            raise ExerciseFailed(f"for ids of shape {tuple(ids.shape)} you got {got:.4f}, "
                                 f"expected {expected:.4f} (F.cross_entropy on the shifted pairs)")
    return "That is the loss every GPT trains on: each position predicts the next token."


@exercise(task="Write adamw_update(p, g, m, v, t, lr, betas, eps, weight_decay) returning the new "
               "(p, m, v). The check runs several steps against torch.optim.AdamW.",
          hint="Update the two running averages (of the gradient and of its square), correct each "
               "for starting at zero, shrink the parameter by the decay factor, then step against "
               "the corrected average divided by the square root of the corrected square, plus eps.")
def adamw_update(student: Callable) -> str:
    generator = seeded(2)
    settings = [(1e-2, (0.9, 0.999), 1e-8, 0.1), (3e-3, (0.8, 0.99), 1e-6, 0.0),
                (5e-2, (0.9, 0.95), 1e-8, 0.5)]
    for lr, betas, eps, decay in settings:
        p = torch.randn(3, 4, generator=generator, dtype=torch.float64)
        g = torch.randn(3, 4, generator=generator, dtype=torch.float64) * 0.1
        expected = adamw_reference(p, g, 4, lr, betas, eps, decay)
        got = student_adamw(student, p, g, 4, lr, betas, eps, decay)
        for step, (a, b) in enumerate(zip(got, expected, strict=True), start=1):
            if not torch.allclose(a.to(b.dtype), b, rtol=1e-7, atol=1e-9):
                mistake = adamw_mistake(got[0].to(p.dtype), p, g, lr, betas, eps, decay)
                if mistake:
                    raise ExerciseFailed(mistake[0], fix=mistake[1])
                raise ExerciseFailed(
                    f"with lr={lr}, betas={betas}, eps={eps}, weight_decay={decay}, step {step} moved "
                    f"the parameter by up to {(a.to(b.dtype) - b).abs().max().item():.2e} more or less "
                    "than torch.optim.AdamW",
                    fix="check that t is the step number, counting from 1, and that m and v you return "
                        "are the updated averages (not the bias-corrected ones).")
    return "Four steps, three settings: the same parameters as torch.optim.AdamW."


def _attention_last_row(x: torch.Tensor, w_q: torch.Tensor, w_k: torch.Tensor,
                        w_v: torch.Tensor) -> torch.Tensor:
    """Full causal single-head attention over x (B, T, d), its last row (B, 1, d_h)."""
    q, k, v = x @ w_q, x @ w_k, x @ w_v
    n = x.shape[1]
    scores = (q @ k.transpose(-2, -1)) / k.shape[-1] ** 0.5
    scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    return (scores.softmax(-1) @ v)[:, -1:]


@exercise(task="Write cache_step(x_new, w_q, w_k, w_v, keys, values) returning (output, keys, values) "
               "after one new token. The check compares with attention over the whole sequence.",
          hint="Project only the new token to its query, key and value; append its key and value "
               "to the stored ones along the token axis; let its query attend to all of them (scaled "
               "scores, softmax over the keys, weighted sum of the values), no mask needed.")
def cache_step(student: Callable) -> str:
    generator = seeded(3)
    for batch, past, d, d_h in [(1, 1, 4, 2), (2, 5, 8, 4), (3, 9, 6, 3)]:
        x = torch.randn(batch, past + 1, d, generator=generator)
        w_q, w_k, w_v = (torch.randn(d, d_h, generator=generator) for _ in range(3))
        keys, values = x[:, :past] @ w_k, x[:, :past] @ w_v
        expected = _attention_last_row(x, w_q, w_k, w_v)
        result = student(x[:, past:], w_q, w_k, w_v, keys.clone(), values.clone())
        if not (isinstance(result, tuple) and len(result) == 3
                and all(isinstance(r, torch.Tensor) for r in result)):
            raise ExerciseFailed(f"the result is a {type(result).__name__}, not a tuple of three tensors",
                                 fix="return the tuple (out, keys, values): the caller keeps the grown "
                                     "cache for the next token.")
        out, new_keys, new_values = result
        want = (batch, past + 1, d_h)
        if tuple(new_keys.shape) != want or tuple(new_values.shape) != want:
            raise ExerciseFailed(f"with {past} stored token(s) the returned keys and values have shapes "
                                 f"{tuple(new_keys.shape)} and {tuple(new_values.shape)}, expected "
                                 f"{want}: append the new token's k and v along the token axis, dim=1",
                                 fix="concatenate along the axis that counts tokens, the middle one "
                                     "of (B, t, d_h).")
        if not torch.allclose(new_keys, x @ w_k, atol=1e-5) or not torch.allclose(new_values, x @ w_v, atol=1e-5):
            raise ExerciseFailed("the returned keys and values are not the stored ones followed by the "
                                 "new token's (x_new @ w_k and x_new @ w_v), in that order",
                                 fix="put the stored keys first and the new token's key last; the same "
                                     "for the values.")
        if tuple(out.shape) != tuple(expected.shape):
            raise ExerciseFailed(f"out has shape {tuple(out.shape)}, expected {tuple(expected.shape)}",
                                 fix="only the new token's query attends: one row per batch entry.")
        if not torch.allclose(out, expected, atol=1e-5):
            q = x[:, past:] @ w_q
            past_only = ((q @ keys.transpose(-2, -1)) / d_h ** 0.5).softmax(-1) @ values
            unscaled = (q @ (x @ w_k).transpose(-2, -1)).softmax(-1) @ (x @ w_v)
            if torch.allclose(out, past_only, atol=1e-5):
                raise ExerciseFailed("the new token attended to the stored tokens only",
                                     fix="append its own key and value first: it may see itself.")
            if torch.allclose(out, unscaled, atol=1e-5):
                raise ExerciseFailed("the scores are not scaled: divide them by sqrt(d_h) before the softmax",
                                     fix="divide the scores by the square root of the head size.")
            raise ExerciseFailed(f"with {past} stored token(s), out differs from the last row of full "
                                 f"causal attention by up to {(out - expected).abs().max().item():.2e}")
    return "One token in, one row out: the same as recomputing everything and keeping the last row."


# --- AdamW on every weight of a model ---------------------------------------------------------


HAND_DECAY, HAND_RATES = 0.2, [1e-2, 5e-3, 2e-2]


@exercise(task="Write the class HandAdamW(update, matrices, vectors, betas, eps, weight_decay) with "
               "a method step(lr): AdamW on every weight, running `update` on each tensor with its "
               "own m and v, decaying the matrices only. The check runs three steps against "
               "torch.optim.AdamW with two parameter groups.",
          hint="In the constructor keep, for every weight, its running averages (zeros of its shape) "
               "and its decay: weight_decay for the matrices, zero for the vectors; start the step "
               "count at zero. In step, without recording gradients, count one more step, then for "
               "each weight call update with its gradient, store the new averages and copy the new "
               "value into the weight in place.",
          points=3)
def hand_adamw(student: type) -> str:
    from helpers.training.by_hand import adamw_update

    if not isinstance(student, type):
        raise ExerciseFailed(f"the answer is a {type(student).__name__}, not a class",
                             fix="pass the class HandAdamW itself to check, not an instance or a function.")
    generator = seeded(4)
    matrices, vectors = weights(generator)
    theirs = [torch.nn.Parameter(p.detach().clone()) for p in (*matrices, *vectors)]
    start = [p.detach().clone() for p in matrices], [p.detach().clone() for p in vectors]
    reference = torch.optim.AdamW([{"params": theirs[:2], "weight_decay": HAND_DECAY},
                                   {"params": theirs[2:], "weight_decay": 0.0}],
                                  lr=1.0, betas=HAND_BETAS, eps=1e-8, foreach=False)
    grads = [[torch.randn(p.shape, generator=generator, dtype=torch.float64) for p in theirs]
             for _ in HAND_RATES]
    try:
        optimizer = student(adamw_update, matrices, vectors, betas=HAND_BETAS, eps=1e-8,
                            weight_decay=HAND_DECAY)
    except TypeError as error:
        raise ExerciseFailed(f"HandAdamW(update, matrices, vectors, betas=..., eps=..., weight_decay=...) "
                             f"failed: {error}",
                             fix="keep the constructor's arguments as the answer cell names them.") from None
    ours = [*matrices, *vectors]
    for step, (grad, lr) in enumerate(zip(grads, HAND_RATES, strict=True), start=1):
        before = [p.detach().clone() for p in ours]
        for mine, other, g in zip(ours, theirs, grad, strict=True):
            mine.grad, other.grad = g.clone(), g.clone()
        try:
            optimizer.step(lr)
        except RuntimeError as error:
            if "leaf Variable" in str(error) or "requires grad" in str(error):
                raise ExerciseFailed("step changed a weight in place while PyTorch records gradients, "
                                     "and PyTorch refused",
                                     fix="run step without recording gradients (decorate it with "
                                         "torch.no_grad, or wrap its body in that block).") from None
            raise
        for group in reference.param_groups:
            group["lr"] = lr
        reference.step()
        if all(torch.equal(a.detach(), b) for a, b in zip(ours, before, strict=True)):
            raise ExerciseFailed(f"after step {step} the model's weights had not moved",
                                 fix="write each new value into the weight tensor itself, in place "
                                     "(copy it into the weight); giving a name a new tensor leaves "
                                     "the model's weights as they were.")
        if all(torch.allclose(a.detach(), b.detach(), rtol=1e-9, atol=1e-12) for a, b in zip(ours, theirs, strict=True)):
            continue
        got = [p.detach() for p in ours]
        slips = {
            ("the biases and gains (the vectors) were decayed too",
             "decay the matrices only: give every vector a weight decay of zero."):
                dict(decays=(HAND_DECAY, HAND_DECAY)),
            ("the matrices were not decayed",
             "give every matrix the weight_decay you were given, every vector zero."):
                dict(decays=(0.0, 0.0)),
            ("the step number t did not grow from step to step",
             "count the steps in the optimiser: one more at the start of every step, from 1."):
                dict(decays=(HAND_DECAY, 0.0), t_of=lambda _: 1),
            ("m and v were not kept from one step to the next",
             "store the averages update returns, per weight, and hand them back at the next step."):
                dict(decays=(HAND_DECAY, 0.0), keep_state=False),
        }
        for (what, fix), slip in slips.items():
            wrong = hand_adamw_run(*start, grads[:step], HAND_RATES[:step], **slip)[-1]
            if all(torch.allclose(a, b, rtol=1e-9, atol=1e-12) for a, b in zip(got, wrong, strict=True)):
                raise ExerciseFailed(what, fix=fix)
        worst = max((a.detach() - b.detach()).abs().max().item() for a, b in zip(ours, theirs, strict=True))
        raise ExerciseFailed(f"after step {step} a weight differs from torch.optim.AdamW's by {worst:.2e}",
                             fix="for every weight call update with the weight, its gradient, its own "
                                 "m and v, the step number, lr, the betas, eps and its decay; keep "
                                 "the m and v it returns and copy the new weight in place.")
    return "Three steps, two groups: the same weights as torch.optim.AdamW."


# --- sampling: temperature and top-k ------------------------------------------------------------


@exercise(task="Write my_generate(gpt, prompt, max_new_tokens, temperature=1.0, top_k=None, "
               "generator=None) returning the prompt (B, S) followed by max_new_tokens sampled tokens. "
               "The check compares greedy runs with generate and the frequencies of thousands of draws "
               "with the probabilities they should have.",
          hint="Repeat once per new token: run the model on what it can read (the last context-length "
               "tokens) and keep its last position's prediction. Greedy settings (temperature "
               "zero, or a top-k of one) take the most likely token; otherwise the temperature and "
               "the top-k cut change the distribution, and one token per row is drawn from it with "
               "the generator you were given. Append the token and go on.",
          points=3)
def sample_tokens(student: Callable) -> str:
    from helpers.model.generation import generate

    model = _small_model(5)
    prompt = torch.randint(0, 11, (2, 3), generator=seeded(5))
    for settings in (dict(temperature=0.0), dict(temperature=1.0, top_k=1)):
        got = call_sampler(student, model, prompt, 10, **settings)
        expected = generate(model, prompt, 10, use_cache=False, **settings)
        if not torch.equal(got, expected):
            raise ExerciseFailed(f"with {settings} (greedy) your tokens {got[:, 3:].tolist()} differ from "
                                 f"generate's {expected[:, 3:].tolist()}",
                                 fix="at temperature zero, or with top-k one, take the most likely token "
                                     "of the last position at every step, without drawing.")
    draws = [call_sampler(student, model, prompt, 10, temperature=1.0,
                           generator=seeded(11)) for _ in range(2)]
    if not torch.equal(*draws):
        raise ExerciseFailed("two runs with generators seeded alike drew different tokens",
                             fix="pass the generator you were given to the draw (torch.multinomial "
                                 "takes it as generator=...).")
    rows = 4000
    one_prompt = prompt[:1].expand(rows, -1)
    logits = torch.tensor([[0.0, 2.0, 1.0, -1.0, 0.5, 0.0, 1.5, -0.5, 0.0, 1.0, 0.0],
                           [1.0, 0.0, 0.5, 2.0, 0.0, -1.0, 0.0, 1.0, 0.5, 0.0, 0.0],
                           [2.5, 0.0, 1.0, 0.3, -1.0, 1.8, 0.0, 0.6, 0.0, 2.0, -0.5]])
    fixed = FixedLogits(logits)  # the last row (position 2) is the one a sampler should use
    for temperature, top_k in ((0.7, None), (1.5, 3)):
        got = call_sampler(student, fixed, one_prompt, 1, temperature=temperature, top_k=top_k,
                            generator=seeded(12))[:, -1]
        counts = torch.bincount(got, minlength=logits.shape[-1]).double() / rows
        right = sampling_probabilities(logits[-1], temperature, top_k)
        if top_k is not None and (counts[right == 0] > 0).any():
            raise ExerciseFailed(f"with top_k={top_k} you drew tokens outside the {top_k} most likely",
                                 fix="set every logit below the k-th largest of its row to minus "
                                     "infinity before the softmax.")
        if (counts - right).abs().max() < 0.04:
            continue
        slips = {
            ("the temperature was not applied", "divide the logits by the temperature before the softmax."):
                sampling_probabilities(logits[-1], 1.0, top_k),
            ("the logits were multiplied by the temperature", "divide the logits by it instead."):
                sampling_probabilities(logits[-1], 1 / temperature, top_k),
            ("you drew from the first position's prediction",
             "the next token comes from the last position's logits."):
                sampling_probabilities(logits[0], temperature, top_k),
            ("the context was cropped one token short: the model saw one token fewer than its context "
             "length allows, so the draw followed the second-to-last position's prediction",
             "keep the last context-length tokens (all of them while the sequence fits), not one fewer."):
                sampling_probabilities(logits[-2], temperature, top_k),
        }
        for (what, fix), probabilities in slips.items():
            if (counts - probabilities).abs().max() < 0.04:
                raise ExerciseFailed(f"{what} (temperature {temperature}, top_k {top_k})", fix=fix)
        worst = int((counts - right).abs().argmax())
        raise ExerciseFailed(f"at temperature {temperature}, top_k {top_k}, token {worst} came up in "
                             f"{counts[worst]:.1%} of {rows:,} draws, but its probability is {right[worst]:.1%}",
                             fix="draw from the softmax of the last position's logits, divided by the "
                                 "temperature, after removing all but the top k.")
    return "Greedy runs match generate, and thousands of draws follow the right probabilities."
