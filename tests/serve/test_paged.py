"""The paged KV cache gives the contiguous cache's logits; blocks, tables, copy on write
(helpers.serve.paged; notebook 14, sections 3 and 5)."""

from __future__ import annotations

import pytest
import torch
from shared_tools import full

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


# helpers.serve.paged, exactly:
#
# The pool's bookkeeping read exactly (which block a sequence takes, reference counts through fork,
# copy on write and free, the free pool's order), the edges of every size check (a pool filled to
# its last block, a position in the last slot, a request exactly max_length long), the cache built
# for a model in another dtype, and every error message read in full.

def _tiny_model(seed: int = 0, **kw) -> GPT:
    torch.manual_seed(seed)
    config = dict(vocab_size=24, context_length=24, n_layers=2, n_heads=2, d_model=16) | kw
    return GPT(GPTConfig(**config)).eval()


def test_lookup_at_the_last_slot_and_one_past():
    assert lookup([4, 6], 7, 4) == (6, 3)
    assert lookup([5], 0, 1) == (5, 0)
    with pytest.raises(ValueError, match=full("position 8 needs block 2 of the sequence, but its "
                                              "block table holds 2 blocks")):
        lookup([4, 6], 8, 4)


@pytest.mark.parametrize("call, error, message", [
    (lambda: lookup([1], -1, 4), ValueError, "position is -1, expected an int >= 0"),
    (lambda: lookup([1], 0, 0), ValueError, "block_size is 0, expected a positive int"),
    (lambda: lookup([1], 0.0, 4), TypeError, "position is 0.0 (a float), expected an int >= 0"),
])
def test_lookup_errors_in_full(call, error, message):
    with pytest.raises(error, match=full(message)):
        call()


def test_a_new_cache_is_empty_and_shaped_layer_block_head_slot_dim():
    cache = PagedKVCache(2, 3, 5, block_size=4, n_blocks=6)
    assert cache.keys.shape == cache.values.shape == (2, 6, 3, 4, 5)
    assert cache.keys.dtype == torch.float32 and not cache.keys.any() and not cache.values.any()
    assert list(cache.free) == [0, 1, 2, 3, 4, 5] and cache.ref_counts == [0] * 6
    assert cache.tables == {} and cache.lengths == {} and cache.copies == 0
    assert cache.blocks_in_use() == 0 and cache.block_size == 4 and cache.n_blocks == 6
    assert PagedKVCache(1, 1, 1, 1, 1, dtype=torch.float64).values.dtype == torch.float64


@pytest.mark.parametrize("name, position", [("n_layers", 0), ("n_kv_heads", 1), ("head_dim", 2),
                                            ("block_size", 3), ("n_blocks", 4)])
def test_each_size_is_checked_by_name(name, position):
    args = [1, 1, 1, 1, 1]
    args[position] = 0
    with pytest.raises(ValueError, match=full(f"{name} is 0, expected a positive int")):
        PagedKVCache(*args)


def test_for_model_reads_the_model_and_its_dtype():
    model = _tiny_model(n_layers=3, n_heads=2, d_model=32).double()
    cache = PagedKVCache.for_model(model, block_size=5, n_blocks=7)
    assert cache.keys.shape == (3, 7, 2, 5, 16) and cache.keys.dtype == torch.float64
    assert cache.values.dtype == torch.float64


def test_blocks_are_taken_in_order_and_counted():
    cache = PagedKVCache(1, 1, 2, block_size=4, n_blocks=6)
    cache.add_sequence("a")
    assert cache.tables["a"] == [] and cache.lengths["a"] == 0
    cache.reserve("a", 5)
    assert cache.tables["a"] == [0, 1] and list(cache.free) == [2, 3, 4, 5]
    assert cache.ref_counts == [1, 1, 0, 0, 0, 0] and cache.blocks_in_use() == 2
    cache.lengths["a"] = 5
    cache.reserve("a", 3)              # 8 tokens: still two blocks
    assert cache.tables["a"] == [0, 1]
    cache.reserve("a", 4)              # 9 tokens: a third
    assert cache.tables["a"] == [0, 1, 2]


def test_blocks_needed_rounds_up():
    cache = PagedKVCache(1, 1, 1, block_size=4, n_blocks=2)
    assert [cache.blocks_needed(n) for n in (0, 1, 4, 5, 8, 9)] == [0, 1, 1, 2, 2, 3]
    with pytest.raises(ValueError, match=full("n_tokens is -1, expected an int >= 0")):
        cache.blocks_needed(-1)


def test_the_pool_can_be_filled_to_its_last_block():
    cache = PagedKVCache(1, 1, 2, block_size=4, n_blocks=2)
    cache.add_sequence(0)
    cache.reserve(0, 8)
    assert cache.tables[0] == [0, 1] and not cache.free
    cache.add_sequence(1)
    with pytest.raises(ValueError, match=full("sequence 1 needs 1 more blocks of 4 tokens for 1 new "
                                              "tokens, but only 0 of 2 are free: the request is "
                                              "longer than the cache")):
        cache.reserve(1, 1)


