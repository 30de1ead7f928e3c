"""The trainer of notebook 7: batches, schedule, precision, fast vs plain path, checkpoints."""

from __future__ import annotations

import dataclasses
import math
import re
import shutil

import pytest
import torch
from shared_tools import small_gpt

from helpers.model.checkpoints import load_checkpoint, save_checkpoint
from helpers.model.gpt import GPT, GPTConfig
from helpers.model.modern import ModernConfig, ModernGPT
from helpers.training import speed
from helpers.training import trainer as train
from helpers.training.speed import pick_dtype
from helpers.training.trainer import (
    History,
    TrainConfig,
    Trainer,
    learning_rate,
    random_batch,
    split_stories,
    split_train_val,
)

CONFIG = GPTConfig(vocab_size=7, context_length=16, n_layers=2, n_heads=2, d_model=16)


def model_and_data(seed: int = 0) -> tuple[GPT, torch.Tensor, torch.Tensor]:
    torch.manual_seed(seed)
    pattern = torch.tensor([0, 1, 2, 3, 4, 5, 6, 5, 4, 3, 2, 1])  # easy to learn
    ids = pattern.repeat(300)
    return GPT(CONFIG), *split_train_val(ids, 0.2)


# --- data and recipe -----------------------------------------------------------------------

def test_random_batch_targets_are_the_inputs_shifted_by_one():
    ids = torch.arange(1000)
    x, y = random_batch(ids, 6, 10, torch.Generator().manual_seed(0))
    assert x.shape == y.shape == (6, 10)
    assert torch.equal(y, x + 1)  # ids[i] == i, so the next token is always one more
    assert torch.equal(x[:, 1:], y[:, :-1])


def test_random_batch_refuses_too_short_a_text():
    with pytest.raises(ValueError, match=r"ids has shape \(5,\), expected a 1-D tensor of at least"):
        random_batch(torch.arange(5), 2, 8)


def test_split_keeps_order_and_sizes():
    train_ids, val_ids = split_train_val(torch.arange(100), 0.1)
    assert torch.equal(torch.cat([train_ids, val_ids]), torch.arange(100))
    assert len(val_ids) == 10


def test_learning_rate_warms_up_then_decays_to_the_floor():
    rates = [learning_rate(p / 100, peak=1e-3, warmup=0.1, floor=0.1) for p in range(101)]
    peak_at = max(range(101), key=rates.__getitem__)
    assert 9 <= peak_at <= 10
    assert all(a < b for a, b in zip(rates[:peak_at], rates[1:peak_at + 1], strict=True))
    assert all(a >= b for a, b in zip(rates[peak_at:], rates[peak_at + 1:], strict=False))
    assert math.isclose(rates[-1], 1e-4)
    assert rates[0] == 0.0  # the formula: linear from 0, nothing added
    assert math.isclose(rates[5], 1e-3 * 0.05 / 0.1)  # halfway through the warm-up: half the peak


def test_fit_runs_no_step_at_rate_0_and_ends_at_the_floor():
    model, train_ids, val_ids = model_and_data()
    config = TrainConfig(batch_size=4, learning_rate=1e-3, warmup=0.2, min_lr_ratio=0.1, eval_every=100)
    history = Trainer(model, train_ids, val_ids, config).fit(steps=10, progress_bar=False)
    assert history.lrs[0] == pytest.approx(1e-3 * 0.1 / 0.2)  # step 1 ends 10 % of the way
    assert history.lrs[1] == pytest.approx(1e-3)  # the end of the warm-up
    assert history.lrs[-1] == pytest.approx(1e-4)


def test_precision_falls_back_to_float32_without_native_bf16(monkeypatch):
    cpu = torch.device("cpu")
    assert pick_dtype(cpu, "fp32") == torch.float32
    assert pick_dtype(cpu, "bf16") == torch.bfloat16
    monkeypatch.setattr(speed, "cpu_has_native_bf16", lambda: False)
    assert pick_dtype(cpu, "auto") == torch.float32
    monkeypatch.setattr(speed, "cpu_has_native_bf16", lambda: True)
    assert pick_dtype(cpu, "auto") == torch.bfloat16
    with pytest.raises(ValueError, match="precision is 'fp16', expected one of 'auto', 'bf16', 'fp32'"):
        pick_dtype(cpu, "fp16")


@pytest.mark.parametrize(("value", "native", "expected"), [
    ("fp32", True, torch.float32), ("bf16", False, torch.bfloat16), ("auto", True, torch.bfloat16),
    ("auto", False, torch.float32), ("", True, torch.bfloat16), (" FP32 ", True, torch.float32)])
def test_course_precision_decides_what_auto_means(monkeypatch, value, native, expected):
    monkeypatch.setattr(speed, "cpu_has_native_bf16", lambda: native)
    monkeypatch.setenv("COURSE_PRECISION", value)
    cpu = torch.device("cpu")
    assert pick_dtype(cpu, "auto") == expected
    # an explicit precision wins over the variable
    assert pick_dtype(cpu, "fp32") == torch.float32 and pick_dtype(cpu, "bf16") == torch.bfloat16


def test_course_precision_reaches_the_trainer(monkeypatch):
    monkeypatch.setattr(speed, "cpu_has_native_bf16", lambda: True)
    monkeypatch.setenv("COURSE_PRECISION", "fp32")
    model, train_ids, val_ids = model_and_data()
    assert Trainer(model, train_ids, val_ids, TrainConfig(batch_size=2)).dtype == torch.float32
    monkeypatch.setenv("COURSE_PRECISION", "bf16")
    model, train_ids, val_ids = model_and_data()
    assert Trainer(model, train_ids, val_ids, TrainConfig(batch_size=2)).dtype == torch.bfloat16


@pytest.mark.parametrize("value", ["fp16", "float32", "1"])
def test_course_precision_refuses_a_bad_value_naming_the_variable(monkeypatch, value):
    monkeypatch.setenv("COURSE_PRECISION", value)
    with pytest.raises(ValueError, match=f"COURSE_PRECISION is '{value}', expected one of fp32, bf16, auto"):
        pick_dtype(torch.device("cpu"), "auto")


# --- fast and plain paths agree ------------------------------------------------------------

def paired_trainers(precision: str) -> tuple[Trainer, Trainer]:
    """The same weights and data under the plain path and the fast path."""
    model, train_ids, val_ids = model_and_data()
    twin = GPT(CONFIG)
    twin.load_state_dict(model.state_dict())
    plain = Trainer(model, train_ids, val_ids, TrainConfig(fast=False, batch_size=4))
    fast = Trainer(twin, train_ids, val_ids, TrainConfig(fast=True, precision=precision, batch_size=4))
    return plain, fast


