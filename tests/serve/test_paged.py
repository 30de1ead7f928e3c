"""The paged KV cache gives the contiguous cache's logits; blocks, tables, copy on write
(helpers.serve.paged; notebook 14, sections 3 and 5)."""

import pytest
import torch

from helpers.model.gpt import GPT, GPTConfig
from helpers.model.kv_cache import KVCache
from helpers.serve.paged import PagedKVCache, contiguous_waste, lookup, paged_waste


def _model(seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    return GPT(GPTConfig(vocab_size=24, context_length=40, n_layers=2, n_heads=2, d_model=32)).eval()


@pytest.mark.parametrize("block_size", [1, 3, 8])
def test_paged_logits_equal_contiguous_cache(block_size):
    model = _model()
    gen = torch.Generator().manual_seed(block_size)
    prompts = [torch.randint(0, 24, (1, n), generator=gen) for n in (5, 11, 2)]
    paged = PagedKVCache.for_model(model, block_size, n_blocks=64)
    contiguous = [KVCache.for_model(model, 1) for _ in prompts]
    for i, (prompt, cache) in enumerate(zip(prompts, contiguous, strict=True)):
        paged.add_sequence(i)
        got = paged.forward(model, [i], prompt)
        assert torch.allclose(got, model.forward_cached(prompt, cache), atol=1e-5)
    for _ in range(6):  # decode steps, all three sequences in one batch
        step = torch.randint(0, 24, (3, 1), generator=gen)
        got = paged.forward(model, [0, 1, 2], step)
        for i, cache in enumerate(contiguous):
            assert torch.allclose(got[i], model.forward_cached(step[i:i + 1], cache)[0], atol=1e-5)
    assert paged.lengths == {0: 11, 1: 17, 2: 8}


def test_lookup_follows_the_block_table():
    assert lookup([7, 2, 9], 0, 4) == (7, 0)
    assert lookup([7, 2, 9], 5, 4) == (2, 1)
    assert lookup([7, 2, 9], 11, 4) == (9, 3)
    with pytest.raises(ValueError, match="block table holds 3 blocks"):
        lookup([7, 2, 9], 12, 4)


def test_blocks_return_to_the_free_pool():
    cache = PagedKVCache(1, 1, 2, block_size=4, n_blocks=5)
    cache.add_sequence("a")
    cache.reserve("a", 9)
    assert len(cache.tables["a"]) == 3 and len(cache.free) == 2
    cache.free_sequence("a")
    assert len(cache.free) == 5 and cache.ref_counts == [0] * 5


def test_fork_shares_blocks_and_copies_on_write():
    model = _model(1)
    cache = PagedKVCache.for_model(model, block_size=4, n_blocks=16)
    cache.add_sequence("prefix")
    prompt = torch.randint(0, 24, (1, 6), generator=torch.Generator().manual_seed(0))
    cache.forward(model, ["prefix"], prompt)
    cache.fork("prefix", "a")
    cache.fork("prefix", "b")
    assert cache.blocks_in_use() == 2 and cache.tables["a"] == cache.tables["prefix"]
    shared_last = cache.tables["prefix"][1]
    before = cache.keys[:, shared_last].clone()
    got = cache.forward(model, ["a", "b"], torch.tensor([[3], [5]]))
    assert cache.copies == 2 and cache.keys[:, shared_last].equal(before)  # the prefix is intact
    assert cache.tables["a"][0] == cache.tables["prefix"][0]               # the full block is still shared
    for row, token in enumerate((3, 5)):
        alone = KVCache.for_model(model, 1)
        full = model.forward_cached(torch.cat([prompt, torch.tensor([[token]])], dim=1), alone)
        assert torch.allclose(got[row, -1], full[0, -1], atol=1e-5)


def test_waste_counts():
    assert contiguous_waste([3, 10], 16) == 13 + 6
    assert paged_waste([3, 10, 8], 4) == 1 + 2 + 0
    with pytest.raises(ValueError, match="longer than max_length"):
        contiguous_waste([20], 16)


@pytest.mark.parametrize("call, error, match", [
    (lambda: PagedKVCache(1, 1, 2, block_size=0, n_blocks=4), ValueError, "block_size is 0"),
    (lambda: PagedKVCache(1, 1, 2, block_size=4, n_blocks=0), ValueError, "n_blocks is 0"),
    (lambda: lookup([1], 0, 0), ValueError, "block_size is 0"),
    (lambda: paged_waste([3], 0), ValueError, "block_size is 0"),
])
def test_bad_cache_arguments(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_a_request_longer_than_the_cache_is_refused():
    cache = PagedKVCache(1, 1, 2, block_size=4, n_blocks=2)
    cache.add_sequence(0)
    with pytest.raises(ValueError, match="longer than the cache"):
        cache.reserve(0, 9)
    with pytest.raises(KeyError, match="not in the cache"):
        cache.reserve(1, 1)
    with pytest.raises(ValueError, match="already"):
        cache.add_sequence(0)
