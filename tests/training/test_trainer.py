"""helpers.training.trainer: token ids and batches, the splits, the schedule, the loop, its
history and progress bar, and checkpoints of what it trained. The fast and plain paths are
compared in test_trainer_paths.py; precision and the one-buffer path in test_speed.py; the
Trainer's refusals in test_guards.py. The model and data are tests/training/conftest.py's.
"""

from __future__ import annotations

import dataclasses
import math
import re

import pytest
import torch

from helpers.model.checkpoints import load_checkpoint, save_checkpoint
from helpers.model.gpt import GPT, GPTConfig
from helpers.model.modern import ModernConfig, ModernGPT
from helpers.training import trainer as train
from helpers.training.trainer import (
    History,
    TrainConfig,
    Trainer,
    learning_rate,
    random_batch,
    split_stories,
    split_train_val,
)


def test_random_batch_targets_are_the_inputs_shifted_by_one():
    ids = torch.arange(1000)
    x, y = random_batch(ids, 6, 10, torch.Generator().manual_seed(0))
    assert x.shape == y.shape == (6, 10)
    assert torch.equal(y, x + 1)  # ids[i] == i, so the next token is always one more
    assert torch.equal(x[:, 1:], y[:, :-1])


def test_random_batch_refuses_too_short_a_text():
    with pytest.raises(ValueError, match=r"ids has shape \(5,\), expected a 1-D tensor of at least"):
        random_batch(torch.arange(5), 2, 8)


def test_split_train_val_keeps_order_and_splits_by_the_fraction():
    train_ids, val_ids = split_train_val(torch.arange(100), 0.1)
    assert torch.equal(torch.cat([train_ids, val_ids]), torch.arange(100)) and len(val_ids) == 10
    assert [len(part) for part in split_train_val(torch.arange(100))] == [90, 10]  # the default, 0.1
    assert [part.tolist() for part in split_train_val(torch.arange(2), 0.5)] == [[0], [1]]  # the smallest


@pytest.mark.parametrize("ids, fraction, said", [
    ([1, 2, 3], 0.1, "^ids is a list, expected a 1-D tensor of token ids$"),
    (torch.zeros(2, 2, dtype=torch.long), 0.1, r"^ids is of shape \(2, 2\), expected a 1-D tensor"),
    (torch.arange(100), 0.0, r"^val_fraction is 0.0, expected a number in \(0, 1\)"),
    (torch.arange(100), 1.0, r"^val_fraction is 1.0, expected a number in \(0, 1\)"),
    (torch.arange(3), 0.9, "^" + re.escape("val_fraction = 0.9 of 3 tokens leaves 0 for training and 3 for "
                                          "validation, expected both parts non-empty: give more text or "
                                          "another val_fraction") + "$"),
    (torch.arange(10), 0.99, "leaves 0 for training and 10 for validation"),
    (torch.arange(3), 1e-17, "leaves 3 for training and 0 for validation"),
])
def test_split_train_val_refuses_bad_input_naming_it(ids, fraction, said):
    with pytest.raises(ValueError, match=said):
        split_train_val(ids, fraction)


def test_learning_rate_warms_up_then_decays_to_the_floor():
    rates = [learning_rate(p / 100, peak=1e-3, warmup=0.1, floor=0.1) for p in range(101)]
    peak_at = max(range(101), key=rates.__getitem__)
    assert 9 <= peak_at <= 10
    assert all(a < b for a, b in zip(rates[:peak_at], rates[1:peak_at + 1], strict=True))
    assert all(a >= b for a, b in zip(rates[peak_at:], rates[peak_at + 1:], strict=False))
    assert math.isclose(rates[-1], 1e-4)
    assert rates[0] == 0.0  # the formula: linear from 0, nothing added
    assert math.isclose(rates[5], 1e-3 * 0.05 / 0.1)  # halfway through the warm-up: half the peak