@pytest.mark.parametrize("precision,tolerance", [("fp32", 1e-5), ("bf16", 2e-2)])
def test_fast_and_plain_paths_give_the_same_loss_on_the_same_batch(precision, tolerance):
    # Tolerance: float32 only reorders sums; bfloat16 keeps ~3 significant digits, and the
    # loss (about 2 nats here) is a mean over 64 tokens, so 2e-2 nats is ~1 %.
    plain, fast = paired_trainers(precision)
    assert plain.dtype == torch.float32
    assert fast.dtype == (torch.bfloat16 if precision == "bf16" else torch.float32)
    x, y = random_batch(plain.train_ids, 4, 16, torch.Generator().manual_seed(3))
    assert abs(plain.loss_on(x, y).item() - fast.loss_on(x, y).item()) < tolerance
    # One optimiser step each from the same weights on the same batch keeps them together.
    assert plain.train_step(1e-3) == pytest.approx(fast.train_step(1e-3), abs=tolerance)
    assert abs(plain.loss_on(x, y).item() - fast.loss_on(x, y).item()) < tolerance


def test_training_makes_the_loss_fall_and_records_history():
    model, train_ids, val_ids = model_and_data()
    trainer = Trainer(model, train_ids, val_ids, TrainConfig(batch_size=8, eval_every=20, learning_rate=1e-2))
    seen: list[int] = []
    history = trainer.fit(steps=60, callbacks=[lambda h: seen.append(len(h.val_losses))],
                          progress_bar=False)
    assert history.steps == list(range(1, 61))
    assert history.eval_steps == [20, 40, 60] and seen == [1, 2, 3]
    assert history.val_losses[-1] < 0.5 * math.log(CONFIG.vocab_size)
    assert history.losses[-1] < history.losses[0]
    assert history.tokens_per_step == 8 * 16 and history.tokens_per_second > 0


def test_time_budget_stops_and_evaluates_at_the_end():
    model, train_ids, val_ids = model_and_data()
    trainer = Trainer(model, train_ids, val_ids, TrainConfig(batch_size=4, eval_every=10_000))
    history = trainer.fit(seconds=0.5, progress_bar=False)
    assert len(history.steps) >= 1 and len(history.val_losses) == 1
    assert history.train_seconds >= 0.5


@pytest.mark.parametrize("kwargs,message", [
    ({}, "expected exactly one"),
    ({"steps": 3, "seconds": 1.0}, "expected exactly one"),
    ({"steps": 0}, "steps is 0, expected a positive int"),
    ({"seconds": -1.0}, "seconds is -1.0, expected a finite number > 0"),
])
def test_fit_checks_its_budget(kwargs, message):
    model, train_ids, val_ids = model_and_data()
    with pytest.raises(ValueError, match=message):
        Trainer(model, train_ids, val_ids).fit(**kwargs, progress_bar=False)


def test_train_config_is_checked():
    with pytest.raises(ValueError, match="batch_size is 0, expected a positive int"):
        TrainConfig(batch_size=0)


def test_history_tokens_per_second():
    history = History(steps=[1, 2, 3, 4], tokens_per_step=100, train_seconds=2.0)
    assert history.tokens_per_second == 200


# --- checkpoints ---------------------------------------------------------------------------

def test_checkpoint_round_trip_is_identical(tmp_path):
    model, train_ids, val_ids = model_and_data()
    trainer = Trainer(model, train_ids, val_ids, TrainConfig(batch_size=4))
    trainer.fit(steps=3, progress_bar=False)
    path = save_checkpoint(tmp_path / "gpt.pt", model, trainer.optimizer, step=3, note="test")
    loaded, state = load_checkpoint(path)
    assert loaded.config == model.config
    assert loaded.lm_head.weight is loaded.embed.token.weight  # still tied
    for (name, a), (_, b) in zip(model.state_dict().items(), loaded.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    ids = torch.randint(0, CONFIG.vocab_size, (2, 16))
    assert torch.equal(model.eval()(ids), loaded.eval()(ids))
    assert state["extra"] == {"step": 3, "note": "test"}
    assert state["optimizer"]["state"], "the optimiser's moments were saved"


# --- any model mapping ids (B, N) to logits (B, N, V): the modern decoder ----------------------

MODERN = ModernConfig(vocab_size=7, context_length=16, n_layers=2, n_heads=2, n_kv_heads=1, d_model=16)


@pytest.mark.parametrize("fast,precision", [(False, "fp32"), (True, "fp32"), (True, "bf16")])
def test_trainer_trains_a_modern_gpt_and_its_loss_falls(fast, precision):
    _, train_ids, val_ids = model_and_data()
    torch.manual_seed(0)
    model = ModernGPT(MODERN)
    config = TrainConfig(batch_size=8, eval_every=30, learning_rate=1e-2, fast=fast, precision=precision)
    trainer = Trainer(model, train_ids, val_ids, config)
    before = trainer.evaluate()["val"]
    history = trainer.fit(steps=30, progress_bar=False)
    assert history.val_losses[-1] < 0.7 * before
    assert all(p.dtype == torch.float32 for p in model.parameters())  # the weights stay float32
    assert trainer.working is model if precision == "fp32" else trainer.working is not model


def test_checkpoint_round_trip_of_a_modern_gpt(tmp_path):
    _, train_ids, val_ids = model_and_data()
    model = ModernGPT(dataclasses.replace(MODERN, tie_weights=True))
    trainer = Trainer(model, train_ids, val_ids, TrainConfig(batch_size=4, precision="fp32"))
    trainer.fit(steps=3, progress_bar=False)
    loaded, state = load_checkpoint(save_checkpoint(tmp_path / "modern.pt", model, trainer.optimizer))
    assert type(loaded) is ModernGPT and loaded.config == model.config
    assert loaded.lm_head.weight is loaded.embed.weight  # still tied
    ids = torch.randint(0, MODERN.vocab_size, (2, 16))
    assert torch.equal(model.eval()(ids), loaded.eval()(ids))
    assert state["architecture"] == "ModernGPT"


def test_checkpoint_refuses_a_model_it_cannot_rebuild(tmp_path):
    with pytest.raises(TypeError, match="model is a Linear, expected one of GPT, ModernGPT"):
        save_checkpoint(tmp_path / "linear.pt", torch.nn.Linear(2, 2))


def test_checkpoint_without_an_architecture_is_read_as_a_gpt(tmp_path):
    model = GPT(CONFIG)
    torch.save({"config": model.config.to_dict(), "model": model.state_dict()}, tmp_path / "old.pt")
    loaded, _ = load_checkpoint(tmp_path / "old.pt")
    assert type(loaded) is GPT and loaded.config == CONFIG


def test_trainer_refuses_a_model_without_a_config():
    _, train_ids, val_ids = model_and_data()
    with pytest.raises(TypeError, match="model is a Linear, expected a torch.nn.Module mapping token ids"):
        Trainer(torch.nn.Linear(2, 2), train_ids, val_ids)


def test_bf16_path_trains_float32_weights_through_a_bf16_working_copy():
    model, train_ids, val_ids = model_and_data()
    trainer = Trainer(model, train_ids, val_ids, TrainConfig(batch_size=4, precision="bf16"))
    before = model.lm_head.weight.detach().clone()
    trainer.fit(steps=3, progress_bar=False)
    working = trainer.working
    assert working is not model and working.lm_head.weight is working.embed.token.weight
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert all(p.dtype == torch.bfloat16 for p in working.parameters())
    assert not torch.equal(model.lm_head.weight, before), "the float32 weights were updated"
    for master, low in zip(model.parameters(), working.parameters(), strict=True):
        assert torch.equal(low, master.to(torch.bfloat16)), "the copy follows the weights"


# --- one buffer for the weights, one for the gradients --------------------------------------

def lies_in(tensor: torch.Tensor, buffer: torch.Tensor) -> bool:
    start = buffer.data_ptr()
    return start <= tensor.data_ptr() < start + buffer.numel() * buffer.element_size()


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_fast_path_keeps_weights_and_gradients_in_one_buffer_each(precision):
    model, train_ids, val_ids = model_and_data()
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    trainer = Trainer(model, train_ids, val_ids, TrainConfig(batch_size=4, precision=precision))
    flat = trainer.weights
    for name, param in model.named_parameters():  # moved into the buffer, values unchanged
        assert lies_in(param, flat.weights) and torch.equal(param, before[name]), name
    assert flat.weights.numel() == sum(p.numel() for p in model.parameters())
    trainer.train_step(1e-3)
    for param in trainer.working.parameters():
        assert lies_in(param, flat.working_weights) and lies_in(param.grad, flat.working_gradients)
    assert flat.working_gradients.abs().sum() > 0, "backward wrote into the gradient buffer"
    assert (trainer.working is model) == (precision == "fp32")


def test_fast_fp32_trainer_takes_the_same_steps_as_the_plain_one():
    plain, fast = paired_trainers("fp32")
    for step in range(5):
        assert plain.train_step(1e-3) == pytest.approx(fast.train_step(1e-3), abs=1e-5), step
    for (name, a), b in zip(plain.model.named_parameters(), fast.model.parameters(), strict=True):
        # Adam moves every weight by about lr per step whatever its gradient's size, so the
        # weights agree to well under one step (1e-3) if the two paths agree.
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0, msg=name)


