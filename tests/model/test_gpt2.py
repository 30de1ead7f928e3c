"""GPT-2 checkpoints in the course GPT: Hugging Face's GPT-2 (random weights, no download) and the
course GPT loaded from its files give the same logits, on every path; bad files get clear errors."""

from __future__ import annotations

import json
import locale
import re
import struct
from pathlib import Path

import pytest
import torch

from helpers.model import gpt2 as gpt2_module
from helpers.model.generation import generate, sample_next
from helpers.model.gpt import GPT, GPTConfig, count_parameters
from helpers.model.gpt2 import (
    convert_gpt2_state,
    download_gpt2,
    fetch_url,
    gpt2_config,
    gpt2_demo,
    load_gpt2,
    load_gpt2_small,
    read_checkpoint,
    read_safetensors,
)
from helpers.model.kv_cache import KVCache
from helpers.model.layers import LayerNorm

transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

SIZES = [dict(vocab_size=61, n_positions=24, n_embd=32, n_layer=2, n_head=4),
         dict(vocab_size=97, n_positions=16, n_embd=48, n_layer=3, n_head=3)]


def hf_gpt2(seed: int = 0, **sizes) -> transformers.GPT2LMHeadModel:
    """A Hugging Face GPT-2 with random weights, larger than its initialisation's so that a
    transposed or swapped matrix changes the logits far beyond round-off."""
    config = transformers.GPT2Config(bos_token_id=0, eos_token_id=0, **sizes)
    torch.manual_seed(seed)
    model = transformers.GPT2LMHeadModel(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.normal_(1.0 if name.endswith("ln_1.weight") or name.endswith("ln_2.weight") else 0.0, 0.2)
    return model


def save(model, folder: Path, kind: str) -> Path:
    """The model's weights as Hugging Face publishes them: safetensors (no prefix on the
    published files, 'transformer.' from save_pretrained) or a pytorch_model.bin."""
    folder.mkdir(parents=True, exist_ok=True)
    model.config.to_json_file(folder / "config.json")
    if kind == "safetensors":
        model.save_pretrained(folder)
        return folder / "model.safetensors"
    if kind == "safetensors-no-prefix":
        path = folder / "model.safetensors"
        safetensors_torch.save_file({k: t.contiguous() for k, t in model.transformer.state_dict().items()}, path)
        return path
    path = folder / "pytorch_model.bin"
    state = model.state_dict() if kind == "bin" else model.transformer.state_dict()
    torch.save(state, path)
    return path


def ids(batch: int, length: int, vocab: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module", params=range(len(SIZES)))
def hf_model(request):
    return hf_gpt2(seed=request.param, **SIZES[request.param])


@pytest.mark.parametrize("kind", ["safetensors", "safetensors-no-prefix", "bin", "bin-no-prefix"])
def test_logits_equal_hugging_face_plain_and_fast(hf_model, kind, tmp_path):
    path = save(hf_model, tmp_path, kind)
    model = load_gpt2(path, tmp_path / "config.json")
    x = ids(2, hf_model.config.n_positions, hf_model.config.vocab_size)
    with torch.no_grad():
        expected = hf_model(x).logits
        plain, fast = model(x), model(x, fast=True)
    assert expected.abs().max() > 1.0  # logits far from 0: a wrong weight could not hide
    torch.testing.assert_close(plain, expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(fast, expected, atol=1e-5, rtol=0)
    assert count_parameters(model) == sum(p.numel() for p in hf_model.parameters())


@pytest.mark.parametrize("fast", [False, True])
def test_kv_cache_logits_and_greedy_tokens_equal_hugging_face(hf_model, fast, tmp_path):
    model = load_gpt2(save(hf_model, tmp_path, "safetensors"), tmp_path / "config.json")
    x = ids(2, hf_model.config.n_positions, hf_model.config.vocab_size, seed=2)
    cache = KVCache.for_model(model, batch_size=2)
    pieces = [model.forward_cached(x[:, start:end], cache, fast=fast)
              for start, end in ((0, 5), (5, 6), (6, 11), (11, x.shape[1]))]
    with torch.no_grad():
        expected = hf_model(x).logits
    torch.testing.assert_close(torch.cat(pieces, dim=1), expected, atol=1e-5, rtol=0)
    # Greedy generation with the cache picks the tokens of Hugging Face's argmax, step by step.
    prompt = x[:, :4]
    tokens = generate(model, prompt, max_new_tokens=8, temperature=0.0, use_cache=True)
    reference = prompt
    with torch.no_grad():
        for _ in range(8):
            reference = torch.cat([reference, hf_model(reference).logits[:, -1:].argmax(-1)], dim=1)
    assert torch.equal(tokens, reference)


def test_own_safetensors_reader_equals_the_library(tmp_path):
    tensors = {"a": torch.randn(3, 4), "b": torch.arange(7, dtype=torch.int64),
               "c": torch.randn(2, 2).to(torch.bfloat16), "d": torch.randn(5).half(), "e": torch.zeros(0, 3)}
    safetensors_torch.save_file(tensors, tmp_path / "t.safetensors", metadata={"format": "pt"})
    ours = read_safetensors(tmp_path / "t.safetensors")
    assert ours.keys() == tensors.keys()
    for name, tensor in tensors.items():
        assert ours[name].dtype == tensor.dtype and torch.equal(ours[name], tensor), name


def test_config_from_shapes_alone_and_gpt2_sizes():
    state = {"wte.weight": torch.empty(50257, 768, device="meta"),
             "wpe.weight": torch.empty(1024, 768, device="meta"),
             **{f"h.{i}.ln_1.weight": torch.empty(768, device="meta") for i in range(12)}}
    config = gpt2_config(state)
    assert (config.vocab_size, config.context_length, config.n_layers, config.n_heads,
            config.d_model, config.activation) == (50257, 1024, 12, 12, 768, "gelu_tanh")
    model = hf_gpt2(**SIZES[0])
    small = gpt2_config(model.state_dict(), n_heads=4)
    assert (small.vocab_size, small.n_layers, small.d_model, small.context_length) == (61, 2, 32, 24)
    with pytest.raises(ValueError, match=r"d_model = 32 is none of GPT-2's sizes.*n_heads"):
        gpt2_config(model.state_dict())


# --- errors that name what is wrong --------------------------------------------------------

def test_not_a_checkpoint(tmp_path):
    text = tmp_path / "model.safetensors"
    text.write_text("this is not a tensor file, just some text of a reasonable length")
    with pytest.raises(ValueError, match="is not a safetensors file"):
        read_checkpoint(text)
    junk = tmp_path / "pytorch_model.bin"
    junk.write_bytes(bytes(range(256)) * 4)
    with pytest.raises(ValueError, match=r"neither a safetensors file.*nor a PyTorch state dict torch.load "
                                         r"can read \(its bytes are not a pickle of tensors\)$"):
        read_checkpoint(junk)
    listed = tmp_path / "list.bin"
    torch.save([torch.zeros(2)], listed)
    with pytest.raises(ValueError, match="holds a list, expected a state dict"):
        read_checkpoint(listed)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        read_checkpoint(tmp_path / "missing.safetensors")


def test_a_header_nested_100000_deep_is_named_not_a_recursion_error(tmp_path):
    header = b"[" * 100_000 + b"]" * 100_000
    deep = tmp_path / "deep.safetensors"
    deep.write_bytes(len(header).to_bytes(8, "little") + header)
    with pytest.raises(ValueError, match=r"deep.safetensors is not a safetensors file: its JSON header is nested "
                                         r"too deeply, expected an object \{name: entry\}"):
        read_safetensors(deep)


def test_missing_key_is_named(tmp_path):
    model = hf_gpt2(**SIZES[0])
    state = model.transformer.state_dict()
    del state["h.1.mlp.c_fc.bias"]
    config = gpt2_config(model.state_dict(), n_heads=4)
    with pytest.raises(ValueError, match=r"no 'h.1.mlp.c_fc.bias', expected a tensor of shape \(128,\)"):
        convert_gpt2_state(state, config)
    with pytest.raises(ValueError, match="no 'wte.weight'.*not a GPT-2 state dict"):
        gpt2_config({"weight": torch.zeros(2)})


def test_shape_against_config_json_is_named(tmp_path):
    model = hf_gpt2(**SIZES[0])
    path = save(model, tmp_path, "safetensors")
    config = json.loads((tmp_path / "config.json").read_text())
    with pytest.raises(ValueError, match=r"'wte.weight' has shape \(61, 32\), expected \(61, 64\)"):
        load_gpt2(path, {**config, "n_embd": 64})
    with pytest.raises(ValueError, match=r"'wpe.weight' has shape \(24, 32\), expected \(30, 32\)"):
        load_gpt2(path, {**config, "n_positions": 30})
    with pytest.raises(ValueError, match=r"keys the config has no place for: \['h.1.attn.c_attn.bias'"):
        load_gpt2(path, {**config, "n_layer": 1})
    with pytest.raises(ValueError, match="activation_function = 'swish'"):
        load_gpt2(path, {**config, "activation_function": "swish"})


def test_untied_head_is_refused(tmp_path):
    model = hf_gpt2(**SIZES[0])
    state = {key: t.clone() for key, t in model.state_dict().items()}
    state["lm_head.weight"] += 1.0
    with pytest.raises(ValueError, match="'lm_head.weight' differs from 'wte.weight'"):
        convert_gpt2_state(state, gpt2_config(state, n_heads=4))


def test_download_fetches_once_and_reports_failures(tmp_path):
    source = tmp_path / "hub"
    source.mkdir()
    (source / "a.txt").write_text("hello")
    calls = []

    def counting_fetch(url, target, timeout):
        calls.append(url)
        target.write_bytes(Path(url.removeprefix("file://")).read_bytes())

    for _ in range(2):
        paths = download_gpt2(tmp_path / "cache", f"file://{source}", ("a.txt",), fetch=counting_fetch)
    assert paths["a.txt"].read_text() == "hello" and len(calls) == 1
    with pytest.raises(RuntimeError, match=r"could not download file://.*missing.txt"):
        download_gpt2(tmp_path / "cache", f"file://{source}", ("missing.txt",))
    assert not (tmp_path / "cache" / "missing.txt.partial").exists()


def test_loaded_model_is_a_course_gpt(tmp_path):
    model = load_gpt2(save(hf_gpt2(**SIZES[1]), tmp_path, "bin"), tmp_path / "config.json")
    assert type(model) is GPT and not model.training
    assert model.lm_head.weight is model.embed.token.weight


def test_notebook_knob_path_with_a_local_fake_download(tmp_path):
    """What notebook 7 runs with LOAD_GPT2 = True, with huggingface.co replaced by a folder:
    a GPT-2-shaped checkpoint (width 768, so no config.json is needed) and tokenizer files."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    from helpers.model.gpt2 import GPT2_FILES, gpt2_demo

    hub = tmp_path / "hub"
    hub.mkdir()
    hf_tokenizer = Tokenizer(models.BPE())
    hf_tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    hf_tokenizer.train_from_iterator(["The cat sat on the mat. The dog sat on the log."] * 5, trainer)
    hf_tokenizer.model.save(str(hub))
    vocab_size = hf_tokenizer.get_vocab_size()
    hf_model = hf_gpt2(vocab_size=vocab_size, n_positions=32, n_embd=768, n_layer=1, n_head=12)
    safetensors_torch.save_file({k: t.contiguous() for k, t in hf_model.transformer.state_dict().items()},
                                hub / "model.safetensors")
    assert sorted(p.name for p in hub.iterdir()) == sorted(GPT2_FILES)

    model, tokenizer, text = gpt2_demo(tmp_path / "cache", "The cat", max_new_tokens=6,
                                       base_url=f"file://{hub}")
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == sorted(GPT2_FILES)
    assert count_parameters(model) == sum(p.numel() for p in hf_model.parameters())
    # The same sampling over Hugging Face's logits, step by step, gives the same text.
    ids = torch.tensor([hf_tokenizer.encode("The cat").ids])
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for _ in range(6):
            next_id = sample_next(hf_model(ids).logits[:, -1], temperature=1.0, top_k=40, generator=generator)
            ids = torch.cat([ids, next_id], dim=1)
    assert text.startswith("The cat") and text == tokenizer.decode(ids[0].tolist())


def test_saved_attention_buffers_are_ignored():
    """Older checkpoints (the published GPT-2 files among them) also hold each block's causal
    mask 'attn.bias' (1, 1, C, C) and 'attn.masked_bias': buffers, not weights."""
    model = hf_gpt2(**SIZES[0])
    state = dict(model.transformer.state_dict())
    context = SIZES[0]["n_positions"]
    for i in range(SIZES[0]["n_layer"]):
        state[f"h.{i}.attn.bias"] = torch.ones(1, 1, context, context, dtype=torch.bool).tril()
        state[f"h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
    converted = convert_gpt2_state(state, gpt2_config(state, n_heads=4))
    assert not any("masked" in key or key.endswith("attn.bias") for key in converted)


# helpers.model.gpt2: the safetensors reader's edge sizes and refusals, config.json's fields at
# non-default values, every refusal's message read in full, and the download path (cache folder,
# URL, timeout, the temporary file) with a fetch that needs no network.
#
# No transformers here: the
# GPT-2 checkpoints are built by hand in Hugging Face's layout (tests/model/test_gpt2.py compares the logits).

def gpt2_state(vocab: int = 11, context: int = 8, d: int = 8, layers: int = 2) -> dict[str, torch.Tensor]:
    """A GPT-2 state dict in Hugging Face's names and Conv1D (in, out) layouts, random weights."""
    g = torch.Generator().manual_seed(0)

    def r(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g)

    state = {"wte.weight": r(vocab, d), "wpe.weight": r(context, d),
             "ln_f.weight": r(d), "ln_f.bias": r(d)}
    for i in range(layers):
        for name, shape in (("ln_1", (d,)), ("ln_2", (d,))):
            state[f"h.{i}.{name}.weight"], state[f"h.{i}.{name}.bias"] = r(*shape), r(*shape)
        for name, (n_in, n_out) in (("attn.c_attn", (d, 3 * d)), ("attn.c_proj", (d, d)),
                                    ("mlp.c_fc", (d, 4 * d)), ("mlp.c_proj", (4 * d, d))):
            state[f"h.{i}.{name}.weight"], state[f"h.{i}.{name}.bias"] = r(n_in, n_out), r(n_out)
    return state


def safetensors_file(path: Path, header: object, data: bytes = b"", length: int | None = None) -> Path:
    """A file in the safetensors layout: the header's length (8 bytes, little-endian, or
    `length` to lie about it), the JSON header, then `data`."""
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text) if length is None else length) + text + data)
    return path


