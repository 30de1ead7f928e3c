"""Multi-head latent attention (notebook 12, section 2): the absorbed form equals the naive one,
the latent cache equals a full pass, the cache sizes, and a transformers DeepSeek-V3's logits."""

from __future__ import annotations

import importlib.util
import math
import re

import pytest
import torch
from shared_tools import full

from helpers.model.deepseek import DeepSeekConfig, DeepSeekGPT
from helpers.model.mla import DEEPSEEK_V3, LatentAttention, cache_values_per_token
from helpers.model.modern import RopeTable

HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None


def _layer(q_rank=0, seed=0):
    torch.manual_seed(seed)
    layer = LatentAttention(d_model=32, n_heads=4, kv_rank=12, rope_dim=4, nope_dim=8, v_dim=6,
                            q_rank=q_rank)
    return layer, RopeTable.build(4, 16)


@pytest.mark.parametrize("q_rank", [0, 16])
def test_absorbed_equals_naive(q_rank):
    layer, table = _layer(q_rank)
    x = torch.randn(2, 10, 32)
    absorbed, (c, k_rope) = layer.forward_absorbed(x, table)
    torch.testing.assert_close(absorbed, layer(x, table), atol=1e-5, rtol=1e-4)
    assert c.shape == (2, 10, 12) and k_rope.shape == (2, 10, 4)


def test_latent_cache_token_by_token_equals_a_full_pass():
    layer, table = _layer()
    x = torch.randn(1, 9, 32)
    cache, steps = None, []
    for t in range(9):
        out, cache = layer.forward_absorbed(x[:, t:t + 1], table, cache)
        steps.append(out)
    torch.testing.assert_close(torch.cat(steps, 1), layer(x, table), atol=1e-5, rtol=1e-4)


def test_cache_values_follow_deepseek_v2s_table():
    d_h, layers = DEEPSEEK_V3["head_dim"], DEEPSEEK_V3["n_layers"]
    assert cache_values_per_token("mha", DEEPSEEK_V3) == 2 * 128 * d_h * layers
    assert cache_values_per_token("gqa", DEEPSEEK_V3, n_groups=8) == 2 * 8 * d_h * layers
    assert cache_values_per_token("mqa", DEEPSEEK_V3) == 2 * d_h * layers
    assert cache_values_per_token("mla", DEEPSEEK_V3) == 4.5 * d_h * layers  # (d_c + d_R) = 9/2 d_h


def test_absorbed_model_equals_naive_model():
    torch.manual_seed(0)
    model = DeepSeekGPT(DeepSeekConfig()).eval()
    ids = torch.randint(0, 64, (2, 12))
    with torch.no_grad():
        torch.testing.assert_close(model(ids, absorbed=True), model(ids), atol=1e-5, rtol=1e-4)


@pytest.mark.skipif(not HAS_TRANSFORMERS, reason="needs transformers")
@pytest.mark.parametrize("q_rank, interleave, groups", [(None, True, (1, 1)), (24, True, (1, 1)),
                                                        (24, False, (1, 1)), (24, True, (3, 2)),
                                                        (None, True, (3, 1))])
