"""The decoder-only GPT, assembled from the course's parts, with generation and a KV cache.

    GPTConfig                       the sizes of a model (n_layers, n_heads, d_model, ...)
    GPT                             token + position embedding -> N Pre-LN blocks -> LayerNorm ->
                                    logits, the output matrix tied to the token embedding
    formula_parameters              12 N d^2 + 2 V d, the back-of-the-envelope count
    exact_parameters                the exact count of a GPT, from its config alone
    count_parameters                the count of a built model (tied weights counted once)
    parameter_breakdown             attention / feed-forward / embeddings / norms
    build_without_weights           a GPT on the meta device: shapes only, no memory
    KVCache                         every layer's keys and values, preallocated
    sample_next                     one token from logits: greedy, temperature, top-k
    generate                        autoregressive generation, with or without the cache

The blocks are `helpers.layers.Block`, the embedding is
`helpers.embeddings.TokenAndPositionEmbedding`: nothing is rewritten here. `GPT.forward` runs
each `Block.forward` (the course's own LayerNorm and attention). `GPT.forward_cached`, for
generation, feeds only the new tokens: each block's attention hands their keys and values to a
KVCache through its `kv_store` hook and attends to everything stored.

Both take `fast=True` (the default for generation) to run `fast_block` instead of
`Block.forward`: the same block, with the block's own weights, computed by PyTorch's fused
kernels (fused LayerNorm, one product for Q, K and V, fused causal attention). Same
parameters, same function: tests/test_gpt.py checks every path against the plain forward.

Model code: it imports torch and the course's model modules, never plots, widgets or exercises.
Shapes: B batch, N tokens, V vocabulary, D = d_model, H heads, D_H = D / H, L = n_layers.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from helpers import checks
from helpers.attention import causal_mask
from helpers.embeddings import TokenAndPositionEmbedding, check_token_ids
from helpers.layers import (
    ACTIVATIONS,
    Block,
    KVStore,
    LayerNorm,
    MultiHeadAttention,
    init_gpt2_,
    merge_heads,
    repeat_kv_heads,
    split_heads,
)


@dataclass(frozen=True)
class GPTConfig:
    """The sizes of a GPT. The defaults are a small character-level model for a laptop CPU.

    vocab_size: tokens the model reads and predicts (V); context_length: the longest sequence it
    reads, the rows of its position table; n_layers: blocks (L); n_heads: attention heads per block
    (H); d_model: the width of every token vector (D), split evenly between the heads.
    activation: the MLP's nonlinearity, "gelu" (exact: z * Phi(z)), "gelu_tanh" (the tanh
    approximation GPT-2 was trained with; `gpt2_small` uses it) or "relu".
    bias: biases in the attention and MLP projections; tie_weights: the output matrix is the
    token embedding. Both must be real booleans: the string "False" is refused.
    """

    vocab_size: int = 64
    context_length: int = 64
    n_layers: int = 4
    n_heads: int = 4
    d_model: int = 128
    dropout: float = 0.0
    bias: bool = True
    tie_weights: bool = True
    activation: str = "gelu"

    def __post_init__(self) -> None:
        for name in ("vocab_size", "context_length", "n_layers", "n_heads", "d_model"):
            checks.positive_int(name, getattr(self, name))
        for name in ("bias", "tie_weights"):
            checks.boolean(name, getattr(self, name))
        checks.one_of("activation", self.activation, ACTIVATIONS)
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}: each "
                             f"head gets d_model / n_heads = {self.d_model / self.n_heads:g} features, "
                             "which must be a whole number")
        checks.number_in("dropout", self.dropout, 0.0, 1.0, high_open=True,
                         expected="a probability in [0, 1)")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @classmethod
    def gpt2_small(cls) -> GPTConfig:
        """GPT-2 small (2019): 12 layers, d = 768, 12 heads, GPT-2's 50,257 tokens, 1024 positions,
        and GPT-2's tanh-approximated GELU, so that GPT-2's weights give GPT-2's logits."""
        return cls(vocab_size=50257, context_length=1024, n_layers=12, n_heads=12, d_model=768,
                   activation="gelu_tanh")

    def to_dict(self) -> dict[str, int | float | bool | str]:
        return asdict(self)