def message(error_type, call) -> str:
    with pytest.raises(error_type) as info:
        call()
    return str(info.value)


def test_files_too_short_for_a_header_are_refused_naming_their_sizes(tmp_path):
    short = tmp_path / "short.safetensors"
    short.write_bytes(b"\x05\x00\x00")
    assert message(ValueError, lambda: read_safetensors(short)) == (
        f"{short} is not a safetensors file: its first 8 bytes give a header of -1 bytes in a "
        "file of 3 bytes")
    empty_header = tmp_path / "eight.safetensors"
    empty_header.write_bytes(bytes(8))
    assert message(ValueError, lambda: read_safetensors(empty_header)) == (
        f"{empty_header} is not a safetensors file: its first 8 bytes give a header of 0 bytes in a "
        "file of 8 bytes")
    past_the_end = safetensors_file(tmp_path / "long.safetensors", {}, length=6)  # "{}" is 2 bytes
    assert message(ValueError, lambda: read_safetensors(past_the_end)) == (
        f"{past_the_end} is not a safetensors file: its first 8 bytes give a header of 6 bytes in a "
        "file of 10 bytes")


def test_headers_that_are_not_a_json_object(tmp_path):
    one_byte = safetensors_file(tmp_path / "one.safetensors", 7)  # the header "7": one byte
    assert message(ValueError, lambda: read_safetensors(one_byte)) == (
        f"{one_byte} is not a safetensors file: its header is a JSON int, expected an object "
        "{name: entry}")
    listed = safetensors_file(tmp_path / "list.safetensors", [1, 2])
    assert message(ValueError, lambda: read_safetensors(listed)) == (
        f"{listed} is not a safetensors file: its header is a JSON list, expected an object "
        "{name: entry}")
    garbled = tmp_path / "garbled.safetensors"
    garbled.write_bytes(struct.pack("<Q", 3) + b"{x}")
    text = message(ValueError, lambda: read_safetensors(garbled))
    assert text.startswith(f"{garbled} is not a safetensors file: its header is not JSON (Expecting")