def test_fit_runs_no_step_at_rate_0_and_ends_at_the_floor(model_and_data):
    model, train_ids, val_ids = model_and_data()
    config = TrainConfig(batch_size=4, learning_rate=1e-3, warmup=0.2, min_lr_ratio=0.1, eval_every=100)
    history = Trainer(model, train_ids, val_ids, config).fit(steps=10, progress_bar=False)
    assert history.lrs[0] == pytest.approx(1e-3 * 0.1 / 0.2)  # step 1 ends 10 % of the way
    assert history.lrs[1] == pytest.approx(1e-3)  # the end of the warm-up
    assert history.lrs[-1] == pytest.approx(1e-4)


def test_training_makes_the_loss_fall_and_records_history(small_config, model_and_data):
    model, train_ids, val_ids = model_and_data()
    trainer = Trainer(model, train_ids, val_ids, TrainConfig(batch_size=8, eval_every=20, learning_rate=1e-2))
    seen: list[int] = []
    history = trainer.fit(steps=60, callbacks=[lambda h: seen.append(len(h.val_losses))],
                          progress_bar=False)
    assert history.steps == list(range(1, 61))
    assert history.eval_steps == [20, 40, 60] and seen == [1, 2, 3]
    assert history.val_losses[-1] < 0.5 * math.log(small_config.vocab_size)
    assert history.losses[-1] < history.losses[0]
    assert history.tokens_per_step == 8 * 16 and history.tokens_per_second > 0


def test_time_budget_stops_and_evaluates_at_the_end(model_and_data):
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
def test_fit_checks_its_budget(kwargs, message, model_and_data):
    model, train_ids, val_ids = model_and_data()
    with pytest.raises(ValueError, match=message):
        Trainer(model, train_ids, val_ids).fit(**kwargs, progress_bar=False)


def test_history_tokens_per_second():
    history = History(steps=[1, 2, 3, 4], tokens_per_step=100, train_seconds=2.0)
    assert history.tokens_per_second == 200


