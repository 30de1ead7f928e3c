"""Notebook 7's checkers (helpers/lab/exercises/gpt.py): every correct formulation passes,
each usual slip fails with a message that names it, and a stub hears what to write."""

from __future__ import annotations

import time

import pytest
import torch
import torch.nn.functional as F

import helpers.lab.exercises as exercises
from helpers.lab.exercises import ExerciseFailed, evaluate, get
from helpers.model.gpt import GPTConfig, build_without_weights, count_parameters

from .judging import named


def test_check_gives_up_on_a_function_that_never_returns(capsys):
    def endless(*args: int) -> int:
        while True:
            pass

    started = time.perf_counter()
    assert exercises.check("gpt.exact_parameters", endless, time_limit=0.5) is None
    assert time.perf_counter() - started < 10
    out = capsys.readouterr().out
    assert "did not return within 0.5 s" in out and "Traceback" not in out


def test_check_gives_up_outside_the_main_thread_too():
    import threading

    stop = threading.Event()

    def endless_until_stopped(*args: int) -> int:
        while not stop.is_set():
            time.sleep(0.01)
        return 0

    verdict: list[tuple[bool, str]] = []
    worker = threading.Thread(target=lambda: verdict.append(
        exercises.evaluate("gpt.exact_parameters", endless_until_stopped, time_limit=0.3)))
    worker.start()
    worker.join(10)
    stop.set()  # let the abandoned checker thread end
    assert verdict and not verdict[0][0] and "did not return within 0.3 s" in verdict[0][1]


def verdict(name: str, answer) -> str:
    """The checker's praise for a right answer, or its message for a wrong one."""
    try:
        return "passed: " + get(name).checker(answer)
    except ExerciseFailed as failure:
        return str(failure)


def by_formula(n_layers: int, d: int, vocab: int, context: int) -> int:
    return n_layers * (12 * d * d + 13 * d) + vocab * d + context * d + 2 * d


def by_building_it(n_layers: int, d: int, vocab: int, context: int) -> int:
    """Another correct way: build the model on the meta device and count."""
    config = GPTConfig(vocab_size=vocab, context_length=context, n_layers=n_layers, n_heads=1, d_model=d)
    return count_parameters(build_without_weights(config))


@pytest.mark.parametrize("answer", [by_formula, by_building_it])
def test_parameter_counts_by_formula_or_by_building_pass(answer):
    assert verdict("gpt.exact_parameters", answer).startswith("passed")


@pytest.mark.parametrize("answer, named", [
    (lambda n, d, v, c: by_formula(n, d, v, c) - c * d, "position table"),
    (lambda n, d, v, c: by_formula(n, d, v, c) + v * d, "tied"),
    (lambda n, d, v, c: by_formula(n, d, v, c) - n * 9 * d, "biases are missing"),
    (lambda n, d, v, c: 12 * n * d * d + v * d, "only 12 N d^2"),
])
def test_parameter_count_mistakes_are_named(answer, named):
    assert named in verdict("gpt.exact_parameters", answer)


def loss_by_gather(gpt, ids):
    log_probs = gpt(ids[:, :-1]).log_softmax(-1)
    return -log_probs.gather(-1, ids[:, 1:, None]).mean()


def loss_by_cross_entropy(gpt, ids):
    """Another correct way: PyTorch's cross-entropy on the flattened positions."""
    return F.cross_entropy(gpt(ids[:, :-1]).flatten(0, 1), ids[:, 1:].flatten())


def loss_by_logsumexp(gpt, ids):
    """Another correct way: log-probabilities as logits minus their logsumexp."""
    logits = gpt(ids[:, :-1])
    return -(logits - logits.logsumexp(-1, keepdim=True)).gather(-1, ids[:, 1:, None]).mean()


@pytest.mark.parametrize("answer", [loss_by_gather, loss_by_logsumexp])
def test_next_token_losses_pass(answer):
    assert verdict("gpt.next_token_loss", answer).startswith("passed")


def test_next_token_loss_refuses_pytorchs_cross_entropy_by_name():
    from helpers.lab.exercises import evaluate

    passed, said = evaluate("gpt.next_token_loss", loss_by_cross_entropy)
    assert not passed and "F.cross_entropy" in said and "write yourself" in said
    nll = evaluate("gpt.next_token_loss", lambda gpt, ids: F.nll_loss(
        gpt(ids[:, :-1]).log_softmax(-1).flatten(0, 1), ids[:, 1:].flatten()))
    assert not nll[0] and "F.nll_loss" in nll[1]