def test_each_bad_header_entry_is_named(tmp_path):
    path = tmp_path / "t.safetensors"
    cases = [
        ({"w": [1]}, "tensor 'w' has the header entry [1], expected {'dtype': ..., 'shape': [...], "
                     "'data_offsets': [start, end]}"),
        ({"w": {"dtype": "F8_E4M3", "shape": [1], "data_offsets": [0, 1]}},
         "tensor 'w' has dtype 'F8_E4M3', expected one of ['BF16', 'BOOL', 'F16', 'F32', 'F64', 'I16', "
         "'I32', 'I64', 'I8', 'U8']"),
        ({"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}},
         "tensor 'w' has shape [-1], expected a list of integers >= 0"),
        ({"w": {"dtype": "F32", "shape": [1], "data_offsets": [-4, 4]}},
         "tensor 'w' has data_offsets [-4, 4], expected [start, end] with 0 <= start <= end <= 8 "
         "(the file's bytes of data)"),
        ({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 12]}},
         "tensor 'w' has data_offsets [0, 12], expected [start, end] with 0 <= start <= end <= 8 "
         "(the file's bytes of data)"),
        ({"w": {"dtype": "F32", "shape": [1], "data_offsets": [2, 8]}},
         "tensor 'w' has 6 bytes (2..8), expected 4 for shape [1] of F32"),
    ]
    for header, expected in cases:
        safetensors_file(path, header, bytes(8))
        assert message(ValueError, lambda: read_safetensors(path)) == f"{path}: {expected}"