def test_clipping_the_buffer_equals_clip_grad_norm():
    model, train_ids, val_ids = model_and_data()
    trainer = Trainer(model, train_ids, val_ids, TrainConfig(batch_size=4, precision="fp32"))
    x, y = random_batch(train_ids, 4, 16, torch.Generator().manual_seed(5))
    trainer.loss_on(x, y).backward()
    params = list(model.parameters())
    copies = [torch.nn.Parameter(p.detach().clone()) for p in params]
    for copy, param in zip(copies, params, strict=True):
        copy.grad = param.grad.clone()
    expected_norm = torch.nn.utils.clip_grad_norm_(copies, 0.01)
    assert trainer.weights.clip_gradients(0.01).item() == pytest.approx(expected_norm.item(), rel=1e-6)
    assert expected_norm > 0.01, "the test must really clip"
    for param, copy in zip(params, copies, strict=True):
        torch.testing.assert_close(param.grad, copy.grad, atol=1e-9, rtol=1e-6)


def test_training_survives_model_zero_grad_and_refuses_a_moved_model():
    model, train_ids, val_ids = model_and_data()
    trainer = Trainer(model, train_ids, val_ids, TrainConfig(batch_size=4, precision="fp32"))
    trainer.train_step(1e-3)
    model.zero_grad()  # sets every .grad to None
    before = model.lm_head.weight.detach().clone()
    trainer.train_step(1e-3)
    assert not torch.equal(model.lm_head.weight, before), "the step still reached the weights"
    model.double()
    with pytest.raises(RuntimeError, match="moved or replaced after the Trainer was made"):
        trainer.train_step(1e-3)


def test_trainer_checks_its_token_ids_once():
    model, train_ids, val_ids = model_and_data()
    with pytest.raises(ValueError, match=r"val_ids contains the id 7, expected ids in \[0, 6\]"):
        Trainer(model, train_ids, torch.tensor([1, 2, 7] * 20))


def test_compile_needs_the_fast_path():
    with pytest.raises(ValueError, match="compile=True needs fast=True"):
        TrainConfig(compile=True, fast=False)


@pytest.mark.skipif(not any(shutil.which(c) for c in ("g++", "clang++", "c++")),
                    reason="torch.compile on a CPU needs a C++ compiler; this machine has none")
def test_compiled_trainer_computes_the_same_loss_and_trains():
    # Slow (the first call compiles, about 10 to 20 s here): it is the only test that compiles.
    model, train_ids, val_ids = model_and_data()
    twin = GPT(CONFIG)
    twin.load_state_dict(model.state_dict())
    config = dict(batch_size=4, precision="fp32")
    eager = Trainer(model, train_ids, val_ids, TrainConfig(**config))
    compiled = Trainer(twin, train_ids, val_ids, TrainConfig(**config, compile=True))
    x, y = random_batch(train_ids, 4, 16, torch.Generator().manual_seed(3))
    assert compiled.loss_on(x, y).item() == pytest.approx(eager.loss_on(x, y).item(), abs=1e-5)
    losses = [compiled.train_step(1e-2) for _ in range(20)]
    assert losses[-1] < losses[0]


def test_split_stories_keeps_every_story_whole_and_holds_out_the_last_ones():
    stories = [f"Story {i} begins.\nStory {i} ends." for i in range(10)]
    text = "\n\n".join(stories) + "\n"
    train_text, val_text = train.split_stories(text, val_fraction=0.2)
    assert train_text == "\n\n".join(stories[:8]) + "\n\n"
    assert val_text == "\n\n".join(stories[8:]) + "\n\n"
    assert train.line_overlap(train_text, val_text) == 0.0


def test_split_stories_holds_out_at_least_one_story_and_keeps_one_for_training():
    text = "a\nb\n\nc\nd\n\ne\nf\n"
    assert train.split_stories(text, val_fraction=0.01) == ("a\nb\n\nc\nd\n\n", "e\nf\n\n")
    assert train.split_stories(text, val_fraction=0.99) == ("a\nb\n\n", "c\nd\n\ne\nf\n\n")


def test_split_stories_refuses_bad_input():
    with pytest.raises(ValueError, match=r"val_fraction is 1.5, expected a number in \(0, 1\)"):
        train.split_stories("a\n\nb", val_fraction=1.5)
    with pytest.raises(ValueError, match="text has 1 stories separated by '\\\\n\\\\n', expected at least 2"):
        train.split_stories("one story only\nno blank line\n")


