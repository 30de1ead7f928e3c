"""Continuous and static batching give each request the tokens it gets alone
(helpers.serve.scheduler; notebook 14, section 4)."""

import pytest
import torch

from helpers.model.generation import generate
from helpers.model.gpt import GPT, GPTConfig
from helpers.serve.paged import PagedKVCache
from helpers.serve.scheduler import Request, Scheduler, serve_continuous, serve_static


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
