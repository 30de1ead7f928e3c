"""The setting of notebook 13, in one place, so that its benchmark rebuilds the same models.

    Setting         the facts, their split, the pretraining text and the tokenizer
    make_setting    build it from seeds (the notebook's defaults)
    pretrain        a small GPT trained on the pretraining text, float32
    sft_batches     (ids, mask) batches of the training questions in the chat template
    prose_accuracy  the share of facts a model completes right from "what is a plus b? "

Notebook 13 writes each step out in its cells and then calls these, asserting they agree.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from helpers import checks
from helpers.model.generation import generate
from helpers.model.gpt import GPT, GPTConfig
from helpers.post import sft, tasks
from helpers.text.chars import CharTokenizer
from helpers.training.trainer import TrainConfig, Trainer, split_train_val


@dataclass
class Setting:
    train_facts: list[tasks.Fact]
    held_facts: list[tasks.Fact]
    text: str
    tokenizer: CharTokenizer

    @property
    def pad_id(self) -> int:
        return self.tokenizer.special_tokens[sft.PAD]


def make_setting(largest: int = 5, held_out: float = 0.3, sentences: int = 3000,
                 seed: int = 0) -> Setting:
    facts = tasks.all_facts(largest)
    train, held = tasks.split_facts(facts, held_out, seed)
    text = tasks.pretraining_text(facts, sentences, seed)
    return Setting(train, held, text, CharTokenizer.train(text, sft.SPECIAL_TOKENS))


def model_config(setting: Setting) -> GPTConfig:
    return GPTConfig(vocab_size=setting.tokenizer.vocab_size, context_length=48, n_layers=2,
                     n_heads=4, d_model=64)


def pretrain(setting: Setting, steps: int, seed: int = 0) -> GPT:
    """A GPT trained for `steps` AdamW steps (batch 32, peak rate 3e-3) on the text, in float32."""
    checks.positive_int("steps", steps)
    torch.manual_seed(seed)
    model = GPT(model_config(setting))
    train_ids, val_ids = split_train_val(torch.tensor(setting.tokenizer.encode(setting.text)))
    config = TrainConfig(batch_size=32, learning_rate=3e-3, precision="fp32", eval_every=10_000,
                         eval_batches=2, seed=seed)
    Trainer(model, train_ids, val_ids, config).fit(steps=steps, progress_bar=False)
    return model.eval()


def sft_batches(setting: Setting, n_batches: int = 20, batch_size: int = 16, seed: int = 0
                ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """`n_batches` batches of `batch_size` training questions (drawn without replacement each)."""
    checks.positive_int("n_batches", n_batches)
    examples = [sft.encode_example(setting.tokenizer, f.question(), f.answer())
                for f in setting.train_facts]
    checks.number_in("batch_size", batch_size, 1, len(examples))
    rng = random.Random(seed)
    return [sft.pad_batch(rng.sample(examples, batch_size), setting.pad_id) for _ in range(n_batches)]


def prose_accuracy(model: torch.nn.Module, tokenizer: CharTokenizer, facts: list[tasks.Fact]) -> float:
    """Notebook 13's prose_accuracy: the share of `facts` whose greedy completion (9 tokens) of
    the question and a space is right (`tasks.is_correct`) up to its first '.'."""
    checks.instance("model", model, torch.nn.Module, "a language model (an nn.Module)")
    checks.instance("tokenizer", tokenizer, CharTokenizer, "the setting's CharTokenizer")
    if not (isinstance(facts, list) and facts and all(isinstance(f, tasks.Fact) for f in facts)):
        raise TypeError(f"facts is {facts!r:.60}, expected a non-empty list of tasks.Fact")
    right = 0
    for fact in facts:
        prompt = torch.tensor([tokenizer.encode(fact.question() + " ")])
        completion = tokenizer.decode(generate(model, prompt, 9, top_k=1)[0, prompt.shape[1]:].tolist())
        right += tasks.is_correct(completion.split(".")[0], fact)
    return right / len(facts)
