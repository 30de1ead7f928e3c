"""Continuous and static batching give each request the tokens it gets alone
(helpers.serve.scheduler; notebook 14, section 4)."""

from __future__ import annotations

import pytest
import torch
from shared_tools import full

from helpers.model.generation import generate
from helpers.model.gpt import GPT, GPTConfig
from helpers.serve.paged import PagedKVCache
from helpers.serve.scheduler import Request, Scheduler, Served, serve_continuous, serve_static


def _setup(seed: int):
    torch.manual_seed(seed)
    model = GPT(GPTConfig(vocab_size=24, context_length=40, n_layers=2, n_heads=2, d_model=32)).eval()
    gen = torch.Generator().manual_seed(seed)
    requests = [Request(i, tuple(torch.randint(0, 24, (int(torch.randint(1, 8, (), generator=gen)),),
                                               generator=gen).tolist()),
                        int(torch.randint(1, 12, (), generator=gen)), arrival=2 * i)
                for i in range(7)]
    return model, requests


def _alone(model, request):
    prompt = torch.tensor([list(request.prompt)])
    return generate(model, prompt, request.max_new_tokens, temperature=0)[0, prompt.shape[1]:].tolist()


@pytest.mark.parametrize("seed", range(3))
def test_continuous_batching_equals_each_request_alone(seed):
    model, requests = _setup(seed)
    served, scheduler = serve_continuous(model, requests, max_batch=3, block_size=4, n_blocks=20)
    for one, request in zip(served, requests, strict=True):
        assert one.tokens == _alone(model, request)
        assert one.request.arrival <= one.first_token <= one.finished
    assert max(scheduler.batch_sizes) <= 3
    assert scheduler.cache.blocks_in_use() == 0  # every block freed


@pytest.mark.parametrize("seed", range(3))
def test_static_batching_equals_each_request_alone_and_waits_longer(seed):
    model, requests = _setup(seed)
    static = serve_static(model, requests, batch_size=3)
    continuous, _ = serve_continuous(model, requests, max_batch=3, block_size=4, n_blocks=40)
    for one, request in zip(static, requests, strict=True):
        assert one.tokens == _alone(model, request)
    mean = lambda served: sum(s.latency for s in served) / len(served)  # noqa: E731
    assert mean(continuous) < mean(static)


def test_a_small_pool_delays_admission_but_not_the_tokens():
    model, requests = _setup(0)
    served, scheduler = serve_continuous(model, requests, max_batch=7, block_size=4, n_blocks=5)
    assert [s.tokens for s in served] == [_alone(model, r) for r in requests]


def test_bad_requests_are_refused():
    model, _ = _setup(0)
    with pytest.raises(ValueError, match="max_new_tokens is 0"):
        Request(0, (1, 2), 0)
    with pytest.raises(ValueError, match="empty prompt"):
        Request(0, (), 3)
    scheduler = Scheduler(model, PagedKVCache.for_model(model, 4, 3), max_batch=2)
    with pytest.raises(ValueError, match="longer than the context"):
        scheduler.submit([Request(0, (1,) * 10, 5)])  # 15 tokens, the pool holds 12
    with pytest.raises(ValueError, match="max_batch is 0"):
        Scheduler(model, PagedKVCache.for_model(model, 4, 3), max_batch=0)


def test_a_request_id_used_twice_is_refused_before_anything_is_queued():
    model, _ = _setup(0)
    scheduler = Scheduler(model, PagedKVCache.for_model(model, 4, 8), max_batch=2)
    with pytest.raises(ValueError, match="^request id 3 is used twice, expected every request"):
        scheduler.submit([Request(3, (1, 2), 2), Request(4, (1,), 2), Request(3, (2,), 2)])
    assert not scheduler.waiting
    scheduler.submit([Request(3, (1, 2), 2)])
    with pytest.raises(ValueError, match="^request id 3 is used twice"):
        scheduler.submit([Request(3, (5,), 1)])
    with pytest.raises(TypeError, match="^requests holds a tuple, expected Request objects"):
        scheduler.submit([(1, 2)])
    with pytest.raises(ValueError, match="longer than the context"):
        scheduler.submit([Request(7, (1,), 2), Request(8, (1,) * 30, 5)])
    assert [r.id for r in scheduler.waiting] == [3]


# helpers.serve.scheduler, exactly:
#
# More requests than slots, with the whole timeline worked by hand (which step admits, prefills,
# decodes and retires each request; the forward passes and the batch size at every step), a pool
# too small for two requests at once (admission waits, first come first served), static batching's
# clock, the defaults, and every message in full.

def _model(context: int = 24) -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=16, context_length=context, n_layers=1, n_heads=2,
                         d_model=16)).eval()


def timeline(served):
    return [(s.request.id, s.first_token, s.finished) for s in served]


