"""GPT-2 checkpoints in the course GPT: Hugging Face's GPT-2 (random weights, no download) and the
course GPT loaded from its files give the same logits, on every path; bad files get clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from helpers.model.generation import generate, sample_next
from helpers.model.gpt import GPT, count_parameters
from helpers.model.gpt2 import (
    convert_gpt2_state,
    download_gpt2,
    gpt2_config,
    load_gpt2,
    read_checkpoint,
    read_safetensors,
)
from helpers.model.kv_cache import KVCache

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
    with pytest.raises(ValueError, match="neither a safetensors file.*nor a PyTorch state dict"):
        read_checkpoint(junk)
    listed = tmp_path / "list.bin"
    torch.save([torch.zeros(2)], listed)
    with pytest.raises(ValueError, match="holds a list, expected a state dict"):
        read_checkpoint(listed)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        read_checkpoint(tmp_path / "missing.safetensors")


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