def test_checkpoint_round_trip_is_identical(tmp_path, small_config, model_and_data):
    model, train_ids, val_ids = model_and_data()
    trainer = Trainer(model, train_ids, val_ids, TrainConfig(batch_size=4))
    trainer.fit(steps=3, progress_bar=False)
    path = save_checkpoint(tmp_path / "gpt.pt", model, trainer.optimizer, step=3, note="test")
    loaded, state = load_checkpoint(path)
    assert loaded.config == model.config
    assert loaded.lm_head.weight is loaded.embed.token.weight  # still tied
    for (name, a), (_, b) in zip(model.state_dict().items(), loaded.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    ids = torch.randint(0, small_config.vocab_size, (2, 16))
    assert torch.equal(model.eval()(ids), loaded.eval()(ids))
    assert state["extra"] == {"step": 3, "note": "test"}
    assert state["optimizer"]["state"], "the optimiser's moments were saved"


MODERN = ModernConfig(vocab_size=7, context_length=16, n_layers=2, n_heads=2, n_kv_heads=1, d_model=16)


@pytest.mark.parametrize("fast,precision", [(False, "fp32"), (True, "fp32"), (True, "bf16")])
def test_trainer_trains_a_modern_gpt_and_its_loss_falls(fast, precision, model_and_data):
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


def test_checkpoint_round_trip_of_a_modern_gpt(tmp_path, model_and_data):
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


def test_checkpoint_without_an_architecture_is_read_as_a_gpt(tmp_path, small_config):
    model = GPT(small_config)
    torch.save({"config": model.config.to_dict(), "model": model.state_dict()}, tmp_path / "old.pt")
    loaded, _ = load_checkpoint(tmp_path / "old.pt")
    assert type(loaded) is GPT and loaded.config == small_config


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


def test_fit_shows_a_bar_unless_told_not_to(bars, tiny_trainer):
    tiny_trainer().fit(steps=2)
    tiny_trainer().fit(steps=2, progress_bar=False)
    assert [bar.settings["disable"] for bar in bars] == [False, True]
    assert bars[0].updates == [1, 1] and bars[0].closed and set(bars[0].postfix) == {"train", "val"}


def test_fit_refuses_a_progress_bar_that_is_not_a_bool(tiny_trainer):
    with pytest.raises(TypeError, match="^progress_bar is 'yes'"):
        tiny_trainer().fit(steps=1, progress_bar="yes")


class _Bar:
    def __init__(self) -> None:
        self.postfix: dict[str, str] = {}

    def set_postfix(self, **values: str) -> None:
        self.postfix = values


def test_each_evaluation_records_and_shows_both_losses(tiny_trainer):
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


def test_fit_by_steps_follows_a_non_default_schedule_and_counts_one_per_step(monkeypatch, tiny_trainer):
    bars = _record_bars(monkeypatch)
    trainer = tiny_trainer(learning_rate=1e-2, warmup=0.25, min_lr_ratio=0.5, eval_every=2)
    history = trainer.fit(steps=3, callbacks=[_at_most(3)], progress_bar=False)
    assert history.lrs == [train.learning_rate(i / 3, 1e-2, 0.25, 0.5) for i in (1, 2, 3)]
    assert history.lrs[-1] == 1e-2 * 0.5  # the floor set, not the default 0.1
    assert history.steps == [1, 2, 3] and history.eval_steps == [2, 3]
    (bar,) = bars
    assert bar.made_with == (3, None, False) and bar.updates == [1, 1, 1] and bar.closed


def test_fit_by_time_budget_guesses_each_steps_end_from_the_last(monkeypatch, tiny_trainer):
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


def test_batches_go_to_the_trainers_device(tiny_trainer):
    trainer = tiny_trainer()
    trainer.device = torch.device("meta")  # as a GPU would, without one
    x, y = trainer._batch(trainer.train_ids, torch.Generator().manual_seed(0))
    assert x.device.type == y.device.type == "meta"


def test_evaluation_batches_are_fixed_by_the_seed_plus_one(small_config, tiny_trainer):
    trainer = tiny_trainer(seed=3, eval_batches=2)
    for name, ids in (("train", trainer.train_ids), ("val", trainer.val_ids)):
        fixed = torch.Generator().manual_seed(4)
        expected = [train.random_batch(ids, 2, small_config.context_length, fixed) for _ in range(2)]
        for (x, y), (ex, ey) in zip(trainer.eval_sets[name], expected, strict=True):
            assert torch.equal(x, ex) and torch.equal(y, ey), name


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


def test_split_stories_keeps_both_parts_non_empty():
    train, val = split_stories("a\n\nb\n\nc\n\n", val_fraction=0.99)
    assert train == "a\n\n" and val == "b\n\nc\n\n"


def test_random_batch_refuses_float_ids():
    from helpers.training.trainer import random_batch
    with pytest.raises(TypeError, match="ids is torch.float32, expected a tensor of integer token ids"):
        random_batch(torch.arange(20.0), 2, 4)


def test_the_history_holds_the_evaluated_losses(tiny_trainer):
    trainer = tiny_trainer(fast=True)
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


def test_fit_shows_a_bar_with_both_losses_by_default(capsys, tiny_trainer):
    tiny_trainer(fast=True).fit(steps=2)
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


def test_fit_and_line_overlap_name_a_bad_argument(tiny_trainer):
    with pytest.raises(TypeError, match="^progress_bar is 'yes'"):
        tiny_trainer(fast=True).fit(steps=1, progress_bar="yes")
    with pytest.raises(ValueError, match="^val_text has no non-blank lines, expected at least one$"):
        train.line_overlap("a", "\n \n")


def test_two_stories_split_and_keep_their_own_spaces():
    assert train.split_stories("  a\n\n b \n", 0.5) == ("  a\n\n", " b \n\n")
