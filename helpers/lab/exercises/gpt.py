"""Exercises of notebook 7 (the full GPT): count its parameters exactly, write one greedy step."""

from __future__ import annotations

from collections.abc import Callable

import torch

from helpers.lab.exercises import ExerciseFailed, exercise, expect_count
from helpers.model import gpt

CONFIGS = [  # (n_layers, d_model, vocab_size, context_length)
    (12, 768, 50257, 1024),  # GPT-2 small
    (2, 128, 52, 64),        # the notebook's character model
    (1, 8, 12, 4),           # the Matrix Magic notes' toy
    (24, 1024, 50257, 1024),  # GPT-2 medium
]


def _diagnose(got: int, n_layers: int, d: int, vocab: int, context: int, expected: int) -> str:
    """A guess at what a wrong count left out or added, from the size of the gap."""
    gaps = {
        vocab * d: "the output matrix is tied to the token embedding: count it once",
        -context * d: "the position table (context_length x d_model) is missing",
        -2 * d: "the final LayerNorm (a gain and a bias of d_model each) is missing",
        -n_layers * 9 * d: "the biases are missing: 4 x d_model in attention, 5 x d_model in the MLP",
        -n_layers * 4 * d: "the two LayerNorms of each block (4 x d_model) are missing",
        -(n_layers * 13 * d + context * d + 2 * d): "only 12 N d^2 + V d: add biases, norms and positions",
    }
    return gaps.get(got - expected, f"the gap is {got - expected:+,} parameters")


@exercise(task="Write gpt_parameters(n_layers, d_model, vocab_size, context_length) returning the exact "
               "count of a GPT-2-style model. The check tries GPT-2 small and medium, the course's models "
               "and a toy, and names the piece a wrong count seems to miss.",
          hint="Per block: 4 d^2 + 4d (W_Q, W_K, W_V, W_O and biases), 8 d^2 + 5d (d -> 4d -> d "
               "and biases), 4d (two LayerNorms). Then V d (tied, once), context x d, and 2d.")
def exact_parameters(student: Callable[[int, int, int, int], int]) -> str:
    for n_layers, d, vocab, context in CONFIGS:
        config = gpt.GPTConfig(vocab_size=vocab, context_length=context, n_layers=n_layers,
                               n_heads=1, d_model=d)
        expected = gpt.exact_parameters(config)
        got = expect_count(student(n_layers, d, vocab, context),
                           f"the count for n_layers={n_layers}, d_model={d}")
        if got != expected:
            raise ExerciseFailed(
                f"for n_layers={n_layers}, d_model={d}, vocab_size={vocab}, context_length={context} "
                f"you counted {got:,}, expected {expected:,}: {_diagnose(got, n_layers, d, vocab, context, expected)}.")
    return "GPT-2 small: 124,439,808, to the last parameter."


def _small_model(seed: int) -> gpt.GPT:
    torch.manual_seed(seed)
    return gpt.GPT(gpt.GPTConfig(vocab_size=11, context_length=8, n_layers=1, n_heads=2, d_model=8)).eval()


@exercise(task="Write greedy_next(gpt, ids) for ids (B, N): the next token of each row, shape (B, 1). "
               "The check compares with the model's most likely token, on prompts longer than its context too.",
          hint="Crop to the last model.config.context_length tokens, run the model, keep the "
               "logits of the last position ([:, -1]), argmax over the vocabulary with keepdim=True.")
