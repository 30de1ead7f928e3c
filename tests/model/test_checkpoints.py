"""helpers.model.checkpoints: hostile and damaged files refused with a CheckpointError that names
what is wrong, read in full; what save_checkpoint refuses, named down to the nested key.


"""

from __future__ import annotations

import hashlib
import os
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from shared_tools import TINY_CONFIG, finishes_within, tiny_ids, tiny_model

from helpers.model import checkpoints
from helpers.model.checkpoints import (
    MAX_CONTEXT_LENGTH,
    CheckpointError,
    load_checkpoint,
    save_checkpoint,
    weights_checksum,
)
from helpers.model.gpt import GPT
from helpers.model.modern import ModernConfig, ModernGPT


def message(error_type, call) -> str:
    with pytest.raises(error_type) as info:
        call()
    return str(info.value)


def saved(tmp_path: Path, change=None) -> Path:
    """A GPT's checkpoint, then (optionally) `change(state)` applied to what the file holds."""
    torch.manual_seed(0)
    path = save_checkpoint(tmp_path / "model.pt", GPT(TINY_CONFIG))
    if change is not None:
        state = torch.load(path, weights_only=True)
        change(state)
        torch.save(state, path)
    return path


def test_weights_that_are_not_name_tensor_pairs_are_refused(tmp_path):
    path = saved(tmp_path, lambda state: state["model"].update(junk=5))
    assert message(CheckpointError, lambda: load_checkpoint(path)) == (
        f"{path} has 'model' entries that are not {{name: tensor}}: ['junk'] (the first: a str key, "
        "a int value), expected a state dict of tensors")
    path = saved(tmp_path, lambda state: state["model"].update({0: torch.ones(1)}))
    assert message(CheckpointError, lambda: load_checkpoint(path)) == (
        f"{path} has 'model' entries that are not {{name: tensor}}: [0] (the first: a int key, "
        "a Tensor value), expected a state dict of tensors")
    path = saved(tmp_path, lambda state: state["model"].update({f"x{i}": [i] for i in range(5)}))
    assert message(CheckpointError, lambda: load_checkpoint(path)) == (
        f"{path} has 'model' entries that are not {{name: tensor}}: ['x0', 'x1', 'x2'] (the first: a "
        "str key, a list value), expected a state dict of tensors")


def test_an_architecture_that_is_not_a_name_is_refused(tmp_path):
    path = saved(tmp_path, lambda state: state.update(architecture=["GPT"]))
    assert message(CheckpointError, lambda: load_checkpoint(path)) == (
        f"{path} holds a model of architecture ['GPT'], expected one of GPT, ModernGPT")


# --- the checksum ----------------------------------------------------------------------------

def test_the_checksum_covers_names_dtypes_shapes_and_bytes_in_order():
    weights = {"a": torch.arange(6, dtype=torch.float32).reshape(2, 3).t(),  # not contiguous
               "b": torch.zeros(0, 4, dtype=torch.float16), "c": torch.tensor([1.5], dtype=torch.float64)}
    digest = hashlib.sha256()
    for name, tensor in weights.items():  # the documented recipe, written out again
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(tensor.contiguous().numpy().tobytes())
    assert weights_checksum(weights) == digest.hexdigest()
    variants = [dict(reversed(list(weights.items()))), {**weights, "c": weights["c"].float()},
                {**weights, "b": torch.zeros(4, 0, dtype=torch.float16)}, {**weights, "c": weights["c"] + 1},
                {"A" if k == "a" else k: v for k, v in weights.items()}]
    assert len({weights_checksum(w) for w in variants} | {digest.hexdigest()}) == 6


# --- save_checkpoint ----------------------------------------------------------------------------

def test_what_a_checkpoint_holds(tmp_path):
    torch.manual_seed(0)
    model = GPT(TINY_CONFIG)
    path = save_checkpoint(str(tmp_path / "gpt.pt"), model, note="x")
    assert path == tmp_path / "gpt.pt" and isinstance(path, Path)
    state = torch.load(path, weights_only=True)
    assert sorted(state) == ["architecture", "checksum", "config", "extra", "model"]  # no optimizer
    assert state["architecture"] == "GPT" and state["config"] == TINY_CONFIG.to_dict()
    assert state["checksum"] == {"sha256": weights_checksum(model.state_dict())}
    assert state["extra"] == {"note": "x"}
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5)
    model(torch.zeros(1, 3, dtype=torch.long)).sum().backward()
    optimizer.step()
    state = torch.load(save_checkpoint(path, model, optimizer), weights_only=True)
    assert "momentum_buffer" in state["optimizer"]["state"][0] and state["extra"] == {}


