"""Small pieces shared by the test modules (exact error messages, a tiny GPT and tokenizer, a notebook cell run as __main__, a time bound for what once hung)."""

from __future__ import annotations

import random
import re
import signal
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from helpers.model.gpt import GPT, GPTConfig
from helpers.post import sft, tasks
from helpers.text.chars import CharTokenizer


def full(message: str) -> str:
    """A pattern that matches exactly `message`, nothing more or less."""
    return "^" + re.escape(message) + "$"


def post_tokenizer() -> CharTokenizer:
    """The character tokenizer of the post-training tests: the facts' text and sft's special tokens."""
    return CharTokenizer.train(tasks.pretraining_text(tasks.all_facts(3), 50, seed=0), sft.SPECIAL_TOKENS)


def tiny_gpt(tok: CharTokenizer, seed: int = 0) -> GPT:
    """A one-layer GPT (d_model 16, 2 heads, context 48) over `tok`, in eval mode, drawn from `seed`."""
    torch.manual_seed(seed)
    return GPT(GPTConfig(vocab_size=tok.vocab_size, context_length=48, n_layers=1, n_heads=2,
                         d_model=16)).eval()


def as_ipython_cell(monkeypatch, source: str, filename: str):
    """Yield `source` executed as the module __main__ with its text in linecache, as IPython runs
    a notebook cell (for the tests of helpers.scale.cell_functions); the cache entry is removed."""
    import linecache
    import sys
    import types

    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    module = types.ModuleType("__main__")
    exec(compile(source, filename, "exec"), module.__dict__)
    monkeypatch.setitem(sys.modules, "__main__", module)
    yield module
    linecache.cache.pop(filename, None)


class FixedDraw(random.Random):
    """A generator whose random() always returns `value`, to put a draw exactly on a threshold
    (0.5, 0.9); choice() and randrange() still draw from the seed."""

    def __init__(self, seed: int, value: float) -> None:
        super().__init__(seed)
        self.value = value

    def random(self) -> float:
        return self.value

    def getrandbits(self, k: int) -> int:  # choice() and randrange() go through it, not random()
        return super().getrandbits(k)


# The exact-causality tests of the GPT, its cache, the modern decoder, the sharded model and the
# trainer: three dtypes, one changed token, one small GPT drawn from seed 0.
DTYPES = [torch.float32, torch.float64, torch.bfloat16]


def changed_at(ids: torch.Tensor, position: int, vocab_size: int) -> torch.Tensor:
    """ids (B, N) with the token at `position` replaced by another one in every row."""
    other = ids.clone()
    other[:, position] = (other[:, position] + 1) % vocab_size
    return other


def small_gpt(dtype: torch.dtype, **sizes) -> GPT:
    """A 2-layer GPT (vocabulary 31, context 16, width 32, 2 heads) from seed 0, in `dtype`, eval mode."""
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=31, context_length=16, n_layers=2, n_heads=2, d_model=32, **sizes)
    return GPT(config).to(dtype).eval()


@contextmanager
def finishes_within(seconds: float) -> Iterator[None]:
    """Raise TimeoutError if the block runs longer than `seconds`, so that code that once hung
    (a walk over 2^40 paths) fails its test instead of stopping the suite. It interrupts Python
    code only (a SIGALRM timer, in the main thread): the hangs it guards are Python loops. The
    bound is generous (a loaded machine); the work it bounds takes milliseconds."""
    def stop(signum, frame):  # noqa: ANN001 - signal's handler signature
        raise TimeoutError(f"still running after {seconds} s: expected it to finish at once")

    previous = signal.signal(signal.SIGALRM, stop)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def raises_exactly(error_type: type[BaseException], message: str):
    """pytest.raises for an error of `error_type` whose message is exactly `message`."""
    import pytest

    return pytest.raises(error_type, match=full(message))


# The smallest GPT of the model tests (forward, cache, generation, checkpoints): vocabulary 11,
# context 8, width 8, two layers of two heads.
TINY_CONFIG = GPTConfig(vocab_size=11, context_length=8, n_layers=2, n_heads=2, d_model=8)


def tiny_model(**changes) -> GPT:
    """A GPT of TINY_CONFIG (with `changes` to its fields) drawn from seed 0, in eval mode."""
    torch.manual_seed(0)
    return GPT(GPTConfig(**{**TINY_CONFIG.to_dict(), **changes})).eval()


def tiny_ids(batch: int = 1, length: int = 4) -> torch.Tensor:
    """Token ids (batch, length) below TINY_CONFIG's vocabulary, drawn from seed 1."""
    return torch.randint(0, TINY_CONFIG.vocab_size, (batch, length), generator=torch.Generator().manual_seed(1))
