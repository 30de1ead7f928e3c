"""Instruction tuning: a chat template, a loss on the answer only, answers' log-probabilities
(notebook 13, section 4).

    USER, ASSISTANT, END      the template's special tokens (one id each)
    chat_prompt               "<|user|>what is two plus two?<|assistant|>"
    encode_example            (ids, answer mask): 1 on the answer's tokens and END, 0 on the prompt
    pad_batch                 right-pad examples into (B, N) ids and (B, N) masks
    answer_only_loss          next-token cross-entropy counted only where the target is an answer token
    token_logps               log p(token t | tokens < t) of every token: (B, N - 1)
    sequence_logps            the sum of those over the answer tokens: (B,)
    sample_answers            sample (or greedily pick) completions of one prompt
    answer_text               the text of a completion, up to END
    greedy_accuracy           the fraction of facts the model answers exactly right

Right padding is safe in a causal model: a pad token sits after every real token, so no real
token attends to it, and the mask keeps it out of every loss and log-probability.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from helpers import checks
from helpers.model.generation import generate

USER, ASSISTANT, END, PAD = "<|user|>", "<|assistant|>", "<|end|>", "<|pad|>"
SPECIAL_TOKENS = (USER, ASSISTANT, END, PAD)


def chat_prompt(question: str) -> str:
    """The prompt the model answers: USER question ASSISTANT."""
    if not isinstance(question, str) or not question.strip():
        raise ValueError(f"question is {question!r}, expected a non-empty str")
    return f"{USER}{question}{ASSISTANT}"


def encode_example(tokenizer, question: str, answer: str) -> tuple[Tensor, Tensor]:
    """ids (N,) of prompt + answer + END, and mask (N,): 1 on the answer's tokens and END."""
    if not isinstance(answer, str) or not answer.strip():
        raise ValueError(f"answer is {answer!r}, expected a non-empty str: an empty answer "
                         "gives the loss nothing to learn but END")
    prompt = tokenizer.encode(chat_prompt(question))
    reply = tokenizer.encode(answer + END)
    ids = torch.tensor(prompt + reply)
    mask = torch.tensor([0] * len(prompt) + [1] * len(reply))
    return ids, mask


def pad_batch(examples: list[tuple[Tensor, Tensor]], pad_id: int) -> tuple[Tensor, Tensor]:
    """Right-pad (ids, mask) pairs into ids (B, N) and mask (B, N); padding has mask 0."""
    if not examples:
        raise ValueError("examples is empty, expected at least one (ids, mask) pair")
    checks.non_negative_int("pad_id", pad_id)
    longest = max(len(ids) for ids, _ in examples)
    ids = torch.full((len(examples), longest), pad_id, dtype=torch.long)
    mask = torch.zeros(len(examples), longest, dtype=torch.long)
    for row, (x, m) in enumerate(examples):
        if x.shape != m.shape:
            raise ValueError(f"example {row}: ids {tuple(x.shape)} and mask {tuple(m.shape)} differ")
        ids[row, :len(x)], mask[row, :len(m)] = x, m
    return ids, mask


def check_ids_and_mask(ids: Tensor, mask: Tensor) -> None:
    """Raise naming the argument unless ids is (B, N), N >= 2, and mask (B, N) holds only 0 and 1
    (the answer-only loss's and DPO's inputs)."""
    for name, value in (("ids", ids), ("mask", mask)):
        checks.instance(name, value, Tensor, "a (B, N) tensor")
    if ids.dim() != 2 or ids.shape[1] < 2:
        raise ValueError(f"ids has shape {tuple(ids.shape)}, expected (B, N) with N >= 2")
    if mask.shape != ids.shape:
        raise ValueError(f"mask has shape {tuple(mask.shape)}, expected {tuple(ids.shape)} like ids")
    if mask.is_complex() or ((mask != 0) & (mask != 1)).any():
        values = mask.unique().tolist()[:6]
        raise ValueError(f"mask holds the values {values}, expected only 0 and 1: a 2 would count "
                         "a token twice, a -1 subtract it")


def answer_only_loss(logits: Tensor, ids: Tensor, mask: Tensor) -> Tensor:
    """logits (B, N, V) from ids (B, N); the mean cross-entropy of predicting ids[:, t] from
    position t - 1, over the positions t where mask[:, t] is 1 (the answer and END)."""
    check_ids_and_mask(ids, mask)
    if logits.shape[:2] != ids.shape:
        raise ValueError(f"logits has shape {tuple(logits.shape)}, expected (B, N, V) with "
                         f"(B, N) = {tuple(ids.shape)}")
    target_mask = mask[:, 1:].float()  # (B, N - 1): is the token predicted at t + 1 an answer token?
    if target_mask.sum() == 0:
        raise ValueError("mask has no answer tokens after position 0, expected some to learn from")
    losses = F.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten(), reduction="none")
    return (losses * target_mask.flatten()).sum() / target_mask.sum()