def test_line_overlap_counts_validation_lines_found_word_for_word_in_training():
    train_text = "The dog ran.\nThe cat sat.\n"
    val_text = "The cat sat.\n\nThe cat sat down.\nThe dog ran.\nA bird sang.\n"
    assert train.line_overlap(train_text, val_text) == 2 / 4
    with pytest.raises(ValueError, match="val_text has no non-blank lines"):
        train.line_overlap(train_text, "\n\n")


def test_course_corpus_split_keeps_stories_whole_yet_shares_sentences():
    # The corpus comes from templates: held-out stories still share sentences with training.
    from helpers.text.corpus import load_corpus

    text = load_corpus()
    train_text, val_text = train.split_stories(text, val_fraction=0.1)
    assert text.startswith(train_text) and train_text + val_text.rstrip("\n") + "\n" == text
    overlap = train.line_overlap(train_text, val_text)
    assert 0.0 < overlap < 1.0
    # The old split by position cut through a story; this one starts the validation at a story.
    first_story = val_text.split("\n\n")[0]
    assert first_story in text.split("\n\n")


# helpers.training.trainer, exactly:
#
# Grouped by the classes of issue 30: configuration asserted (the progress bar's settings, what
# fit records and shows), edge sizes (two stories, the smallest split), fixtures where the
# behaviour decides the answer (stories that begin with a blank or an X), exact messages.

TINY = GPTConfig(vocab_size=5, context_length=4, n_layers=1, n_heads=1, d_model=8)


def tiny_trainer(**config) -> Trainer:
    torch.manual_seed(0)
    ids = torch.tensor([0, 1, 2, 3, 4, 3, 2, 1]).repeat(10)
    settings = dict(batch_size=2, eval_batches=1, eval_every=2, fast=False) | config
    val = torch.tensor([4, 4, 0, 0, 1, 2]).repeat(10)  # another text: its loss differs
    return Trainer(GPT(TINY), ids, val, TrainConfig(**settings))


class _Tokenizer:
    def encode(self, text: str) -> list[int]:
        return [ord(c) - ord("a") for c in text]


def test_encode_text_is_the_tokenizers_ids_as_int64():
    ids = train.encode_text(_Tokenizer(), "cab")
    assert ids.dtype == torch.long and ids.tolist() == [2, 0, 1]
    assert train.encode_text(_Tokenizer(), "").dtype == torch.long  # even with no token at all


@pytest.mark.parametrize("ids, said", [([1, 2, 3], "ids is a list, expected a 1-D tensor of token ids"),
                                       (torch.zeros(2, 2), "ids is of shape (2, 2), expected a 1-D tensor")])
def test_split_train_val_says_what_it_got(ids, said):
    with pytest.raises(ValueError, match=re.escape(said)):
        train.split_train_val(ids)


def test_split_stories_keeps_spaces_and_xs_and_takes_two_stories():
    # Only newlines are stripped from a story: its spaces and letters (even X) are its own.
    text = "  X one X  \n\n\nX two X\n\n"
    assert train.split_stories(text, 0.5) == ("  X one X  \n\n", "X two X\n\n")
    assert train.split_stories("a\n\nb") == ("a\n\n", "b\n\n")  # two stories are enough
    with pytest.raises(ValueError, match=re.escape("text has 1 stories separated by '\\n\\n', expected at least 2")):
        train.split_stories("a\n\n")


def test_line_overlap_message():
    with pytest.raises(ValueError, match="^val_text has no non-blank lines, expected at least one$"):
        train.line_overlap("a", "\n \n")


class _Tqdm:
    """Stands in for tqdm and keeps its settings (a real bar drawn in a forked mutmut worker can
    hang on tqdm's process lock, so these tests build none)."""

    made: list[_Tqdm] = []

    def __init__(self, **settings) -> None:
        self.settings, self.updates, self.postfix, self.closed = settings, [], {}, False
        _Tqdm.made.append(self)

    def update(self, n: float) -> None:
        self.updates.append(n)

    def set_postfix(self, **values: str) -> None:
        self.postfix = values

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def bars(monkeypatch) -> list[_Tqdm]:
    monkeypatch.setattr(_Tqdm, "made", [])
    monkeypatch.setattr(train, "tqdm", _Tqdm)
    return _Tqdm.made


def test_progress_bar_counts_steps_every_half_second(bars):
    train._progress_bar(7, None, True)
    train._progress_bar(7, None, False)
    assert [bar.settings for bar in bars] == [dict(total=7, unit="step", disable=False, mininterval=0.5),
                                              dict(total=7, unit="step", disable=True, mininterval=0.5)]


def test_progress_bar_of_a_time_budget_counts_whole_seconds(bars):
    train._progress_bar(None, 3.0, True)
    train._progress_bar(None, 3.0, False)
    form = "{l_bar}{bar}| {n:.0f}/{total:.0f} s [{elapsed}<{remaining}]{postfix}"
    assert [bar.settings for bar in bars] == [
        dict(total=3.0, unit="s", disable=False, mininterval=0.5, bar_format=form),
        dict(total=3.0, unit="s", disable=True, mininterval=0.5, bar_format=form)]


def test_fit_shows_a_bar_unless_told_not_to(bars):
    tiny_trainer().fit(steps=2)
    tiny_trainer().fit(steps=2, progress_bar=False)
    assert [bar.settings["disable"] for bar in bars] == [False, True]
    assert bars[0].updates == [1, 1] and bars[0].closed and set(bars[0].postfix) == {"train", "val"}


def test_fit_refuses_a_progress_bar_that_is_not_a_bool():
    with pytest.raises(TypeError, match="^progress_bar is 'yes'"):
        tiny_trainer().fit(steps=1, progress_bar="yes")


class _Bar:
    def __init__(self) -> None:
        self.postfix: dict[str, str] = {}

    def set_postfix(self, **values: str) -> None:
        self.postfix = values


def test_each_evaluation_records_and_shows_both_losses():
    trainer = tiny_trainer()
    losses, bar, seen = trainer.evaluate(), _Bar(), []
    assert losses["train"] != losses["val"]  # so that a swap would show
    trainer._evaluate_and_report([seen.append], bar)
    history = trainer.history
    assert history.train_losses == [losses["train"]] and history.val_losses == [losses["val"]]
    assert history.eval_steps == [0] and seen == [history]
    assert bar.postfix == {"train": f"{losses['train']:.3f}", "val": f"{losses['val']:.3f}"}


class _RecordingBar(_Bar):
    def __init__(self, steps: int | None, seconds: float | None, enabled: bool) -> None:
        super().__init__()
        self.made_with, self.updates, self.closed = (steps, seconds, enabled), [], False

    def update(self, n: float) -> None:
        self.updates.append(n)

    def close(self) -> None:
        self.closed = True