def test_a_modern_gpt_round_trips_with_its_optimizer(tmp_path):
    torch.manual_seed(1)
    config = ModernConfig(vocab_size=13, context_length=8, n_layers=1, n_heads=2, n_kv_heads=1, d_model=8)
    model = ModernGPT(config)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    ids = torch.tensor([[1, 2, 3]])
    model(ids).sum().backward()
    optimizer.step()
    loaded, state = load_checkpoint(save_checkpoint(tmp_path / "m.pt", model, optimizer, step=1))
    assert type(loaded) is ModernGPT and loaded.config == config and state["architecture"] == "ModernGPT"
    assert torch.equal(loaded(ids), model(ids)) and state["extra"] == {"step": 1}
    again = torch.optim.SGD(loaded.parameters(), lr=0.1, momentum=0.9)
    again.load_state_dict(state["optimizer"])
    assert torch.equal(again.state[next(iter(loaded.parameters()))]["momentum_buffer"],
                       optimizer.state[next(iter(model.parameters()))]["momentum_buffer"])


def test_save_names_a_model_or_path_it_cannot_take(tmp_path):
    assert message(TypeError, lambda: save_checkpoint(tmp_path / "m.pt", torch.nn.Linear(2, 2))) == (
        "model is a Linear, expected one of GPT, ModernGPT (helpers.model.gpt.GPT or "
        "helpers.model.modern.ModernGPT)")
    for target in (tmp_path, tmp_path / "missing" / "m.pt"):
        assert message(ValueError, lambda target=target: save_checkpoint(target, GPT(TINY_CONFIG))) == (
            f"path {str(target)!r} is a folder or lies in a folder that does not exist, expected a "
            "file name in an existing folder, such as 'model.pt'")


class Item:
    """Looks like a numpy scalar: it has .item()."""

    def item(self):
        return 1.0

    def __repr__(self):
        return "Item()"


@pytest.mark.parametrize("extra, expected", [
    ({"meta": {1.5: 0}}, "extra value 'meta' has the key 1.5 (a float), expected str or int keys"),
    ({"meta": {"a": [1, {2: Item()}]}},
     "extra value 'meta'['a'][1][2] is Item(), a Item: expected a bool, int, float, str, None, tensor, "
     "or a list or dict of them (use float(...) or int(...)), which load_checkpoint can read back safely"),
    ({"folder": Path("runs")},
     f"extra value 'folder' is {Path('runs')!r}, a {type(Path('runs')).__name__}: expected a bool, int, "
     "float, str, None, tensor, or a list or dict of them (use str(...)), which load_checkpoint can "
     "read back safely"),
    ({"tags": {"a"}},
     "extra value 'tags' is {'a'}, a set: expected a bool, int, float, str, None, tensor, or a list or "
     "dict of them, which load_checkpoint can read back safely"),
])
def test_extras_that_could_not_be_read_back_are_named_in_full(tmp_path, extra, expected):
    assert message(TypeError, lambda: save_checkpoint(tmp_path / "m.pt", GPT(TINY_CONFIG), **extra)) == expected
    assert not (tmp_path / "m.pt").exists()


def test_a_config_with_a_numpy_number_is_refused_at_save_not_at_load(tmp_path):
    import dataclasses

    import numpy as np

    model = GPT(TINY_CONFIG)
    model.config = dataclasses.replace(TINY_CONFIG, n_layers=np.int64(TINY_CONFIG.n_layers))
    said = message(TypeError, lambda: save_checkpoint(tmp_path / "m.pt", model))
    assert said.startswith("model.config.n_layers is ") and "(use float(...) or int(...))" in said
    assert not (tmp_path / "m.pt").exists()


def test_plain_extras_round_trip(tmp_path):
    extra = dict(a=(1, 2.5, "x", None, True), b={"k": [torch.ones(2)], 3: {"deep": False}},
                 c=torch.nn.Parameter(torch.zeros(1)))
    _, state = load_checkpoint(save_checkpoint(tmp_path / "m.pt", GPT(TINY_CONFIG), **extra))
    assert state["extra"]["a"] == (1, 2.5, "x", None, True)
    assert torch.equal(state["extra"]["b"]["k"][0], torch.ones(2)) and state["extra"]["b"][3] == {"deep": False}


