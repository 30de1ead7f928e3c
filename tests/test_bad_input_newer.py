"""Bad input to the modules added last (issue 23): each class of careless or hostile input ends
in a clear error, raised before any work is done, naming the argument or file, what it got and
what was expected. The model-side classes of the older modules are in tests/test_bad_input.py.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import threading
import time
import zipfile
from pathlib import Path

import pytest
import torch

from helpers import checks
from helpers.flash import tiled
from helpers.lab.own_text import read_text_file
from helpers.model.attention import causal_mask
from helpers.model.checkpoints import CheckpointError, load_checkpoint, save_checkpoint
from helpers.model.gpt import GPT, GPTConfig
from helpers.model.gpt2 import convert_gpt2_state, download_gpt2, read_safetensors
from helpers.model.kv_cache import KVCache
from helpers.model.llama import from_llama_state_dict, llama_key_map
from helpers.model.modern import (
    ModernConfig,
    ModernGPT,
    RMSNorm,
    RopeTable,
    alibi_attention,
    rms_norm,
    rope_angles,
    rope_rotate_half,
)
from helpers.scale.data_parallel import shard_rows
from helpers.scale.sharded import ShardedAdamW
from helpers.scale.tensor_parallel import column_shard, row_shard
from helpers.scale.workers import Workers, init_from_environment, launch
from helpers.training.trainer import TrainConfig, Trainer, split_stories, split_train_val

SMALL = GPTConfig(vocab_size=11, context_length=8, n_layers=2, n_heads=2, d_model=8)
MODERN = ModernConfig(vocab_size=11, context_length=8, n_layers=2, n_heads=2, n_kv_heads=1, d_model=8)


# --- hangs and denial of service ----------------------------------------------------------------

@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes are POSIX")
def test_read_text_file_refuses_a_named_pipe_without_blocking(tmp_path):
    pipe = tmp_path / "pipe.txt"
    os.mkfifo(pipe)
    outcome = {}

    def read() -> None:
        try:
            read_text_file(pipe)
        except ValueError as error:
            outcome["error"] = str(error)

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    thread.join(timeout=5.0)
    assert not thread.is_alive(), "read_text_file blocked on a named pipe"
    assert "is a named pipe, expected a regular UTF-8 text file" in outcome["error"]


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="no /dev/zero here")
def test_read_text_file_refuses_a_device():
    with pytest.raises(ValueError, match="'/dev/zero' is a device, expected a regular"):
        read_text_file("/dev/zero")


def test_read_text_file_refuses_a_file_over_the_size_cap(tmp_path):
    big = tmp_path / "big.txt"
    big.write_text("a" * 101)
    with pytest.raises(ValueError, match="has 101 bytes, expected at most max_bytes = 100"):
        read_text_file(big, max_bytes=100)
    assert read_text_file(big, max_bytes=101) == "a" * 101
    with pytest.raises(ValueError, match="max_bytes"):
        read_text_file(big, max_bytes=0)


def saved_checkpoint(tmp_path: Path, model: torch.nn.Module | None = None) -> Path:
    torch.manual_seed(0)
    return save_checkpoint(tmp_path / "model.pt", model or GPT(SMALL))


def rewrite(path: Path, change) -> None:
    state = torch.load(path, weights_only=True)
    change(state)
    torch.save(state, path)


def test_checkpoint_asking_for_100000_layers_is_refused_before_building_anything(tmp_path):
    path = saved_checkpoint(tmp_path)
    rewrite(path, lambda state: state["config"].update(n_layers=100_000))
    start = time.perf_counter()
    with pytest.raises(CheckpointError, match="n_layers = 100,000, but its weights hold 2 blocks"):
        load_checkpoint(path)
    assert time.perf_counter() - start < 5.0


def test_checkpoint_with_a_huge_context_is_refused(tmp_path):
    path = saved_checkpoint(tmp_path, ModernGPT(MODERN))
    rewrite(path, lambda state: state["config"].update(context_length=10**9))
    with pytest.raises(CheckpointError, match="context_length = 1,000,000,000, expected at most"):
        load_checkpoint(path)


# --- silent corruption --------------------------------------------------------------------------

def test_a_flipped_byte_in_the_weights_is_caught_by_the_checksum(tmp_path):
    path = saved_checkpoint(tmp_path)
    model, _ = load_checkpoint(path)  # intact: loads
    with zipfile.ZipFile(path) as archive:
        data_name = next(n for n in archive.namelist() if "/data/" in n and archive.getinfo(n).file_size > 64)
        offset = archive.getinfo(data_name).header_offset
    raw = bytearray(path.read_bytes())
    # the stored (uncompressed) tensor bytes start after the local header: flip one in the middle
    name_length, extra_length = (int.from_bytes(raw[offset + i:offset + i + 2], "little") for i in (26, 28))
    raw[offset + 30 + name_length + extra_length + 20] ^= 0x10
    path.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match="is corrupted: its weights' sha256 is"):
        load_checkpoint(path)


def test_checkpoint_with_integer_weights_is_refused(tmp_path):
    path = saved_checkpoint(tmp_path)
    rewrite(path, lambda s: s.update(checksum=None) or s["model"].update(
        {"ln_f.weight": s["model"]["ln_f.weight"].long()}))
    with pytest.raises(CheckpointError, match=r"weights of dtype torch.int64 \(\['ln_f.weight'\]\), expected floating"):
        load_checkpoint(path)


def write_safetensors(path: Path, header: dict, data: bytes) -> Path:
    encoded = json.dumps(header).encode()
    path.write_bytes(len(encoded).to_bytes(8, "little") + encoded + data)
    return path


@pytest.mark.parametrize("header, words", [
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
      "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, "tensors 'a' and 'b' share bytes"),
    ({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, "has 8 bytes (0..8), expected 12"),
    ({"a": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}}, "shape [-2], expected a list"),
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0]}}, "data_offsets [0], expected [start, end]"),
    ({"a": [1, 2]}, "header entry [1, 2], expected"),
    ({"a": {"dtype": "F13", "shape": [2], "data_offsets": [0, 8]}}, "dtype 'F13', expected one of"),
])
def test_safetensors_header_that_lies_is_refused(tmp_path, header, words):
    path = write_safetensors(tmp_path / "bad.safetensors", header, bytes(16))
    with pytest.raises(ValueError, match=f"bad.safetensors.*{_escape(words)}"):
        read_safetensors(path)


def _escape(text: str) -> str:
    import re
    return re.escape(text)


def test_gpt2_conversion_refuses_integer_weights():
    config = GPTConfig(vocab_size=5, context_length=4, n_layers=1, n_heads=2, d_model=4)
    state = {"wte.weight": torch.zeros(5, 4, dtype=torch.int32)}
    with pytest.raises(ValueError, match="'wte.weight' has dtype torch.int32, expected floating-point"):
        convert_gpt2_state(state, config)


def test_a_cut_short_merges_file_is_refused(tmp_path):
    from helpers.text.gpt2_tokenizer import GPT2Tokenizer, bytes_to_unicode
    chars = list(bytes_to_unicode().values())
    vocab = {c: i for i, c in enumerate(chars)}
    merges = [("a", "b"), ("ab", "c"), ("Ġ", "t")]
    for left, right in merges:
        vocab[left + right] = len(vocab)
    vocab["<|endoftext|>"] = len(vocab)
    assert GPT2Tokenizer(vocab, merges).vocab_size == len(vocab)  # whole: fine
    with pytest.raises(ValueError, match=r"merges.txt has 1 merges, but vocab.json has 2 tokens .*cut short"):
        GPT2Tokenizer(vocab, merges[:1])


def test_llama_state_dict_with_extra_layers_is_refused():
    torch.manual_seed(0)
    bigger = ModernGPT(ModernConfig(**{**MODERN.__dict__, "n_layers": 3}))
    names = llama_key_map(bigger.config)
    state = {names[ours]: p.detach() for ours, p in bigger.named_parameters()}
    with pytest.raises(ValueError, match=r"no place for: \['model.layers.2"):
        from_llama_state_dict(state, MODERN)


@pytest.mark.parametrize("spoil, error, message", [
    (lambda w: w.round().long(), TypeError, r"has dtype torch.int64, expected a floating-point tensor"),
    (lambda w: w.tolist(), TypeError, r"has a list, expected a floating-point tensor"),
    (lambda w: w.clone().fill_(float("nan")), ValueError, r"holds NaN or inf, expected finite weights"),
])
def test_llama_weights_that_are_not_finite_floats_are_refused_by_name(spoil, error, message):
    torch.manual_seed(0)
    model = ModernGPT(MODERN)
    names = llama_key_map(MODERN)
    state = {names[ours]: p.detach() for ours, p in model.named_parameters()}
    first = names[next(iter(dict(model.named_parameters())))]
    state[first] = spoil(state[first])
    with pytest.raises(error, match=re.escape(f"state_dict[{first!r}]") + " " + message):
        from_llama_state_dict(state, MODERN)


# --- paths ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["../evil.txt", "sub/model.bin", "..", "a\\b", "/etc/passwd", ""])
def test_download_list_names_cannot_leave_the_cache(tmp_path, name):
    fetched = []
    with pytest.raises(ValueError, match="expected a plain file name"):
        download_gpt2(tmp_path / "cache", files=("vocab.json", name),
                      fetch=lambda url, target, timeout: fetched.append(target))
    assert fetched == []  # refused before anything was fetched
    with pytest.raises(TypeError, match="files is 'vocab.json', expected a non-empty tuple"):
        download_gpt2(tmp_path / "cache", files="vocab.json")


# --- silent nonsense ------------------------------------------------------------------------------

@pytest.mark.parametrize("lr", [float("nan"), float("inf"), -1.0, "0.1"])
def test_train_step_refuses_a_learning_rate_that_is_not_finite_and_non_negative(lr):
    torch.manual_seed(0)
    ids = torch.arange(40) % SMALL.vocab_size
    trainer = Trainer(GPT(SMALL), ids, ids, TrainConfig(batch_size=2, precision="fp32"))
    before = [p.detach().clone() for p in trainer.model.parameters()]
    with pytest.raises((ValueError, TypeError), match="lr is"):
        trainer.train_step(lr)
    assert all(torch.equal(a, b) for a, b in zip(before, trainer.model.parameters(), strict=True))


@pytest.mark.parametrize("kwargs, words", [
    ({"betas": (0.9, 1.0)}, "betas[1] is 1.0, expected a number in [0, 1)"),
    ({"betas": (1.0, 0.99)}, "betas[0] is 1.0"),
    ({"betas": (0.9,)}, "betas is (0.9,), expected two numbers"),
    ({"eps": 0.0}, "eps is 0.0"),
    ({"rank": 2}, "rank is 2, expected 0 <= rank < world_size = 2"),
    ({"rank": -1}, "rank is -1"),
])
def test_sharded_adamw_refuses_nonsense(kwargs, words):
    params = [torch.nn.Parameter(torch.ones(3))]
    with pytest.raises(ValueError, match=_escape(words)):
        ShardedAdamW(params, **{"rank": 0, "world_size": 2, **kwargs})
    optimizer = ShardedAdamW(params, rank=0, world_size=1)
    with pytest.raises(ValueError, match="have no .grad"):
        optimizer.step(0.1)
    params[0].grad = torch.ones(3)
    with pytest.raises(ValueError, match="lr is nan"):
        optimizer.step(float("nan"))


@pytest.mark.parametrize("call", [
    lambda: shard_rows(torch.zeros(4, 2), 2, 2), lambda: shard_rows(torch.zeros(4, 2), -1, 2),
    lambda: column_shard(torch.nn.Linear(4, 4), 3, 2), lambda: row_shard(torch.nn.Linear(4, 4), 2, 2),
    lambda: checks.rank_in_world(5, 4)])
def test_a_rank_outside_the_world_is_refused(call):
    with pytest.raises(ValueError, match=r"rank is -?\d, expected 0 <= rank < world_size"):
        call()


@pytest.mark.parametrize("make, words", [
    (lambda: RMSNorm(4, eps=0.0), "eps is 0.0"), (lambda: RMSNorm(4, eps=-1e-6), "eps is -1e-06"),
    (lambda: rms_norm(torch.ones(2, 4), eps=0.0), "eps is 0.0"),
    (lambda: rope_angles(8, 4, base=1.0), "base is 1.0, expected a finite number > 1"),
    (lambda: rope_angles(8, 4, base=0.5), "base is 0.5"),
    (lambda: ModernConfig(rope_base=1.0), "rope_base is 1.0, expected a finite number > 1"),
])
def test_modern_parts_refuse_nonsense_numbers(make, words):
    with pytest.raises(ValueError, match=_escape(words)):
        make()


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


@pytest.mark.parametrize("path", ["fa1", "fa2", "flash", "plain"])
def test_causal_attention_with_more_queries_than_keys_is_refused_alike(path):
    q, k = torch.randn(1, 1, 5, 4), torch.randn(1, 1, 3, 4)
    call = {"fa1": lambda: tiled.tiled_attention_fa1(q, k, k, causal=True),
            "fa2": lambda: tiled.tiled_attention_fa2(q, k, k, causal=True),
            "flash": lambda: tiled.flash_attention(q, k, k, causal=True),
            "plain": lambda: causal_mask(5, 3)}[path]  # the Triton path: tests/test_flash_triton.py
    with pytest.raises(ValueError, match=r"n_k is 3, expected n_k >= n_q = 5"):
        call()


# --- obscure errors made clear --------------------------------------------------------------------

def test_rope_positions_of_the_wrong_shape_or_dtype_are_named():
    table = RopeTable.build(8, 16)
    for positions in (torch.arange(3), torch.arange(4)[None], torch.arange(4.0)):
        with pytest.raises(ValueError, match=r"positions is .*expected an integer tensor of shape \(4,\)"):
            rope_rotate_half(torch.zeros(4, 8), table, positions=positions)


def test_alibi_with_different_query_and_key_lengths_is_named():
    q, k = torch.randn(1, 2, 4, 8), torch.randn(1, 2, 6, 8)
    with pytest.raises(ValueError, match=r"q, k, v have shapes \(1, 2, 4, 8\), \(1, 2, 6, 8\)"):
        alibi_attention(q, k, k)


def test_alibi_names_a_q_of_too_few_dimensions_and_a_non_tensor_before_any_work():
    """q.shape[-3] used to be read before the check: a 2-D q raised IndexError, a list AttributeError."""
    with pytest.raises(ValueError, match=r"q, k, v have shapes \(4, 8\), \(4, 8\), \(4, 8\)"):
        alibi_attention(torch.randn(4, 8), torch.randn(4, 8), torch.randn(4, 8))
    with pytest.raises(TypeError, match="k is a list, expected a tensor"):
        alibi_attention(torch.randn(1, 2, 4, 8), [[0.0]], torch.randn(1, 2, 4, 8))


def test_the_modern_models_cache_is_checked():
    torch.manual_seed(0)
    model = ModernGPT(MODERN).eval()
    ids = torch.zeros(2, 3, dtype=torch.long)
    with pytest.raises(TypeError, match="cache is a dict, expected a KVCache"):
        model.forward_cached(ids, {})
    with pytest.raises(ValueError, match="cache has batch size 1 .*expected 2"):
        model.forward_cached(ids, KVCache.for_model(model, 1))
    with pytest.raises(ValueError, match="cache has key/value heads 2 .*expected 1"):
        model.forward_cached(ids, KVCache(2, 2, 2, 8, 4))


@pytest.mark.parametrize("backend, words", [("glo", "backend is 'glo', expected one of 'gloo'"),
                                            ("nccl", "needs a GPU")])
def test_a_misspelt_or_unusable_backend_is_named(backend, words):
    if backend == "nccl" and torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(ValueError, match=words):
        init_from_environment(backend)


def test_an_argument_that_cannot_be_pickled_is_refused_at_once():
    start = time.monotonic()
    with pytest.raises(TypeError, match="argument 0 .*cannot be sent to the workers"):
        launch(sleep_then_return, 2, threading.Lock(), timeout=60.0)
    assert time.monotonic() - start < 5.0  # no worker was even started


def sleep_then_return(rank: int, world_size: int, value: object) -> object:
    return value


def exit_on_rank(rank: int, world_size: int, exiting_rank: int = 1) -> float:
    """Rank `exiting_rank` leaves without a word; the others wait for it in an all-reduce."""
    if rank == exiting_rank:
        os._exit(3)
    total = torch.ones(1)
    torch.distributed.all_reduce(total)
    return float(total)


def differing_shapes(rank: int, world_size: int) -> None:
    model = torch.nn.Linear(4, 4 + rank)
    ShardedAdamW(model.parameters(), rank, world_size)


def test_workers_name_the_rank_that_exited_and_the_ranks_whose_shapes_differ():
    with Workers(2, timeout=60.0) as workers:
        with pytest.raises(Exception, match="(?s)worker of rank 1 failed.*exited with code 3") as failure:
            workers.run(exit_on_rank, 1)
        assert failure.value.rank == 1
        with pytest.raises(Exception, match=r"(?s)params differ across ranks: rank 1 .*\(5, 4\)"):
            workers.run(differing_shapes)


def test_unpicklable_check_accepts_tensors():
    pickle.dumps(torch.ones(2))  # the check uses plain pickle, which tensors support


# --- found by trying the modules as a careless user -----------------------------------------------

def test_checkpoint_paths_and_devices_are_named(tmp_path):
    model = GPT(SMALL)
    for target in (tmp_path / "missing" / "model.pt", tmp_path):
        with pytest.raises(ValueError, match="is a folder or lies in a folder that does not exist"):
            save_checkpoint(target, model)
    path = save_checkpoint(tmp_path / "model.pt", model)
    with pytest.raises(ValueError, match="device is 'gpu', expected 'cpu', 'cuda'"):
        load_checkpoint(path, device="gpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="this machine has no cuda"):
            load_checkpoint(path, device="cuda")
    with pytest.raises(TypeError, match="path is 5 .int., expected a str or Path"):
        load_checkpoint(5)


def test_random_batch_refuses_float_ids():
    from helpers.training.trainer import random_batch
    with pytest.raises(TypeError, match="ids is torch.float32, expected a tensor of integer token ids"):
        random_batch(torch.arange(20.0), 2, 4)


def test_a_typo_in_world_size_starts_no_thousand_processes():
    with pytest.raises(ValueError, match="world_size is 1000, expected at most 64"):
        Workers(1000)


def test_a_safetensors_shape_too_large_to_count_is_refused(tmp_path):
    header = {"a": {"dtype": "F32", "shape": [2**40, 2**40], "data_offsets": [0, 0]}}
    with pytest.raises(ValueError, match="has 0 bytes .*expected 4835703278458516698824704"):
        read_safetensors(write_safetensors(tmp_path / "big.safetensors", header, b""))
