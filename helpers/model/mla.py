"""Multi-head latent attention (DeepSeek-V2/V3): cache one low-rank latent per token, not K and V.

Defined in notebook 12, "The decoder of 2025-2026", section 2:

    LatentAttention          the layer; `forward(x, table)` is the naive form (keys and values
                             rebuilt from the latent for every head), `forward_absorbed` the
                             inference form (the key up-projection folded into the query, the
                             value up-projection applied after the weighted sum), proven equal
    LatentAttention.latent   what the cache stores per token: c_KV (r,) and the RoPE key (d_R,)
    cache_values_per_token   values per token per layer for "mha", "gqa", "mqa", "mla" from a config
    DEEPSEEK_V3              DeepSeek-V3's published attention sizes (its config.json)

Per head h: q_h = [q_nope (d_nope), q_rope (d_R)], k_h = [W_UK_h c, k_rope] (k_rope shared by
every head, the "decoupled RoPE key"), v_h = W_UV_h c, with c = RMSNorm(W_DKV x) of rank r.
Because q_nope . (W_UK_h c) = (W_UK_h^T q_nope) . c, a query can meet the latent directly: the
cache never needs the per-head keys. RoPE cannot be absorbed (the rotation depends on the
position), which is why a small separate key carries it.
Model code: imports torch and the course's model modules. Shapes: B batch, N tokens, D d_model,
H heads, r kv_rank, d_R rope_dim, d_nope, d_v.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from helpers import checks
from helpers.model.modern import RMSNorm, RopeTable, rope_rotate_half
from helpers.model.multihead import check_features

DEEPSEEK_V3 = {"n_layers": 61, "d_model": 7168, "n_heads": 128, "kv_rank": 512, "rope_dim": 64,
               "nope_dim": 128, "v_dim": 128, "q_rank": 1536, "head_dim": 128}


def cache_values_per_token(kind: str, config: dict, n_groups: int = 8) -> int:
    """Cached numbers per token (all layers) for an attention of `kind` with the sizes of `config`
    (keys n_layers, n_heads, head_dim, kv_rank, rope_dim): DeepSeek-V2's table 1.

    mha: 2 H d_h L; gqa: 2 n_groups d_h L; mqa: 2 d_h L; mla: (r + d_R) L.
    """
    checks.one_of("kind", kind, ("mha", "gqa", "mqa", "mla"))
    checks.positive_int("n_groups", n_groups)
    for key in ("n_layers", "n_heads", "head_dim", "kv_rank", "rope_dim"):
        if key not in config:
            raise KeyError(f"config has no {key!r}, expected the keys of DEEPSEEK_V3")
    n_layers, d_h = config["n_layers"], config["head_dim"]
    per_layer = {"mha": 2 * config["n_heads"] * d_h, "gqa": 2 * n_groups * d_h, "mqa": 2 * d_h,
                 "mla": config["kv_rank"] + config["rope_dim"]}[kind]
    return per_layer * n_layers


class LatentAttention(nn.Module):
    """MLA with the names of DeepSeek's code: q_a/q_b (or q_proj when q_rank = 0), kv_a (D ->
    r + d_R), kv_b (r -> H (d_nope + d_v)), o_proj (H d_v -> D)."""

    def __init__(self, d_model: int, n_heads: int, kv_rank: int, rope_dim: int, nope_dim: int,
                 v_dim: int, q_rank: int = 0, eps: float = 1e-6) -> None:
        super().__init__()
        for name, value in (("d_model", d_model), ("n_heads", n_heads), ("kv_rank", kv_rank),
                            ("rope_dim", rope_dim), ("nope_dim", nope_dim), ("v_dim", v_dim)):
            checks.positive_int(name, value)
        checks.non_negative_int("q_rank", q_rank)
        if kv_rank >= d_model:
            raise ValueError(f"kv_rank is {kv_rank}, expected less than d_model = {d_model}: the "
                             "latent is a compression of the token, so it must be narrower")
        if q_rank >= d_model:
            raise ValueError(f"q_rank is {q_rank}, expected less than d_model = {d_model} (or 0)")
        if rope_dim % 2:
            raise ValueError(f"rope_dim is {rope_dim}, expected an even number for RoPE")
        self.d_model, self.n_heads, self.kv_rank, self.rope_dim = d_model, n_heads, kv_rank, rope_dim
        self.nope_dim, self.v_dim, self.q_rank = nope_dim, v_dim, q_rank
        q_width = n_heads * (nope_dim + rope_dim)
        if q_rank:
            self.q_a = nn.Linear(d_model, q_rank, bias=False)
            self.q_a_norm = RMSNorm(q_rank, eps)
            self.q_b = nn.Linear(q_rank, q_width, bias=False)
        else:
            self.q_proj = nn.Linear(d_model, q_width, bias=False)
        self.kv_a = nn.Linear(d_model, kv_rank + rope_dim, bias=False)
        self.kv_a_norm = RMSNorm(kv_rank, eps)
        self.kv_b = nn.Linear(kv_rank, n_heads * (nope_dim + v_dim), bias=False)
        self.o_proj = nn.Linear(n_heads * v_dim, d_model, bias=False)
        self.scale = 1.0 / math.sqrt(nope_dim + rope_dim)

    def _check_input(self, x: Tensor, table: RopeTable) -> None:
        """x a (B, N, D) tensor in the weights' dtype, table a RopeTable of head_dim = rope_dim:
        a clear error before any product (else torch's "mat1 and mat2" or an unpacking error)."""
        check_features("x", x, self.d_model, self.kv_a.weight.dtype)
        if x.dim() != 3:
            raise ValueError(f"x has shape {tuple(x.shape)}, expected (B, N, {self.d_model})")
        if not isinstance(table, RopeTable):
            raise TypeError(f"table is a {type(table).__name__}, expected a RopeTable built for "
                            f"rope_dim = {self.rope_dim}")
        if table.head_dim != self.rope_dim:
            raise ValueError(f"table has head_dim {table.head_dim}, expected rope_dim = {self.rope_dim}: "
                             "the RoPE table rotates only the rope_dim features of each key and query")

    def queries(self, x: Tensor, table: RopeTable, positions: Tensor | None = None
                ) -> tuple[Tensor, Tensor]:
        """x (B, N, D) -> q_nope (B, H, N, d_nope), q_rope (B, H, N, d_R) rotated at `positions`
        (N,) (default 0 ... N - 1)."""
        self._check_input(x, table)
        b, n, _ = x.shape
        q = self.q_b(self.q_a_norm(self.q_a(x))) if self.q_rank else self.q_proj(x)
        q = q.view(b, n, self.n_heads, self.nope_dim + self.rope_dim).transpose(1, 2)
        q_nope, q_rope = q.split([self.nope_dim, self.rope_dim], dim=-1)
        return q_nope, rope_rotate_half(q_rope, table, positions)

    def latent(self, x: Tensor, table: RopeTable, positions: Tensor | None = None
               ) -> tuple[Tensor, Tensor]:
        """What the cache keeps: x (B, N, D) -> c (B, N, r), k_rope (B, N, d_R) rotated."""
        self._check_input(x, table)
        c, k_rope = self.kv_a(x).split([self.kv_rank, self.rope_dim], dim=-1)
        return self.kv_a_norm(c), rope_rotate_half(k_rope, table, positions)

    def up_projections(self) -> tuple[Tensor, Tensor]:
        """W_UK (H, d_nope, r) and W_UV (H, d_v, r), the two halves of kv_b per head."""
        w = self.kv_b.weight.view(self.n_heads, self.nope_dim + self.v_dim, self.kv_rank)
        return w[:, :self.nope_dim], w[:, self.nope_dim:]

    def _check_cache(self, cache: tuple[Tensor, Tensor], batch: int, dtype: torch.dtype) -> int:
        """The number of tokens in a (c (B, M0, r), k_rope (B, M0, d_R)) cache; a clear error if
        it is not one that `forward_absorbed` returned for this layer and batch."""
        if not (isinstance(cache, tuple) and len(cache) == 2 and all(isinstance(t, Tensor) for t in cache)):
            raise TypeError(f"cache is {type(cache).__name__}, expected None or the (c, k_rope) "
                            "pair of tensors that forward_absorbed returned")
        c, k_rope = cache
        m0 = c.shape[1] if c.dim() == 3 else -1
        for name, t, width in (("cache[0] (c)", c, self.kv_rank), ("cache[1] (k_rope)", k_rope, self.rope_dim)):
            if t.dim() != 3 or tuple(t.shape) != (batch, m0, width) or t.dtype != dtype:
                raise ValueError(f"{name} has shape {tuple(t.shape)} and dtype {t.dtype}, expected "
                                 f"({batch}, M0, {width}) with one M0 for both, dtype {dtype}")
        return m0

    def _attend(self, scores: Tensor) -> Tensor:
        n_q, n_k = scores.shape[-2:]
        mask = torch.ones(n_q, n_k, dtype=torch.bool, device=scores.device).tril(n_k - n_q)
        return torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)

    def forward(self, x: Tensor, table: RopeTable) -> Tensor:
        """The naive form: x (B, N, D) -> (B, N, D), per-head keys and values rebuilt from c."""
        q_nope, q_rope = self.queries(x, table)                            # checks x and table first
        b, n, _ = x.shape
        c, k_rope = self.latent(x, table)
        kv = self.kv_b(c).view(b, n, self.n_heads, self.nope_dim + self.v_dim).transpose(1, 2)
        k_nope, v = kv.split([self.nope_dim, self.v_dim], dim=-1)         # (B, H, N, d_nope), (B, H, N, d_v)
        k = torch.cat([k_nope, k_rope[:, None].expand(-1, self.n_heads, -1, -1)], dim=-1)
        q = torch.cat([q_nope, q_rope], dim=-1)
        attn = self._attend(q @ k.transpose(-2, -1) * self.scale)         # (B, H, N, N)
        return self.o_proj((attn @ v).transpose(1, 2).reshape(b, n, -1))

    def forward_absorbed(self, x: Tensor, table: RopeTable, cache: tuple[Tensor, Tensor] | None = None
                         ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """The inference form: x (B, N, D) for the tokens after `cache` (c (B, M0, r), k_rope
        (B, M0, d_R), None for none) -> (output (B, N, D), the cache grown by N tokens).
        No per-head key or value is ever built: scores and sums run in the latent space."""
        self._check_input(x, table)
        b, n, _ = x.shape
        start = 0 if cache is None else self._check_cache(cache, b, x.dtype)
        if start + n > table.n_positions:
            raise ValueError(f"the cache holds {start} tokens and x adds {n}, expected at most "
                             f"{table.n_positions} in all (the RoPE table's length)")
        positions = torch.arange(start, start + n, device=x.device)
        q_nope, q_rope = self.queries(x, table, positions)
        c, k_rope = self.latent(x, table, positions)
        if cache is not None:
            c, k_rope = torch.cat([cache[0], c], dim=1), torch.cat([cache[1], k_rope], dim=1)
        w_uk, w_uv = self.up_projections()
        q_latent = torch.einsum("bhnd,hdr->bhnr", q_nope, w_uk)            # W_UK^T q_nope: (B, H, N, r)
        scores = q_latent @ c[:, None].transpose(-2, -1) + q_rope @ k_rope[:, None].transpose(-2, -1)
        attn = self._attend(scores * self.scale)                             # (B, H, N, M)
        out_latent = attn @ c[:, None]                                       # (B, H, N, r)
        out = torch.einsum("bhnr,hvr->bnhv", out_latent, w_uv)               # W_UV after the sum
        return self.o_proj(out.reshape(b, n, -1)), (c, k_rope)