def test_five_requests_two_slots_the_timeline_by_hand():
    """max_batch 2, all arrive at 0, max_new_tokens 3, 1, 2, 4, 1:
    step 0: admit 0, 1 (two prefills); 1 is done.   step 1: admit 2 (prefill), decode 0.
    step 2: decode 0, 2; both done.                  step 3: admit 3, 4 (two prefills); 4 done.
    steps 4-6: decode 3; done at 6."""
    model = _model()
    requests = [Request(i, (i + 1, 2), m) for i, m in enumerate((3, 1, 2, 4, 1))]
    served, scheduler = serve_continuous(model, requests, max_batch=2, block_size=4, n_blocks=16)
    assert timeline(served) == [(0, 0, 2), (1, 0, 0), (2, 1, 2), (3, 3, 6), (4, 3, 3)]
    assert [s.latency for s in served] == [3, 1, 3, 7, 4]
    assert scheduler.batch_sizes == [2, 2, 2, 2, 1, 1, 1]
    assert scheduler.forward_passes == 2 + 2 + 1 + 2 + 1 + 1 + 1
    assert scheduler.clock == 7 and not scheduler.running and not scheduler.waiting
    assert [len(s.tokens) for s in served] == [3, 1, 2, 4, 1]
    assert [s.tokens for s in served] == [_alone(model, r) for r in requests]
    assert [s.request for s in served] == requests


def test_a_request_waits_for_its_arrival():
    model = _model()
    requests = [Request(0, (1,), 2, arrival=0), Request(1, (2,), 1, arrival=3)]
    served, scheduler = serve_continuous(model, requests, max_batch=4)
    assert timeline(served) == [(0, 0, 1), (1, 3, 3)]
    assert scheduler.batch_sizes == [1, 1, 0, 1] and scheduler.forward_passes == 3
    assert served[1].latency == 1


def test_requests_are_served_in_arrival_order_then_id_order():
    model = _model()
    requests = [Request(5, (1,), 2, arrival=1), Request(3, (2,), 2, arrival=1), Request(9, (3,), 2)]
    served, _ = serve_continuous(model, requests, max_batch=1)
    assert timeline(served) == [(3, 2, 3), (5, 4, 5), (9, 0, 1)]  # returned in id order


def test_a_small_pool_admits_first_come_first_served():
    """block_size 4, 3 blocks. Request 0 (8 tokens) holds 1 block after its prefill and is
    promised 1 more: request 1 (8 tokens, 2 blocks) must wait until 0 is done, and request 2
    (1 block, would fit) waits behind it."""
    model = _model()
    requests = [Request(0, (1,), 7), Request(1, (2,), 7, arrival=1), Request(2, (3,), 1, arrival=1)]
    served, scheduler = serve_continuous(model, requests, max_batch=3, block_size=4, n_blocks=3)
    assert timeline(served) == [(0, 0, 6), (1, 7, 13), (2, 7, 7)]
    assert [s.tokens for s in served] == [_alone(model, r) for r in requests]
    assert scheduler.cache.blocks_in_use() == 0


def test_the_promised_blocks_of_running_requests_are_counted():
    model = _model()
    scheduler = Scheduler(model, PagedKVCache.for_model(model, 4, 8), max_batch=2)
    scheduler.submit([Request(0, (1, 2, 3), 9), Request(1, (4,), 2)])
    assert scheduler._blocks_promised() == 0
    scheduler.step()   # both admitted: 0 holds 1 of its 3 blocks, 1 holds its 1 block
    assert scheduler._blocks_promised() == 2
    assert [s.request.id for s in scheduler.running] == [0, 1]


def test_one_step_by_hand():
    model = _model()
    scheduler = Scheduler(model, PagedKVCache.for_model(model, 4, 8), max_batch=2)
    assert (scheduler.clock, scheduler.forward_passes, scheduler.batch_sizes) == (0, 0, [])
    scheduler.submit([Request(0, (1, 2), 2)])
    scheduler.step()
    assert scheduler.clock == 1 and scheduler.forward_passes == 1 and scheduler.batch_sizes == [1]
    assert scheduler.cache.lengths[0] == 2 and len(scheduler.running[0].tokens) == 1
    scheduler.step()
    assert scheduler.clock == 2 and scheduler.forward_passes == 2 and scheduler.batch_sizes == [1, 1]
    assert scheduler.done[0].finished == 1 and 0 not in scheduler.cache.tables
    scheduler.step()                       # nothing left: an idle step
    assert scheduler.clock == 3 and scheduler.forward_passes == 2 and scheduler.batch_sizes == [1, 1, 0]


def test_the_scheduler_puts_the_model_in_eval_mode():
    model = _model().train()
    scheduler = Scheduler(model, PagedKVCache.for_model(model, 4, 8), max_batch=1)
    assert not model.training and scheduler.model is model


