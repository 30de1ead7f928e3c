"""GPT-2's published weights in the course's own GPT (notebook 7, "Optional: GPT-2's own weights").

    read_checkpoint          a state dict from `model.safetensors` or `pytorch_model.bin`
    read_safetensors         the safetensors format read by hand: a JSON header, then raw bytes
    gpt2_config              the GPTConfig that fits a checkpoint (sizes from the shapes)
    convert_gpt2_state       Hugging Face's GPT-2 names and layouts -> the course GPT's
    load_gpt2                a checkpoint file -> a course `GPT` in eval mode, GPT-2's weights in it
    download_gpt2            GPT-2's files fetched once into a cache folder (timeouts, clear errors)
    load_gpt2_small          GPT-2 small's model and tokenizer, downloaded once
    gpt2_demo                what notebook 7's LOAD_GPT2 cell calls: load, then generate

Hugging Face stores GPT-2 as OpenAI trained it. Three things differ from the course GPT:
the names (`h.3.attn.c_attn.weight` vs `blocks.3.attn.q_proj.weight`); the projections are
"Conv1D" layers whose weight is stored (in, out), the transpose of an nn.Linear's (out, in);
and Q, K, V are one matrix `c_attn` of 3 D columns, cut here into three. The output matrix is
tied to the token embedding, as in the course GPT. Nothing else changes: same LayerNorm, same
tanh-GELU, same causal attention, so the logits are GPT-2's (tests/model/test_gpt2.py: 1e-5).

Model code with file input/output: it imports torch, json, urllib and the course's model modules.
Shapes: V vocabulary, C context length, D = d_model, L = n_layers.
"""

from __future__ import annotations

import json
import math
import os
import re
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path

import torch
from torch import Tensor

from helpers import checks
from helpers.model.generation import generate
from helpers.model.gpt import GPT, GPTConfig
from helpers.model.layers import LayerNorm

GPT2_URL = "https://huggingface.co/openai-community/gpt2/resolve/main"
GPT2_FILES = ("model.safetensors", "vocab.json", "merges.txt")

# The four published sizes: d_model -> n_heads (small, medium, large, XL). A checkpoint of
# another width needs its config.json, which names n_head.
GPT2_HEADS = {768: 12, 1024: 16, 1280: 20, 1600: 25}
# Hugging Face's activation names -> the course's (GPT-2 was trained with "gelu_new", the tanh form).
GPT2_ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu",
                    "relu": "relu"}
# Buffers older checkpoints saved with the weights: the causal mask and its fill value.
IGNORED_SUFFIXES = (".attn.bias", ".attn.masked_bias")

_SAFETENSORS_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16,
                       "BF16": torch.bfloat16, "I64": torch.int64, "I32": torch.int32,
                       "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool}


# --- reading a checkpoint file -------------------------------------------------------------