def test_a_request_too_long_is_refused_with_the_counts():
    cache = PagedKVCache(1, 1, 2, block_size=4, n_blocks=3)
    cache.add_sequence("s")
    with pytest.raises(ValueError, match=full("sequence 's' needs 4 more blocks of 4 tokens for 13 "
                                              "new tokens, but only 3 of 3 are free: the request "
                                              "is longer than the cache")):
        cache.reserve("s", 13)
    assert cache.tables["s"] == [] and len(cache.free) == 3  # nothing taken


def test_fork_and_free_follow_the_reference_counts():
    cache = PagedKVCache(1, 1, 2, block_size=4, n_blocks=6)
    cache.add_sequence("p")
    cache.reserve("p", 6)
    cache.lengths["p"] = 6
    cache.fork("p", "c")
    assert cache.tables["c"] == [0, 1] and cache.tables["c"] is not cache.tables["p"]
    assert cache.lengths["c"] == 6 and cache.ref_counts[:2] == [2, 2]
    cache.free_sequence("p")
    assert "p" not in cache.tables and "p" not in cache.lengths
    assert cache.ref_counts[:2] == [1, 1] and list(cache.free) == [2, 3, 4, 5]
    cache.free_sequence("c")
    assert cache.ref_counts == [0] * 6 and list(cache.free) == [2, 3, 4, 5, 0, 1]


def test_copy_on_write_copies_only_a_shared_partial_block():
    cache = PagedKVCache(2, 1, 2, block_size=4, n_blocks=8)
    cache.add_sequence("p")
    cache.reserve("p", 6)
    cache.lengths["p"] = 6
    cache.keys[:, 1] = 3.0
    cache.values[:, 1] = 5.0
    cache.reserve("p", 1)                         # unshared: written in place
    assert cache.copies == 0 and cache.tables["p"] == [0, 1]
    cache.fork("p", "c")
    cache.reserve("c", 1)                         # shared and half full: copied first
    assert cache.copies == 1 and cache.tables["c"] == [0, 2] and cache.tables["p"] == [0, 1]
    assert cache.ref_counts[:3] == [2, 1, 1]
    assert (cache.keys[:, 2] == 3.0).all() and (cache.values[:, 2] == 5.0).all()
    cache.reserve("c", 1)                         # now its own: no second copy
    assert cache.copies == 1


def test_a_shared_full_block_is_not_copied():
    cache = PagedKVCache(1, 1, 2, block_size=4, n_blocks=4)
    cache.add_sequence("p")
    cache.reserve("p", 4)
    cache.lengths["p"] = 4
    cache.fork("p", "c")
    cache.reserve("c", 1)                         # the next token opens a fresh block
    assert cache.copies == 0 and cache.tables["c"] == [0, 1] and cache.ref_counts[0] == 2


def test_copy_on_write_without_a_free_block_is_refused():
    cache = PagedKVCache(1, 1, 2, block_size=4, n_blocks=1)
    cache.add_sequence("p")
    cache.reserve("p", 2)
    cache.lengths["p"] = 2
    cache.fork("p", "c")
    with pytest.raises(ValueError, match=full("copy on write needs a free block, and none is left")):
        cache.reserve("c", 1)


@pytest.mark.parametrize("call, message", [
    (lambda c: c.reserve("x", 1), "sequence 'x' is not in the cache (known: ['a', 'b'])"),
    (lambda c: c.fork("x", "y"), "sequence 'x' is not in the cache (known: ['a', 'b'])"),
    (lambda c: c.free_sequence("x"), "sequence 'x' is not in the cache (known: ['a', 'b'])"),
])
def test_unknown_sequences_are_named(call, message):
    cache = PagedKVCache(1, 1, 2, block_size=4, n_blocks=4)
    cache.add_sequence("a")
    cache.add_sequence("b")
    with pytest.raises(KeyError) as info:
        call(cache)
    assert info.value.args[0] == message


def test_the_known_list_is_cut_at_eight():
    cache = PagedKVCache(1, 1, 2, block_size=4, n_blocks=4)
    for seq in range(10):
        cache.add_sequence(seq)
    with pytest.raises(KeyError) as info:
        cache.reserve(99, 1)
    assert info.value.args[0] == "sequence 99 is not in the cache (known: [0, 1, 2, 3, 4, 5, 6, 7])"


def test_a_sequence_is_added_once():
    cache = PagedKVCache(1, 1, 2, block_size=4, n_blocks=4)
    cache.add_sequence("a")
    with pytest.raises(ValueError, match=full("sequence 'a' is already in the cache")):
        cache.add_sequence("a")
    with pytest.raises(ValueError, match=full("sequence 'a' is already in the cache")):
        cache.fork("a", "a")


