"""helpers.scale.parallelism: every cost formula at non-default sizes, the table's words, the
timing sweep's calls (one rank, in the pytest process), the fit, and every refusal's message.

"""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist

from helpers.model.gpt import GPTConfig, exact_parameters
from helpers.scale import parallelism
from helpers.scale.parallelism import (
    PRECISIONS,
    bubble_fraction,
    communication_per_step,
    fit_latency_bandwidth,
    memory_per_rank,
    readable_bytes,
    time_all_reduce_warm,
)

CONFIG = GPTConfig(vocab_size=50, context_length=10, n_layers=3, n_heads=2, d_model=8)


def test_each_split_sends_what_its_formula_says():
    """p = 4 ranks, B = 5 sequences of N = 10 tokens, D = 8, L = 3, 3 bytes a value."""
    n_params = exact_parameters(CONFIG)
    activations = 5 * 10 * 8 * 3                       # one (B, N, D) tensor: 1200 bytes
    rows = communication_per_step(CONFIG, batch_size=5, world_size=4, bytes_per_value=3)
    assert [row.bytes_per_rank for row in rows] == [
        1.5 * n_params * 3,                            # ring all-reduce: 2 (p - 1) / p
        3 * 0.75 * n_params * 3,                       # 2 all-gathers + 1 reduce-scatter: (p - 1) / p
        4 * 3 * 1.5 * activations,                     # 4 all-reduces of activations per layer
        2 * activations,                               # activations forward, their gradient back
        2 * 3 * 2 * 3 * activations / 4,               # K and V, p - 1 hops of 1 / p each, fwd + bwd
        4 * 3 * 0.75 * activations,                    # 2 all-to-alls forward, 2 backward, per layer
    ]


def test_values_are_two_bytes_unless_told_and_one_rank_sends_nothing():
    rows = communication_per_step(CONFIG, batch_size=5, world_size=4)
    assert rows[3].bytes_per_rank == 2 * 5 * 10 * 8 * 2
    assert rows[0].bytes_per_rank == 1.5 * exact_parameters(CONFIG) * 2
    assert [row.bytes_per_rank for row in communication_per_step(CONFIG, 5, 1)] == [0.0] * 6
    assert communication_per_step(CONFIG, 5, 2)[3].bytes_per_rank == 2 * 5 * 10 * 8 * 2


def test_the_table_says_what_each_split_splits_and_sends():
    """Notebook 11 prints these words beside the numbers."""
    assert [(row.name, row.splits, row.sends, row.use_when) for row in communication_per_step(CONFIG, 1, 2)] == [
        ("data (DDP)", "the batch; every rank holds the whole model",
         "all-reduce of the gradients, once per step",
         "the model fits on one device: always the outermost split"),
        ("sharded data (ZeRO-3 / FSDP)", "the batch, and weights, gradients, optimizer state",
         "all-gather the weights (forward and backward), reduce-scatter the gradients",
         "the model's training state does not fit on one device"),
        ("tensor (Megatron)", "every weight matrix: heads, MLP units",
         "all-reduce of the (B, N, D) activations, 2 per layer forward, 2 backward",
         "a layer is too big or slow for one device; needs a fast link (inside a node)"),
        ("pipeline", "the layers: rank r runs blocks r L/p ... (r+1) L/p",
         "the (B, N, D) activations to the next stage, their gradient back",
         "many layers, slow links between nodes; micro-batches hide the idle 'bubble'"),
        ("sequence / context (ring attention)", "the N tokens of each sequence",
         "keys and values passed around the ring, every layer, forward and backward",
         "long contexts whose activations do not fit on one device"),
        ("expert (mixture of experts)", "the MLP experts: one per rank",
         "all-to-all: tokens to their expert and back, forward and backward",
         "models with many experts (each token uses only a few)"),
    ]