# --- load_checkpoint: what it is given ---------------------------------------------------------------

def test_load_names_a_bad_path_or_device(tmp_path):
    assert message(TypeError, lambda: load_checkpoint(5)) == "path is 5 (int), expected a str or Path"
    assert message(FileNotFoundError, lambda: load_checkpoint(tmp_path / "no.pt")) == \
        f"path is {str(tmp_path / 'no.pt')!r}: no such file"
    path = saved(tmp_path)
    assert message(ValueError, lambda: load_checkpoint(path, device="gpu")) == \
        "device is 'gpu', expected 'cpu', 'cuda' or a torch.device"
    assert message(ValueError, lambda: load_checkpoint(path, device=3.5)) == \
        "device is 3.5, expected 'cpu', 'cuda' or a torch.device"
    assert message(ValueError, lambda: load_checkpoint(path, device="meta")) == \
        "device is 'meta', but this machine has no meta: expected 'cpu'"
    model, _ = load_checkpoint(path, device=torch.device("cpu"))
    assert next(model.parameters()).device.type == "cpu"


def test_the_file_is_read_onto_the_device_asked_for(tmp_path, monkeypatch):
    path, where = saved(tmp_path), []
    real_load = torch.load

    def spy(*args, **kwargs):
        where.append((kwargs["map_location"], kwargs["weights_only"]))
        return real_load(*args, **kwargs)

    monkeypatch.setattr(torch, "load", spy)
    device = torch.device("cpu")
    load_checkpoint(path, device=device)
    assert where == [(device, True)]


# --- load_checkpoint: files that are not checkpoints -----------------------------------------------

@pytest.mark.parametrize("content, found", [
    ([torch.ones(1)], "a list"),
    ({}, "a dict"),
    ({"b": 1, "a": 2, "config": {}}, "a dict with the keys ['a', 'b', 'config']"),
    ({f"k{i}": torch.ones(1) for i in range(7)},
     "a bare state dict (weights without a config, e.g. torch.save(model.state_dict()))"),
])
def test_files_without_a_config_and_weights_are_named(tmp_path, content, found):
    path = tmp_path / "x.pt"
    torch.save(content, path)
    assert message(CheckpointError, lambda: load_checkpoint(path)) == (
        f"{path} holds {found}, expected a checkpoint with 'config' and 'model' entries: save with "
        "helpers.model.checkpoints.save_checkpoint(path, model)")


class Hostile:
    def __reduce__(self):
        return (print, ("hostile code ran",))


def test_unreadable_files_are_named_in_full(tmp_path, capsys):
    expected_end = ": expected a file written by helpers.model.checkpoints.save_checkpoint(path, model)"
    for head in ("[1, 2]", '{"a": 1}'):
        path = tmp_path / "t.json"
        path.write_text(head)
        assert message(CheckpointError, lambda path=path: load_checkpoint(path)) == (
            f"{path} is a JSON file (a tokenizer's or a config's?), expected a checkpoint written by "
            "helpers.model.checkpoints.save_checkpoint")
    pickled = tmp_path / "pickled.pt"
    torch.save({"config": {}, "model": Hostile()}, pickled)
    assert message(CheckpointError, lambda: load_checkpoint(pickled)) == (
        f"{pickled} is a whole pickled object (torch.save(model)?), which could run code when loaded, "
        f"so it is not loaded{expected_end}")
    assert "hostile code ran" not in capsys.readouterr().out
    truncated = tmp_path / "cut.pt"
    truncated.write_bytes(saved(tmp_path).read_bytes()[:2000])
    assert message(CheckpointError, lambda: load_checkpoint(truncated)) == (
        f"{truncated} is a damaged or truncated checkpoint (the zip archive is incomplete){expected_end}")
    empty = tmp_path / "empty.pt"
    empty.write_bytes(b"")
    assert message(CheckpointError, lambda: load_checkpoint(empty)) == \
        f"{empty} is not a PyTorch checkpoint{expected_end}"


# --- load_checkpoint: the config and the weights, checked before building -------------------------