def read_safetensors(path: str | Path) -> dict[str, Tensor]:
    """The tensors of a .safetensors file: 8 bytes (little-endian) giving the header's length,
    a JSON header {name: {"dtype", "shape", "data_offsets": [start, end]}}, then raw bytes.

    No pickle, so a file can hold only tensors: that is why models are published this way.
    """
    path = Path(path)
    data = bytearray(path.read_bytes())
    header_length = int.from_bytes(data[:8], "little") if len(data) >= 8 else -1
    if not 0 < header_length <= len(data) - 8:
        raise ValueError(f"{path} is not a safetensors file: its first 8 bytes give a header of "
                         f"{header_length} bytes in a file of {len(data)} bytes")
    try:
        header = json.loads(data[8:8 + header_length].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{path} is not a safetensors file: its header is not JSON ({error})") from None
    except RecursionError:  # json recurses once per level: a hostile header nests 100,000 deep
        raise ValueError(f"{path} is not a safetensors file: its JSON header is nested too deeply, "
                         "expected an object {name: entry} whose entries are one level deep") from None
    if not isinstance(header, dict):
        raise ValueError(f"{path} is not a safetensors file: its header is a JSON "
                         f"{type(header).__name__}, expected an object {{name: entry}}")
    start_of_data = 8 + header_length
    entries = {name: _safetensors_entry(path, name, entry, len(data) - start_of_data)
               for name, entry in header.items() if name != "__metadata__"}
    _check_no_overlap(path, entries)
    tensors = {}
    for name, (dtype, shape, start, end) in entries.items():
        count = (end - start) // dtype.itemsize
        flat = torch.frombuffer(data, dtype=dtype, count=count, offset=start_of_data + start) \
            if count else torch.empty(0, dtype=dtype)
        tensors[name] = flat.reshape(shape)
    return tensors


def _safetensors_entry(path: Path, name: str, entry: object,
                       n_data: int) -> tuple[torch.dtype, tuple[int, ...], int, int]:
    """One header entry checked: (dtype, shape, start, end), its byte range inside the file's
    `n_data` bytes of data and exactly as long as its dtype and shape need."""
    if not isinstance(entry, dict):
        raise ValueError(f"{path}: tensor {name!r} has the header entry {entry!r:.80}, expected "
                         "{'dtype': ..., 'shape': [...], 'data_offsets': [start, end]}")
    dtype = _SAFETENSORS_DTYPES.get(entry.get("dtype"))
    shape, offsets = entry.get("shape"), entry.get("data_offsets")
    if dtype is None:
        raise ValueError(f"{path}: tensor {name!r} has dtype {entry.get('dtype')!r}, expected one "
                         f"of {sorted(_SAFETENSORS_DTYPES)}")
    if not (isinstance(shape, list) and all(type(n) is int and n >= 0 for n in shape)):
        raise ValueError(f"{path}: tensor {name!r} has shape {shape!r:.80}, expected a list of "
                         "integers >= 0")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(n) is int for n in offsets)
            and 0 <= offsets[0] <= offsets[1] <= n_data):
        raise ValueError(f"{path}: tensor {name!r} has data_offsets {offsets!r:.80}, expected "
                         f"[start, end] with 0 <= start <= end <= {n_data} (the file's bytes of data)")
    needed = dtype.itemsize * math.prod(shape)  # Python ints: a lying shape cannot overflow
    if offsets[1] - offsets[0] != needed:
        raise ValueError(f"{path}: tensor {name!r} has {offsets[1] - offsets[0]} bytes "
                         f"({offsets[0]}..{offsets[1]}), expected {needed} for shape {shape} "
                         f"of {entry['dtype']}")
    return dtype, tuple(shape), offsets[0], offsets[1]


def _check_no_overlap(path: Path, entries: Mapping[str, tuple]) -> None:
    """Refuse two tensors whose bytes overlap: each weight must have bytes of its own."""
    spans = sorted((start, end, name) for name, (_, _, start, end) in entries.items() if end > start)
    for (_, end, first), (start, _, second) in zip(spans, spans[1:], strict=False):
        if start < end:
            raise ValueError(f"{path}: tensors {first!r} and {second!r} share bytes "
                             f"({second!r} starts at {start}, before {first!r} ends at {end}), "
                             "expected each tensor's bytes to be its own")


