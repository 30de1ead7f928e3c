"""Bad input to the model-side helpers ends in a course message, never silently or in torch's
own words (issue 17): each case asserts the exception type and that the message names the
argument. Cases that are made right instead of refused (a tiny temperature, a numpy scale)
assert the right result.
"""

from __future__ import annotations

import math
import os
import random
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import helpers.lab.exercises as exercises
from helpers import checks
from helpers.model.attention import padding_mask, scaled_dot_product_attention
from helpers.model.checkpoints import CheckpointError, load_checkpoint, save_checkpoint
from helpers.model.embeddings import TokenAndPositionEmbedding
from helpers.model.generation import generate, sample_next
from helpers.model.gpt import GPT, GPTConfig
from helpers.model.kv_cache import KVCache
from helpers.model.layers import Block, FeedForward, LayerNorm, SwiGLUFeedForward, layer_norm
from helpers.model.multihead import MultiHeadAttention
from helpers.training.trainer import TrainConfig, Trainer

SMALL = GPTConfig(vocab_size=11, context_length=8, n_layers=2, n_heads=2, d_model=8)


def small_model(**changes) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(**{**SMALL.to_dict(), **changes})).eval()


def ids(batch: int = 1, length: int = 4) -> torch.Tensor:
    return torch.randint(0, SMALL.vocab_size, (batch, length), generator=torch.Generator().manual_seed(1))


def training_data() -> tuple[torch.Tensor, torch.Tensor]:
    pattern = torch.tensor([0, 1, 2, 3, 4, 5, 6, 5, 4, 3, 2, 1]).repeat(40)
    return pattern[:400], pattern[400:]


# --- the shared checks ---------------------------------------------------------------------

@pytest.mark.parametrize("check, value, error, match", [
    (checks.positive_int, 0, ValueError, "n is 0, expected a positive int"),
    (checks.positive_int, 2.0, TypeError, r"n is 2.0 \(a float\), expected a positive int"),
    (checks.positive_int, True, TypeError, "n is True"),
    (checks.positive_int, None, TypeError, "n is None"),
    (checks.positive_float, 0.0, ValueError, "n is 0.0, expected a finite number > 0"),
    (checks.positive_float, math.nan, ValueError, "n is nan"),
    (checks.positive_float, "1", TypeError, "n is '1'"),
    (checks.boolean, "False", TypeError, "n is 'False' .*write False, not the string"),
    (checks.boolean, 1, TypeError, "n is 1 .*expected True or False"),
    (checks.integer, 1.0, TypeError, r"^n is 1.0 \(a float\), expected an int$"),
    (checks.integer, True, TypeError, r"^n is True \(a bool\), expected an int$"),
    (checks.integer, "7", TypeError, r"^n is '7' \(a str\), expected an int$"),
])
def test_shared_checks_name_the_argument(check, value, error, match):
    with pytest.raises(error, match=match):
        check("n", value)


def test_shared_checks_accept_numpy_numbers_and_return_plain_ones():
    assert checks.positive_int("n", np.int64(3)) == 3 and type(checks.positive_int("n", np.int64(3))) is int
    assert checks.positive_float("x", np.float32(0.5)) == 0.5
    assert checks.boolean("b", np.bool_(True)) is True
    assert checks.integer("seed", -3) == -3 and type(checks.integer("seed", np.int64(5))) is int
    with pytest.raises(TypeError, match=r"^n is 2.5 \(a float\), expected a whole number$"):
        checks.integer("n", 2.5, "a whole number")
    text = "abc"
    assert checks.instance("text", text, str, "a str") is text
    with pytest.raises(TypeError, match=r"^rng is 3 \(a int\), expected a random.Random$"):
        checks.instance("rng", 3, random.Random, "a random.Random")
    assert checks.number_in("p", 0.0, 0.0, 1.0, high_open=True) == 0.0
    with pytest.raises(ValueError, match=r"p is 1.0, expected a number in \[0, 1\)"):
        checks.number_in("p", 1.0, 0.0, 1.0, high_open=True)


# --- layers: silent before -----------------------------------------------------------------