@pytest.mark.parametrize("answer, named", [
    (lambda gpt, ids: -gpt(ids[:, :-1]).log_softmax(-1).gather(-1, ids[:, :-1, None]).mean(),
     "its own token"),
    (lambda gpt, ids: -gpt(ids[:, :-1]).log_softmax(-1).gather(-1, ids[:, 1:, None]).sum(),
     "mean, not the sum"),
    (lambda gpt, ids: gpt(ids[:, :-1]).log_softmax(-1).gather(-1, ids[:, 1:, None]).mean(), "sign"),
])
def test_next_token_loss_mistakes_are_named(answer, named):
    assert named in verdict("gpt.next_token_loss", answer)


def adamw(p, g, m, v, t, lr, betas, eps, weight_decay):
    beta1, beta2 = betas
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    m_hat, v_hat = m / (1 - beta1 ** t), v / (1 - beta2 ** t)
    return p * (1 - lr * weight_decay) - lr * m_hat / (v_hat.sqrt() + eps), m, v


def adamw_in_place(p, g, m, v, t, lr, betas, eps, weight_decay):
    """Another correct way: PyTorch's in-place operations, as torch.optim.AdamW writes them."""
    beta1, beta2 = betas
    m.lerp_(g, 1 - beta1)
    v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
    p.mul_(1 - lr * weight_decay)
    denominator = (v / (1 - beta2 ** t)).sqrt().add_(eps)
    p.addcdiv_(m, denominator, value=-lr / (1 - beta1 ** t))
    return p, m, v


@pytest.mark.parametrize("answer", [adamw, adamw_in_place])
def test_adamw_updates_pass(answer):
    assert verdict("gpt.adamw_update", answer).startswith("passed")


def no_bias_correction(p, g, m, v, t, lr, betas, eps, weight_decay):
    beta1, beta2 = betas
    m, v = beta1 * m + (1 - beta1) * g, beta2 * v + (1 - beta2) * g * g
    return p * (1 - lr * weight_decay) - lr * m / (v.sqrt() + eps), m, v


def l2_instead_of_decay(p, g, m, v, t, lr, betas, eps, weight_decay):
    return adamw(p, g + weight_decay * p, m, v, t, lr, betas, eps, 0.0)


@pytest.mark.parametrize("answer, named", [
    (no_bias_correction, "no bias correction"),
    (l2_instead_of_decay, "decoupled"),
    (lambda p, g, m, v, t, lr, betas, eps, wd: adamw(p, g, m, v, t, lr, betas, eps, 0.0), "decay is missing"),
])
def test_adamw_mistakes_are_named(answer, named):
    assert named in verdict("gpt.adamw_update", answer)


def cache_step(x_new, w_q, w_k, w_v, keys, values):
    q = x_new @ w_q
    keys, values = torch.cat([keys, x_new @ w_k], dim=1), torch.cat([values, x_new @ w_v], dim=1)
    weights = (q @ keys.transpose(-2, -1) / keys.shape[-1] ** 0.5).softmax(-1)
    return weights @ values, keys, values


def cache_step_with_sdpa(x_new, w_q, w_k, w_v, keys, values):
    """Another correct way: PyTorch's attention on the grown cache (one query sees every key)."""
    keys, values = torch.cat([keys, x_new @ w_k], dim=1), torch.cat([values, x_new @ w_v], dim=1)
    return F.scaled_dot_product_attention(x_new @ w_q, keys, values), keys, values


@pytest.mark.parametrize("answer", [cache_step, cache_step_with_sdpa])
def test_cache_steps_pass(answer):
    assert verdict("gpt.cache_step", answer).startswith("passed")


def past_only(x_new, w_q, w_k, w_v, keys, values):
    q = x_new @ w_q
    out = (q @ keys.transpose(-2, -1) / keys.shape[-1] ** 0.5).softmax(-1) @ values
    return out, torch.cat([keys, x_new @ w_k], 1), torch.cat([values, x_new @ w_v], 1)


