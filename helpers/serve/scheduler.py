"""Continuous batching: a scheduler that admits new requests as soon as others finish.

Defined in notebook 14, "Serving the model", section 4, in vLLM's words:

    Request             a prompt, how many tokens to generate, and when it arrives (a step)
    Scheduler           a waiting queue and a running batch over one PagedKVCache: each step
                        admits arrived requests while the batch and the free pool have room
                        (prefill), then gives every running request one token (one batched
                        decode pass), and frees the blocks of requests that are done
    serve_static        the baseline: fixed batches in arrival order, each waits for its last
                        arrival and runs until its longest request is done
    Served              per request: its tokens, arrival, first-token and finish steps

A step is one round in which every running request gets one token. Greedy tokens equal serving
each request alone (tests/serve/test_scheduler.py); the number of steps and forward passes is counted
exactly, so throughput and latency in steps are deterministic (benchmarks/bench_serve.py times
them in seconds).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from helpers import checks
from helpers.serve.batching import check_prompts, generate_batch
from helpers.serve.paged import PagedKVCache


@dataclass(frozen=True)
class Request:
    """A prompt (token ids), how many tokens to generate, and the step at which it arrives."""

    id: int
    prompt: tuple[int, ...]
    max_new_tokens: int
    arrival: int = 0

    def __post_init__(self) -> None:
        checks.non_negative_int("id", self.id)
        checks.positive_int("max_new_tokens", self.max_new_tokens)
        checks.non_negative_int("arrival", self.arrival)
        if len(self.prompt) == 0:
            raise ValueError(f"request {self.id} has an empty prompt, expected at least one token")


@dataclass
class Served:
    """What happened to one request: its new tokens and the steps of its life."""

    request: Request
    tokens: list[int] = field(default_factory=list)
    first_token: int = -1  # the step that produced its first token
    finished: int = -1     # the step that produced its last token

    @property
    def latency(self) -> int:
        """Steps from arrival to the last token, that step included."""
        return self.finished - self.request.arrival + 1


class Scheduler:
    """Continuous batching over a paged cache: waiting queue -> running batch -> done."""

    def __init__(self, model: nn.Module, cache: PagedKVCache, max_batch: int) -> None:
        self.model, self.cache = model.eval(), cache
        self.max_batch = checks.positive_int("max_batch", max_batch)
        self.waiting: deque[Request] = deque()
        self.running: list[Served] = []
        self.done: list[Served] = []
        self.clock = 0             # steps taken
        self.forward_passes = 0    # prefills + batched decodes
        self.batch_sizes: list[int] = []  # running requests at each step, for the timeline

    def submit(self, requests: Sequence[Request]) -> None:
        """Queue requests (in arrival order); refuse one that could never fit the cache, or whose
        id is taken (the cache's block tables are kept by id), before queueing any of them."""
        context = self.model.config.context_length
        bad = [r for r in requests if not isinstance(r, Request)]
        if bad:
            raise TypeError(f"requests holds a {type(bad[0]).__name__}, expected Request objects")
        taken = {r.id for r in self.waiting} | {s.request.id for s in (*self.running, *self.done)}
        seen: set[int] = set()
        for request in requests:
            if request.id in taken or request.id in seen:
                raise ValueError(f"request id {request.id} is used twice, expected every request "
                                 "(queued, running, done or new) to have its own id")
            seen.add(request.id)
        ordered = sorted(requests, key=lambda r: (r.arrival, r.id))
        for request in ordered:
            check_prompts([request.prompt], self.model.config.vocab_size)
            total = len(request.prompt) + request.max_new_tokens
            if total > context or self.cache.blocks_needed(total) > self.cache.n_blocks:
                raise ValueError(f"request {request.id} needs {total} tokens, longer than the "
                                 f"context ({context}) or the cache ({self.cache.n_blocks} blocks "
                                 f"of {self.cache.block_size})")
        self.waiting.extend(ordered)

    def _blocks_promised(self) -> int:
        """Blocks the running requests will still take before they finish."""
        cache = self.cache
        return sum(cache.blocks_needed(len(s.request.prompt) + s.request.max_new_tokens)
                   - len(cache.tables[s.request.id]) for s in self.running)

    def _admit(self) -> list[Served]:
        """Move arrived requests from the waiting queue while the batch and the pool have room.

        A request is admitted only if the free pool can hold all of it, so nothing is ever
        preempted (vLLM instead admits greedily and preempts when the pool runs dry)."""
        admitted = []
        while self.waiting and self.waiting[0].arrival <= self.clock \
                and len(self.running) < self.max_batch:
            request = self.waiting[0]
            needed = self.cache.blocks_needed(len(request.prompt) + request.max_new_tokens)
            if needed > len(self.cache.free) - self._blocks_promised():
                break
            self.waiting.popleft()
            self.cache.add_sequence(request.id)
            served = Served(request)
            self.running.append(served)
            admitted.append(served)
        return admitted

    def step(self) -> None:
        """One step: prefill the newly admitted, one decode pass for the others, retire the done."""
        admitted = self._admit()
        decoding = [s for s in self.running if s not in admitted]
        for served in admitted:  # prefill: the whole prompt in one pass gives the first token
            ids = torch.tensor([served.request.prompt])
            logits = self.cache.forward(self.model, [served.request.id], ids)
            self._emit(served, int(logits[0, -1].argmax()))
        if decoding:
            ids = torch.tensor([[s.tokens[-1]] for s in decoding])
            logits = self.cache.forward(self.model, [s.request.id for s in decoding], ids)
            for served, row in zip(decoding, logits[:, -1], strict=True):
                self._emit(served, int(row.argmax()))
        self.forward_passes += len(admitted) + bool(decoding)
        self.batch_sizes.append(len(self.running))
        for served in [s for s in self.running if len(s.tokens) == s.request.max_new_tokens]:
            served.finished = self.clock
            self.running.remove(served)
            self.cache.free_sequence(served.request.id)
            self.done.append(served)
        self.clock += 1

    def _emit(self, served: Served, token: int) -> None:
        if not served.tokens:
            served.first_token = self.clock
        served.tokens.append(token)

    def run(self) -> list[Served]:
        """Step until every submitted request is done; returns them in id order."""
        while self.waiting or self.running:
            self.step()
        return sorted(self.done, key=lambda s: s.request.id)


def serve_continuous(model: nn.Module, requests: Sequence[Request], max_batch: int,
                     block_size: int = 8, n_blocks: int = 64) -> tuple[list[Served], Scheduler]:
    """Serve `requests` with continuous batching; returns what happened and the scheduler."""
    scheduler = Scheduler(model, PagedKVCache.for_model(model, block_size, n_blocks), max_batch)
    scheduler.submit(requests)
    return scheduler.run(), scheduler


def serve_static(model: nn.Module, requests: Sequence[Request], batch_size: int) -> list[Served]:
    """Static batching: batches of `batch_size` in arrival order; a batch starts when its last
    request has arrived and the previous batch is done, and runs as many steps as its longest
    request needs (`generate_batch`, left padding, one contiguous cache)."""
    checks.positive_int("batch_size", batch_size)
    ordered = sorted(requests, key=lambda r: (r.arrival, r.id))
    clock, served = 0, []
    for first in range(0, len(ordered), batch_size):
        group = ordered[first:first + batch_size]
        clock = max(clock, max(r.arrival for r in group))
        steps = max(r.max_new_tokens for r in group)
        tokens = generate_batch(model, [list(r.prompt) for r in group], steps)
        for request, row in zip(group, tokens, strict=True):
            served.append(Served(request, row[:request.max_new_tokens], first_token=clock,
                                 finished=clock + steps - 1))
        clock += steps
    return sorted(served, key=lambda s: s.request.id)