def test_deepseek_v3_logits_equal_transformers(q_rank, interleave, groups):
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    from helpers.model.deepseek import config_from_deepseek_v3, from_deepseek_v3
    torch.manual_seed(0)
    hf_config = DeepseekV3Config(
        vocab_size=50, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, n_routed_experts=6,
        n_shared_experts=1, num_experts_per_tok=2, n_group=groups[0], topk_group=groups[1], first_k_dense_replace=1,
        kv_lora_rank=12, q_lora_rank=q_rank, qk_rope_head_dim=4, qk_nope_head_dim=8, v_head_dim=8,
        max_position_embeddings=32, rope_interleave=interleave)
    hf = DeepseekV3ForCausalLM(hf_config).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.normal_(0, 0.2) if p.dim() > 1 else p.normal_(1, 0.1)
        for name, buffer in hf.named_buffers():
            if "bias" in name:
                buffer.normal_(0, 0.1)
    ids = torch.randint(0, 50, (2, 12))
    ours = from_deepseek_v3(hf.state_dict(), config_from_deepseek_v3(hf_config), interleave).eval()
    with torch.no_grad():
        expected = hf(ids).logits
        torch.testing.assert_close(ours(ids), expected, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(ours(ids, absorbed=True), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("call, message", [
    (lambda: LatentAttention(32, 4, 32, 4, 8, 8), "kv_rank is 32, expected less than d_model = 32"),
    (lambda: LatentAttention(32, 4, 40, 4, 8, 8), "kv_rank is 40"),
    (lambda: LatentAttention(32, 4, 8, 3, 8, 8), "rope_dim is 3"),
    (lambda: LatentAttention(32, 4, 8, 4, 8, 8, q_rank=64), "q_rank is 64"),
    (lambda: LatentAttention(32, 0, 8, 4, 8, 8), "n_heads is 0"),
    (lambda: cache_values_per_token("mha", {}), "config has no"),
    (lambda: cache_values_per_token("mla2", DEEPSEEK_V3), "kind is 'mla2'"),
    (lambda: _layer()[0].latent(torch.randn(1, 3, 31), _layer()[1]), "x has shape"),
])
def test_bad_input_raises_a_clear_error(call, message):
    with pytest.raises((ValueError, TypeError, KeyError), match=message):
        call()


@pytest.mark.parametrize("make_cache, error, message", [
    (lambda c, k: [c, k], TypeError, "cache is list"),
    (lambda c, k: (c,), TypeError, "cache is tuple"),
    (lambda c, k: (c[:, :, :-1], k), ValueError, r"cache\[0\] \(c\) has shape \(2, 5, 11\)"),
    (lambda c, k: (c, k[:, :-1]), ValueError, r"cache\[1\] \(k_rope\) has shape \(2, 4, 4\)"),
    (lambda c, k: (c[:1], k[:1]), ValueError, r"expected \(2, M0, 12\)"),
    (lambda c, k: (c.double(), k.double()), ValueError, "dtype torch.float64"),
])
def test_a_cache_that_forward_absorbed_did_not_return_is_refused(make_cache, error, message):
    layer, table = _layer()
    x = torch.randn(2, 5, layer.d_model)
    with torch.no_grad():
        _, (c, k_rope) = layer.forward_absorbed(x, table)
        with pytest.raises(error, match=message):
            layer.forward_absorbed(x[:, :1], table, make_cache(c, k_rope))


def test_a_cache_past_the_rope_table_is_refused():
    layer, table = _layer()
    x = torch.randn(1, table.n_positions, layer.d_model)
    with torch.no_grad():
        _, cache = layer.forward_absorbed(x, table)
        with pytest.raises(ValueError, match=f"holds {table.n_positions} tokens and x adds 1"):
            layer.forward_absorbed(x[:, :1], table, cache)


# helpers.model.mla, exactly:
#
# Both forms of latent attention against a float64 reference written here from the equations
# (per head, per query, RoPE by its angles, not by the course's code), the latent cache grown in
# uneven chunks, the sizes of the weights, the config table's defaults, every error message read
# in full.

D, H, R, D_R, D_NOPE, D_V = 20, 3, 6, 4, 5, 7   # every size different, so a swapped one shows


def _latent_layer(q_rank=0, seed=0, eps=1e-6, dtype=torch.float64):
    torch.manual_seed(seed)
    layer = LatentAttention(D, H, R, D_R, D_NOPE, D_V, q_rank=q_rank, eps=eps).to(dtype)
    with torch.no_grad():
        for p in layer.parameters():   # gains away from 1, weights large enough to matter
            p.copy_(torch.randn_like(p) * 0.5 + (1.0 if p.dim() == 1 else 0.0))
    return layer, RopeTable.build(D_R, 16, dtype=dtype)


def _rope(x, position, base=10000.0):
    """Rotate-half RoPE of one vector x (d,) at `position`: pair (i, i + d/2) turned by
    position x base^(-2i/d)."""
    half = x.shape[0] // 2
    angle = position * base ** (-2.0 * torch.arange(half, dtype=torch.float64) / x.shape[0])
    a, b = x[:half], x[half:]
    return torch.cat([a * angle.cos() - b * angle.sin(), b * angle.cos() + a * angle.sin()])


def _rms(x, gain, eps):
    return x / torch.sqrt((x * x).mean() + eps) * gain


def reference(layer, x, eps=1e-6):
    """MLA's output for x (B, N, D), token t at position t, as B x N x H separate dot products in
    float64: q_h = [q_nope, rope(q_rope)], k_h = [W_UK_h c, rope(k_rope)], v_h = W_UV_h c, causal
    softmax with scale 1 / sqrt(d_nope + d_R)."""
    x = x.double()
    b, n, _ = x.shape
    w = {name: p.detach().double() for name, p in layer.named_parameters()}
    kv_b = w["kv_b.weight"].view(H, D_NOPE + D_V, R)
    out = torch.zeros(b, n, H * D_V, dtype=torch.float64)
    for i in range(b):
        keys, values = [], []
        for t in range(n):
            a = w["kv_a.weight"] @ x[i, t]
            c = _rms(a[:R], w["kv_a_norm.weight"], eps)
            k_rope = _rope(a[R:], t)
            keys.append([torch.cat([kv_b[h, :D_NOPE] @ c, k_rope]) for h in range(H)])
            values.append([kv_b[h, D_NOPE:] @ c for h in range(H)])
        for t in range(n):
            if layer.q_rank:
                q_all = w["q_b.weight"] @ _rms(w["q_a.weight"] @ x[i, t], w["q_a_norm.weight"], eps)
            else:
                q_all = w["q_proj.weight"] @ x[i, t]
            for h in range(H):
                q = q_all[h * (D_NOPE + D_R):(h + 1) * (D_NOPE + D_R)]
                q = torch.cat([q[:D_NOPE], _rope(q[D_NOPE:], t)])
                scores = torch.stack([q @ keys[s][h] for s in range(t + 1)]) / math.sqrt(D_NOPE + D_R)
                p = torch.softmax(scores, 0)
                out[i, t, h * D_V:(h + 1) * D_V] = sum(p[s] * values[s][h] for s in range(t + 1))
    return out @ w["o_proj.weight"].T


@pytest.mark.parametrize("q_rank", [0, 9])
def test_naive_and_absorbed_forms_equal_the_float64_reference(q_rank):
    layer, table = _latent_layer(q_rank)
    x = torch.randn(2, 4, D, dtype=torch.float64)
    expected = reference(layer, x)
    torch.testing.assert_close(layer(x, table), expected, atol=1e-10, rtol=1e-10)
    absorbed, (c, k_rope) = layer.forward_absorbed(x, table)
    torch.testing.assert_close(absorbed, expected, atol=1e-10, rtol=1e-10)
    assert c.shape == (2, 4, R) and k_rope.shape == (2, 4, D_R)


@pytest.mark.parametrize("q_rank", [0, 9])
def test_eps_reaches_both_rms_norms(q_rank):
    """A large eps changes the latent's norm (and q_a's); the reference with the same eps agrees."""
    layer, table = _latent_layer(q_rank, eps=0.5)
    assert layer.kv_a_norm.eps == 0.5
    if q_rank:
        assert layer.q_a_norm.eps == 0.5
    x = torch.randn(1, 4, D, dtype=torch.float64) * 0.3
    expected = reference(layer, x, eps=0.5)
    torch.testing.assert_close(layer(x, table), expected, atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(layer.forward_absorbed(x, table)[0], expected, atol=1e-10, rtol=1e-10)


def test_the_default_eps_is_one_in_a_million():
    layer = LatentAttention(D, H, R, D_R, D_NOPE, D_V, q_rank=9)
    assert layer.kv_a_norm.eps == 1e-6 and layer.q_a_norm.eps == 1e-6
    assert layer.scale == 1 / math.sqrt(D_NOPE + D_R)


def test_the_weights_have_deepseeks_shapes_and_names():
    low = LatentAttention(D, H, R, D_R, D_NOPE, D_V, q_rank=9)
    shapes = {name: tuple(p.shape) for name, p in low.named_parameters()}
    assert shapes == {"q_a.weight": (9, D), "q_a_norm.weight": (9,), "q_b.weight": (H * (D_NOPE + D_R), 9),
                      "kv_a.weight": (R + D_R, D), "kv_a_norm.weight": (R,),
                      "kv_b.weight": (H * (D_NOPE + D_V), R), "o_proj.weight": (D, H * D_V)}
    plain = LatentAttention(D, H, R, D_R, D_NOPE, D_V)
    assert {name for name, _ in plain.named_parameters()} == {
        "q_proj.weight", "kv_a.weight", "kv_a_norm.weight", "kv_b.weight", "o_proj.weight"}
    assert all(m.bias is None for m in plain.modules() if isinstance(m, torch.nn.Linear))
    assert (plain.d_model, plain.n_heads, plain.kv_rank, plain.rope_dim, plain.nope_dim, plain.v_dim,
            plain.q_rank) == (D, H, R, D_R, D_NOPE, D_V, 0)


def test_up_projections_are_the_two_halves_of_kv_b_per_head():
    layer, _ = _latent_layer()
    w_uk, w_uv = layer.up_projections()
    assert w_uk.shape == (H, D_NOPE, R) and w_uv.shape == (H, D_V, R)
    rows = layer.kv_b.weight.view(H, D_NOPE + D_V, R)
    assert torch.equal(w_uk, rows[:, :D_NOPE]) and torch.equal(w_uv, rows[:, D_NOPE:])


def test_queries_and_latent_rotate_at_the_positions_given():
    layer, table = _latent_layer()
    x = torch.randn(1, 3, D, dtype=torch.float64)
    positions = torch.tensor([4, 7, 11])
    q_nope, q_rope = layer.queries(x, table, positions)
    c, k_rope = layer.latent(x, table, positions)
    q_all = x[0] @ layer.q_proj.weight.T                               # (3, H (d_nope + d_R))
    a = x[0] @ layer.kv_a.weight.T
    for t, pos in enumerate(positions.tolist()):
        torch.testing.assert_close(k_rope[0, t], _rope(a[t, R:], pos), atol=1e-12, rtol=0)
        torch.testing.assert_close(c[0, t], _rms(a[t, :R], layer.kv_a_norm.weight, 1e-6), atol=1e-12, rtol=0)
        for h in range(H):
            q = q_all[t, h * (D_NOPE + D_R):(h + 1) * (D_NOPE + D_R)]
            torch.testing.assert_close(q_nope[0, h, t], q[:D_NOPE], atol=1e-12, rtol=0)
            torch.testing.assert_close(q_rope[0, h, t], _rope(q[D_NOPE:], pos), atol=1e-12, rtol=0)
    q_nope0, q_rope0 = layer.queries(x, table)                          # default: 0 .. N - 1
    torch.testing.assert_close(q_rope0, layer.queries(x, table, torch.arange(3))[1], atol=0, rtol=0)
    assert torch.equal(q_nope0, q_nope)


@pytest.mark.parametrize("chunks", [(1, 4, 2), (3, 1, 3), (6, 1)])
def test_the_cache_grown_in_uneven_chunks_equals_one_pass(chunks):
    """Queries after a cache sit at its end: their mask is tril(M - N), their RoPE starts at M0."""
    layer, table = _latent_layer(q_rank=9)
    x = torch.randn(2, sum(chunks), D, dtype=torch.float64)
    full_out, (c_full, k_full) = layer.forward_absorbed(x, table)
    cache, outs, start = None, [], 0
    for n in chunks:
        out, cache = layer.forward_absorbed(x[:, start:start + n], table, cache)
        outs.append(out)
        start += n
        assert cache[0].shape == (2, start, R) and cache[1].shape == (2, start, D_R)
    torch.testing.assert_close(torch.cat(outs, 1), full_out, atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(cache[0], c_full, atol=1e-12, rtol=0)
    torch.testing.assert_close(cache[1], k_full, atol=1e-12, rtol=0)


def test_a_cache_may_reach_the_rope_table_exactly():
    layer, table = _latent_layer()
    x = torch.randn(1, table.n_positions, D, dtype=torch.float64)
    _, cache = layer.forward_absorbed(x[:, :-1], table)
    out, cache = layer.forward_absorbed(x[:, -1:], table, cache)       # start + n == n_positions
    assert cache[0].shape[1] == table.n_positions
    torch.testing.assert_close(out, layer(x, table)[:, -1:], atol=1e-10, rtol=1e-10)
    with pytest.raises(ValueError, match=full(
            "the cache holds 0 tokens and x adds 17, expected at most 16 in all (the RoPE table's length)")):
        layer.forward_absorbed(torch.randn(1, 17, D, dtype=torch.float64), table)


def test_cache_errors_are_read_in_full():
    layer, table = _latent_layer(dtype=torch.float32)
    x = torch.randn(2, 3, D)
    _, (c, k) = layer.forward_absorbed(x, table)
    with pytest.raises(TypeError, match=full(
            "cache is list, expected None or the (c, k_rope) pair of tensors that forward_absorbed returned")):
        layer.forward_absorbed(x, table, [c, k])
    with pytest.raises(TypeError, match="^cache is tuple"):
        layer.forward_absorbed(x, table, (c, k.tolist()))
    with pytest.raises(TypeError, match="^cache is tuple"):
        layer.forward_absorbed(x, table, (c, k, k))
    with pytest.raises(ValueError, match=full(
            f"cache[0] (c) has shape (2, 3, {R + 1}) and dtype torch.float32, expected "
            f"(2, M0, {R}) with one M0 for both, dtype torch.float32")):
        layer.forward_absorbed(x, table, (torch.cat([c, c[..., :1]], -1), k))
    with pytest.raises(ValueError, match=full(
            f"cache[1] (k_rope) has shape (2, 2, {D_R}) and dtype torch.float32, expected "
            f"(2, M0, {D_R}) with one M0 for both, dtype torch.float32")):
        layer.forward_absorbed(x, table, (c, k[:, :2]))
    with pytest.raises(ValueError, match=re.escape(f"cache[0] (c) has shape (3, {R})")):
        layer.forward_absorbed(x, table, (c[0], k))                    # 2-D: no M0 to read
    with pytest.raises(ValueError, match=re.escape(f"cache[1] (k_rope) has shape (1, 2, 3, {D_R})")):
        layer.forward_absorbed(x, table, (c, k[None]))
    with pytest.raises(ValueError, match=re.escape("cache[1] (k_rope) has shape (2, 3, 4) and dtype torch.float64")):
        layer.forward_absorbed(x, table, (c, k.double()))

    with pytest.raises(ValueError, match=re.escape(f"cache[0] (c) has shape ({R},)")):
        layer.forward_absorbed(x, table, (c[0, 0], k))                 # 1-D: no shape[1] either


def test_the_causal_mask_is_built_on_the_scores_device():
    layer, _ = _latent_layer()
    scores = torch.zeros(2, H, 3, 5, device="meta")                   # shapes only, no values
    assert layer._attend(scores).device.type == "meta"
    weights = layer._attend(torch.zeros(1, 1, 3, 5, dtype=torch.float64))
    expected = torch.tensor([[1 / 3] * 3 + [0, 0], [1 / 4] * 4 + [0], [1 / 5] * 5], dtype=torch.float64)
    torch.testing.assert_close(weights[0, 0], expected, atol=1e-15, rtol=0)   # tril(M - N)


def test_forward_absorbed_checks_x_first():
    layer, table = _latent_layer(dtype=torch.float32)
    with pytest.raises(ValueError, match=full(
            f"x has shape (1, 2, {D + 1}), expected (..., {D}): the last dimension holds each "
            f"token's d_model = {D} features")):
        layer.forward_absorbed(torch.randn(1, 2, D + 1), table)
    with pytest.raises(TypeError, match="^x has dtype torch.float64"):
        layer.forward_absorbed(torch.randn(1, 2, D, dtype=torch.float64), table)


@pytest.mark.parametrize("args, kwargs, message", [
    ((D, H, D, D_R, D_NOPE, D_V), {}, f"kv_rank is {D}, expected less than d_model = {D}: the latent "
                                      "is a compression of the token, so it must be narrower"),
    ((D, H, R, D_R, D_NOPE, D_V), {"q_rank": D},
     f"q_rank is {D}, expected less than d_model = {D} (or 0)"),
    ((D, H, R, 3, D_NOPE, D_V), {}, "rope_dim is 3, expected an even number for RoPE"),
])
def test_constructor_errors_are_read_in_full(args, kwargs, message):
    with pytest.raises(ValueError, match=full(message)):
        LatentAttention(*args, **kwargs)


@pytest.mark.parametrize("position, name", list(enumerate(
    ["d_model", "n_heads", "kv_rank", "rope_dim", "nope_dim", "v_dim"])))
def test_every_size_is_checked_by_name(position, name):
    args = [D, H, R, D_R, D_NOPE, D_V]
    args[position] = 0
    with pytest.raises(ValueError, match=f"^{name} is 0"):
        LatentAttention(*args)
    with pytest.raises(ValueError, match="^q_rank is -1"):
        LatentAttention(D, H, R, D_R, D_NOPE, D_V, q_rank=-1)


def test_sizes_just_under_d_model_are_accepted():
    layer = LatentAttention(D, H, D - 1, D_R, D_NOPE, D_V, q_rank=D - 1)
    assert layer.kv_rank == layer.q_rank == D - 1


def test_cache_values_per_token_for_a_small_config():
    config = {"n_layers": 3, "n_heads": 5, "head_dim": 7, "kv_rank": 11, "rope_dim": 2}
    assert cache_values_per_token("mha", config) == 2 * 5 * 7 * 3
    assert cache_values_per_token("gqa", config) == 2 * 8 * 7 * 3            # n_groups defaults to 8
    assert cache_values_per_token("gqa", config, n_groups=2) == 2 * 2 * 7 * 3
    assert cache_values_per_token("mqa", config) == 2 * 7 * 3
    assert cache_values_per_token("mla", config) == (11 + 2) * 3
    assert DEEPSEEK_V3 == {"n_layers": 61, "d_model": 7168, "n_heads": 128, "kv_rank": 512,
                           "rope_dim": 64, "nope_dim": 128, "v_dim": 128, "q_rank": 1536, "head_dim": 128}


@pytest.mark.parametrize("missing", ["n_layers", "n_heads", "head_dim", "kv_rank", "rope_dim"])
def test_cache_values_per_token_names_the_missing_key(missing):
    config = {k: v for k, v in DEEPSEEK_V3.items() if k != missing}
    with pytest.raises(KeyError, match=re.escape(f"config has no {missing!r}, expected the keys of DEEPSEEK_V3")):
        cache_values_per_token("mla", config)


def test_cache_values_per_token_checks_kind_and_groups():
    with pytest.raises(ValueError, match="^kind is 'mla2'"):
        cache_values_per_token("mla2", DEEPSEEK_V3)
    with pytest.raises(ValueError, match="^n_groups is 0"):
        cache_values_per_token("gqa", DEEPSEEK_V3, n_groups=0)


@pytest.mark.parametrize("method", ["forward", "forward_absorbed", "queries", "latent"])
def test_every_entry_point_checks_x_and_the_table_before_any_product(method):
    layer, table = _latent_layer(dtype=torch.float32)
    call = getattr(layer, method)
    with pytest.raises(ValueError, match=full(
            f"x has shape (1, 2, {D + 1}), expected (..., {D}): the last dimension holds each "
            f"token's d_model = {D} features")):
        call(torch.randn(1, 2, D + 1), table)                          # was torch's "mat1 and mat2"
    with pytest.raises(ValueError, match=full(f"x has shape (2, {D}), expected (B, N, {D})")):
        call(torch.randn(2, D), table)                                 # was "not enough values to unpack"
    with pytest.raises(TypeError, match=full(f"table is a tuple, expected a RopeTable built for rope_dim = {D_R}")):
        call(torch.randn(1, 2, D), (table.cos, table.sin))
    with pytest.raises(ValueError, match=full(
            f"table has head_dim 6, expected rope_dim = {D_R}: the RoPE table rotates only the "
            "rope_dim features of each key and query")):
        call(torch.randn(1, 2, D), RopeTable.build(6, 16))             # was "x has shape (1, 3, 2, 4)"