def token_logps(logits: Tensor, ids: Tensor) -> Tensor:
    """logits (B, N, V), ids (B, N) -> (B, N - 1): log p(ids[:, t + 1] | ids[:, :t + 1])."""
    if logits.dim() != 3 or logits.shape[:2] != ids.shape:
        raise ValueError(f"logits has shape {tuple(logits.shape)}, expected (B, N, V) with "
                         f"(B, N) = {tuple(ids.shape)}")
    logps = logits[:, :-1].to(torch.promote_types(logits.dtype, torch.float32)).log_softmax(dim=-1)
    return logps.gather(-1, ids[:, 1:, None]).squeeze(-1)


def sequence_logps(model: nn.Module, ids: Tensor, mask: Tensor) -> Tensor:
    """log pi(answer | prompt) for each row: the answer tokens' log-probabilities summed, (B,)."""
    check_ids_and_mask(ids, mask)
    return (token_logps(model(ids), ids) * mask[:, 1:]).sum(dim=1)


def completion_mask(completions: Tensor, end_id: int) -> Tensor:
    """completions (G, T) -> (G, T) mask: 1 up to and including the first END, 0 after it."""
    is_end = (completions == end_id).long()
    ended_before = is_end.cumsum(dim=1) - is_end  # how many ENDs strictly before t
    return (ended_before == 0).long()


@torch.no_grad()
def sample_answers(model: nn.Module, prompt: Tensor, n: int, max_new_tokens: int, end_id: int,
                   temperature: float = 1.0, generator: torch.Generator | None = None
                   ) -> tuple[Tensor, Tensor]:
    """n completions of one prompt (P,): ids (n, P + T) and mask (n, P + T), 1 on the completion
    up to its first END. temperature 0 means greedy (then all n are the same)."""
    checks.positive_int("n", n)
    if prompt.dim() != 1 or len(prompt) == 0:
        raise ValueError(f"prompt has shape {tuple(prompt.shape)}, expected (P,) with P >= 1")
    if temperature == 0:
        ids = generate(model, prompt[None], max_new_tokens, top_k=1).expand(n, -1)
    else:
        checks.positive_float("temperature", temperature, " (or 0 for greedy)")
        ids = generate(model, prompt[None].expand(n, -1), max_new_tokens, temperature=temperature,
                       generator=generator)
    mask = torch.zeros_like(ids)
    mask[:, len(prompt):] = completion_mask(ids[:, len(prompt):], end_id)
    return ids, mask


def answer_text(tokenizer, completion: list[int], end_id: int) -> str:
    """The decoded completion up to (not including) its first END."""
    if end_id in completion:
        completion = completion[:completion.index(end_id)]
    return tokenizer.decode(completion)


def greedy_answers(model: nn.Module, tokenizer, questions: list[str], max_new_tokens: int = 10
                   ) -> list[str]:
    """The model's greedy answer to each question, in the chat template. Prompts of the same
    length are answered together, as one batch."""
    end_id = tokenizer.special_tokens[END]
    prompts = [tokenizer.encode(chat_prompt(q)) for q in questions]
    answers = [""] * len(questions)
    for length in sorted({len(p) for p in prompts}):
        rows = [i for i, p in enumerate(prompts) if len(p) == length]
        ids = generate(model, torch.tensor([prompts[i] for i in rows]), max_new_tokens, top_k=1)
        for row, completion in zip(rows, ids[:, length:].tolist(), strict=True):
            answers[row] = answer_text(tokenizer, completion, end_id)
    return answers


def greedy_accuracy(model: nn.Module, tokenizer, facts: list, max_new_tokens: int = 10) -> float:
    """The fraction of `facts` (helpers.post.tasks.Fact) whose greedy answer is exactly right."""
    from helpers.post.tasks import is_correct

    if not facts:
        raise ValueError("facts is empty, expected questions to answer")
    answers = greedy_answers(model, tokenizer, [f.question() for f in facts], max_new_tokens)
    return sum(is_correct(a, f) for a, f in zip(answers, facts, strict=True)) / len(facts)


def train_sft(model: nn.Module, batches: list[tuple[Tensor, Tensor]], steps: int, lr: float,
              seed: int = 0) -> list[float]:
    """AdamW on answer_only_loss over batches drawn at random from `batches`; the losses."""
    checks.positive_int("steps", steps)
    checks.positive_float("lr", lr)
    if not batches:
        raise ValueError("batches is empty, expected (ids, mask) batches")
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr,
                                  weight_decay=0.0)
    model.train()
    losses = []
    for _ in range(steps):
        ids, mask = batches[int(torch.randint(len(batches), (1,), generator=generator))]
        loss = answer_only_loss(model(ids), ids, mask)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    model.eval()
    return losses