def _record_bars(monkeypatch) -> list[_RecordingBar]:
    bars: list[_RecordingBar] = []

    def make(steps, seconds, enabled):
        bars.append(_RecordingBar(steps, seconds, enabled))
        return bars[-1]
    monkeypatch.setattr(train, "_progress_bar", make)
    return bars


def _at_most(steps: int):
    """A callback that stops a loop which runs past `steps` (a mutant's endless loop fails fast)."""
    def check(history) -> None:
        assert len(history.steps) <= steps, f"{len(history.steps)} steps, expected at most {steps}"
    return check


def test_fit_by_steps_follows_a_non_default_schedule_and_counts_one_per_step(monkeypatch):
    bars = _record_bars(monkeypatch)
    trainer = tiny_trainer(learning_rate=1e-2, warmup=0.25, min_lr_ratio=0.5, eval_every=2)
    history = trainer.fit(steps=3, callbacks=[_at_most(3)], progress_bar=False)
    assert history.lrs == [train.learning_rate(i / 3, 1e-2, 0.25, 0.5) for i in (1, 2, 3)]
    assert history.lrs[-1] == 1e-2 * 0.5  # the floor set, not the default 0.1
    assert history.steps == [1, 2, 3] and history.eval_steps == [2, 3]
    (bar,) = bars
    assert bar.made_with == (3, None, False) and bar.updates == [1, 1, 1] and bar.closed


def test_fit_by_time_budget_guesses_each_steps_end_from_the_last(monkeypatch):
    ticks = iter([0.5 * i for i in range(100)])  # every clock reading 0.5 s after the one before
    monkeypatch.setattr(train, "time", type("Clock", (), {"perf_counter": staticmethod(lambda: next(ticks))}))
    bars = _record_bars(monkeypatch)
    trainer = tiny_trainer(learning_rate=1e-2, warmup=0.25, min_lr_ratio=0.5, eval_every=1)
    history = trainer.fit(seconds=2.0, callbacks=[_at_most(4)])
    # progress (spent + last) / seconds: 0 (no duration known yet), then 1/2, 3/4 and 1; then 2 s are spent
    assert history.lrs == [train.learning_rate(p, 1e-2, 0.25, 0.5) for p in (0.0, 0.5, 0.75, 1.0)]
    assert history.lrs[0] == 0.0 and history.train_seconds == 2.0
    assert history.steps == history.eval_steps == [1, 2, 3, 4]
    (bar,) = bars
    assert bar.made_with == (None, 2.0, True) and bar.updates == [0.5] * 4 and bar.closed


def test_split_train_val_default_and_its_fraction_named():
    train_ids, val_ids = train.split_train_val(torch.arange(100))
    assert len(train_ids) == 90 and len(val_ids) == 10
    for fraction in (0.0, 1.0):
        with pytest.raises(ValueError, match=re.escape(f"val_fraction is {fraction}, expected a number in (0, 1)")):
            train.split_train_val(torch.arange(100), fraction)


@pytest.mark.parametrize("ids, batch, length, error, said", [
    (torch.arange(9), 0, 4, ValueError, "batch_size is 0, expected a positive int"),
    (torch.arange(9), 2, 0, ValueError, "context_length is 0, expected a positive int"),
    (torch.ones(9, dtype=torch.bool), 2, 4, TypeError, "ids is torch.bool, expected a tensor of integer token ids"),
    ([1, 2, 3, 4, 5], 2, 4, TypeError, "ids is a list, expected a tensor of integer token ids"),
    (torch.arange(4), 2, 4, ValueError, "ids has shape (4,), expected a 1-D tensor of at least context_length + 1 = 5"),
])
def test_random_batch_names_what_is_wrong(ids, batch, length, error, said):
    with pytest.raises(error, match="^" + re.escape(said)):
        train.random_batch(ids, batch, length)


def test_random_batch_takes_a_text_of_exactly_one_window_and_its_next_token():
    x, y = train.random_batch(torch.arange(5), 3, 4)  # one possible window
    assert x.tolist() == [[0, 1, 2, 3]] * 3 and y.tolist() == [[1, 2, 3, 4]] * 3


@pytest.mark.parametrize("args, said", [
    ((float("nan"), 1.0), "progress is nan, expected a number in [-inf, inf]"),
    ((0.5, 0.0), "peak is 0.0, expected a finite number > 0"),
    ((0.5, 1.0, 1.0), "warmup is 1.0, expected a number in [0, 1)"),
    ((0.5, 1.0, 1.5), "warmup is 1.5, expected a number in [0, 1)"),
    ((0.5, 1.0, 0.1, 1.5), "floor is 1.5, expected a number in [0, 1]"),
])
def test_learning_rate_names_what_is_wrong(args, said):
    with pytest.raises(ValueError, match="^" + re.escape(said)):
        train.learning_rate(*args)


def test_learning_rate_without_warmup_and_past_the_end():
    assert train.learning_rate(0.0, 2.0, warmup=0.0) == 2.0  # no warm-up: the peak at once
    assert train.learning_rate(1.5, 2.0, 0.1, 0.25) == train.learning_rate(1.0, 2.0, 0.1, 0.25) == 0.5
    assert train.learning_rate(-1.0, 2.0) == 0.0
    assert train.learning_rate(1.0, 2.0, 0.1, 1.0) == 2.0  # a floor of 1: no decay at all


def _record_fast(model) -> list[bool]:
    seen: list[bool] = []
    model.register_forward_pre_hook(lambda module, args, kwargs: seen.append(kwargs.get("fast", False)),
                                    with_kwargs=True)
    return seen


@pytest.mark.parametrize("fast", [True, False])
def test_a_gpt_trains_on_its_fused_kernels_only_on_the_fast_path_and_evaluates_on_them(fast):
    trainer = tiny_trainer(fast=fast, precision="fp32")  # fp32: the working model is the model
    seen = _record_fast(trainer.model)
    x, y = trainer._batch(trainer.train_ids, torch.Generator().manual_seed(0))
    trainer.loss_on(x, y)
    assert seen == [fast]
    seen.clear()
    trainer.evaluate()  # the same yardstick for every trainer: fused kernels, float32
    assert seen == [True, True]


def test_a_model_that_is_not_a_gpt_is_called_without_fast():
    class Doubler(torch.nn.Module):
        def forward(self, x):
            return 2 * x
    assert train._logits(Doubler(), torch.ones(2), fast=True).tolist() == [2.0, 2.0]


def test_batches_go_to_the_trainers_device():
    trainer = tiny_trainer()
    trainer.device = torch.device("meta")  # as a GPU would, without one
    x, y = trainer._batch(trainer.train_ids, torch.Generator().manual_seed(0))
    assert x.device.type == y.device.type == "meta"