@pytest.mark.parametrize("batch_size, world_size, error, message", [
    (5, 0, ValueError, "^world_size is 0, expected a positive int$"),
    (0, 4, ValueError, "^batch_size is 0, expected a positive int$"),
    (5, 2.0, TypeError, "^world_size is 2.0 "),
])
def test_the_table_names_a_bad_size(batch_size, world_size, error, message):
    with pytest.raises(error, match=message):
        communication_per_step(CONFIG, batch_size, world_size)


def test_zero_stages_split_more_and_more_of_the_state():
    assert PRECISIONS == {"fp32": (4, 4, 8), "mixed": (2, 2, 12)}
    assert memory_per_rank(10, 4) == {
        "data parallel": 160, "ZeRO-1 (optimizer state)": 40 + 40 + 20,
        "ZeRO-2 (+ gradients)": 40 + 30, "ZeRO-3 / FSDP (+ weights)": 40}
    assert memory_per_rank(10, 4, precision="mixed") == {
        "data parallel": 160, "ZeRO-1 (optimizer state)": 20 + 20 + 30,
        "ZeRO-2 (+ gradients)": 20 + 35, "ZeRO-3 / FSDP (+ weights)": 40}
    assert memory_per_rank(10, 1) == dict.fromkeys(memory_per_rank(10, 4), 160)


@pytest.mark.parametrize("args, error, message", [
    ((0, 4), ValueError, "^n_params is 0, expected a positive int$"),
    ((10, 0), ValueError, "^world_size is 0, expected a positive int$"),
    ((10, 4, "bf16"), ValueError, "^precision is 'bf16', expected one of 'fp32', 'mixed'$"),
])
def test_memory_names_a_bad_argument(args, error, message):
    with pytest.raises(error, match=message):
        memory_per_rank(*args)


@pytest.mark.parametrize("n, text", [
    (0, "0 B"), (999, "999 B"), (999.6, "1000 B"), (1000, "1 kB"), (1500, "1.5 kB"), (999_999, "1e+03 kB"),
    (1e6, "1 MB"), (12.34e6, "12.3 MB"), (1e9, "1 GB"), (1.494e9, "1.49 GB"), (1e12, "1 TB"),
    (2.5e15, "2.5e+03 TB"),
])
def test_readable_bytes_uses_powers_of_1000_and_three_digits(n, text):
    assert readable_bytes(n) == text


def test_the_bubble_is_fill_and_drain_over_the_whole_step():
    assert bubble_fraction(3, 5) == 2 / 7
    assert bubble_fraction(5, 3) == 4 / 7
    assert bubble_fraction(1, 1) == 0.0


@pytest.mark.parametrize("args, message", [
    ((0, 4), "^stages is 0, expected a positive int$"),
    ((4, 0), "^micro_batches is 0, expected a positive int$"),
])
def test_the_bubble_names_a_bad_argument(args, message):
    with pytest.raises(ValueError, match=message):
        bubble_fraction(*args)


# --- timing a link, on one rank in this process --------------------------------------------------

@pytest.fixture
def one_rank():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_the_sweep_warms_every_size_up_before_timing_any(one_rank, monkeypatch):
    calls = []
    real_all_reduce = dist.all_reduce

    def all_reduce(tensor, *args, **kwargs):
        calls.append(("all_reduce", tensor.shape[0], tensor.dtype, tensor.sum().item()))
        return real_all_reduce(tensor, *args, **kwargs)

    def best_time(fn, repeats, warmup):
        calls.append(("best_time", repeats, warmup))
        fn()
        return 0.25 * repeats

    monkeypatch.setattr(dist, "all_reduce", all_reduce)
    monkeypatch.setattr(dist, "barrier", lambda: calls.append(("barrier",)))
    monkeypatch.setattr(parallelism, "best_time", best_time)
    times = time_all_reduce_warm(0, 1, [3, 5], repeats=2, warmup=2)
    assert times == {3: 0.5, 5: 0.5}
    sweep = [("all_reduce", 3, torch.float32, 3.0), ("all_reduce", 5, torch.float32, 5.0)]
    assert calls == sweep * 2 + [
        ("barrier",), ("best_time", 2, 2), ("all_reduce", 3, torch.float32, 3.0),
        ("barrier",), ("best_time", 2, 2), ("all_reduce", 5, torch.float32, 5.0)]
    calls.clear()
    assert time_all_reduce_warm(0, 1, [4]) == {4: 0.25 * 7}
    assert calls[:4] == [("all_reduce", 4, torch.float32, 4.0)] * 3 + [("barrier",)]
    assert calls[4] == ("best_time", 7, 3)