def read_checkpoint(path: str | Path) -> dict[str, Tensor]:
    """The state dict in `path`: a .safetensors file, or a PyTorch .bin/.pt file (read with
    weights_only=True, so a file cannot run code). Raises ValueError for anything else."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    if path.suffix == ".safetensors":
        return read_safetensors(path)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # torch raises several types for a file that is not its own
        # our own words, never torch's advice to retry with weights_only=False (which runs code)
        if "Unsupported global" in str(error):
            raise ValueError(f"{path} holds pickled Python objects, which could run code when "
                             "loaded, so it is not loaded: expected a state dict {name: tensor} "
                             "such as Hugging Face's pytorch_model.bin, or a .safetensors file") from None
        why = "its bytes are not a pickle of tensors" if "Weights only load failed" in str(error) \
            else f"{type(error).__name__}: {error}"
        raise ValueError(f"{path} is neither a safetensors file (by its name) nor a PyTorch "
                         f"state dict torch.load can read ({why})"[:400]) from None
    if not isinstance(state, Mapping) or not all(isinstance(t, Tensor) for t in state.values()):
        raise ValueError(f"{path} holds a {type(state).__name__}, expected a state dict "
                         "{name: tensor} such as Hugging Face's pytorch_model.bin")
    return dict(state)


# --- the config and the conversion ---------------------------------------------------------

def _strip_prefix(state: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """GPT2LMHeadModel's keys start with "transformer." (its head is "lm_head.weight");
    GPT2Model's and the published files' do not. Returns the keys without it."""
    return {key.removeprefix("transformer."): tensor for key, tensor in state.items()}


def _hf_config(config_json: str | Path | Mapping | None) -> dict:
    if config_json is None or isinstance(config_json, Mapping):
        return dict(config_json or {})
    return json.loads(Path(config_json).read_text(encoding="utf-8"))


def gpt2_config(state: Mapping[str, Tensor], config_json: str | Path | Mapping | None = None,
                n_heads: int | None = None) -> GPTConfig:
    """The GPTConfig of a GPT-2 checkpoint.

    With Hugging Face's config.json (a path or the dict) its sizes are used, and
    `convert_gpt2_state` then checks every tensor against them. Without it the sizes come from
    the shapes: V and D from wte (V, D), C from wpe (C, D), L from the blocks h.0 ... h.{L-1},
    and n_heads from `n_heads` or GPT-2's four published sizes.
    """
    hf = _hf_config(config_json)
    state = _strip_prefix(state)
    for key in ("wte.weight", "wpe.weight"):
        if key not in state:
            raise ValueError(f"the checkpoint has no {key!r}: it is not a GPT-2 state dict "
                             f"(its first keys: {list(state)[:4]})")
    vocab_size, d_model = state["wte.weight"].shape
    layers = {int(m.group(1)) for key in state if (m := re.match(r"h\.(\d+)\.", key))}
    sizes = {"vocab_size": hf.get("vocab_size", vocab_size),
             "context_length": hf.get("n_positions", hf.get("n_ctx", state["wpe.weight"].shape[0])),
             "n_layers": hf.get("n_layer", max(layers, default=-1) + 1),
             "d_model": hf.get("n_embd", d_model)}
    heads = n_heads if n_heads is not None else hf.get("n_head", GPT2_HEADS.get(sizes["d_model"]))
    if heads is None:
        raise ValueError(f"d_model = {sizes['d_model']} is none of GPT-2's sizes "
                         f"{sorted(GPT2_HEADS)}: pass n_heads=... or the checkpoint's config.json")
    for flag in ("scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn"):
        if hf.get(flag):
            raise ValueError(f"config.json sets {flag} = true, a variant of attention the course "
                             "GPT does not compute; expected false (GPT-2's own setting)")
    if hf.get("n_inner") not in (None, 4 * sizes["d_model"]):
        raise ValueError(f"config.json has n_inner = {hf['n_inner']}, expected 4 * n_embd = "
                         f"{4 * sizes['d_model']}: the course MLP is D -> 4D -> D")
    activation = hf.get("activation_function", "gelu_new")
    if activation not in GPT2_ACTIVATIONS:
        raise ValueError(f"config.json has activation_function = {activation!r}, expected one of "
                         f"{sorted(GPT2_ACTIVATIONS)}")
    return GPTConfig(n_heads=heads, activation=GPT2_ACTIVATIONS[activation], **sizes)


def convert_gpt2_state(state: Mapping[str, Tensor], config: GPTConfig) -> dict[str, Tensor]:
    """Hugging Face's GPT-2 state dict -> the state dict of `GPT(config)`.

    Conv1D weights (in, out) are transposed to nn.Linear's (out, in); c_attn (D, 3D) is cut
    into W_Q, W_K, W_V. Every tensor is checked: a missing key, a shape other than the config's
    or a key left over raises a ValueError that names it.
    """
    state = _strip_prefix(state)
    left = {key for key in state if not key.endswith(IGNORED_SUFFIXES)}
    d, v = config.d_model, config.vocab_size

    def take(key: str, shape: tuple[int, ...]) -> Tensor:
        if key not in state:
            raise ValueError(f"the checkpoint has no {key!r}, expected a tensor of shape {shape} "
                             f"for {config.n_layers} layers, d_model = {d}")
        tensor = state[key]
        if not tensor.is_floating_point():
            raise ValueError(f"{key!r} has dtype {tensor.dtype}, expected floating-point weights")
        if tuple(tensor.shape) != shape:
            raise ValueError(f"{key!r} has shape {tuple(tensor.shape)}, expected {shape} for "
                             f"vocab_size = {v}, context_length = {config.context_length}, d_model = {d}")
        left.discard(key)
        return tensor.float()

    out = {"embed.token.weight": take("wte.weight", (v, d)),
           "embed.position.weight": take("wpe.weight", (config.context_length, d))}
    for i in range(config.n_layers):
        hf, ours = f"h.{i}.", f"blocks.{i}."
        for hf_norm, our_norm in (("ln_1", "ln1"), ("ln_2", "ln2")):
            out[f"{ours}{our_norm}.weight"] = take(f"{hf}{hf_norm}.weight", (d,))
            out[f"{ours}{our_norm}.bias"] = take(f"{hf}{hf_norm}.bias", (d,))
        # c_attn: x (.., D) @ W (D, 3D) gives [q | k | v]; nn.Linear wants W^T, (3D, D).
        q, k, vv = take(f"{hf}attn.c_attn.weight", (d, 3 * d)).t().split(d)
        q_bias, k_bias, v_bias = take(f"{hf}attn.c_attn.bias", (3 * d,)).split(d)
        for name, weight, bias in (("q_proj", q, q_bias), ("k_proj", k, k_bias), ("v_proj", vv, v_bias)):
            out[f"{ours}attn.{name}.weight"], out[f"{ours}attn.{name}.bias"] = weight, bias
        for hf_name, our_name, shape in (("attn.c_proj", "attn.out_proj", (d, d)),
                                         ("mlp.c_fc", "mlp.up", (d, 4 * d)),
                                         ("mlp.c_proj", "mlp.down", (4 * d, d))):
            out[f"{ours}{our_name}.weight"] = take(f"{hf}{hf_name}.weight", shape).t()
            out[f"{ours}{our_name}.bias"] = take(f"{hf}{hf_name}.bias", (shape[1],))
    out["ln_f.weight"], out["ln_f.bias"] = take("ln_f.weight", (d,)), take("ln_f.bias", (d,))
    if "lm_head.weight" in state:  # GPT2LMHeadModel saves its (tied) head too
        if not torch.equal(take("lm_head.weight", (v, d)), out["embed.token.weight"]):
            raise ValueError("'lm_head.weight' differs from 'wte.weight': the course GPT ties its "
                             "output matrix to the token embedding, as GPT-2 does")
    if left:
        raise ValueError(f"the checkpoint has keys the config has no place for: {sorted(left)[:5]} "
                         f"(config: {config.n_layers} layers); is it a GPT-2 checkpoint of this size?")
    out["lm_head.weight"] = out["embed.token.weight"]
    return out


def load_gpt2(checkpoint: str | Path, config_json: str | Path | Mapping | None = None,
              n_heads: int | None = None) -> GPT:
    """A course `GPT` with the weights of a GPT-2 checkpoint, in eval mode (float32, CPU).

    checkpoint: `model.safetensors` or `pytorch_model.bin`, of any GPT-2 size; config_json:
    the config.json beside it (needed only for widths other than GPT-2's four, or pass n_heads).
    """
    state = read_checkpoint(checkpoint)
    hf = _hf_config(config_json)
    config = gpt2_config(state, hf, n_heads)
    weights = convert_gpt2_state(state, config)
    model = GPT(config)
    model.load_state_dict(weights)
    eps = hf.get("layer_norm_epsilon", 1e-5)
    for module in model.modules():
        if isinstance(module, LayerNorm):
            module.eps = checks.positive_float("layer_norm_epsilon", eps)
    return model.eval()


# --- downloading once ----------------------------------------------------------------------

Fetch = Callable[[str, Path, float], None]


def fetch_url(url: str, target: Path, timeout: float) -> None:
    """Copy `url` (https:// or file://) to `target`, through a temporary file, so that an
    interrupted download never leaves a truncated file that looks complete."""
    partial = target.with_name(target.name + ".partial")
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response, partial.open("wb") as out:
            while chunk := response.read(1 << 20):
                out.write(chunk)
    except (urllib.error.URLError, OSError) as error:
        partial.unlink(missing_ok=True)
        raise RuntimeError(f"could not download {url} (timeout {timeout:g} s): {error}. Is this "
                           "machine online? On Colab it is; elsewhere set LOAD_GPT2 = False") from None
    os.replace(partial, target)


def download_gpt2(cache_dir: str | Path, base_url: str = GPT2_URL, files: tuple[str, ...] = GPT2_FILES,
                  timeout: float = 60.0, fetch: Fetch = fetch_url) -> dict[str, Path]:
    """Fetch `files` from `base_url` into `cache_dir`, each only if it is not there yet.

    Returns {file name: path}. fetch(url, target, timeout) does the copying; tests pass a
    file:// base_url or their own fetch, so nothing here needs the network to be proven.
    """
    checks.positive_float("timeout", timeout)
    if isinstance(files, str | bytes) or not files:
        raise TypeError(f"files is {files!r:.60}, expected a non-empty tuple of file names, "
                        "such as ('model.safetensors', 'vocab.json', 'merges.txt')")
    for name in files:
        _check_file_name(name)
    cache = Path(cache_dir)
    cache.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name in files:
        target = cache / name
        if not target.is_file() or target.stat().st_size == 0:
            fetch(f"{base_url.rstrip('/')}/{name}", target, timeout)
        paths[name] = target
    return paths


def _check_file_name(name: object) -> None:
    """A download-list entry must be a plain file name: one that cannot leave the cache folder."""
    if not isinstance(name, str) or not name.strip() or name in (".", "..") or ".." in name \
            or any(sep in name for sep in ("/", "\\", "\0")) or Path(name).is_absolute():
        raise ValueError(f"files has the entry {name!r:.80}, expected a plain file name such as "
                         "'model.safetensors' (no folders, separators or '..': the file must stay "
                         "in cache_dir)")


def load_gpt2_small(cache_dir: str | Path, base_url: str = GPT2_URL, timeout: float = 60.0,
                    fetch: Fetch = fetch_url):
    """GPT-2 small, ready to generate: (model, tokenizer), downloaded once into `cache_dir`.

    The tokenizer is `helpers.text.gpt2_tokenizer.GPT2Tokenizer`: the course BPE with GPT-2's ids.
    """
    from helpers.text.gpt2_tokenizer import GPT2Tokenizer

    paths = download_gpt2(cache_dir, base_url, GPT2_FILES, timeout, fetch)
    model = load_gpt2(paths["model.safetensors"])
    tokenizer = GPT2Tokenizer.from_files(paths["vocab.json"], paths["merges.txt"])
    if tokenizer.vocab_size != model.config.vocab_size:
        raise ValueError(f"the tokenizer has {tokenizer.vocab_size} ids and the model "
                         f"{model.config.vocab_size}: vocab.json and model.safetensors do not belong together")
    return model, tokenizer



def gpt2_demo(cache_dir: str | Path, prompt: str, max_new_tokens: int = 40, top_k: int = 40,
              seed: int = 0, base_url: str = GPT2_URL, fetch: Fetch = fetch_url):
    """Notebook 7's LOAD_GPT2 cell: GPT-2 small (downloaded once into `cache_dir`) continues
    `prompt` with the course's `generate` and KV cache, top-k sampling, seeded.

    Returns (model, tokenizer, text): the course GPT, the GPT-2 tokenizer, prompt + continuation.
    """
    model, tokenizer = load_gpt2_small(cache_dir, base_url, fetch=fetch)
    prompt_ids = torch.tensor([tokenizer.encode(prompt)])
    ids = generate(model, prompt_ids, max_new_tokens, temperature=1.0, top_k=top_k, use_cache=True,
                   generator=torch.Generator().manual_seed(seed))
    return model, tokenizer, tokenizer.decode(ids[0].tolist())