def test_the_plain_path_frees_each_steps_gradients_instead_of_zeroing_them_in_place():
    trainer = tiny_trainer(fast=False)
    trainer.train_step(1e-3)
    before = [(p.grad, p.grad.clone()) for p in trainer.model.parameters()]
    trainer.train_step(1e-3)
    for p, (grad, kept) in zip(trainer.model.parameters(), before, strict=True):
        assert p.grad is not grad and torch.equal(grad, kept)  # set_to_none: the old one untouched


def test_the_trainer_refuses_a_config_that_is_not_a_trainconfig():
    ids = torch.arange(5).repeat(4)
    with pytest.raises(TypeError, match="^config is a dict, expected a TrainConfig$"):
        Trainer(GPT(TINY), ids, ids, {"fast": False})


@pytest.mark.parametrize("fast", [True, False])
def test_each_path_builds_its_own_working_model_and_optimizer(fast):
    trainer = tiny_trainer(fast=fast, precision="fp32")
    if fast:  # one buffer for every weight, and PyTorch's fused AdamW step
        assert isinstance(trainer.weights, speed.FlatWeights) and trainer.optimizer.defaults["fused"] is True
    else:  # the model itself, and the textbook per-parameter AdamW
        assert isinstance(trainer.weights, train.PlainWeights) and trainer.working is trainer.model
        assert not trainer.optimizer.defaults["fused"] and trainer.optimizer.defaults["foreach"] is False


@pytest.mark.parametrize("compile", [True, False])
def test_compile_true_and_only_it_compiles_the_working_loss(compile, monkeypatch):
    compiled = []
    monkeypatch.setattr(train, "compile_loss", lambda loss: compiled.append(loss) or "compiled")
    trainer = tiny_trainer(fast=True, compile=compile)
    assert compiled == ([trainer._working_loss] if compile else [])
    assert trainer._loss == ("compiled" if compile else trainer._working_loss)


def test_evaluation_batches_are_fixed_by_the_seed_plus_one():
    trainer = tiny_trainer(seed=3, eval_batches=2)
    for name, ids in (("train", trainer.train_ids), ("val", trainer.val_ids)):
        fixed = torch.Generator().manual_seed(4)
        expected = [train.random_batch(ids, 2, TINY.context_length, fixed) for _ in range(2)]
        for (x, y), (ex, ey) in zip(trainer.eval_sets[name], expected, strict=True):
            assert torch.equal(x, ex) and torch.equal(y, ey), name


def test_a_nan_weight_stops_the_step_with_the_loss_and_norm_it_saw():
    trainer = tiny_trainer(fast=False)
    with torch.no_grad():
        trainer.model.blocks[0].attn.q_proj.weight[0, 0] = float("nan")
    said = ("the training loss is nan and the gradient norm nan at step 1 (learning rate 0.001), so "
            "training stopped before the update; the model's weights already hold NaN or inf "
            "(blocks.0.attn.q_proj.weight): rebuild or reload it")
    with pytest.raises(FloatingPointError, match="^" + re.escape(said) + "$"):
        trainer.train_step(1e-3)


def test_a_divergence_names_the_peak_rate_and_what_to_try():
    trainer = tiny_trainer(learning_rate=0.25)
    trainer.history.steps = [1, 2]
    said = ("the training loss is inf and the gradient norm 3.0 at step 3 (learning rate 0.125), so "
            "training stopped before the update; it diverged: try a smaller TrainConfig(learning_rate=...) "
            "(the peak is 0.25), a longer warmup or a smaller grad_clip")
    with pytest.raises(FloatingPointError, match="^" + re.escape(said) + "$"):
        trainer._stop_diverged(float("inf"), 3.0, 0.125)


@pytest.mark.parametrize("field, value, error, said", [
    ("batch_size", 0, ValueError, "batch_size is 0, expected a positive int"),
    ("eval_every", 0, ValueError, "eval_every is 0, expected a positive int"),
    ("eval_batches", 1.5, TypeError, "eval_batches is 1.5 (a float), expected a positive int"),
    ("context_length", 0, ValueError,
     "context_length is 0, expected a positive int (or None for the model's context length)"),
    ("context_length", "8", TypeError,
     "context_length is '8' (a str), expected a positive int (or None for the model's context length)"),
    ("learning_rate", 0.0, ValueError, "learning_rate is 0.0, expected a finite number > 0"),
    ("grad_clip", -1.0, ValueError, "grad_clip is -1.0, expected a finite number > 0"),
    ("warmup", 1.0, ValueError, "warmup is 1.0, expected a fraction of the run in [0, 1)"),
    ("warmup", -0.5, ValueError, "warmup is -0.5, expected a fraction of the run in [0, 1)"),
    ("min_lr_ratio", 1.5, ValueError, "min_lr_ratio is 1.5, expected a fraction of the peak learning rate in [0, 1]"),
    ("min_lr_ratio", -0.5, ValueError, "min_lr_ratio is -0.5, expected a fraction of the peak learning rate in [0, 1]"),
    ("weight_decay", -0.5, ValueError, "weight_decay is -0.5, expected a number >= 0 (0 = no decay)"),
    ("weight_decay", float("inf"), ValueError, "weight_decay is inf, expected a number >= 0 (0 = no decay)"),
    ("precision", "fp16", ValueError, "precision is 'fp16', expected one of 'auto', 'bf16', 'fp32'"),
    ("fast", 1, TypeError, "fast is 1 (a int), expected True or False"),
    ("compile", "no", TypeError, "compile is 'no' (a str), expected True or False"),
    ("seed", -1, ValueError, "seed is -1, expected an int >= 0"),
])
def test_trainconfig_messages(field, value, error, said):
    with pytest.raises(error, match="^" + re.escape(said) + "$"):
        TrainConfig(**{field: value})
    with pytest.raises(ValueError, match="^compile=True needs fast=True: the plain path is the uncompiled reference$"):
        TrainConfig(compile=True, fast=False)


def test_trainconfig_accepts_the_edges_of_each_range():
    config = TrainConfig(warmup=0.0, min_lr_ratio=1.0, weight_decay=0.0, seed=0, context_length=1,
                         batch_size=1, eval_every=1, eval_batches=1, precision="bf16")
    assert (config.warmup, config.min_lr_ratio, config.weight_decay) == (0.0, 1.0, 0.0)
    assert TrainConfig(min_lr_ratio=0.0, fast=False, precision="fp32").min_lr_ratio == 0.0


def test_split_train_val_takes_one_token_each_and_says_when_a_part_is_empty():
    train_ids, val_ids = train.split_train_val(torch.arange(2), 0.5)  # the smallest split
    assert train_ids.tolist() == [0] and val_ids.tolist() == [1]
    said = ("val_fraction = 0.9 of 3 tokens leaves 0 for training and 3 for validation, expected both "
            "parts non-empty: give more text or another val_fraction")
    with pytest.raises(ValueError, match="^" + re.escape(said) + "$"):
        train.split_train_val(torch.arange(3), 0.9)