def greedy_step(student: Callable[[gpt.GPT, torch.Tensor], torch.Tensor]) -> str:
    generator = torch.Generator().manual_seed(0)
    for seed, (batch, length) in enumerate([(1, 3), (4, 8), (2, 13)]):
        model = _small_model(seed)
        ids = torch.randint(0, 11, (batch, length), generator=generator)
        expected = model(ids[:, -8:])[:, -1].argmax(-1, keepdim=True)
        try:
            with torch.no_grad():
                got = student(model, ids)
        except ValueError as error:
            if "context_length" in str(error):
                raise ExerciseFailed(f"ids of shape {tuple(ids.shape)} are longer than the model's "
                                     "context of 8: keep only the last context_length tokens") from None
            raise
        if not isinstance(got, torch.Tensor):
            raise ExerciseFailed(f"return a tensor of ids, got {type(got).__name__}")
        if got.shape == (batch,):
            raise ExerciseFailed(f"the result has shape {tuple(got.shape)}: keep the token axis, "
                                 f"(B, 1) = {tuple(expected.shape)}, with keepdim=True")
        if got.shape != expected.shape:
            raise ExerciseFailed(f"for ids of shape {tuple(ids.shape)} the result has shape "
                                 f"{tuple(got.shape)}, expected {tuple(expected.shape)}")
        if not torch.equal(got.long(), expected):
            first = model(ids[:, -8:])[:, 0].argmax(-1, keepdim=True)
            if torch.equal(got.long(), first):
                raise ExerciseFailed("you picked the prediction of the first position: the next "
                                     "token comes from the last one, [:, -1]")
            raise ExerciseFailed(f"for ids {ids.tolist()} you chose {got.flatten().tolist()}, "
                                 f"expected {expected.flatten().tolist()}")
    return "That is one step of greedy decoding; generate() repeats it, appending each token."


def _expected_next_token_loss(model: gpt.GPT, ids: torch.Tensor) -> torch.Tensor:
    logits = model(ids[:, :-1])
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten())


def _as_number(value: object, what: str) -> float:
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ExerciseFailed(f"{what} has shape {tuple(value.shape)}: return one number, the "
                                 "mean over every position of every row")
        return value.item()
    if isinstance(value, (int, float)):
        return float(value)
    raise ExerciseFailed(f"{what} is a {type(value).__name__}, expected a tensor with one number")


@exercise(task="Write next_token_loss(gpt, ids) for windows ids (B, N + 1): the mean next-token "
               "cross-entropy, a scalar tensor. The check compares with F.cross_entropy on three models.",
          hint="inputs = ids[:, :-1], targets = ids[:, 1:]; log_probs = logits minus the "
               "logsumexp over the vocabulary; pick each target's log-probability with "
               "gather(-1, targets[..., None]) and return minus their mean.")
def next_token_loss(student: Callable[[gpt.GPT, torch.Tensor], torch.Tensor]) -> str:
    generator = torch.Generator().manual_seed(1)
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
                                         f"{length - 1} targets: run the model on ids[:, :-1] only") from None
                raise
            got = _as_number(answer, f"the loss for ids of shape {tuple(ids.shape)}")
            logits = model(ids[:, :-1])
            log_probs = logits.log_softmax(-1)
            picked = log_probs.gather(-1, ids[:, 1:, None])
            inputs = ids[:, :-1]  # predicting each input itself, a shift forgotten
            unshifted = -logits.log_softmax(-1).gather(-1, inputs[..., None]).mean().item()
            mistakes = {
                "you scored each position on its own token: the target of position i is the token "
                "at i + 1, so compare model(ids[:, :-1]) with ids[:, 1:]": unshifted,
                "the loss is the mean, not the sum, over the positions": -picked.sum().item(),
                "the sign: the loss is minus the mean log-probability of the targets (a positive "
                "number)": picked.mean().item(),
                "take the log of the softmax: you averaged probabilities, not log-probabilities":
                    -log_probs.exp().gather(-1, ids[:, 1:, None]).mean().item(),
            }
        if abs(got - expected) > 1e-4 * max(1.0, abs(expected)):
            for message, value in mistakes.items():
                if abs(got - value) <= 1e-4 * max(1.0, abs(value)):
                    raise ExerciseFailed(message)
            raise ExerciseFailed(f"for ids of shape {tuple(ids.shape)} you got {got:.4f}, "
                                 f"expected {expected:.4f} (F.cross_entropy on the shifted pairs)")
    return "That is the loss every GPT trains on: each position predicts the next token."