def unscaled(x_new, w_q, w_k, w_v, keys, values):
    keys, values = torch.cat([keys, x_new @ w_k], dim=1), torch.cat([values, x_new @ w_v], dim=1)
    return ((x_new @ w_q) @ keys.transpose(-2, -1)).softmax(-1) @ values, keys, values


@pytest.mark.parametrize("answer, named", [
    (past_only, "stored tokens only"),
    (unscaled, "sqrt(d_h)"),
    (lambda x, wq, wk, wv, keys, values: cache_step(x, wq, wk, wv, keys, values)[0], "tuple"),
])
def test_cache_step_mistakes_are_named(answer, named):
    assert named in verdict("gpt.cache_step", answer)


class HandAdamW:
    """The notebook's optimiser: m, v and a decay per weight, in-place steps under no_grad."""

    def __init__(self, update, matrices, vectors, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1,
                 decay_vectors=False, keep_state=True, count_steps=True, in_place=True, no_grad=True):
        self.update, self.betas, self.eps, self.t = update, betas, eps, 0
        self.keep_state, self.count_steps, self.in_place, self.no_grad = keep_state, count_steps, in_place, no_grad
        vector_decay = weight_decay if decay_vectors else 0.0
        self.slots = [[p, torch.zeros_like(p), torch.zeros_like(p), decay]
                      for params, decay in ((matrices, weight_decay), (vectors, vector_decay)) for p in params]

    def step(self, lr):
        with torch.no_grad() if self.no_grad else torch.enable_grad():
            self.t = self.t + 1 if self.count_steps else 1
            for slot in self.slots:
                p, m, v, decay = slot
                new_p, m, v = self.update(p, p.grad, m, v, self.t, lr, self.betas, self.eps, decay)
                if self.keep_state:
                    slot[1], slot[2] = m, v
                if self.in_place:
                    p.copy_(new_p)
                else:
                    slot[0] = new_p


class HandAdamWByGroups:
    """Another correct way: parameter groups as dicts, state in a dict keyed by position."""

    def __init__(self, update, matrices, vectors, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1):
        self.update, self.betas, self.eps, self.steps = update, betas, eps, 0
        self.groups = [{"params": list(matrices), "decay": weight_decay}, {"params": list(vectors), "decay": 0.0}]
        self.state = {}

    @torch.no_grad()
    def step(self, lr):
        self.steps += 1
        for g, group in enumerate(self.groups):
            for i, p in enumerate(group["params"]):
                m, v = self.state.get((g, i), (torch.zeros_like(p), torch.zeros_like(p)))
                new_p, m, v = self.update(p, p.grad, m, v, self.steps, lr, self.betas, self.eps, group["decay"])
                self.state[(g, i)] = (m, v)
                p.copy_(new_p)


def variant(**slip):
    """HandAdamW with one slip, as a class the checker can build."""
    return type("HandAdamWSlip", (HandAdamW,), {"__init__": lambda self, *a, **k: HandAdamW.__init__(self, *a, **k, **slip)})


@pytest.mark.parametrize("answer", [HandAdamW, HandAdamWByGroups])
def test_hand_adamw_classes_pass(answer):
    assert verdict("gpt.hand_adamw", answer).startswith("passed")


@pytest.mark.parametrize("answer, named", [
    (variant(decay_vectors=True), "vectors) were decayed too"),
    (variant(keep_state=False), "m and v were not kept"),
    (variant(count_steps=False), "step number t did not grow"),
    (variant(in_place=False), "weights had not moved"),
    (variant(no_grad=False), "while PyTorch records gradients"),
])
def test_hand_adamw_mistakes_are_named(answer, named):
    assert named in verdict("gpt.hand_adamw", answer)


def test_hand_adamw_wants_the_class_and_refuses_the_course_class_by_name():
    from helpers.lab.exercises import evaluate
    from helpers.training.by_hand import HandAdamW as CourseHandAdamW

    assert "not a class" in verdict("gpt.hand_adamw", lambda *args: None)
    passed, said = evaluate("gpt.hand_adamw", CourseHandAdamW)
    assert not passed and "helpers.training.by_hand.HandAdamW" in said