@pytest.mark.parametrize("make", [lambda: LayerNorm(8, eps=0), lambda: LayerNorm(8, eps=-1),
                                  lambda: layer_norm(torch.ones(2, 8), eps=0.0)])
def test_layer_norm_refuses_an_eps_that_is_not_positive(make):
    with pytest.raises(ValueError, match="eps is .*expected a finite number > 0"):
        make()


@pytest.mark.parametrize("make", [lambda: FeedForward(8, hidden=0), lambda: SwiGLUFeedForward(8, hidden=0)])
def test_feed_forward_refuses_an_empty_hidden_layer(make):
    with pytest.raises(ValueError, match="hidden is 0, expected a positive int"):
        make()


@pytest.mark.parametrize("make, name", [
    (lambda: GPTConfig(tie_weights="False"), "tie_weights"),
    (lambda: GPTConfig(bias="True"), "bias"),
    (lambda: Block(8, 2, pre_norm="no"), "pre_norm"),
    (lambda: MultiHeadAttention(8, 2, bias="False"), "bias"),
    (lambda: TrainConfig(fast="False"), "fast"),
    (lambda: TrainConfig(compile="yes"), "compile"),
    (lambda: MultiHeadAttention(8, 2)(torch.randn(1, 3, 8), causal="no"), "causal"),
    (lambda: small_model()(ids(), fast="False"), "fast"),
    (lambda: generate(small_model(), ids(), 2, use_cache="False"), "use_cache"),
])
def test_strings_are_refused_where_a_bool_is_expected(make, name):
    with pytest.raises(TypeError, match=rf"{name} is '.*' \(a str\), expected True or False"):
        make()


def test_padding_mask_refuses_float_lengths():
    with pytest.raises(TypeError, match="lengths has dtype torch.float32, expected an integer tensor"):
        padding_mask(torch.tensor([2.5, 1.0]), 4)


def test_attention_refuses_tensors_on_different_devices():
    q = torch.randn(3, 4)
    k = torch.randn(3, 4, device="meta")
    with pytest.raises(ValueError, match="q is on cpu, k on meta and v on cpu"):
        scaled_dot_product_attention(q, k, torch.randn(3, 4))


# --- generation ----------------------------------------------------------------------------

@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_sampling_refuses_nan_logits_instead_of_picking_them(temperature):
    logits = torch.tensor([[0.5, float("nan"), 0.1], [0.2, 0.3, 0.1]])
    with pytest.raises(ValueError, match="logits row 0 contains NaN"):
        sample_next(logits, temperature=temperature)


def test_generate_stops_on_a_model_with_a_nan_weight():
    model = small_model()
    with torch.no_grad():
        model.blocks[0].mlp.up.weight[0, 0] = float("nan")
    with pytest.raises(ValueError, match="logits row 0 contains NaN"):
        generate(model, ids(), 3, temperature=0.0)


def test_top_k_keeps_exactly_k_tokens_and_breaks_ties_by_the_lower_id():
    logits = torch.tensor([[5.0, 1.0, 5.0, 5.0, 0.0]]).expand(2000, 5)
    drawn = sample_next(logits, temperature=1.0, top_k=2, generator=torch.Generator().manual_seed(0))
    assert set(drawn.flatten().tolist()) == {0, 2}  # of the three tied best (0, 2, 3), the two lowest ids


def test_forward_cached_refuses_training_mode_with_dropout():
    model = small_model(dropout=0.1).train()
    with pytest.raises(RuntimeError, match=r"training mode with dropout = 0.1.*call model.eval\(\)"):
        model.forward_cached(ids(), KVCache.for_model(model, 1))
    model.eval()
    assert model.forward_cached(ids(), KVCache.for_model(model, 1)).shape == (1, 4, SMALL.vocab_size)


# --- training ------------------------------------------------------------------------------

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


# --- checkpoints ---------------------------------------------------------------------------

@pytest.mark.parametrize("extra, match", [
    ({"folder": Path("runs")}, r"extra value 'folder' is PosixPath|extra value 'folder' is WindowsPath"),
    ({"loss": np.float64(1.5)}, r"extra value 'loss' is np.float64\(1.5\).*use float\(...\)"),
    ({"losses": [1.0, np.float32(2.0)]}, r"extra value 'losses'\[1\]"),
])
def test_save_checkpoint_refuses_extras_that_could_not_be_loaded_back(tmp_path, extra, match):
    with pytest.raises(TypeError, match=match):
        save_checkpoint(tmp_path / "model.pt", small_model(), **extra)
    assert not (tmp_path / "model.pt").exists()