def test_store_writes_each_token_into_its_slot_and_gathers_in_table_order():
    cache = PagedKVCache(2, 2, 3, block_size=2, n_blocks=6)
    for seq in ("a", "b"):
        cache.add_sequence(seq)
    cache.reserve("b", 3)                       # b takes blocks 0, 1
    cache.reserve("a", 3)                       # a takes blocks 2, 3
    cache.lengths["b"] = 1
    keys = torch.arange(2 * 2 * 2 * 3, dtype=torch.float32).view(2, 2, 2, 3)  # (B, H, n, D)
    got_k, got_v = cache.store_hook(1, ["a", "b"])(keys, -keys)
    assert torch.equal(cache.keys[1, 2, :, 0:2], keys[0])          # a: slots 0, 1 of block 2
    assert torch.equal(cache.keys[1, 0, :, 1], keys[1, :, 0])      # b: slot 1 of block 0
    assert torch.equal(cache.keys[1, 1, :, 0], keys[1, :, 1])      # then slot 0 of block 1
    assert torch.equal(cache.values[1, 2, :, 0:2], -keys[0])
    assert not cache.keys[0].any()                                  # only layer 1 written
    assert got_k.shape == got_v.shape == (2, 2, 4, 3)
    assert torch.equal(got_k[0, :, :2], keys[0]) and torch.equal(got_k[1, :, 1:3], keys[1])
    assert torch.equal(got_v[0, :, :2], -keys[0])


def test_gather_pads_short_tables_to_the_longest():
    cache = PagedKVCache(1, 1, 1, block_size=2, n_blocks=5)
    cache.keys[0, :, 0, :, 0] = torch.arange(10, dtype=torch.float32).view(5, 2)
    cache.tables = {"a": [3], "b": [4, 1]}
    out = cache._gather(cache.keys[0], ["a", "b"])
    assert out[:, 0, :, 0].tolist() == [[6, 7, 0, 1], [8, 9, 2, 3]]


def test_forward_of_a_batch_with_different_lengths_equals_each_alone():
    model = _tiny_model()
    cache = PagedKVCache.for_model(model, block_size=3, n_blocks=16)
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 24, (1, n), generator=gen) for n in (4, 7)]
    alone = [KVCache.for_model(model, 1) for _ in prompts]
    for i, prompt in enumerate(prompts):
        cache.add_sequence(i)
        cache.forward(model, [i], prompt)
        model.forward_cached(prompt, alone[i])
    step = torch.randint(0, 24, (2, 2), generator=gen)   # two new tokens each, one batch
    got = cache.forward(model, [0, 1], step)
    assert got.shape == (2, 2, 24) and cache.lengths == {0: 6, 1: 9}
    for i in range(2):
        want = model.forward_cached(step[i:i + 1], alone[i])[0]
        assert (got[i] - want).abs().max() < 1e-5


@pytest.mark.parametrize("ids", [torch.zeros(2, dtype=torch.long), torch.zeros(2, 1, dtype=torch.long)])
def test_forward_wants_one_row_per_sequence(ids):
    model = _tiny_model()
    cache = PagedKVCache.for_model(model, block_size=4, n_blocks=4)
    cache.add_sequence(0)
    with pytest.raises(ValueError, match=full(f"token_ids has shape {tuple(ids.shape)}, expected "
                                              "(1, n): one row per sequence")):
        cache.forward(model, [0], ids)


def test_waste_at_the_edges():
    assert contiguous_waste([16, 1], 16) == 15
    assert contiguous_waste([], 4) == 0 and paged_waste([], 4) == 0
    assert paged_waste([4, 5, 1], 4) == 0 + 3 + 3
    assert paged_waste([3, 7], 1) == 0
    with pytest.raises(ValueError, match=full("a request of 20 tokens is longer than max_length = 16")):
        contiguous_waste([3, 20, 17], 16)
    with pytest.raises(ValueError, match=full("max_length is 0, expected a positive int")):
        contiguous_waste([1], 0)
    with pytest.raises(ValueError, match=full("block_size is 0, expected a positive int")):
        paged_waste([1], 0)


def test_lookup_divides_in_integers():
    """A block table is any sequence: a range of 2^55 blocks, the last slot of the last one.
    Float division would round 3 * 2^55 - 1 over 3 up to 2^55 and call it out of range."""
    assert lookup(range(2**55), 3 * 2**55 - 1, 3) == (2**55 - 1, 2)


def test_for_model_of_a_one_layer_model():
    cache = PagedKVCache.for_model(_tiny_model(n_layers=1), block_size=2, n_blocks=3)
    assert cache.keys.shape == (1, 3, 2, 2, 8)


@pytest.mark.parametrize("tokens, blocks", [(2, 1), (10, 3)])
def test_copy_on_write_replaces_the_last_block(tokens, blocks):
    cache = PagedKVCache(1, 1, 2, block_size=4, n_blocks=8)
    cache.add_sequence("p")
    cache.reserve("p", tokens)
    cache.lengths["p"] = tokens
    cache.fork("p", "c")
    cache.reserve("c", 1)
    assert cache.tables["c"] == list(range(blocks - 1)) + [blocks]
    assert cache.tables["p"] == list(range(blocks))