def test_serve_continuous_defaults_block_size_8_and_64_blocks():
    _, scheduler = serve_continuous(_model(), [Request(0, (1,), 1)], max_batch=1)
    assert (scheduler.cache.block_size, scheduler.cache.n_blocks) == (8, 64)
    assert scheduler.max_batch == 1


def test_a_request_exactly_as_long_as_the_context_or_the_pool_is_accepted():
    model = _model(context=12)
    scheduler = Scheduler(model, PagedKVCache.for_model(model, 4, 3), max_batch=1)
    scheduler.submit([Request(0, (1,) * 4, 8)])   # 12 tokens: the context and the 3 blocks
    assert len(scheduler.run()[0].tokens) == 8
    with pytest.raises(ValueError, match=full("request 1 needs 13 tokens, longer than the context "
                                              "(12) or the cache (3 blocks of 4)")):
        scheduler.submit([Request(1, (1,) * 4, 9)])
    small = Scheduler(model, PagedKVCache.for_model(model, 4, 2), max_batch=1)
    with pytest.raises(ValueError, match=full("request 2 needs 9 tokens, longer than the context "
                                              "(12) or the cache (2 blocks of 4)")):
        small.submit([Request(2, (1,) * 4, 5)])


def test_submit_checks_the_prompt_ids():
    model = _model()
    scheduler = Scheduler(model, PagedKVCache.for_model(model, 4, 8), max_batch=1)
    with pytest.raises(ValueError, match=full("prompts[0] = [1, 16]... holds a value that is not a "
                                              "token id in [0, 16)")):
        scheduler.submit([Request(0, (1, 16), 1)])
    assert not scheduler.waiting


@pytest.mark.parametrize("args, error, message", [
    ((-1, (1,), 1), ValueError, "id is -1, expected an int >= 0"),
    ((0, (1,), 1, -2), ValueError, "arrival is -2, expected an int >= 0"),
    ((0, (1,), 1.0), TypeError, "max_new_tokens is 1.0 (a float), expected a positive int"),
    ((4, (), 1), ValueError, "request 4 has an empty prompt, expected at least one token"),
])
def test_request_errors_in_full(args, error, message):
    with pytest.raises(error, match=full(message)):
        Request(*args)


def test_request_defaults_and_served_defaults():
    request = Request(0, (1,), 2)
    assert request.arrival == 0
    served = Served(request)
    assert served.tokens == [] and served.first_token == -1 and served.finished == -1
    assert Served(Request(0, (1,), 2, arrival=4), finished=9).latency == 6


def test_static_batching_clock_by_hand():
    """batch_size 2, in arrival order 0, 1 | 2, 4 | 3. Batch {0, 1} starts at 0 and runs 3 steps
    (its longest request); batch {2, 4} has arrived by then, starts at 3 and runs 2; batch {3}
    waits for its arrival at 6 and runs 1."""
    model = _model()
    requests = [Request(0, (1,), 3), Request(1, (2, 3), 1), Request(2, (4,), 2, arrival=1),
                Request(3, (5,), 1, arrival=6), Request(4, (6,), 2, arrival=2)]
    served = serve_static(model, requests, batch_size=2)
    assert timeline(served) == [(0, 0, 2), (1, 0, 2), (2, 3, 4), (3, 6, 6), (4, 3, 4)]
    assert [s.latency for s in served] == [3, 3, 4, 1, 3]
    assert [s.tokens for s in served] == [_alone(model, r) for r in requests]


def test_static_batching_in_arrival_order():
    model = _model()
    requests = [Request(0, (1,), 2, arrival=4), Request(1, (2,), 2, arrival=0),
                Request(2, (3,), 2, arrival=0)]
    served = serve_static(model, requests, batch_size=2)
    assert timeline(served) == [(0, 4, 5), (1, 0, 1), (2, 0, 1)]  # 0 waits for its arrival


def test_static_batch_size_is_checked():
    with pytest.raises(ValueError, match=full("batch_size is 0, expected a positive int")):
        serve_static(_model(), [Request(0, (1,), 1)], batch_size=0)
    with pytest.raises(ValueError, match=full("max_batch is 0, expected a positive int")):
        serve_continuous(_model(), [Request(0, (1,), 1)], max_batch=0)


def test_static_batches_run_back_to_back():
    """batch_size 1, all arrive at 0, 2, 3 and 1 tokens: each starts when the one before ends,
    at 0, 2 and 5."""
    model = _model()
    requests = [Request(0, (1,), 2), Request(1, (2,), 3), Request(2, (3,), 1)]
    assert timeline(serve_static(model, requests, batch_size=1)) == [(0, 0, 1), (1, 2, 4), (2, 5, 5)]