def test_tokens_per_second_of_a_run_too_short_to_time_is_finite():
    # train_seconds 0 (or below a nanosecond) counts as 1 ns: 4 steps of 100 tokens -> 4e11 / s
    for seconds in (0.0, 1e-12):
        rate = train.History(steps=[1, 2, 3, 4], tokens_per_step=100, train_seconds=seconds).tokens_per_second
        assert rate == pytest.approx(4e11, rel=1e-12)
    assert train.History(steps=[7], tokens_per_step=3, train_seconds=0.5).tokens_per_second == 6.0


def test_evaluate_loss_is_the_mean_over_batches_without_dropout_and_restores_the_mode():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=5, context_length=4, n_layers=1, n_heads=1, d_model=8,
                          dropout=0.5))
    batches = [(torch.tensor([[0, 1, 2, 3]]), torch.tensor([[1, 2, 3, 4]])),
               (torch.tensor([[4, 4, 0, 0], [1, 2, 3, 4]]), torch.tensor([[4, 0, 0, 1], [2, 3, 4, 0]]))]
    model.eval()
    with torch.no_grad():
        losses = [torch.nn.functional.cross_entropy(model(x, fast=True).flatten(0, 1), y.flatten()).item()
                  for x, y in batches]
    assert losses[0] != pytest.approx(losses[1], rel=1e-3)  # the mean is not either one
    model.train()
    assert train.evaluate_loss(model, batches) == pytest.approx(sum(losses) / 2, rel=1e-6)
    assert model.training is True and all(m.training for m in model.modules())
    assert train.evaluate_loss(model, batches[:1]) == pytest.approx(losses[0], rel=1e-6)
    model.eval()
    assert train.evaluate_loss(model, batches) == pytest.approx(sum(losses) / 2, rel=1e-6)
    assert model.training is False


SMALL = GPTConfig(vocab_size=11, context_length=8, n_layers=2, n_heads=2, d_model=8)


def training_data() -> tuple[torch.Tensor, torch.Tensor]:
    pattern = torch.tensor([0, 1, 2, 3, 4, 5, 6, 5, 4, 3, 2, 1]).repeat(40)
    return pattern[:400], pattern[400:]


def test_trainer_refuses_a_model_with_a_nan_weight():
    model = GPT(SMALL)
    with torch.no_grad():
        model.blocks[1].attn.q_proj.weight[0, 0] = float("nan")
    with pytest.raises(ValueError, match=r"model has NaN or inf in blocks.1.attn.q_proj.weight before training"):
        Trainer(model, *training_data())


@pytest.mark.parametrize("fast", [True, False])
def test_training_stops_at_a_weight_turned_nan_naming_the_step(fast):
    torch.manual_seed(0)
    model = GPT(SMALL)
    trainer = Trainer(model, *training_data(), TrainConfig(batch_size=4, fast=fast, precision="fp32"))
    trainer.fit(steps=2, progress_bar=False)
    with torch.no_grad():
        model.blocks[1].attn.q_proj.weight[0, 0] = float("nan")
    before = model.blocks[0].mlp.up.weight.clone()
    with pytest.raises(FloatingPointError, match=r"at step 3 .*weights already hold NaN "
                                                 r"or inf \(blocks.1.attn.q_proj.weight\)"):
        trainer.fit(steps=5, progress_bar=False)
    assert torch.equal(model.blocks[0].mlp.up.weight, before)  # stopped before the update


@pytest.mark.parametrize("fast", [True, False])
def test_training_stops_when_a_huge_learning_rate_diverges(fast):
    torch.manual_seed(0)
    config = TrainConfig(batch_size=4, learning_rate=1e6, warmup=0.0, fast=fast, precision="fp32")
    trainer = Trainer(GPT(SMALL), *training_data(), config)
    with pytest.raises(FloatingPointError, match=r"at step \d+ .*try a smaller TrainConfig\(learning_rate"):
        trainer.fit(steps=40, progress_bar=False)
    assert all(math.isfinite(loss) for loss in trainer.history.losses)  # nothing NaN was recorded


@pytest.mark.parametrize("field, value, error", [
    ("context_length", 0, ValueError), ("context_length", 4.0, TypeError), ("weight_decay", -1.0, ValueError),
    ("min_lr_ratio", 5.0, ValueError), ("warmup", -1.0, ValueError), ("warmup", 1.0, ValueError),
    ("learning_rate", 0.0, ValueError), ("precision", "fp16", ValueError),
])
def test_train_config_refuses_values_that_make_no_sense(field, value, error):
    with pytest.raises(error, match=f"{field} is {value!r}"):
        TrainConfig(**{field: value})


def test_block_size_none_means_the_context_length_and_a_longer_one_is_refused():
    train_ids, val_ids = training_data()
    assert Trainer(GPT(SMALL), train_ids, val_ids, TrainConfig(context_length=None)).context_length == 8
    with pytest.raises(ValueError, match="context_length is 9, expected at most the model's context_length = 8"):
        Trainer(GPT(SMALL), train_ids, val_ids, TrainConfig(context_length=9))


@pytest.mark.parametrize("short", ["train_ids", "val_ids"])
def test_too_short_data_is_named(short):
    data = dict(zip(("train_ids", "val_ids"), training_data(), strict=True))
    data[short] = data[short][:5]
    with pytest.raises(ValueError, match=rf"{short} has shape \(5,\), expected .* at least context_length \+ 1 = 9"):
        Trainer(GPT(SMALL), data["train_ids"], data["val_ids"])


def _escape(text: str) -> str:
    import re
    return re.escape(text)


@pytest.mark.parametrize("lr", [float("nan"), float("inf"), -1.0, "0.1"])
def test_train_step_refuses_a_learning_rate_that_is_not_finite_and_non_negative(lr):
    torch.manual_seed(0)
    ids = torch.arange(40) % SMALL.vocab_size
    trainer = Trainer(GPT(SMALL), ids, ids, TrainConfig(batch_size=2, precision="fp32"))
    before = [p.detach().clone() for p in trainer.model.parameters()]
    with pytest.raises((ValueError, TypeError), match="lr is"):
        trainer.train_step(lr)
    assert all(torch.equal(a, b) for a, b in zip(before, trainer.model.parameters(), strict=True))


@pytest.mark.parametrize("ids, fraction, words", [
    (torch.arange(10), 0.99, "leaves 0 for training and 10 for validation"),
    (torch.arange(3), 1e-17, "leaves 3 for training and 0 for validation"),
    (torch.zeros(2, 5), 0.1, "ids is of shape (2, 5), expected a 1-D tensor"),
])
def test_split_train_val_refuses_an_empty_split(ids, fraction, words):
    with pytest.raises(ValueError, match=_escape(words)):
        split_train_val(ids, fraction)