def _adamw_reference(p: torch.Tensor, g: torch.Tensor, steps: int, lr: float, betas: tuple[float, float],
                     eps: float, weight_decay: float) -> list[torch.Tensor]:
    """The parameter after each of `steps` steps of torch.optim.AdamW with the gradient g."""
    param = torch.nn.Parameter(p.clone())
    optimizer = torch.optim.AdamW([param], lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                                  foreach=False)
    out = []
    for _ in range(steps):
        param.grad = g.clone()
        optimizer.step()
        out.append(param.detach().clone())
    return out


def _student_adamw(student: Callable, p: torch.Tensor, g: torch.Tensor, steps: int, lr: float,
                   betas: tuple[float, float], eps: float, weight_decay: float) -> list[torch.Tensor]:
    p, m, v = p.clone(), torch.zeros_like(p), torch.zeros_like(p)
    out = []
    for t in range(1, steps + 1):
        result = student(p.clone(), g.clone(), m.clone(), v.clone(), t, lr, betas, eps, weight_decay)
        if not (isinstance(result, tuple) and len(result) == 3
                and all(isinstance(r, torch.Tensor) for r in result)):
            raise ExerciseFailed(f"return the tuple (param, m, v) of three tensors, got {type(result).__name__}")
        p, m, v = result
        if p.shape != g.shape or m.shape != g.shape or v.shape != g.shape:
            raise ExerciseFailed(f"param, m and v must keep the parameter's shape {tuple(g.shape)}, "
                                 f"got {tuple(p.shape)}, {tuple(m.shape)}, {tuple(v.shape)}")
        out.append(p.clone())
    return out


def _adamw_mistake(got: torch.Tensor, p: torch.Tensor, g: torch.Tensor, lr: float,
                   betas: tuple[float, float], eps: float, decay: float) -> str | None:
    """Name the usual slip that explains a wrong first step, if one does."""
    b1, b2 = betas
    m, v = (1 - b1) * g, (1 - b2) * g * g
    candidates = {
        "no bias correction: divide m by 1 - beta1^t and v by 1 - beta2^t (t counts from 1)":
            p * (1 - lr * decay) - lr * m / (v.sqrt() + eps),
        "weight decay is decoupled in AdamW: shrink the parameter by (1 - lr * weight_decay), "
        "do not add weight_decay * param to the gradient (that is Adam with L2)":
            p - lr * ((1 - b1) * (g + decay * p) / (1 - b1)) / (
                ((1 - b2) * (g + decay * p) ** 2 / (1 - b2)).sqrt() + eps),
        "the weight decay is missing: multiply the parameter by (1 - lr * weight_decay)":
            p - lr * (m / (1 - b1)) / ((v / (1 - b2)).sqrt() + eps),
        "divide by the square root of v-hat, plus eps: sqrt(v_hat) + eps":
            p * (1 - lr * decay) - lr * (m / (1 - b1)) / ((v / (1 - b2)) + eps),
    }
    for message, value in candidates.items():
        if torch.allclose(got, value, rtol=1e-5, atol=1e-7):
            return message
    return None


@exercise(task="Write adamw_update(p, g, m, v, t, lr, betas, eps, weight_decay) returning the new "
               "(p, m, v). The check runs several steps against torch.optim.AdamW.",
          hint="p = p * (1 - lr * weight_decay); m = beta1 * m + (1 - beta1) * g; "
               "v = beta2 * v + (1 - beta2) * g * g; m_hat = m / (1 - beta1 ** t); "
               "v_hat = v / (1 - beta2 ** t); p = p - lr * m_hat / (sqrt(v_hat) + eps).")