def test_overlapping_tensors_are_named_and_an_empty_one_overlaps_nothing(tmp_path):
    data = struct.pack("<4f", 1.0, 2.0, 3.0, 4.0)
    inside = {"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
              "e": {"dtype": "I64", "shape": [0, 3], "data_offsets": [8, 8]}}  # no bytes, mid-way
    tensors = read_safetensors(safetensors_file(tmp_path / "ok.safetensors", inside, data))
    assert tensors["a"].tolist() == [1.0, 2.0, 3.0, 4.0]
    assert tensors["e"].shape == (0, 3) and tensors["e"].dtype == torch.int64
    shared = {"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 12]},
              "b": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}}
    path = safetensors_file(tmp_path / "shared.safetensors", shared, data)
    assert message(ValueError, lambda: read_safetensors(path)) == (
        f"{path}: tensors 'a' and 'b' share bytes ('b' starts at 8, before 'a' ends at 12), "
        "expected each tensor's bytes to be its own")


def test_empty_tensors_keep_their_dtype(tmp_path):
    header = {"i": {"dtype": "I32", "shape": [0], "data_offsets": [0, 0]},
              "h": {"dtype": "F16", "shape": [2, 0], "data_offsets": [0, 0]}}
    tensors = read_safetensors(safetensors_file(tmp_path / "e.safetensors", header))
    assert tensors["i"].dtype == torch.int32 and tensors["h"].dtype == torch.float16
    assert tensors["h"].shape == (2, 0)