def test_a_checkpoint_naming_no_architecture_is_a_gpt_and_an_unknown_one_is_named(tmp_path):
    model, _ = load_checkpoint(saved(tmp_path, lambda state: state.pop("architecture")))
    assert type(model) is GPT
    path = saved(tmp_path, lambda state: state.update(architecture="Mamba"))
    assert message(CheckpointError, lambda: load_checkpoint(path)) == \
        f"{path} holds a model of architecture 'Mamba', expected one of GPT, ModernGPT"


def test_bad_configs_are_named_in_full(tmp_path):
    fields = sorted(TINY_CONFIG.to_dict())
    path = saved(tmp_path, lambda state: state.update(config=[1]))
    assert message(CheckpointError, lambda: load_checkpoint(path)) == \
        f"{path} has a 'config' of type list, expected a dict of GPTConfig fields"
    path = saved(tmp_path, lambda state: state["config"].update(n_kv_heads=2, flash=True))
    assert message(CheckpointError, lambda: load_checkpoint(path)) == \
        f"{path} has a config with unknown fields ['flash', 'n_kv_heads'], expected fields among {fields}"
    path = saved(tmp_path, lambda state: state["config"].update(n_heads=3))
    assert message(CheckpointError, lambda: load_checkpoint(path)).startswith(
        f"{path} has an invalid config: d_model")


def test_weights_that_do_not_fit_the_config_are_named(tmp_path):
    def drop(state):
        for name in ("ln_f.weight", "blocks.0.ln1.bias", "ln_f.bias", "blocks.1.ln2.bias"):
            del state["model"][name]
    path = saved(tmp_path, drop)
    assert message(CheckpointError, lambda: load_checkpoint(path)) == (
        f"{path} has weights that do not match its config (missing ['blocks.0.ln1.bias', "
        "'blocks.1.ln2.bias', 'ln_f.bias'])")

    def extra(state):
        for name in ("zeta", "alpha", "beta", "gamma"):
            state["model"][name] = torch.ones(1)
    path = saved(tmp_path, extra)
    assert message(CheckpointError, lambda: load_checkpoint(path)) == (
        f"{path} has weights that do not match its config (unexpected ['alpha', 'beta', 'gamma'])")
    path = saved(tmp_path, lambda state: state["model"].update({"ln_f.weight": torch.ones(9)}))
    assert message(CheckpointError, lambda: load_checkpoint(path)) == (
        f"{path} has weights that do not match its config (ln_f.weight has shape (9,), the config "
        "gives (8,))")
    path = saved(tmp_path, lambda state: state.update(model=[1]))
    assert message(CheckpointError, lambda: load_checkpoint(path)) == \
        f"{path} has 'model' of type list, expected a state dict of tensors"

    def integers(state):
        state["checksum"] = None
        for name in ("ln_f.weight", "ln_f.bias", "blocks.0.ln1.weight"):
            state["model"][name] = state["model"][name].long()
        state["model"]["blocks.0.ln1.bias"] = state["model"]["blocks.0.ln1.bias"].int()  # the first named
    path = saved(tmp_path, integers)
    assert message(CheckpointError, lambda: load_checkpoint(path)) == (
        f"{path} has weights of dtype torch.int64 (['blocks.0.ln1.weight', 'blocks.0.ln1.bias', "
        "'ln_f.weight']), expected floating-point weights")


def test_the_block_count_and_numbering_and_the_context_cap(tmp_path):
    path = saved(tmp_path, lambda state: state["config"].update(n_layers=3))
    assert message(CheckpointError, lambda: load_checkpoint(path)) == (
        f"{path} has a config with n_layers = 3, but its weights hold 2 blocks: expected the two to agree")

    def renumber(state):
        state["model"] = {k.replace("blocks.1.", "blocks.2."): v for k, v in state["model"].items()}
    path = saved(tmp_path, renumber)
    assert message(CheckpointError, lambda: load_checkpoint(path)) == (
        f"{path} has a config with n_layers = 2, but its weights hold 2 blocks (not numbered 0, 1, ...): "
        "expected the two to agree")
    path = saved(tmp_path, lambda state: state["config"].update(context_length=MAX_CONTEXT_LENGTH + 1))
    assert message(CheckpointError, lambda: load_checkpoint(path)) == (
        f"{path} has a config with context_length = 1,048,577, expected at most MAX_CONTEXT_LENGTH = "
        "1,048,576")
    path = saved(tmp_path, lambda state: state["config"].update(context_length=MAX_CONTEXT_LENGTH))
    assert "do not match its config (embed.position.weight has shape (8, 8)" in \
        message(CheckpointError, lambda: load_checkpoint(path))  # at the cap: on to the weights


