"""helpers.training.trainer: what the mutation run (benchmarks/mutation.py) showed no test asserting.

Grouped by the classes of issue 30: configuration asserted (the progress bar's settings, what
fit records and shows), edge sizes (two stories, the smallest split), fixtures where the
behaviour decides the answer (stories that begin with a blank or an X), exact messages.
"""

from __future__ import annotations

import re

import pytest
import torch

from helpers.model.gpt import GPT, GPTConfig
from helpers.training import trainer as train
from helpers.training.trainer import TrainConfig, Trainer

TINY = GPTConfig(vocab_size=5, context_length=4, n_layers=1, n_heads=1, d_model=8)


def tiny_trainer(**config) -> Trainer:
    torch.manual_seed(0)
    ids = torch.tensor([0, 1, 2, 3, 4, 3, 2, 1]).repeat(10)
    settings = dict(batch_size=2, eval_batches=1, eval_every=2, fast=False) | config
    val = torch.tensor([4, 4, 0, 0, 1, 2]).repeat(10)  # another text: its loss differs
    return Trainer(GPT(TINY), ids, val, TrainConfig(**settings))


# --- data ------------------------------------------------------------------------------------

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


# --- the progress bar: its settings, and what fit shows -------------------------------------

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


# --- fit: the schedule it follows, what it counts, on a clock it does not own ----------------

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


# --- random_batch and learning_rate: every argument named, the edges of each range ------------

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


# --- the paths: which forward runs, where batches go, how gradients are reset -----------------

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


# --- what the Trainer builds: its paths, optimiser, compiled loss and fixed evaluation batches -

def test_the_trainer_refuses_a_config_that_is_not_a_trainconfig():
    ids = torch.arange(5).repeat(4)
    with pytest.raises(TypeError, match="^config is a dict, expected a TrainConfig$"):
        Trainer(GPT(TINY), ids, ids, {"fast": False})


@pytest.mark.parametrize("fast", [True, False])
def test_each_path_builds_its_own_working_model_and_optimizer(fast):
    trainer = tiny_trainer(fast=fast, precision="fp32")
    if fast:  # one buffer for every weight, and PyTorch's fused AdamW step
        assert trainer.flat is not None and trainer.optimizer.defaults["fused"] is True
    else:  # the model itself, and the textbook per-parameter AdamW
        assert trainer.flat is None and trainer.working is trainer.model
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


# --- TrainConfig: every field's refusal, whole, and the edges it accepts ---------------------

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


# --- what a run measured, and the evaluation (mutated since @property and @torch.no_grad() are) ---

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