class _RunsCode:
    def __reduce__(self):
        return (print, ("a pickled file ran code",))


def test_a_bin_is_read_with_weights_only_on_the_cpu(tmp_path, monkeypatch, capsys):
    calls = []
    real_load = torch.load

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return real_load(*args, **kwargs)

    monkeypatch.setattr(torch, "load", spy)
    good = tmp_path / "pytorch_model.bin"
    torch.save({"w": torch.ones(2)}, good)
    assert read_checkpoint(good)["w"].tolist() == [1.0, 1.0]
    assert calls == [{"map_location": "cpu", "weights_only": True}]  # torch < 2.6 defaults to False
    hostile = tmp_path / "hostile.bin"
    torch.save({"w": _RunsCode()}, hostile)
    text = message(ValueError, lambda: read_checkpoint(hostile))
    assert "ran code" not in capsys.readouterr().out
    # the course's words, not torch's advice to retry with weights_only=False (which would run it)
    assert text == (f"{hostile} holds pickled Python objects, which could run code when loaded, so it is "
                    "not loaded: expected a state dict {name: tensor} such as Hugging Face's "
                    "pytorch_model.bin, or a .safetensors file")


def test_a_bin_holding_a_list_is_named(tmp_path):
    listed = tmp_path / "list.bin"
    torch.save([torch.zeros(2)], listed)
    assert message(ValueError, lambda: read_checkpoint(listed)) == (
        f"{listed} holds a list, expected a state dict {{name: tensor}} such as Hugging Face's "
        "pytorch_model.bin")


def test_config_json_sizes_win_over_the_shapes():
    state = gpt2_state()
    config = gpt2_config(state, {"vocab_size": 13, "n_ctx": 6, "n_layer": 1, "n_embd": 8, "n_head": 2})
    assert (config.vocab_size, config.context_length, config.n_layers, config.d_model,
            config.n_heads) == (13, 6, 1, 8, 2)
    assert gpt2_config(state, {"n_positions": 5, "n_ctx": 6, "n_head": 2}).context_length == 5
    assert gpt2_config(state, n_heads=2).context_length == 8  # neither: wpe's rows


def test_a_state_without_blocks_is_a_zero_layer_config():
    state = {"wte.weight": torch.zeros(11, 8), "wpe.weight": torch.zeros(8, 8)}
    assert message(ValueError, lambda: gpt2_config(state, n_heads=2)) == \
        "n_layers is 0, expected a positive int"