def test_the_checksum_entry_and_a_changed_weight_are_named(tmp_path):
    model, _ = load_checkpoint(saved(tmp_path, lambda state: state.pop("checksum")))  # older files
    assert type(model) is GPT
    for entry in ("abc", {"md5": "abc"}, {"sha256": 5}):
        path = saved(tmp_path, lambda state, entry=entry: state.update(checksum=entry))
        assert message(CheckpointError, lambda path=path: load_checkpoint(path)) == (
            f"{path} has a 'checksum' entry {entry!r}, expected {{'sha256': '<hex digest>'}}")
    original = {}

    def change(state):
        original.update(state["model"])
        state["model"]["ln_f.bias"] = state["model"]["ln_f.bias"] + 1
    path = saved(tmp_path, change)
    changed = weights_checksum(torch.load(path, weights_only=True)["model"])
    assert message(CheckpointError, lambda: load_checkpoint(path)) == (
        f"{path} is corrupted: its weights' sha256 is {changed[:16]}..., the checksum saved with them "
        f"is {weights_checksum(original)[:16]}...: the file changed after it was saved (a bad copy or "
        "download?); save it again")


def test_a_file_without_a_config_or_with_many_keys_is_named(tmp_path):
    path = tmp_path / "x.pt"
    torch.save({"model": {"w": torch.ones(1)}}, path)
    assert message(CheckpointError, lambda: load_checkpoint(path)).startswith(
        f"{path} holds a dict with the keys ['model'], expected a checkpoint with 'config'")
    torch.save({k: 1 for k in "gfedcba"}, path)
    assert message(CheckpointError, lambda: load_checkpoint(path)).startswith(
        f"{path} holds a dict with the keys ['a', 'b', 'c', 'd', 'e'], expected")


@pytest.mark.parametrize("text, pickled", [
    ("Unsupported global: GLOBAL pkg.Thing was not an allowed global by default", True),
    ("Unsupported global: pkg.Thing", True),  # without the rest of newer torch's explanation
    ("Weights only load failed: weights_only=True refuses GLOBAL pkg.Thing", True),
    ("Weights only load failed: weights_only=True met an unknown opcode", False),  # no GLOBAL
    ("GLOBAL pkg.Thing could not be found", False),  # not weights_only's refusal
])
def test_torch_refusing_a_pickled_object_is_told_apart_in_its_wordings(tmp_path, monkeypatch, text, pickled):
    path = saved(tmp_path)  # a zip: a failure that is not a refused object reads as damaged

    def refuse(*args, **kwargs):
        raise RuntimeError(text)

    monkeypatch.setattr(torch, "load", refuse)
    what = ("a whole pickled object (torch.save(model)?), which could run code when loaded, so it "
            "is not loaded") if pickled else "a damaged or truncated checkpoint (the zip archive is incomplete)"
    assert message(CheckpointError, lambda: load_checkpoint(path)) == (
        f"{path} is {what}: expected a file written by helpers.model.checkpoints.save_checkpoint(path, model)")


def test_the_model_is_moved_to_the_device_asked_for(tmp_path, monkeypatch):
    moved, real_to = [], torch.nn.Module.to

    def spy(self, *args, **kwargs):
        moved.append(args)
        return real_to(self, *args, **kwargs)

    monkeypatch.setattr(GPT, "to", spy)
    device = torch.device("cpu")
    load_checkpoint(saved(tmp_path), device=device)
    assert moved == [(device,)]


def test_a_device_this_machine_has_is_accepted(monkeypatch):
    from helpers.model.checkpoints import check_device
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # as on a one-GPU machine
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    check_device("cuda")
    check_device(torch.device("cuda", 0))
    check_device("cpu")
    check_device("cpu:1")  # a CPU index names the one CPU device: torch accepts any
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    check_device("cuda:1")
    assert message(ValueError, lambda: check_device("cuda:2")) == \
        "device is 'cuda:2', but this machine has 2 cuda device(s): expected an index below 2"
    assert message(ValueError, lambda: check_device(torch.device("cuda", 7))) == \
        "device is device(type='cuda', index=7), but this machine has 2 cuda device(s): expected an index below 2"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert message(ValueError, lambda: check_device("cuda:0")) == \
        "device is 'cuda:0', but this machine has no cuda: expected 'cpu'"