def adamw_update(student: Callable) -> str:
    generator = torch.Generator().manual_seed(2)
    settings = [(1e-2, (0.9, 0.999), 1e-8, 0.1), (3e-3, (0.8, 0.99), 1e-6, 0.0),
                (5e-2, (0.9, 0.95), 1e-8, 0.5)]
    for lr, betas, eps, decay in settings:
        p = torch.randn(3, 4, generator=generator, dtype=torch.float64)
        g = torch.randn(3, 4, generator=generator, dtype=torch.float64) * 0.1
        expected = _adamw_reference(p, g, 4, lr, betas, eps, decay)
        got = _student_adamw(student, p, g, 4, lr, betas, eps, decay)
        for step, (a, b) in enumerate(zip(got, expected, strict=True), start=1):
            if not torch.allclose(a.to(b.dtype), b, rtol=1e-7, atol=1e-9):
                mistake = _adamw_mistake(got[0].to(p.dtype), p, g, lr, betas, eps, decay)
                if mistake:
                    raise ExerciseFailed(mistake)
                raise ExerciseFailed(
                    f"with lr={lr}, betas={betas}, eps={eps}, weight_decay={decay}, step {step} moved "
                    f"the parameter by up to {(a.to(b.dtype) - b).abs().max().item():.2e} more or less "
                    "than torch.optim.AdamW (is t the step number, counting from 1?)")
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
          hint="q, k, v = x_new @ w_q, x_new @ w_k, x_new @ w_v (each (B, 1, d_h)); keys = "
               "cat([keys, k], dim=1), the same for values; weights = softmax(q @ keys^T / "
               "sqrt(d_h)) over the last axis; return (weights @ values, keys, values).")
def cache_step(student: Callable) -> str:
    generator = torch.Generator().manual_seed(3)
    for batch, past, d, d_h in [(1, 1, 4, 2), (2, 5, 8, 4), (3, 9, 6, 3)]:
        x = torch.randn(batch, past + 1, d, generator=generator)
        w_q, w_k, w_v = (torch.randn(d, d_h, generator=generator) for _ in range(3))
        keys, values = x[:, :past] @ w_k, x[:, :past] @ w_v
        expected = _attention_last_row(x, w_q, w_k, w_v)
        result = student(x[:, past:], w_q, w_k, w_v, keys.clone(), values.clone())
        if not (isinstance(result, tuple) and len(result) == 3
                and all(isinstance(r, torch.Tensor) for r in result)):
            raise ExerciseFailed(f"return the tuple (out, keys, values) of three tensors, got "
                                 f"{type(result).__name__}")
        out, new_keys, new_values = result
        want = (batch, past + 1, d_h)
        if tuple(new_keys.shape) != want or tuple(new_values.shape) != want:
            raise ExerciseFailed(f"with {past} stored token(s) the returned keys and values have shapes "
                                 f"{tuple(new_keys.shape)} and {tuple(new_values.shape)}, expected "
                                 f"{want}: append the new token's k and v along the token axis, dim=1")
        if not torch.allclose(new_keys, x @ w_k, atol=1e-5) or not torch.allclose(new_values, x @ w_v, atol=1e-5):
            raise ExerciseFailed("the returned keys and values are not the stored ones followed by the "
                                 "new token's (x_new @ w_k and x_new @ w_v), in that order")
        if tuple(out.shape) != tuple(expected.shape):
            raise ExerciseFailed(f"out has shape {tuple(out.shape)}, expected {tuple(expected.shape)}: "
                                 "one row (the new token) per batch entry")
        if not torch.allclose(out, expected, atol=1e-5):
            q = x[:, past:] @ w_q
            past_only = ((q @ keys.transpose(-2, -1)) / d_h ** 0.5).softmax(-1) @ values
            unscaled = (q @ (x @ w_k).transpose(-2, -1)).softmax(-1) @ (x @ w_v)
            if torch.allclose(out, past_only, atol=1e-5):
                raise ExerciseFailed("the new token attended to the stored tokens only: append its own "
                                     "key and value first, it may see itself")
            if torch.allclose(out, unscaled, atol=1e-5):
                raise ExerciseFailed("divide the scores by sqrt(d_h) before the softmax")
            raise ExerciseFailed(f"with {past} stored token(s), out differs from the last row of full "
                                 f"causal attention by up to {(out - expected).abs().max().item():.2e}")
    return "One token in, one row out: the same as recomputing everything and keeping the last row."
