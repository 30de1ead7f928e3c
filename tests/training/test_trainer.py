"""The trainer of notebook 7: batches, schedule, precision, fast vs plain path, checkpoints."""

from __future__ import annotations

import dataclasses
import math
import shutil

import pytest
import torch

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
    flat = trainer.flat
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
    assert trainer.flat.clip_gradients(0.01).item() == pytest.approx(expected_norm.item(), rel=1e-6)
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