def test_the_sweep_times_real_all_reduces(one_rank):
    times = time_all_reduce_warm(0, 1, [1, 100], repeats=2, warmup=1)
    assert list(times) == [1, 100] and all(0 < t < 1 for t in times.values())


@pytest.mark.parametrize("kwargs, message", [
    (dict(repeats=0), "^repeats is 0, expected a positive int$"),
    (dict(warmup=0), "^warmup is 0, expected a positive int$"),
    (dict(sizes=[4, 0]), "^size is 0, expected a positive int$"),
])
def test_the_sweep_names_a_bad_argument_before_any_collective(kwargs, message, monkeypatch):
    monkeypatch.setattr(dist, "all_reduce", lambda *args: pytest.fail("an all-reduce ran"))
    with pytest.raises(ValueError, match=message):
        time_all_reduce_warm(0, 1, **{"sizes": [4], **kwargs})


# --- the latency + bandwidth fit ---------------------------------------------------------------

def test_the_fit_recovers_an_exact_link():
    sizes = [1e2, 1e4, 1e6, 1e8]
    latency, bandwidth = fit_latency_bandwidth(sizes, [30e-6 + n / 5e9 for n in sizes])
    assert latency == pytest.approx(30e-6, rel=1e-9) and bandwidth == pytest.approx(5e9, rel=1e-9)


def test_the_fit_weighs_every_message_by_its_relative_error():
    """Minimises sum ((latency + n / bandwidth) / t - 1)^2: the normal equations, solved here."""
    sizes, seconds = [1e3, 1e5, 1e7], [2e-5, 3e-5, 4e-3]
    a = torch.tensor([[1 / t, n / t] for n, t in zip(sizes, seconds, strict=True)], dtype=torch.float64)
    latency, per_byte = torch.linalg.solve(a.T @ a, a.T @ torch.ones(3, dtype=torch.float64)).tolist()
    got = fit_latency_bandwidth(sizes, seconds)
    assert got == pytest.approx((latency, 1 / per_byte), rel=1e-9)
    plain = torch.linalg.lstsq(torch.tensor([[1, n] for n in sizes], dtype=torch.float64),
                               torch.tensor(seconds, dtype=torch.float64)[:, None]).solution[:, 0]
    assert got[0] != pytest.approx(plain[0].item(), rel=0.1)


def test_a_negative_latency_is_zero_and_a_falling_time_is_an_infinite_bandwidth():
    latency, bandwidth = fit_latency_bandwidth([1e3, 1e6], [1e-6, 1e-3 + 1e-6])  # fit: latency < 0
    assert latency == 0.0 and math.isfinite(bandwidth) and bandwidth > 0
    latency, bandwidth = fit_latency_bandwidth([1e3, 1e6], [2e-3, 1e-3])
    assert bandwidth == math.inf and latency > 0


@pytest.mark.parametrize("n_bytes, seconds, message", [
    ([1.0, 2.0], [1.0], r"^n_bytes and seconds have 2 and 1 entries, expected the same number, at least 2$"),
    ([1.0], [1.0], r"^n_bytes and seconds have 1 and 1 entries, expected the same number, at least 2$"),
    ([1.0, 0.0], [1.0, 1.0], r"^n_bytes is \[1.0, 0.0\], expected finite positive numbers$"),
    ([1.0, math.inf], [1.0, 1.0], r"^n_bytes is \[1.0, inf\], expected finite positive numbers$"),
    ([1.0, 2.0], [1.0, -1.0], r"^seconds is \[1.0, -1.0\], expected finite positive numbers$"),
    ([1.0, 2.0], [1.0, math.nan], r"^seconds is \[1.0, nan\], expected finite positive numbers$"),
])
def test_the_fit_names_bad_measurements(n_bytes, seconds, message):
    with pytest.raises(ValueError, match=message):
        fit_latency_bandwidth(n_bytes, seconds)