class GPT(nn.Module):
    """GPT-2's architecture: embeddings, `n_layers` Pre-LN blocks, a final LayerNorm, tied output.

    forward: token ids (B, N) -> logits (B, N, V); position t's logits depend on tokens 0..t only.
    """

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.embed = TokenAndPositionEmbedding(config.vocab_size, config.context_length, config.d_model)
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(
            Block(config.d_model, config.n_heads, dropout=config.dropout, bias=config.bias,
                  activation=config.activation)
            for _ in range(config.n_layers))
        self.ln_f = LayerNorm(config.d_model)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        init_gpt2_(self, config.n_layers)
        if config.tie_weights:
            # One matrix, two jobs: row i embeds token i and scores token i as the next token.
            self.lm_head.weight = self.embed.token.weight

    def forward(self, token_ids: Tensor, fast: bool = False) -> Tensor:
        """token_ids: (B, N) ints in [0, V) with N <= context_length -> logits (B, N, V).

        fast=True computes the same function with fused PyTorch kernels (see `fast_block`).
        """
        checks.boolean("fast", fast)
        self._check_ids(token_ids)
        return self._blocks_to_logits(self.drop(self.embed(token_ids)), fast)

    @torch.no_grad()
    def forward_cached(self, token_ids: Tensor, cache: KVCache, fast: bool = True) -> Tensor:
        """Feed the next tokens, reusing the keys and values of every earlier token in `cache`.

        token_ids: (B, n), the n tokens that follow the cache.length tokens already in the cache.
        Returns their logits (B, n, V), equal to the last n rows of a full forward pass; the
        cache then holds cache.length + n tokens. Each block's attention hands its new keys and
        values to the cache (its `kv_store` hook) and attends to everything stored.
        fast=False runs the course's own Block.forward, fast=True `fast_block`.

        It is for generation, so a model in training mode with dropout > 0 is refused
        (RuntimeError) rather than silently dropping activations: call model.eval() first.
        """
        if self.training and self.config.dropout > 0:
            raise RuntimeError(f"forward_cached is for generation, but the model is in training "
                               f"mode with dropout = {self.config.dropout}, so dropout would "
                               "change its outputs: call model.eval() first (generate() does)")
        checks.boolean("fast", fast)
        self._check_ids(token_ids)
        self._check_cache(cache, token_ids.shape[0])
        start, n_new = cache.length, token_ids.shape[1]
        if start + n_new > self.config.context_length:
            raise ValueError(f"the cache holds {start} tokens and token_ids has {n_new} more, "
                             f"expected at most context_length = {self.config.context_length} "
                             "in all: crop the sequence and start a new cache")
        x = self.drop(self.embed(token_ids, start=start))  # (B, n, D), positions start ... start + n - 1
        logits = self._blocks_to_logits(x, fast, cache)
        cache.length = start + n_new
        return logits

    def _blocks_to_logits(self, x: Tensor, fast: bool, cache: KVCache | None = None) -> Tensor:
        """x: (B, n, D) embedded tokens -> logits (B, n, V), through every block and ln_f."""
        for layer, block in enumerate(self.blocks):
            kv_store = None if cache is None else cache.store_hook(layer)
            x = fast_block(block, x, kv_store) if fast else block(x, causal=True, kv_store=kv_store)
        x = fused_layer_norm(self.ln_f, x) if fast else self.ln_f(x)
        return self.lm_head(x)

    def _check_ids(self, token_ids: Tensor) -> None:
        check_token_ids(token_ids, self.config.vocab_size)
        if token_ids.dim() != 2:
            raise ValueError(f"token_ids has shape {tuple(token_ids.shape)}, expected (B, N): "
                             "add a batch axis with token_ids.unsqueeze(0)")
        if token_ids.shape[1] == 0:
            raise ValueError(f"token_ids has shape {tuple(token_ids.shape)}: a sequence of 0 "
                             "tokens, expected at least one (N >= 1)")
        device = self.lm_head.weight.device
        if token_ids.device != device and device.type != "meta":
            raise ValueError(f"token_ids is on {token_ids.device} and the model on {device}: "
                             f"move the ids with token_ids.to({str(device)!r})")

    def _check_cache(self, cache: KVCache, batch_size: int) -> None:
        """Raise unless `cache` fits this model and a batch of `batch_size` sequences."""
        if not isinstance(cache, KVCache):
            raise TypeError(f"cache is a {type(cache).__name__}, expected a KVCache "
                            "(KVCache.for_model(model, batch_size))")
        attn, weight = self.blocks[0].attn, self.lm_head.weight
        expected = {"layers": len(self.blocks), "batch size": batch_size,
                    "key/value heads": attn.n_kv_heads, "head size": attn.head_dim}
        got = dict(zip(expected, (cache.keys.shape[i] for i in (0, 1, 2, 4)), strict=True))
        for what, value in expected.items():
            if got[what] != value:
                raise ValueError(f"cache has {what} {got[what]} (keys of shape "
                                 f"{tuple(cache.keys.shape)}), expected {value} for this model and "
                                 f"token_ids: make it with KVCache.for_model(model, {batch_size})")
        if cache.keys.dtype != weight.dtype or cache.keys.device != weight.device:
            raise TypeError(f"cache holds {cache.keys.dtype} on {cache.keys.device}, expected "
                            f"{weight.dtype} on {weight.device} like the model's weights: make it "
                            f"with KVCache.for_model(model, {batch_size})")


