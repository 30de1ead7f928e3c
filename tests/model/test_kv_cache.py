"""helpers.model.kv_cache: the cache's shape, dtype and device at non-default values, where
`store` writes, and every refusal's message read in full.

 Sizes are all different
(L=2, B=3, H_KV=1, max_length=5, D_H=4) so that a swapped axis shows.
"""

from __future__ import annotations

import pytest
import torch
from shared_tools import DTYPES, TINY_CONFIG, changed_at, full, small_gpt, tiny_ids, tiny_model

from helpers.model.gpt import GPT, GPTConfig
from helpers.model.kv_cache import KVCache, check_cache
from helpers.model.modern import ModernConfig, ModernGPT


def small_cache(**kwargs) -> KVCache:
    return KVCache(2, 3, 1, 5, 4, **kwargs)


def test_a_new_cache_is_two_zero_tensors_of_the_asked_shape_dtype_and_length_zero():
    cache = small_cache()
    assert cache.keys.shape == cache.values.shape == (2, 3, 1, 5, 4)
    assert cache.keys.dtype == cache.values.dtype == torch.float32
    assert cache.keys.device.type == cache.values.device.type == "cpu"
    assert not cache.keys.any() and not cache.values.any()
    assert cache.keys is not cache.values
    assert cache.length == 0 and cache.max_length == 5
    half = small_cache(dtype=torch.bfloat16, device="cpu")
    assert half.keys.dtype == half.values.dtype == torch.bfloat16
    meta = small_cache(device="meta")  # a device other than the default, without a GPU
    assert meta.keys.is_meta and meta.values.is_meta


def test_nbytes_counts_both_tensors_at_every_slot():
    assert small_cache().nbytes() == 2 * (2 * 3 * 1 * 5 * 4) * 4
    assert small_cache(dtype=torch.bfloat16).nbytes() == 2 * (2 * 3 * 1 * 5 * 4) * 2


@pytest.mark.parametrize("position, name", list(enumerate(
    ["n_layers", "batch_size", "n_kv_heads", "max_length", "head_dim"])))
def test_every_size_is_checked_by_name(position, name):
    sizes = [2, 3, 1, 5, 4]
    sizes[position] = 0
    with pytest.raises(ValueError, match=rf"^{name} is 0, expected a positive int$"):
        KVCache(*sizes)
    sizes[position] = 1.5
    with pytest.raises(TypeError, match=rf"^{name} is "):
        KVCache(*sizes)


def test_for_model_takes_the_models_sizes_dtype_and_device():
    torch.manual_seed(0)
    config = ModernConfig(vocab_size=13, context_length=7, n_layers=3, n_heads=4, n_kv_heads=2,
                          d_model=24)
    model = ModernGPT(config).to(torch.bfloat16)
    cache = KVCache.for_model(model, 5)
    assert cache.keys.shape == cache.values.shape == (3, 5, 2, 7, 6)
    assert cache.keys.dtype == cache.values.dtype == torch.bfloat16
    assert cache.max_length == 7 and cache.length == 0
    cache.check_fits(model, 5)


def test_for_model_and_check_fits_work_for_one_layer_on_any_device():
    config = ModernConfig(vocab_size=13, context_length=7, n_layers=1, n_heads=4, n_kv_heads=1,
                          d_model=24)
    model = ModernGPT(config).to("meta")
    cache = KVCache.for_model(model, 2)
    assert cache.keys.is_meta and cache.values.is_meta
    assert cache.keys.shape == (1, 2, 1, 7, 6)
    cache.check_fits(model, 2)
    check_cache(cache, model, 2)


def test_store_writes_after_the_stored_tokens_and_returns_the_layers_prefix():
    cache = small_cache()
    k1, v1 = torch.randn(3, 1, 2, 4), torch.randn(3, 1, 2, 4)
    keys, values = cache.store(1, k1, v1)
    assert torch.equal(keys, k1) and torch.equal(values, v1)
    assert cache.length == 0  # the model moves length on, not store
    assert not cache.keys[0].any() and not cache.values[0].any()  # other layers untouched
    cache.length = 2
    k2, v2 = torch.randn(3, 1, 3, 4), torch.randn(3, 1, 3, 4)
    keys, values = cache.store(1, k2, v2)
    assert torch.equal(keys, torch.cat([k1, k2], dim=2))
    assert torch.equal(values, torch.cat([v1, v2], dim=2))
    assert torch.equal(cache.keys[1], keys) and torch.equal(cache.values[1], values)
    assert not cache.keys[0].any() and not cache.values[0].any()


def test_store_hook_stores_into_its_own_layer():
    cache = small_cache()
    k, v = torch.randn(3, 1, 1, 4), torch.randn(3, 1, 1, 4)
    keys, values = cache.store_hook(1)(k, v)
    assert torch.equal(cache.keys[1, :, :, :1], k) and torch.equal(cache.values[1, :, :, :1], v)
    assert not cache.keys[0].any() and torch.equal(keys, k) and torch.equal(values, v)


def test_store_fills_the_cache_exactly_and_refuses_one_more():
    cache = small_cache()
    cache.length = 3
    cache.store(0, torch.ones(3, 1, 2, 4), torch.ones(3, 1, 2, 4))  # 3 + 2 = 5: fits exactly
    with pytest.raises(ValueError, match=r"^the cache holds 3 tokens of at most 5; 3 more do not "
                                         r"fit$"):
        cache.store(0, torch.ones(3, 1, 3, 4), torch.ones(3, 1, 3, 4))


