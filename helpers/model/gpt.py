"""The decoder-only GPT, assembled from the course's parts, and its parameter counts.

Defined in notebook 7, "GPT": section 1 (from parts to a model) and section 3 (counting
parameters):

    GPTConfig                       the sizes of a model (n_layers, n_heads, d_model, ...)
    GPT                             token + position embedding -> L Pre-LN blocks -> LayerNorm ->
                                    logits, the output matrix tied to the token embedding
    formula_parameters              12 L D^2 + 2 V D, the back-of-the-envelope count
    exact_parameters                the exact count of a GPT, from its config alone
    count_parameters                the count of a built model (tied weights counted once)
    parameter_breakdown             attention / feed-forward / embeddings / norms
    build_without_weights           a GPT on the meta device: shapes only, no memory

The blocks are `helpers.model.layers.Block`, the embedding is
`helpers.model.embeddings.TokenAndPositionEmbedding`: nothing is rewritten here. `GPT.forward` runs
each `Block.forward`. `GPT.forward_cached` feeds only new tokens: each block's attention hands
their keys and values to a `helpers.model.kv_cache.KVCache` and attends to everything stored.

Both take `fast=True` (the default for generation, and what the Trainer uses): the same
layers with the same weights, computed by PyTorch's fused kernels (`helpers.model.fused.fast_logits`).
That is the one switch between the two paths; tests/model/test_gpt.py checks they agree.

Model code: it imports torch and the course's model modules, never plots, widgets or exercises.
Shapes (the legend of `helpers`): B batch, N tokens, V vocabulary, D = d_model, H heads,
D_H = D / H, L = n_layers.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import Tensor, nn

from helpers import checks
from helpers.model.embeddings import TokenAndPositionEmbedding, check_token_ids
from helpers.model.fused import fast_block, fused_layer_norm
from helpers.model.kv_cache import KVCache
from helpers.model.layers import ACTIVATIONS, Block, LayerNorm, init_gpt2_
from helpers.model.multihead import check_head_counts


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
        for name in ("vocab_size", "context_length", "n_layers"):
            checks.positive_int(name, getattr(self, name))
        for name in ("bias", "tie_weights"):
            checks.boolean(name, getattr(self, name))
        checks.one_of("activation", self.activation, ACTIVATIONS)
        check_head_counts(self.d_model, self.n_heads, self.n_heads)
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

        fast=True computes the same function with fused PyTorch kernels (`helpers.model.fused`).
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
        fast=False runs the course's own Block.forward, fast=True `helpers.model.fused.fast_block`.

        It is for generation, so a model in training mode with dropout > 0 is refused
        (RuntimeError) rather than silently dropping activations: call model.eval() first.
        """
        self._check_cached_call(token_ids, cache, fast)
        start = cache.length
        x = self.drop(self.embed(token_ids, start=start))  # (B, n, D), positions start ... start + n - 1
        logits = self._blocks_to_logits(x, fast, cache)
        cache.length = start + token_ids.shape[1]
        return logits

    def _blocks_to_logits(self, x: Tensor, fast: bool, cache: KVCache | None = None) -> Tensor:
        """x: (B, n, D) embedded tokens -> logits (B, n, V), through every block and ln_f."""
        for layer, block in enumerate(self.blocks):
            kv_store = None if cache is None else cache.store_hook(layer)
            if fast:  # the same layers and weights, PyTorch's fused kernels (helpers.model.fused)
                x = fast_block(block, x, kv_store)
            else:
                x = block(x, causal=True, kv_store=kv_store)
        return self.lm_head(fused_layer_norm(self.ln_f, x) if fast else self.ln_f(x))

    def _check_cached_call(self, token_ids: Tensor, cache: KVCache, fast: bool) -> None:
        """Raise unless forward_cached can feed `token_ids` (B, n) through `cache` now."""
        if self.training and self.config.dropout > 0:
            raise RuntimeError(f"forward_cached is for generation, but the model is in training "
                               f"mode with dropout = {self.config.dropout}, so dropout would "
                               "change its outputs: call model.eval() first (generate() does)")
        checks.boolean("fast", fast)
        self._check_ids(token_ids)
        if not isinstance(cache, KVCache):
            raise TypeError(f"cache is a {type(cache).__name__}, expected a KVCache "
                            "(KVCache.for_model(model, batch_size))")
        cache.check_fits(self, token_ids.shape[0])
        start, n_new = cache.length, token_ids.shape[1]
        if start + n_new > self.config.context_length:
            raise ValueError(f"the cache holds {start} tokens and token_ids has {n_new} more, "
                             f"expected at most context_length = {self.config.context_length} "
                             "in all: crop the sequence and start a new cache")

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


# --- counting parameters -------------------------------------------------------------------

def formula_parameters(n_layers: int, d_model: int, vocab_size: int) -> int:
    """12 L D^2 + 2 V D: 4 D^2 of attention and 8 D^2 of MLP per block, input and output
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

