"""Each slip a student makes often gets a message that names it (issue 51): the checkers of
notebooks 1, 3-5, 7-9, 13 and 14 are fed the slipped answer through `evaluate`, as `check` would
run it, and the message must say what went wrong, not only "wrong values"."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from helpers.lab.exercises import evaluate


def named(name: str, answer, *words: str) -> str:
    """The checker's message for a wrong `answer`, asserted to fail and to hold every word."""
    passed, message = evaluate(name, answer)
    assert not passed, message
    for word in words:
        assert word in message, message
    return message


# --- notebook 7 -------------------------------------------------------------------------------

def sampler(crop: int):
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
    assert evaluate("gpt.sample_tokens", sampler(0))[0]
    message = named("gpt.sample_tokens", sampler(1), "cropped one token short")
    assert "temperature was not applied" not in message and "came up in" not in message


def adamw_without_bias_correction(p, g, m, v, t, lr, betas, eps, weight_decay):
    beta1, beta2 = betas
    m, v = beta1 * m + (1 - beta1) * g, beta2 * v + (1 - beta2) * g * g
    return p * (1 - lr * weight_decay) - lr * m / (v.sqrt() + eps), m, v


def test_adamw_without_bias_correction_is_too_large_with_betas_0_9_and_0_999():
    message = named("gpt.adamw_update", adamw_without_bias_correction, "no bias correction", "too large")
    assert "3.16 times" in message and "too small" not in message


# --- notebook 13 ------------------------------------------------------------------------------

def test_advantages_without_eps_name_the_nan_of_an_equal_group():
    def without_eps(rewards, eps):
        mean = rewards.mean(dim=1, keepdim=True)
        return (rewards - mean) / rewards.std(dim=1, keepdim=True)

    named("post_training.group_advantages", without_eps, "NaN", "without eps")


def test_advantages_messages_read_as_sentences():
    def off_by_one(rewards, eps):
        mean = rewards.mean(dim=1, keepdim=True)
        return (rewards - mean) / (rewards.std(dim=1, keepdim=True) + eps) + 1

    message = named("post_training.group_advantages", off_by_one)
    assert "the advantages has" not in message and "tensor of advantages has" in message

    def population(rewards, eps):
        mean = rewards.mean(dim=1, keepdim=True)
        return (rewards - mean) / (rewards.std(dim=1, keepdim=True, correction=0) + eps)

    passed, praise = evaluate("post_training.group_advantages", population)
    assert passed and "Correct" not in praise and "population std" in praise


def sft_loss_over_every_position(logits, ids, mask):
    logps = logits[:, :-1].log_softmax(-1).gather(-1, ids[:, 1:, None])[..., 0]
    weights = mask[:, 1:].to(logps.dtype)
    return -(logps * weights).sum() / weights.numel()


def test_an_sft_loss_divided_by_every_position_is_named():
    named("post_training.answer_only_loss", sft_loss_over_every_position, "every position", "answer tokens")


def test_a_dpo_loss_without_beta_is_named():
    def without_beta(policy_chosen, policy_rejected, ref_chosen, ref_rejected, beta):
        chosen, rejected = policy_chosen - ref_chosen, policy_rejected - ref_rejected
        return -F.logsigmoid(chosen - rejected), beta * chosen.detach(), beta * rejected.detach()

    named("post_training.dpo_loss", without_beta, "beta is missing")