# --- the fast path: the same block, fused kernels ------------------------------------------

def fused_layer_norm(norm: LayerNorm, x: Tensor) -> Tensor:
    """`norm(x)` computed by PyTorch's fused kernel: x (..., D) -> (..., D)."""
    return F.layer_norm(x, (norm.d_model,), norm.weight, norm.bias, norm.eps)


def fused_causal_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Causal softmax(q k^T / sqrt(D_H)) v: q (B, H, N, D_H), k, v (B, H, M, D_H) -> (B, H, N, D_H).

    With M > N (cached keys first) query i sees keys up to M - N + i, as in `causal_mask`.
    PyTorch's `scaled_dot_product_attention` is fastest in float32 and on GPUs. In bfloat16 on
    a CPU its kernel was slower here than three plain products (a training step of the
    benchmark's model took about 1.5x as long with it), so those are used there.
    """
    n_q, n_k = q.shape[-2], k.shape[-2]
    if n_q == n_k and q.device.type == "cpu" and q.dtype != torch.float32:
        return _attention_in_three_products(q, k, v)
    if n_q == n_k:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    # is_causal would align the triangle to the top left; a single query sees every key.
    mask = None if n_q == 1 else causal_mask(n_q, n_k, device=q.device)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def _causal_bias(n: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """(n, n): 0 where query i may see key j (j <= i), -inf above the diagonal.

    Made once per size and kept; torch.compile builds it into its graph instead.
    """
    if torch.compiler.is_compiling():
        return _build_causal_bias(n, dtype, device)
    return _kept_causal_bias(n, dtype, device)


def _build_causal_bias(n: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    future = torch.ones(n, n, dtype=torch.bool, device=device).triu_(1)
    return torch.zeros(n, n, dtype=dtype, device=device).masked_fill_(future, float("-inf"))


_kept_causal_bias = functools.cache(_build_causal_bias)


def _attention_in_three_products(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """The causal attention as baddbmm (mask added in the same op), softmax, bmm."""
    *lead, n, head_dim = q.shape
    q, k, v = (t.reshape(-1, n, head_dim) for t in (q, k, v))  # (B * H, N, D_H)
    # bias + q k^T / sqrt(D_H) in one operation: the mask and the scale cost no extra pass.
    scores = torch.baddbmm(_causal_bias(n, q.dtype, q.device), q, k.transpose(1, 2),
                           alpha=1.0 / math.sqrt(head_dim))
    weights = F.softmax(scores, dim=-1)
    return (weights.to(v.dtype) @ v).view(*lead, n, head_dim)


def _project_qkv(attn: MultiHeadAttention, h: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """q (B, H, N, D_H) and k, v (B, H_kv, N, D_H) from one product with W_Q, W_K, W_V stacked.

    For a single token (a generation step) stacking the weights costs more than it saves, so
    the three projections run apart.
    """
    projections = (attn.q_proj, attn.k_proj, attn.v_proj)
    if h.shape[-2] == 1:
        return split_heads(attn.q_proj(h), attn.n_heads), *attn.project_keys_values(h)
    weight = torch.cat([p.weight for p in projections])
    bias = None if attn.q_proj.bias is None else torch.cat([p.bias for p in projections])
    sizes = [p.out_features for p in projections]
    q, k, v = F.linear(h, weight, bias).split(sizes, dim=-1)
    return split_heads(q, attn.n_heads), split_heads(k, attn.n_kv_heads), split_heads(v, attn.n_kv_heads)


def fast_block(block: Block, x: Tensor, kv_store: KVStore | None = None) -> Tensor:
    """`block(x, causal=True, kv_store=kv_store)` for a Pre-LN block, with fused kernels and one
    Q/K/V product. x: (B, N, D) -> (B, N, D).

    Uses the block's own parameters; attention weights are not kept. tests/test_gpt.py checks
    it against `Block.forward`, the definition it must follow.
    """
    if not block.pre_norm:
        raise ValueError("fast_block computes a Pre-LN block (GPT-2's order); this block is "
                         "Post-LN (pre_norm=False): call block(x) instead")
    attn = block.attn
    q, k, v = _project_qkv(attn, fused_layer_norm(block.ln1, x))
    if kv_store is not None:
        k, v = kv_store(k, v)  # (B, H_kv, earlier + N, D_H)
    groups = attn.n_heads // attn.n_kv_heads
    heads = fused_causal_attention(q, repeat_kv_heads(k, groups), repeat_kv_heads(v, groups))
    x = x + attn.dropout(attn.out_proj(merge_heads(heads)))
    return x + block.mlp(fused_layer_norm(block.ln2, x))


# --- counting parameters -------------------------------------------------------------------

def formula_parameters(n_layers: int, d_model: int, vocab_size: int) -> int:
    """12 N d^2 + 2 V d: 4 d^2 of attention and 8 d^2 of MLP per block, input and output
    embeddings untied; biases, norms and positions left out."""
    for name, value in (("n_layers", n_layers), ("d_model", d_model), ("vocab_size", vocab_size)):
        checks.positive_int(name, value)
    return 12 * n_layers * d_model**2 + 2 * vocab_size * d_model


def exact_parameters(config: GPTConfig) -> int:
    """The exact parameter count of `GPT(config)`, worked out from its sizes.

    Per block: W_Q, W_K, W_V, W_O (4 d^2, + 4d biases), the MLP d -> 4d -> d (8 d^2, + 5d
    biases), two LayerNorms (4d). Plus the token table (V d, counted once when tied, twice
    otherwise), the position table (context d) and the final LayerNorm (2d).
    """
    d, v = config.d_model, config.vocab_size
    biases = 9 * d if config.bias else 0
    per_block = 12 * d * d + biases + 4 * d
    output = 0 if config.tie_weights else v * d
    return config.n_layers * per_block + v * d + output + config.context_length * d + 2 * d


def count_parameters(model: nn.Module) -> int:
    """Every distinct parameter of `model`: a tied matrix is one tensor and counts once."""
    return sum(p.numel() for p in model.parameters())


def parameter_breakdown(model: GPT) -> dict[str, int]:
    """How the parameters of a GPT split: attention, feed-forward, embeddings, norms.

    The shares add up to count_parameters(model); an untied output matrix is listed apart.
    """
    parts = {"attention": 0, "feed-forward": 0, "embeddings": 0, "layer norms": 0, "output": 0}
    for name, param in model.named_parameters():  # yields a tied tensor once, under its first name
        if ".attn." in name:
            parts["attention"] += param.numel()
        elif ".mlp." in name:
            parts["feed-forward"] += param.numel()
        elif name.startswith("embed."):
            parts["embeddings"] += param.numel()
        elif name.startswith("lm_head."):
            parts["output"] += param.numel()
        else:
            parts["layer norms"] += param.numel()
    if not parts["output"]:
        del parts["output"]
    return parts


def build_without_weights(config: GPTConfig) -> GPT:
    """GPT(config) on PyTorch's meta device: every tensor has a shape and no storage.

    Counting the parameters of GPT-2 small this way takes no memory and no time.
    """
    with torch.device("meta"):
        return GPT(config)


# --- the KV cache --------------------------------------------------------------------------

class KVCache:
    """The keys and values of every layer for the tokens seen so far.

    Two preallocated tensors of shape (L, B, H_kv, max_length, D_H), filled from the left:
    2 x L x H_kv x D_H numbers per token and sequence, whatever the model's vocabulary or MLP.
    """

    def __init__(self, n_layers: int, batch_size: int, n_kv_heads: int, max_length: int,
                 head_dim: int, dtype: torch.dtype = torch.float32,
                 device: torch.device | str | None = None) -> None:
        for name, value in (("n_layers", n_layers), ("batch_size", batch_size),
                            ("n_kv_heads", n_kv_heads), ("max_length", max_length),
                            ("head_dim", head_dim)):
            checks.positive_int(name, value)
        shape = (n_layers, batch_size, n_kv_heads, max_length, head_dim)
        self.keys = torch.zeros(shape, dtype=dtype, device=device)
        self.values = torch.zeros(shape, dtype=dtype, device=device)
        self.length = 0

    @classmethod
    def for_model(cls, model: GPT, batch_size: int) -> KVCache:
        """An empty cache with room for a full context of `model`, in its dtype and device."""
        weight = model.lm_head.weight
        attn = model.blocks[0].attn
        return cls(len(model.blocks), batch_size, attn.n_kv_heads, model.config.context_length,
                   attn.head_dim, dtype=weight.dtype, device=weight.device)

    @property
    def max_length(self) -> int:
        return self.keys.shape[3]

    def store(self, layer: int, keys: Tensor, values: Tensor) -> tuple[Tensor, Tensor]:
        """Write the new tokens' keys and values (B, H_kv, n, D_H) of `layer` after the
        `length` stored ones; return all of that layer's, (B, H_kv, length + n, D_H).

        `length` itself moves on once every layer has stored (GPT.forward_cached does it).
        """
        expected = (*self.keys.shape[1:3], self.keys.shape[4])
        if keys.dtype != self.keys.dtype or values.dtype != self.keys.dtype:
            raise TypeError(f"keys are {keys.dtype} and values {values.dtype}, expected "
                            f"{self.keys.dtype}, the dtype this cache was made with")
        if keys.shape != values.shape or (keys.shape[0], keys.shape[1], keys.shape[3]) != expected:
            raise ValueError(f"keys has shape {tuple(keys.shape)} and values {tuple(values.shape)}, "
                             f"expected both (B, H_kv, n, D_H) with (B, H_kv, D_H) = {expected}")
        end = self.length + keys.shape[2]
        if end > self.max_length:
            raise ValueError(f"the cache holds {self.length} tokens of at most {self.max_length}; "
                             f"{keys.shape[2]} more do not fit")
        self.keys[layer, :, :, self.length:end] = keys
        self.values[layer, :, :, self.length:end] = values
        return self.keys[layer, :, :, :end], self.values[layer, :, :, :end]

    def store_hook(self, layer: int) -> KVStore:
        """`store` for one layer: the `kv_store` that MultiHeadAttention.forward calls."""
        return functools.partial(self.store, layer)

    def nbytes(self) -> int:
        """Bytes the two tensors really occupy (all max_length slots)."""
        return self.keys.nbytes + self.values.nbytes


# --- sampling and generation ---------------------------------------------------------------

def sample_next(logits: Tensor, temperature: float = 1.0, top_k: int | None = None,
                generator: torch.Generator | None = None) -> Tensor:
    """Pick the next token of each row: logits (B, V) -> ids (B, 1).

    temperature 0 or top_k 1 is greedy (argmax). Otherwise the logits are divided by
    `temperature` (below 1 sharpens, above 1 flattens), every token outside the `top_k` highest
    is removed, and one token is drawn from the softmax. The division comes after subtracting
    each row's maximum, in float64, so a tiny temperature (1e-40) is simply greedy, never NaN.

    Ties: top_k keeps exactly k tokens; among equal logits the lower token id is kept first
    (top_k=2 over three equal best logits keeps the two lowest ids). Greedy picks the lowest id
    of the best logits too.

    Logits with a NaN (a model with a NaN weight) or a row that is all -inf (no token possible)
    are refused with a ValueError, instead of silently picking a token.
    """
    _check_logits(logits)
    temperature = checks.number_in("temperature", temperature, 0.0, math.inf, high_open=True,
                                   expected="a number >= 0 (0 = greedy)")
    if top_k is not None:
        top_k = checks.positive_int("top_k", top_k)
    if temperature == 0 or top_k == 1:
        return logits.argmax(dim=-1, keepdim=True)
    logits = logits.double()
    logits = (logits - logits.amax(dim=-1, keepdim=True)) / temperature  # best token: exactly 0
    if top_k is not None and top_k < logits.shape[-1]:
        # A stable sort keeps equal logits in id order, so exactly top_k tokens stay.
        order = logits.sort(dim=-1, descending=True, stable=True).indices[:, :top_k]  # (B, k)
        kept = torch.full_like(logits, float("-inf")).scatter(-1, order, logits.gather(-1, order))
        logits = kept
    return torch.multinomial(F.softmax(logits, dim=-1), num_samples=1, generator=generator)


def _check_logits(logits: Tensor) -> None:
    """Raise unless logits is a float (B, V) tensor with V >= 1, no NaN and a finite best logit."""
    if not isinstance(logits, Tensor):
        raise TypeError(f"logits is a {type(logits).__name__}, expected a torch.Tensor (B, V)")
    if not logits.is_floating_point():
        raise TypeError(f"logits has dtype {logits.dtype}, expected a floating-point tensor")
    if logits.dim() != 2 or logits.shape[1] == 0:
        raise ValueError(f"logits has shape {tuple(logits.shape)}, expected (B, V) with a "
                         "vocabulary of V >= 1 tokens")
    if logits.isnan().any():
        row = int(logits.isnan().any(dim=-1).nonzero()[0])
        raise ValueError(f"logits row {row} contains NaN: the model computed NaN (check its "
                         "weights with torch.isfinite); no token can be chosen from it")
    best = logits.amax(dim=-1)
    if not torch.isfinite(best).all():
        row = int((~torch.isfinite(best)).nonzero()[0])
        raise ValueError(f"logits row {row} has best value {best[row].item()}, expected a finite "
                         "maximum: with every logit -inf (or one +inf) no distribution is defined")


@torch.no_grad()
def generate(model: GPT, prompt: Tensor, max_new_tokens: int, temperature: float = 1.0,
             top_k: int | None = None, use_cache: bool = True,
             generator: torch.Generator | None = None) -> Tensor:
    """Extend `prompt` (B, N) by `max_new_tokens` tokens, one at a time: (B, N + max_new_tokens).

    Past the context length the model reads only the last context_length tokens (the sequence
    is cropped, as GPT-2 does; no error). With use_cache=True each step feeds one token through
    a KVCache; when the cache is full it is rebuilt from the cropped window, so the tokens are
    exactly those of recomputing the full window every step (use_cache=False).
    The model is put in eval mode (no dropout) for the call and restored afterwards.
    """
    checks.positive_int("max_new_tokens", max_new_tokens)
    checks.boolean("use_cache", use_cache)
    if not isinstance(prompt, Tensor):
        raise TypeError(f"prompt is a {type(prompt).__name__}, expected a (B, N) tensor of token "
                        "ids, e.g. torch.tensor([ids])")
    if prompt.dim() != 2 or prompt.shape[1] == 0:
        raise ValueError(f"prompt has shape {tuple(prompt.shape)}, expected (B, N) with N >= 1")
    check_token_ids(prompt, model.config.vocab_size, "prompt")
    was_training = model.training
    model.eval()
    try:
        next_logits = _CachedSteps(model, prompt.shape[0]) if use_cache else _recompute(model)
        ids = prompt
        for _ in range(max_new_tokens):
            ids = torch.cat([ids, sample_next(next_logits(ids), temperature, top_k, generator)], dim=1)
        return ids
    finally:
        model.train(was_training)


def _recompute(model: GPT) -> Callable[[Tensor], Tensor]:
    """Next-token logits (B, V) of a sequence (B, S), from a full pass over its last window."""
    return lambda ids: model(ids[:, -model.config.context_length:])[:, -1]


class _CachedSteps:
    """Next-token logits for a growing sequence, feeding only the new token when it can."""

    def __init__(self, model: GPT, batch_size: int) -> None:
        self.model = model
        self.cache = KVCache.for_model(model, batch_size)
        self.seen = 0  # tokens of the sequence already in the cache (0: start afresh)

    def __call__(self, ids: Tensor) -> Tensor:
        """ids: (B, S), the whole sequence so far -> logits for the token after it, (B, V)."""
        fits = self.seen > 0 and ids.shape[1] - self.seen == 1 \
            and self.cache.length < self.cache.max_length
        if fits:
            logits = self.model.forward_cached(ids[:, -1:], self.cache)
        else:  # first call, or the window slid: refill the cache from the last window
            self.cache.length = 0
            logits = self.model.forward_cached(ids[:, -self.cache.max_length:], self.cache)
        self.seen = ids.shape[1]
        return logits[:, -1]