def test_split_stories_keeps_both_parts_non_empty():
    train, val = split_stories("a\n\nb\n\nc\n\n", val_fraction=0.99)
    assert train == "a\n\n" and val == "b\n\nc\n\n"


def test_random_batch_refuses_float_ids():
    from helpers.training.trainer import random_batch
    with pytest.raises(TypeError, match="ids is torch.float32, expected a tensor of integer token ids"):
        random_batch(torch.arange(20.0), 2, 4)


@pytest.mark.parametrize("fast", [False, True])
def test_weight_decay_reaches_the_matrices_only_at_the_configured_value(fast):
    model = small_gpt(torch.float32)
    ids = torch.randint(0, 31, (500,), generator=torch.Generator().manual_seed(0))
    trainer = Trainer(model, ids, ids, TrainConfig(weight_decay=0.37, learning_rate=3e-3,
                                                   fast=fast, precision="fp32", batch_size=2))
    groups = trainer.optimizer.param_groups
    assert [g["weight_decay"] for g in groups] == [0.37, 0.0]
    assert all(g["lr"] == 3e-3 for g in groups)
    decayed = sum(p.numel() for p in groups[0]["params"])
    not_decayed = sum(p.numel() for p in groups[1]["params"])
    matrices = sum(p.numel() for p in model.parameters() if p.dim() >= 2)
    vectors = sum(p.numel() for p in model.parameters() if p.dim() < 2)
    assert (decayed, not_decayed) == (matrices, vectors)  # the tied matrix counted once


@pytest.mark.parametrize("precision,expected", [("fp32", torch.float32), ("bf16", torch.bfloat16)])
def test_the_trainer_computes_in_the_precision_asked_for(precision, expected):
    model = small_gpt(torch.float32)
    ids = torch.randint(0, 31, (500,), generator=torch.Generator().manual_seed(0))
    trainer = Trainer(model, ids, ids, TrainConfig(precision=precision, batch_size=2))
    assert trainer.dtype == expected
    assert next(trainer.working.parameters()).dtype == expected
    assert next(model.parameters()).dtype == torch.float32  # the weights AdamW updates stay float32


def tiny_trainer_evaluating_every_2_steps(**config) -> train.Trainer:
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=7, context_length=8, n_layers=1, n_heads=1, d_model=8))
    ids = torch.tensor([0, 1, 2, 3, 4, 5, 6, 5, 4, 3, 2, 1]).repeat(20)
    settings = dict(batch_size=2, eval_batches=1, eval_every=2) | config
    return train.Trainer(model, *train.split_train_val(ids, 0.2), train.TrainConfig(**settings))


def test_the_history_holds_the_evaluated_losses():
    trainer = tiny_trainer_evaluating_every_2_steps()
    history = trainer.fit(steps=2, progress_bar=False)
    losses = trainer.evaluate()  # the same fixed batches, the same weights
    assert history.eval_steps == [2]
    assert history.train_losses == [losses["train"]] and history.val_losses == [losses["val"]]


def test_the_schedules_defaults_are_a_5_percent_warmup_and_a_10_percent_floor():
    for progress in (0.0, 0.025, 0.05, 0.3, 0.9, 1.0):
        assert train.learning_rate(progress, 2.0) == train.learning_rate(progress, 2.0, 0.05, 0.1)
    assert train.learning_rate(0.025, 2.0) == 1.0 and train.learning_rate(1.0, 2.0) == 0.2


def test_the_schedule_holds_outside_the_run_and_peaks_exactly_at_the_warmups_end():
    assert train.learning_rate(1.5, 0.7) == train.learning_rate(1.0, 0.7) == pytest.approx(0.07)
    assert train.learning_rate(-0.5, 0.7) == 0.0
    assert 0.7 * 0.05 / 0.05 != 0.7  # so the warm-up formula at its own end would be seen
    assert train.learning_rate(0.05, 0.7, warmup=0.05) == 0.7


def test_the_progress_bar_counts_steps_or_seconds_as_asked():
    bar = train._progress_bar(5, None, enabled=True)
    assert (bar.total, bar.unit, bar.disable, bar.mininterval) == (5, "step", False, 0.5)
    bar.close()
    bar = train._progress_bar(None, 3.0, enabled=True)
    assert (bar.total, bar.unit, bar.disable, bar.mininterval) == (3.0, "s", False, 0.5)
    assert "{n:.0f}/{total:.0f} s" in bar.bar_format
    bar.close()
    for steps, seconds in ((5, None), (None, 3.0)):
        assert train._progress_bar(steps, seconds, enabled=False).disable is True


def test_fit_shows_a_bar_with_both_losses_by_default(capsys):
    tiny_trainer_evaluating_every_2_steps().fit(steps=2)
    err = capsys.readouterr().err
    assert "2/2" in err and "step" in err and "train=" in err and "val=" in err


def test_encode_text_gives_int64_ids_even_for_no_text():
    class Letters:
        def encode(self, text):
            return [ord(c) - ord("a") for c in text]

    assert train.encode_text(Letters(), "cab").tolist() == [2, 0, 1]
    empty = train.encode_text(Letters(), "")
    assert empty.dtype == torch.int64 and empty.shape == (0,)


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(progress="a"), TypeError, r"^progress is 'a' \(a str\), expected a number in \[-inf, inf\]$"),
    (dict(peak=0.0), ValueError, "^peak is 0.0, expected a finite number > 0$"),
    (dict(warmup=1.0), ValueError, r"^warmup is 1.0, expected a number in \[0, 1\)$"),
    (dict(warmup=1.5), ValueError, r"^warmup is 1.5, expected a number in \[0, 1\)$"),
    (dict(floor=1.5), ValueError, r"^floor is 1.5, expected a number in \[0, 1\]$"),
])
def test_the_schedule_names_a_bad_argument(kwargs, error, message):
    with pytest.raises(error, match=message):
        train.learning_rate(**(dict(progress=0.5, peak=1.0) | kwargs))


def test_fit_and_the_splits_name_a_bad_argument():
    with pytest.raises(TypeError, match="^progress_bar is 'yes'"):
        tiny_trainer_evaluating_every_2_steps().fit(steps=1, progress_bar="yes")
    with pytest.raises(ValueError, match="^ids is a list, expected a 1-D tensor of token ids$"):
        train.split_train_val([1, 2, 3])
    with pytest.raises(ValueError, match=r"^ids is of shape \(2, 2\), expected a 1-D tensor"):
        train.split_train_val(torch.zeros(2, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="^val_text has no non-blank lines, expected at least one$"):
        train.line_overlap("a", "\n \n")


def test_two_stories_split_and_keep_their_own_spaces():
    assert train.split_stories("  a\n\n b \n", 0.5) == ("  a\n\n", " b \n\n")