@pytest.mark.parametrize("extra, match", [
    ({"folder": Path("runs")}, r"extra value 'folder' is PosixPath|extra value 'folder' is WindowsPath"),
    ({"loss": np.float64(1.5)}, r"extra value 'loss' is np.float64\(1.5\).*use float\(...\)"),
    ({"losses": [1.0, np.float32(2.0)]}, r"extra value 'losses'\[1\]"),
])
def test_save_checkpoint_refuses_extras_that_could_not_be_loaded_back(tmp_path, extra, match):
    with pytest.raises(TypeError, match=match):
        save_checkpoint(tmp_path / "model.pt", tiny_model(), **extra)
    assert not (tmp_path / "model.pt").exists()


def test_a_checkpoint_round_trips_with_plain_extras(tmp_path):
    model = tiny_model(activation="gelu_tanh")
    save_checkpoint(tmp_path / "model.pt", model, steps=3, note="run 1", losses=[2.5, 2.0], meta={"a": 1})
    restored, saved = load_checkpoint(tmp_path / "model.pt")
    assert restored.config == model.config and saved["extra"]["losses"] == [2.5, 2.0]
    assert torch.equal(restored(tiny_ids()), model(tiny_ids()))


def _write_bad_file(kind: str, folder: Path) -> Path:
    path = folder / f"{kind}.pt"
    if kind == "random":
        path.write_bytes(b"\x00" + os.urandom(1999))  # never "{" or "[" first: that is the JSON case
    elif kind == "truncated":
        save_checkpoint(path, tiny_model())
        path.write_bytes(path.read_bytes()[:3000])
    elif kind == "tokenizer JSON":
        path.write_text('{"merges": [[104, 105]], "pattern": "x"}')
    elif kind == "pickled model":
        torch.save(tiny_model(), path)
    elif kind == "state dict":
        torch.save(tiny_model().state_dict(), path)
    elif kind == "huge config":
        save_checkpoint(path, tiny_model())
        state = torch.load(path, weights_only=True)
        state["config"]["vocab_size"] = 10**12  # 8 TB of embedding if it were allocated
        torch.save(state, path)
    elif kind == "string flag in config":
        save_checkpoint(path, tiny_model())
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


MODERN = ModernConfig(vocab_size=11, context_length=8, n_layers=2, n_heads=2, n_kv_heads=1, d_model=8)


def saved_checkpoint(tmp_path: Path, model: torch.nn.Module | None = None) -> Path:
    torch.manual_seed(0)
    return save_checkpoint(tmp_path / "model.pt", model or GPT(TINY_CONFIG))


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


def test_checkpoint_paths_and_devices_are_named(tmp_path):
    model = GPT(TINY_CONFIG)
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


def test_extra_values_sharing_one_list_are_checked_once_and_too_deep_ones_refused(tmp_path):
    shared = [1]
    for _ in range(40):
        shared = [shared, shared]  # 2^40 paths through 41 lists: the check once walked them all
    with finishes_within(10):
        save_checkpoint(tmp_path / "model.pt", GPT(TINY_CONFIG), shared=shared, again=shared)
    _, state = load_checkpoint(tmp_path / "model.pt")
    assert state["extra"]["shared"] is state["extra"]["again"]
    deep = [1]
    for _ in range(100):
        deep = [deep]
    with pytest.raises(ValueError, match=r"^extra value 'deep'(\[0\]){100} is nested more than 100 levels "
                                         r"deep, expected plain values in at most 100 levels"):
        save_checkpoint(tmp_path / "deep.pt", GPT(TINY_CONFIG), deep=deep)


def test_the_public_checks_refuse_by_name():
    with pytest.raises(ValueError, match="^device is 'tpu0'"):
        checkpoints.check_device("tpu0")
    with pytest.raises(TypeError, match="opts"):
        checkpoints.check_plain("opts", {"f": print})
    checkpoints.check_device("cpu")
    checkpoints.check_plain("opts", {"lr": 1e-3, "betas": (0.9, 0.99)})