def test_a_checkpoint_round_trips_with_plain_extras(tmp_path):
    model = small_model(activation="gelu_tanh")
    save_checkpoint(tmp_path / "model.pt", model, steps=3, note="run 1", losses=[2.5, 2.0], meta={"a": 1})
    restored, saved = load_checkpoint(tmp_path / "model.pt")
    assert restored.config == model.config and saved["extra"]["losses"] == [2.5, 2.0]
    assert torch.equal(restored(ids()), model(ids()))


def _write_bad_file(kind: str, folder: Path) -> Path:
    path = folder / f"{kind}.pt"
    if kind == "random":
        path.write_bytes(b"\x00" + os.urandom(1999))  # never "{" or "[" first: that is the JSON case
    elif kind == "truncated":
        save_checkpoint(path, small_model())
        path.write_bytes(path.read_bytes()[:3000])
    elif kind == "tokenizer JSON":
        path.write_text('{"merges": [[104, 105]], "pattern": "x"}')
    elif kind == "pickled model":
        torch.save(small_model(), path)
    elif kind == "state dict":
        torch.save(small_model().state_dict(), path)
    elif kind == "huge config":
        save_checkpoint(path, small_model())
        state = torch.load(path, weights_only=True)
        state["config"]["vocab_size"] = 10**12  # 8 TB of embedding if it were allocated
        torch.save(state, path)
    elif kind == "string flag in config":
        save_checkpoint(path, small_model())
        state = torch.load(path, weights_only=True)
        state["config"]["tie_weights"] = "False"
        torch.save(state, path)
    return path


@pytest.mark.parametrize("kind, match", [
    ("random", "is not a PyTorch checkpoint"),
    ("truncated", "damaged or truncated"),
    ("tokenizer JSON", "is a JSON file"),
    ("pickled model", "a whole pickled object"),
    ("state dict", "a bare state dict"),
    ("huge config", r"do not match its config \(embed.token.weight has shape \(11, 8\)"),
    ("string flag in config", "invalid config: tie_weights is 'False'"),
])
def test_load_checkpoint_explains_files_it_cannot_load(tmp_path, kind, match):
    path = _write_bad_file(kind, tmp_path)
    with pytest.raises(CheckpointError, match=match) as raised:
        load_checkpoint(path)
    assert str(path) in str(raised.value)
    assert "weights_only=False" not in str(raised.value)


# --- exercises -----------------------------------------------------------------------------

def test_check_refuses_a_float_count(capsys):
    def as_float(n_layers: int, d_model: int, vocab_size: int, context_length: int) -> float:
        d = d_model
        return float(n_layers * (12 * d * d + 13 * d) + vocab_size * d + context_length * d + 2 * d)

    assert not exercises.passes("gpt.exact_parameters", as_float)
    exercises.check("gpt.exact_parameters", as_float)
    assert "should be an int, but it is a float" in capsys.readouterr().out
    assert exercises.passes("gpt.exact_parameters", lambda *args: int(as_float(*args)))
    assert not exercises.passes("multihead_attention.kv_cache_bytes_per_token",
                                lambda n, h, d, b: 2.0 * n * h * d * b)
    assert not exercises.passes("tokenization.count_pairs",
                                lambda ids: {pair: 1.0 for pair in zip(ids, ids[1:], strict=False)})


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


# --- obscure before: torch's words replaced by the course's --------------------------------

@pytest.mark.parametrize("module", [MultiHeadAttention(8, 2), FeedForward(8), SwiGLUFeedForward(8), Block(8, 2)])
def test_wrong_width_is_named_before_the_matrix_product(module):
    with pytest.raises(ValueError, match=r"x has shape \(1, 3, 6\), expected \((B, N|\.\.\.), 8\)"):
        module(torch.randn(1, 3, 6))