def sampler(slip: str = ""):
    """A generate loop, right by default, with one named slip."""
    def my_generate(gpt, prompt, max_new_tokens, temperature=1.0, top_k=None, generator=None):
        ids = prompt
        for _ in range(max_new_tokens):
            window = ids if slip == "no crop" else ids[:, -gpt.config.context_length:]
            logits = gpt(window)[:, -1]
            if temperature == 0 or top_k == 1:
                chosen = logits.argmax(-1, keepdim=True)
            else:
                logits = logits * temperature if slip == "multiply" else logits / temperature
                if top_k is not None and slip != "no top-k":
                    logits = logits.masked_fill(logits < logits.topk(top_k, -1).values[:, -1:], float("-inf"))
                chosen = torch.multinomial(logits.softmax(-1), 1,
                                           generator=None if slip == "no generator" else generator)
            ids = torch.cat([ids, chosen], dim=1)
        return ids[:, prompt.shape[1]:] if slip == "new only" else ids
    return my_generate


def sampler_by_gumbel(gpt, prompt, max_new_tokens, temperature=1.0, top_k=None, generator=None):
    """Another correct way: the Gumbel-max trick draws from the same distribution."""
    ids = prompt
    for _ in range(max_new_tokens):
        logits = gpt(ids[:, -gpt.config.context_length:])[:, -1]
        if temperature == 0 or top_k == 1:
            chosen = logits.argmax(-1, keepdim=True)
        else:
            logits = logits / temperature
            if top_k is not None:
                logits = logits.masked_fill(logits < logits.topk(top_k, -1).values[:, -1:], float("-inf"))
            uniform = torch.rand(logits.shape, generator=generator).clamp_min(1e-12)
            chosen = (logits - (-uniform.log()).log()).argmax(-1, keepdim=True)
        ids = torch.cat([ids, chosen], dim=1)
    return ids


@pytest.mark.parametrize("answer", [sampler(), sampler_by_gumbel])
def test_samplers_pass(answer):
    assert verdict("gpt.sample_tokens", answer).startswith("passed")


@pytest.mark.parametrize("slip, named", [
    ("no crop", "outgrew the model's context"),
    ("multiply", "multiplied by the temperature"),
    ("no top-k", "outside the 3 most likely"),
    ("no generator", "seeded alike drew different tokens"),
    ("new only", "the new tokens only"),
])
def test_sampling_mistakes_are_named(slip, named):
    assert named in verdict("gpt.sample_tokens", sampler(slip))


def test_a_sampler_that_ignores_the_temperature_is_named():
    right = sampler()

    def no_temperature(gpt, prompt, n, temperature=1.0, top_k=None, generator=None):
        return right(gpt, prompt, n, 1.0 if temperature else 0.0, top_k, generator)

    assert "temperature was not applied" in verdict("gpt.sample_tokens", no_temperature)


def cropping_sampler(crop: int):
    """A generate loop that keeps the last context_length - crop tokens (crop 0 is right)."""
    def my_generate(gpt, prompt, max_new_tokens, temperature=1.0, top_k=None, generator=None):
        ids = prompt
        for _ in range(max_new_tokens):
            with torch.no_grad():
                logits = gpt(ids[:, -(gpt.config.context_length - crop):])[:, -1]
            if temperature == 0 or top_k == 1:
                chosen = logits.argmax(-1, keepdim=True)
            else:
                logits = logits / temperature
                if top_k is not None:
                    logits = logits.masked_fill(logits < logits.topk(top_k, -1).values[:, -1:], float("-inf"))
                chosen = torch.multinomial(logits.softmax(-1), 1, generator=generator)
            ids = torch.cat([ids, chosen], dim=1)
        return ids
    return my_generate


def test_a_context_cropped_one_short_is_named_not_blamed_on_the_temperature():
    assert evaluate("gpt.sample_tokens", cropping_sampler(0))[0]
    message = named("gpt.sample_tokens", cropping_sampler(1), "cropped one token short")
    assert "temperature was not applied" not in message and "came up in" not in message


def adamw_without_bias_correction(p, g, m, v, t, lr, betas, eps, weight_decay):
    beta1, beta2 = betas
    m, v = beta1 * m + (1 - beta1) * g, beta2 * v + (1 - beta2) * g * g
    return p * (1 - lr * weight_decay) - lr * m / (v.sqrt() + eps), m, v


def test_adamw_without_bias_correction_is_too_large_with_betas_0_9_and_0_999():
    message = named("gpt.adamw_update", adamw_without_bias_correction, "no bias correction", "too large")
    assert "3.16 times" in message and "too small" not in message