def test_store_refuses_another_dtype_in_keys_or_values():
    cache = small_cache()
    good, half = torch.ones(3, 1, 1, 4), torch.ones(3, 1, 1, 4, dtype=torch.float64)
    message = (r"^keys are torch.float32 and values torch.float64, expected torch.float32, the "
               r"dtype this cache was made with$")
    with pytest.raises(TypeError, match=message):
        cache.store(0, good, half)
    with pytest.raises(TypeError, match=r"^keys are torch.float64 and values torch.float32, "):
        cache.store(0, half, good)


@pytest.mark.parametrize("keys_shape, values_shape", [
    ((3, 1, 1, 4), (3, 1, 2, 4)),   # keys and values differ
    ((2, 1, 1, 4), (2, 1, 1, 4)),   # batch
    ((3, 2, 1, 4), (3, 2, 1, 4)),   # heads
    ((3, 1, 1, 5), (3, 1, 1, 5)),   # head size
])
def test_store_refuses_shapes_that_do_not_fit(keys_shape, values_shape):
    cache = small_cache()
    message = (f"keys has shape {keys_shape} and values {values_shape}, expected both "
               f"(B, H_KV, n, D_H) with (B, H_KV, D_H) = (3, 1, 4)")
    with pytest.raises(ValueError, match=full(message)):
        cache.store(0, torch.ones(keys_shape), torch.ones(values_shape))


GPT_SMALL = dict(vocab_size=11, context_length=5, n_layers=2, n_heads=2, d_model=8)


@pytest.mark.parametrize("sizes, what, got, expected", [
    ((3, 3, 2, 5, 4), "layers", 3, 2),
    ((2, 2, 2, 5, 4), "batch size", 2, 3),
    ((2, 3, 1, 5, 4), "key/value heads", 1, 2),
    ((2, 3, 2, 5, 3), "head size", 3, 4),
])
def test_check_fits_names_the_size_that_differs(sizes, what, got, expected):
    model = GPT(GPTConfig(**GPT_SMALL))
    message = (f"cache has {what} {got} (keys of shape {sizes}), expected {expected} for this "
               f"model and token_ids: make it with KVCache.for_model(model, 3)")
    with pytest.raises(ValueError, match=full(message)):
        KVCache(*sizes).check_fits(model, 3)
    KVCache(2, 3, 2, 5, 4).check_fits(model, 3)  # the right sizes pass
    KVCache(2, 3, 2, 9, 4).check_fits(model, 3)  # a longer cache than the context is fine


def test_check_fits_refuses_another_dtype():
    model = GPT(GPTConfig(**GPT_SMALL))
    message = (r"^cache holds torch.float64 on cpu, expected torch.float32 on cpu like the model's "
               r"weights: make it with KVCache.for_model\(model, 3\)$")
    with pytest.raises(TypeError, match=message):
        KVCache(2, 3, 2, 5, 4, dtype=torch.float64).check_fits(model, 3)
    # the right dtype on another device ("meta": no GPU needed) is refused too
    with pytest.raises(TypeError, match=r"^cache holds torch.float32 on meta, expected "
                                        r"torch.float32 on cpu like"):
        KVCache(2, 3, 2, 5, 4, device="meta").check_fits(model, 3)


def test_check_cache_refuses_what_is_not_a_cache_then_checks_the_fit():
    model = GPT(GPTConfig(**GPT_SMALL))
    with pytest.raises(TypeError, match=r"^cache is a list, expected a KVCache "
                                        r"\(KVCache.for_model\(model, 3\)\)$"):
        check_cache([], model, 3)
    with pytest.raises(ValueError, match=r"^cache has batch size 2 "):
        check_cache(KVCache(2, 2, 2, 5, 4), model, 3)
    check_cache(KVCache.for_model(model, 3), model, 3)


def test_forward_cached_refuses_training_mode_with_dropout():
    model = tiny_model(dropout=0.1).train()
    with pytest.raises(RuntimeError, match=r"training mode with dropout = 0.1.*call model.eval\(\)"):
        model.forward_cached(tiny_ids(), KVCache.for_model(model, 1))
    model.eval()
    assert model.forward_cached(tiny_ids(), KVCache.for_model(model, 1)).shape == (1, 4, TINY_CONFIG.vocab_size)


@pytest.mark.parametrize("cache, error, match", [
    (KVCache(2, 3, 2, 8, 4), ValueError, "cache has batch size 3 .*expected 1"),
    (KVCache(1, 1, 2, 8, 4), ValueError, "cache has layers 1 .*expected 2"),
    (KVCache(2, 1, 2, 8, 4, dtype=torch.float64), TypeError, "cache holds torch.float64"),
])
def test_a_cache_that_does_not_fit_the_model_is_named(cache, error, match):
    with pytest.raises(error, match=match):
        tiny_model().forward_cached(tiny_ids(), cache)


MODERN = ModernConfig(vocab_size=11, context_length=8, n_layers=2, n_heads=2, n_kv_heads=1, d_model=8)


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


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("fast", [False, True], ids=["plain", "fused"])
def test_the_cached_forward_is_causal_exactly_too(dtype, fast):
    model = small_gpt(dtype)
    ids = torch.randint(0, 31, (2, 12), generator=torch.Generator().manual_seed(2))
    outputs = []
    for sequence in (ids, changed_at(ids, 8, 31)):
        cache = KVCache.for_model(model, batch_size=2)
        outputs.append(torch.cat([model.forward_cached(sequence[:, t:t + 1], cache, fast=fast)
                                  for t in range(12)], dim=1))
    assert torch.equal(outputs[0][:, :8], outputs[1][:, :8])
    assert not torch.equal(outputs[0][:, 8:], outputs[1][:, 8:])