def test_a_time_that_does_not_grow_with_the_message_is_an_infinite_bandwidth():
    """Equal times for 1 and 2 bytes: the fit's seconds per byte is exactly 0, not a division by it."""
    latency, bandwidth = fit_latency_bandwidth([1.0, 2.0], [1.0, 1.0])
    assert latency == pytest.approx(1.0, rel=1e-12) and bandwidth == math.inf


def test_the_fit_reads_sizes_past_2_to_the_24_exactly():
    """123456789 bytes is no float32 number (the nearest is 123456792): read in float32, the fit
    would be off by about 2e-8 of the bandwidth."""
    sizes = [1000.0, 123_456_789.0, 16_777_217.0]
    latency, bandwidth = fit_latency_bandwidth(sizes, [2e-5 + n / 1e9 for n in sizes])
    assert latency == pytest.approx(2e-5, rel=1e-9) and bandwidth == pytest.approx(1e9, rel=1e-10)


def test_communication_table_for_gpt2_small():
    config = GPTConfig.gpt2_small()
    rows = {row.name: row for row in communication_per_step(config, batch_size=8, world_size=8)}
    assert rows["data (DDP)"].bytes_per_rank == 2 * 7 / 8 * exact_parameters(config) * 2
    assert rows["tensor (Megatron)"].bytes_per_rank == 4 * 12 * 2 * 7 / 8 * 8 * 1024 * 768 * 2
    assert communication_per_step(config, 8, 1)[0].bytes_per_rank == 0
    memory = memory_per_rank(1000, 4)
    assert memory["data parallel"] == 16_000 and memory["ZeRO-3 / FSDP (+ weights)"] == 4000


def test_zero_memory_in_mixed_precision_follows_the_paper():
    from helpers.scale.parallelism import memory_per_rank
    fp32, mixed = memory_per_rank(1000, 8), memory_per_rank(1000, 8, precision="mixed")
    assert fp32["data parallel"] == mixed["data parallel"] == 16_000
    assert mixed["ZeRO-1 (optimizer state)"] == 2000 + 2000 + 12_000 / 8  # 2 + 2 + 12/p bytes a parameter
    assert round(16 / 5.5, 1) == round(mixed["data parallel"] / mixed["ZeRO-1 (optimizer state)"], 1) == 2.9
    with pytest.raises(ValueError, match="precision"):
        memory_per_rank(1000, 8, precision="bf16")
    with pytest.raises(ValueError, match="n_params"):
        memory_per_rank(0, 8)


def test_bubble_fraction_counts_fill_and_drain_slots():
    from helpers.scale.parallelism import bubble_fraction
    assert bubble_fraction(1, 4) == 0.0 and bubble_fraction(4, 1) == 3 / 4
    assert bubble_fraction(4, 12) == 3 / 15
    with pytest.raises(ValueError, match="micro_batches"):
        bubble_fraction(4, 0)


def test_latency_bandwidth_fit_recovers_a_known_link():
    from helpers.scale.parallelism import fit_latency_bandwidth
    sizes = [1e3, 1e4, 1e5, 1e6, 1e7]
    latency, bandwidth = fit_latency_bandwidth(sizes, [20e-6 + n / 2e9 for n in sizes])
    assert abs(latency - 20e-6) < 1e-9 and abs(bandwidth / 2e9 - 1) < 1e-6
    with pytest.raises(ValueError, match="seconds"):
        fit_latency_bandwidth(sizes, [1.0, 2.0, 3.0, 4.0, -1.0])
    with pytest.raises(ValueError, match="at least 2"):
        fit_latency_bandwidth([1.0], [1.0])