def test_a_state_without_wte_names_its_first_four_keys():
    state = {f"k{i}": torch.zeros(1) for i in range(6)}
    assert message(ValueError, lambda: gpt2_config(state)) == (
        "the checkpoint has no 'wte.weight': it is not a GPT-2 state dict (its first keys: "
        "['k0', 'k1', 'k2', 'k3'])")


@pytest.mark.parametrize("flag", ["scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn"])
def test_attention_variants_are_refused(flag):
    assert gpt2_config(gpt2_state(), {"n_head": 2, flag: False}).n_heads == 2
    assert message(ValueError, lambda: gpt2_config(gpt2_state(), {"n_head": 2, flag: True})) == (
        f"config.json sets {flag} = true, a variant of attention the course GPT does not compute; "
        "expected false (GPT-2's own setting)")


def test_n_inner_must_be_four_times_the_width():
    for fine in (None, 32):
        assert gpt2_config(gpt2_state(), {"n_head": 2, "n_inner": fine}).d_model == 8
    assert message(ValueError, lambda: gpt2_config(gpt2_state(), {"n_head": 2, "n_inner": 16})) == (
        "config.json has n_inner = 16, expected 4 * n_embd = 32: the course MLP is D -> 4D -> D")
    with pytest.raises(ValueError, match="n_inner = 40"):
        gpt2_config(gpt2_state(), {"n_head": 2, "n_inner": 40})  # 5 D


def test_integer_weights_are_refused():
    config = GPTConfig(vocab_size=5, context_length=4, n_layers=1, n_heads=2, d_model=4)
    state = {"wte.weight": torch.zeros(5, 4, dtype=torch.int32)}
    assert message(ValueError, lambda: convert_gpt2_state(state, config)) == \
        "'wte.weight' has dtype torch.int32, expected floating-point weights"


def test_an_untied_head_and_leftover_keys_are_named_in_full():
    state = gpt2_state()
    config = gpt2_config(state, n_heads=2)
    untied = dict(state, **{"lm_head.weight": state["wte.weight"] + 1})
    assert message(ValueError, lambda: convert_gpt2_state(untied, config)) == (
        "'lm_head.weight' differs from 'wte.weight': the course GPT ties its output matrix to the "
        "token embedding, as GPT-2 does")
    one_layer = GPTConfig(**{**config.to_dict(), "n_layers": 1})
    leftover = sorted(key for key in state if key.startswith("h.1."))
    assert len(leftover) == 12
    assert message(ValueError, lambda: convert_gpt2_state(state, one_layer)) == (
        f"the checkpoint has keys the config has no place for: {leftover[:5]} (config: 1 layers); "
        "is it a GPT-2 checkpoint of this size?")


def test_load_takes_n_heads_and_the_layer_norm_eps(tmp_path):
    path = tmp_path / "pytorch_model.bin"
    torch.save(gpt2_state(), path)
    model = load_gpt2(path, n_heads=2)  # width 8 is none of GPT-2's: n_heads is needed
    assert model.config.n_heads == 2 and not model.training
    norms = [m for m in model.modules() if isinstance(m, LayerNorm)]
    assert len(norms) == 5 and {m.eps for m in norms} == {1e-5}  # GPT-2's default
    model = load_gpt2(path, {"n_head": 4, "layer_norm_epsilon": 1e-3})
    assert model.config.n_heads == 4 and {m.eps for m in model.modules() if isinstance(m, LayerNorm)} == {1e-3}
    assert message(ValueError, lambda: load_gpt2(path, {"n_head": 2, "layer_norm_epsilon": 0.0})) == (
        "layer_norm_epsilon is 0.0, expected a finite number > 0")


def test_config_json_is_read_as_utf8_whatever_the_locale(tmp_path):
    path = tmp_path / "pytorch_model.bin"
    torch.save(gpt2_state(), path)
    config_json = tmp_path / "config.json"
    config_json.write_text(json.dumps({"n_head": 2, "_name_or_path": "Café"}, ensure_ascii=False),
                           encoding="utf-8")
    before = locale.setlocale(locale.LC_CTYPE)
    try:
        locale.setlocale(locale.LC_CTYPE, "C")  # an ASCII locale, as on some Windows and old Linux
        model = load_gpt2(path, config_json)
    finally:
        locale.setlocale(locale.LC_CTYPE, before)
    assert model.config.n_heads == 2


def copying_fetch(hub: dict[str, bytes], calls: list):
    """A fetch that serves `hub` {url: bytes} and records (url, timeout): no network."""
    def fetch(url: str, target: Path, timeout: float) -> None:
        calls.append((url, timeout))
        target.write_bytes(hub[url])
    return fetch