@pytest.mark.parametrize("module", [MultiHeadAttention(8, 2), FeedForward(8), SwiGLUFeedForward(8), Block(8, 2)])
def test_wrong_dtype_is_named_before_the_matrix_product(module):
    with pytest.raises(TypeError, match="x has dtype torch.float64, expected torch.float32"):
        module(torch.randn(1, 3, 8, dtype=torch.float64))


@pytest.mark.parametrize("make, name", [
    (lambda: MultiHeadAttention(-8, 2), "d_model"), (lambda: LayerNorm(-1), "d_model"),
    (lambda: FeedForward(-4), "d_model"), (lambda: SwiGLUFeedForward(-6), "d_model"),
    (lambda: Block(8, -2), "n_heads"), (lambda: GPTConfig(d_model=-8), "d_model"),
    (lambda: KVCache(-1, 1, 1, 4, 4), "n_layers"),
    (lambda: TokenAndPositionEmbedding(-3, 4, 4), "vocab_size"),
])
def test_negative_sizes_are_named(make, name):
    with pytest.raises(ValueError, match=f"{name} is -"):
        make()


@pytest.mark.parametrize("token_ids, error, match", [
    (torch.tensor([[1, 2]], dtype=torch.uint8), TypeError, "token_ids has dtype torch.uint8, expected .*torch.long"),
    (torch.zeros(1, 2, dtype=torch.long, device="meta"), ValueError, "token_ids is on the meta device"),
    (torch.zeros(1, 0, dtype=torch.long), ValueError, r"token_ids has shape \(1, 0\): a sequence of 0 tokens"),
])
def test_bad_token_ids_are_named(token_ids, error, match):
    with pytest.raises(error, match=match):
        small_model()(token_ids)


def test_vocab_size_none_is_named():
    with pytest.raises(TypeError, match="vocab_size is None"):
        GPTConfig(vocab_size=None)


@pytest.mark.parametrize("cache, error, match", [
    (KVCache(2, 3, 2, 8, 4), ValueError, "cache has batch size 3 .*expected 1"),
    (KVCache(1, 1, 2, 8, 4), ValueError, "cache has layers 1 .*expected 2"),
    (KVCache(2, 1, 2, 8, 4, dtype=torch.float64), TypeError, "cache holds torch.float64"),
])
def test_a_cache_that_does_not_fit_the_model_is_named(cache, error, match):
    with pytest.raises(error, match=match):
        small_model().forward_cached(ids(), cache)


def test_a_tiny_temperature_is_greedy_not_nan():
    logits = torch.tensor([[0.1, 2.0, 1.9], [3.0, -1.0, 0.0]])
    drawn = sample_next(logits, temperature=1e-40, generator=torch.Generator().manual_seed(0))
    assert drawn.flatten().tolist() == [1, 0]


@pytest.mark.parametrize("logits, error, match", [
    (torch.full((2, 4), float("-inf")), ValueError, "logits row 0 has best value -inf"),
    (torch.zeros(1, 0), ValueError, r"logits has shape \(1, 0\), expected \(B, V\) with a vocabulary of V >= 1"),
    ([[0.1, 0.2]], TypeError, "logits is a list"),
])
def test_sampling_names_logits_it_cannot_sample_from(logits, error, match):
    with pytest.raises(error, match=match):
        sample_next(logits)


def test_generate_names_a_list_prompt():
    with pytest.raises(TypeError, match=r"prompt is a list, expected a \(B, N\) tensor"):
        generate(small_model(), [[1, 2, 3]], 2)


def test_numpy_scales_are_accepted_when_positive():
    q, k, v = torch.randn(3, 4), torch.randn(5, 4), torch.randn(5, 4)
    out, _ = scaled_dot_product_attention(q, k, v, scale=np.float32(0.5))
    assert torch.allclose(out, scaled_dot_product_attention(q, k, v, scale=0.5)[0])
    with pytest.raises(ValueError, match="scale is np.float32"):
        scaled_dot_product_attention(q, k, v, scale=np.float32(-1.0))


def test_a_zero_length_sequence_is_named_as_the_argument():
    with pytest.raises(ValueError, match=r"x has shape \(1, 0, 8\): a sequence of 0 tokens"):
        MultiHeadAttention(8, 2)(torch.randn(1, 0, 8), causal=True)