def test_download_url_cache_folder_timeout_and_refetch_of_empty_files(tmp_path):
    calls = []
    hub = {"https://hub.example/gpt2/a.txt": b"A", "https://hub.example/gpt2/b.txt": b"BB"}
    cache = tmp_path / "two" / "levels"  # neither exists yet
    paths = download_gpt2(cache, "https://hub.example/gpt2/", ("a.txt", "b.txt"),
                          fetch=copying_fetch(hub, calls))
    assert calls == [("https://hub.example/gpt2/a.txt", 60.0), ("https://hub.example/gpt2/b.txt", 60.0)]
    assert paths == {"a.txt": cache / "a.txt", "b.txt": cache / "b.txt"}
    (cache / "b.txt").write_bytes(b"")  # an empty file (an interrupted copy): fetched again
    download_gpt2(cache, "https://hub.example/gpt2", ("a.txt", "b.txt"), timeout=5.0,
                  fetch=copying_fetch(hub, calls))
    assert calls[2:] == [("https://hub.example/gpt2/b.txt", 5.0)]  # one byte: kept
    download_gpt2(tmp_path / "box", "https://hub.example/BOX/", ("a.txt",),  # only the one '/' cut
                  fetch=copying_fetch({"https://hub.example/BOX/a.txt": b"A"}, calls))
    assert (cache / "a.txt").read_bytes() == b"A" and (cache / "b.txt").read_bytes() == b"BB"


def test_download_arguments_are_named_in_full(tmp_path):
    assert message(ValueError, lambda: download_gpt2(tmp_path, timeout=0.0)) == \
        "timeout is 0.0, expected a finite number > 0"
    assert message(TypeError, lambda: download_gpt2(tmp_path, files=())) == (
        "files is (), expected a non-empty tuple of file names, such as ('model.safetensors', "
        "'vocab.json', 'merges.txt')")
    assert message(TypeError, lambda: download_gpt2(tmp_path, files="vocab.json")) == (
        "files is 'vocab.json', expected a non-empty tuple of file names, such as "
        "('model.safetensors', 'vocab.json', 'merges.txt')")
    for name in (".", "..x", "a..b", "nul\0.txt", "../evil.txt", "sub/model.bin", "..", "a\\b",
                 "/etc/passwd", "", " ", 5):
        fetched = []
        assert message(ValueError, lambda name=name, fetched=fetched: download_gpt2(
            tmp_path / "cache", files=("vocab.json", name),
            fetch=lambda url, target, timeout: fetched.append(target))) == (
            f"files has the entry {name!r}, expected a plain file name such as 'model.safetensors' "
            "(no folders, separators or '..': the file must stay in cache_dir)")
        assert fetched == []  # refused before anything was fetched


class _Response:
    """What urlopen returns, serving `data` and checking the caller reads in bounded chunks."""

    def __init__(self, data: bytes, target: Path) -> None:
        self.data, self.target, self.sizes = data, target, []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def read(self, size=None):
        self.sizes.append(size)
        assert isinstance(size, int) and 0 < size <= 1 << 20, size  # bounded memory: never read(None)
        # while downloading, only the temporary file exists: no truncated file under the real name
        assert not self.target.exists()
        assert (self.target.parent / (self.target.name + ".partial")).exists()
        chunk, self.data = self.data[:size], self.data[size:]
        return chunk


def test_fetch_streams_through_a_partial_file_with_the_timeout(tmp_path, monkeypatch):
    target = tmp_path / "model.safetensors"
    response, opened = _Response(b"x" * ((1 << 21) + 5), target), []

    def urlopen(url, timeout=None):
        opened.append((url, timeout))
        return response

    monkeypatch.setattr(gpt2_module.urllib.request, "urlopen", urlopen)
    fetch_url("https://hub.example/model.safetensors", target, 7.5)
    assert opened == [("https://hub.example/model.safetensors", 7.5)]
    assert target.read_bytes() == b"x" * ((1 << 21) + 5)
    assert len(response.sizes) >= 3  # 2 MiB and 5 bytes, then the empty read that ends the loop
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.safetensors"]


def test_a_failed_fetch_says_what_to_do(tmp_path):
    missing = tmp_path / "nowhere" / "a.txt"
    text = message(RuntimeError, lambda: fetch_url(f"file://{missing}", tmp_path / "a.txt", 3.0))
    assert text.startswith(f"could not download file://{missing} (timeout 3 s): ")
    assert text.endswith(". Is this machine online? On Colab it is; elsewhere set LOAD_GPT2 = False")
    assert not any(tmp_path.iterdir())  # no a.txt, no a.txt.partial left behind


def fake_hub(vocab_size: int) -> dict[str, bytes]:
    """GPT-2's three files at a made-up address: a tokenizer of the 256 byte tokens and
    <|endoftext|>, no merges, and a model of width 8 (the tests add 8 to GPT2_HEADS, as if it
    were one of GPT-2's widths, since load_gpt2_small reads no config.json)."""
    from safetensors.torch import save

    from helpers.text.gpt2_tokenizer import bytes_to_unicode

    vocab = {char: i for i, char in enumerate(bytes_to_unicode().values())}
    vocab["<|endoftext|>"] = len(vocab)
    state = {key: t.contiguous() for key, t in gpt2_state(vocab=vocab_size, context=16, d=8, layers=1).items()}
    base = "https://hub.example/gpt2"
    return {f"{base}/vocab.json": json.dumps(vocab).encode(), f"{base}/merges.txt": b"#version: 0.2\n",
            f"{base}/model.safetensors": save(state)}


@pytest.fixture(scope="module")
def hub() -> dict[str, bytes]:
    pytest.importorskip("safetensors")
    return fake_hub(257)


@pytest.fixture
def width_8_is_gpt2(monkeypatch):
    monkeypatch.setitem(gpt2_module.GPT2_HEADS, 8, 2)


def test_load_gpt2_small_uses_the_fetch_and_timeout_given(tmp_path, hub, width_8_is_gpt2):
    calls = []
    model, tokenizer = load_gpt2_small(tmp_path, "https://hub.example/gpt2", fetch=copying_fetch(hub, calls))
    assert isinstance(model, GPT) and tokenizer.vocab_size == model.config.vocab_size == 257
    assert {timeout for _, timeout in calls} == {60.0} and len(calls) == 3


def test_a_tokenizer_and_model_that_do_not_belong_together(tmp_path, hub, width_8_is_gpt2):
    other = dict(hub, **{"https://hub.example/gpt2/model.safetensors":
                         fake_hub(300)["https://hub.example/gpt2/model.safetensors"]})
    assert message(ValueError, lambda: load_gpt2_small(tmp_path, "https://hub.example/gpt2",
                                                      fetch=copying_fetch(other, []))) == (
        "the tokenizer has 257 ids and the model 300: vocab.json and model.safetensors do not "
        "belong together")


def test_the_demo_samples_what_notebook_7_asks(tmp_path, hub, monkeypatch, width_8_is_gpt2):
    seen = {}

    def spy_generate(model, prompt_ids, max_new_tokens, **options):
        seen.update(options, max_new_tokens=max_new_tokens, state=options["generator"].get_state())
        return prompt_ids

    monkeypatch.setattr(gpt2_module, "generate", spy_generate)
    model, tokenizer, text = gpt2_demo(tmp_path, "hi", base_url="https://hub.example/gpt2",
                                       fetch=copying_fetch(hub, []))
    assert text == "hi"
    assert torch.equal(seen.pop("state"), torch.Generator().manual_seed(0).get_state())
    seen.pop("generator")
    assert seen == {"max_new_tokens": 40, "temperature": 1.0, "top_k": 40, "use_cache": True}


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
    with pytest.raises(ValueError, match=f"bad.safetensors.*{re.escape(words)}"):
        read_safetensors(path)


@pytest.mark.parametrize("name", ["../evil.txt", "sub/model.bin", "..", "a\\b", "/etc/passwd", ""])
def test_download_list_names_cannot_leave_the_cache(tmp_path, name):
    fetched = []
    with pytest.raises(ValueError, match="expected a plain file name"):
        download_gpt2(tmp_path / "cache", files=("vocab.json", name),
                      fetch=lambda url, target, timeout: fetched.append(target))
    assert fetched == []  # refused before anything was fetched
    with pytest.raises(TypeError, match="files is 'vocab.json', expected a non-empty tuple"):
        download_gpt2(tmp_path / "cache", files="vocab.json")


def test_a_safetensors_shape_too_large_to_count_is_refused(tmp_path):
    header = {"a": {"dtype": "F32", "shape": [2**40, 2**40], "data_offsets": [0, 0]}}
    with pytest.raises(ValueError, match="has 0 bytes .*expected 4835703278458516698824704"):
        read_safetensors(write_safetensors(tmp_path / "big.safetensors", header, b""))
