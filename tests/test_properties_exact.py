"""Tests written against the mutants that survived benchmarks/mutation.py (see benchmarks/MUTATION.md).

Each one can fail: it was first seen to fail on the planted bug it is named after. Grouped by the
five classes of issue 30, beside tests/test_properties.py:

1. exact properties on every path: buffers on the inputs' device and in their dtype, whatever the
   default device or dtype (a buffer made with `device=None` lands on the default device);
2. hand-written pieces against the reference (PyTorch's attention, the paper's statistics);
3. configuration asserted, defaults and non-default values alike;
4. sizes that reach the edges (tiles of several sizes, each argument checked on every entry point);
5. fixtures where the behaviour decides the answer (block sizes that change the bits).
"""

from __future__ import annotations

import inspect

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from helpers.flash import tiled
from helpers.model import attention
from helpers.model import multihead as mh
from helpers.model.gpt import GPT, GPTConfig
from helpers.scale import sharded
from helpers.scale.data_parallel import Run, make_model, max_difference, train_single
from helpers.training import speed
from helpers.training import trainer as train

PATHS = {
    "fa1": tiled.tiled_attention_fa1,
    "fa2": lambda q, k, v, **kw: tiled.tiled_attention_fa2(q, k, v, **kw)[0],
    "flash": tiled.flash_attention,
}


def qkv(*shape: int, dtype: torch.dtype = torch.float32, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(*shape, generator=generator, dtype=dtype) for _ in range(3))


def reference(q, k, v, **kw):
    return F.scaled_dot_product_attention(q, k, v, **kw)


# --- 1. exact properties: buffers follow the inputs, not the defaults ------------------------------

@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("causal", [False, True])
def test_tiled_attention_ignores_the_default_device(path, causal):
    """Every buffer is made on q's device: under a `meta` default device a buffer made with
    device=None would be a meta tensor, and mixing it with the CPU inputs would fail."""
    q, k, v = qkv(2, 7, 4)
    mask = torch.rand(2, 7, 9, generator=torch.Generator().manual_seed(1)) > 0.3
    k, v = torch.cat([k, k[:, :2]], 1), torch.cat([v, v[:, :2]], 1)
    with torch.no_grad():
        expected = PATHS[path](q, k, v, mask=mask, causal=causal, block_q=3, block_k=4)
        with torch.device("meta"):
            got = PATHS[path](q, k, v, mask=mask, causal=causal, block_q=3, block_k=4)
    assert got.device == q.device and torch.equal(got, expected)


@pytest.mark.parametrize("causal", [False, True])
def test_the_log_sum_exp_and_the_backward_ignore_the_default_device(causal):
    q, k, v = qkv(2, 7, 4)
    with torch.no_grad():
        expected = tiled.tiled_attention_fa2(q, k, v, causal=causal, block_q=3, block_k=4)
        with torch.device("meta"):
            got = tiled.tiled_attention_fa2(q, k, v, causal=causal, block_q=3, block_k=4)
    for a, b in zip(got, expected, strict=True):
        assert a.device == q.device and torch.equal(a, b)
    # the backward itself (autograd runs it outside the default-device context)
    args = (q, k, v, *expected, torch.ones_like(expected[0]), None, causal, 0.5, 3, 4)
    grads = tiled.tiled_attention_backward(*args)
    with torch.device("meta"):
        grads_meta = tiled.tiled_attention_backward(*args)
    for a, b in zip(grads_meta, grads, strict=True):
        assert a.device == q.device and torch.equal(a, b)


@pytest.mark.parametrize("causal", [False, True])
def test_trace_tiles_ignores_the_default_device(causal):
    q, k, v = qkv(5, 4)
    expected = tiled.trace_tiles(q, k, v, 2, 2, causal=causal)
    with torch.device("meta"):
        got = tiled.trace_tiles(q, k, v, 2, 2, causal=causal)
    assert len(got) == len(expected)
    for a, b in zip(got, expected, strict=True):
        assert torch.equal(a.output, b.output) and torch.equal(a.row_max, b.row_max)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float64], ids=str)
def test_the_start_state_has_the_tiles_dtype_and_device(dtype):
    q_tile = torch.randn(2, 3, 4, dtype=dtype)
    with torch.device("meta"):
        state = tiled.start_tile_state(q_tile, d_v=5)
    assert state.row_max.shape == state.row_sum.shape == (2, 3)
    assert state.acc.shape == (2, 3, 5)
    for name, tensor in state._asdict().items():
        assert (tensor.dtype, tensor.device) == (dtype, q_tile.device), name
    assert torch.all(state.row_max == float("-inf"))
    assert not state.row_sum.any() and not state.acc.any()


MASKS = {  # each mask function with arguments that give a (4, 4) or (4, 6) mask, and device
    "causal": lambda device: attention.causal_mask(4, 6, device=device),
    "bidirectional": lambda device: attention.bidirectional_mask(4, 6, device=device),
    "local": lambda device: attention.local_mask(4, 1, device=device),
    "strided": lambda device: attention.strided_mask(4, 2, device=device),
    "global": lambda device: attention.global_mask(4, [1], device=device),
}


@pytest.mark.parametrize("name", MASKS)
def test_masks_are_made_on_the_device_asked_for_not_the_default_one(name):
    expected = MASKS[name]("cpu")
    with torch.device("meta"):
        got = MASKS[name]("cpu")
    assert got.device.type == "cpu" and torch.equal(got, expected)


def test_the_padding_mask_follows_the_lengths_device():
    lengths = torch.tensor([2, 0, 3])
    expected = attention.padding_mask(lengths, 3)
    with torch.device("meta"):
        got = attention.padding_mask(lengths, 3)
    assert got.device.type == "cpu" and torch.equal(got, expected)


def test_one_buffer_holds_the_weights_in_the_dtype_asked_for():
    params = [nn.Parameter(torch.randn(2, 3)), nn.Parameter(torch.randn(3))]
    buffer = speed.flatten_into_one_buffer(params, torch.bfloat16)
    assert buffer.dtype == torch.bfloat16 and buffer.shape == (9,)
    assert all(p.dtype == torch.bfloat16 and p.data_ptr() >= buffer.data_ptr() for p in params)


def test_the_master_weights_are_float32_whatever_the_models_dtype():
    model = nn.Linear(3, 2).to(torch.bfloat16)
    flat = speed.FlatWeights(model, torch.bfloat16)
    assert flat.weights.dtype == flat.gradients.dtype == torch.float32
    assert flat.working_weights.dtype == torch.bfloat16


def test_the_heads_causal_mask_is_made_on_the_inputs_device():
    torch.manual_seed(0)
    x, head, fused = torch.randn(2, 4, 8), mh.AttentionHead(8, 4), mh.MultiHeadAttention(8, 2)
    expected = head(x, causal=True), fused(x, causal=True)
    with torch.device("meta"):
        got = head(x, causal=True), fused(x, causal=True)
    for a, b in zip(got, expected, strict=True):
        assert a.device == x.device and torch.equal(a, b)


# --- 2. against the reference: the statistics trace_tiles shows ----------------------------------

def test_every_traced_tile_holds_the_papers_running_statistics():
    q, k, v = qkv(5, 4, dtype=torch.float64)
    snapshots = tiled.trace_tiles(q, k, v, block_q=2, block_k=3)
    assert [(s.rows, s.cols) for s in snapshots] == [
        (rows, cols) for rows in (slice(0, 2), slice(2, 4), slice(4, 5))
        for cols in (slice(0, 3), slice(3, 5))]
    scores = q @ k.T / 2.0  # scale 1 / sqrt(4)
    for s in snapshots:
        seen = scores[s.rows, : s.cols.stop]  # every key tile up to this one
        row_max = seen.amax(dim=-1)
        torch.testing.assert_close(s.row_max, row_max)
        torch.testing.assert_close(s.row_sum, torch.exp(seen - row_max[:, None]).sum(-1))
        torch.testing.assert_close(s.output, torch.softmax(seen, -1) @ v[: s.cols.stop])


def test_the_softmax_jacobian_of_a_batch_is_autograds_row_by_row():
    a = torch.softmax(torch.randn(3, 4, dtype=torch.float64), -1)
    got = attention.softmax_jacobian(a)
    assert got.shape == (3, 4, 4)
    for row, jacobian in zip(a, got, strict=True):
        expected = torch.autograd.functional.jacobian(
            lambda s: torch.softmax(s, -1), torch.log(row))  # softmax(log a) = a
        torch.testing.assert_close(jacobian, expected)


@pytest.fixture
def one_rank():
    """A one-process gloo group in this process: the workers' code runs here, where a mutation
    tool (and a debugger) can see it; with one rank, sharded must equal unsharded exactly."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.mark.parametrize("task", [sharded.train_zero_by_hand, sharded.train_zero_torch])
def test_zero_on_one_rank_is_adamw_bit_for_bit(one_rank, task):
    run = Run(model="gpt", steps=2, lr=0.01)
    result = task(0, 1, run)
    assert result["max_gap"] == 0.0
    n_bytes = sum(p.numel() * p.element_size() for p in make_model(run).parameters())
    assert result["state_bytes"] == result["full_state_bytes"] == 2 * n_bytes  # m and v
    if task is sharded.train_zero_by_hand:
        assert result["owned"] == result["parameters"] == len(list(make_model(run).parameters()))


@pytest.mark.parametrize("model", ["gpt", "mlp"])
def test_fsdp_on_one_rank_holds_every_weight_and_trains_as_one_process(one_rank, model):
    run = Run(model=model, steps=2)
    result = sharded.train_fsdp(0, 1, run)
    assert result["local_bytes"] == result["full_bytes"] and result["kind"] == "DTensor"
    assert max_difference(result["weights"], train_single(run)) == 0.0


def test_torchs_zero_runs_with_the_settings_of_ours(one_rank, monkeypatch):
    """Both optimizers of train_zero_torch are AdamW with ShardedAdamW's defaults: the notebook
    compares the two implementations, so their settings must be the same ones."""
    settings = []

    class RecordingAdamW(torch.optim.AdamW):
        def __init__(self, params, **kwargs):
            settings.append(kwargs)
            super().__init__(params, **kwargs)

    monkeypatch.setattr(torch.optim, "AdamW", RecordingAdamW)
    sharded.train_zero_torch(0, 1, Run(steps=1, lr=0.05))
    defaults = inspect.signature(sharded.ShardedAdamW).parameters
    expected = dict(lr=0.05, betas=defaults["betas"].default, eps=defaults["eps"].default,
                    weight_decay=defaults["weight_decay"].default, foreach=False)
    assert settings == [expected, expected]
    assert expected == dict(lr=0.05, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1, foreach=False)


def test_the_sharded_optimizers_defaults_are_torchs_adamw_with_decay_on_matrices():
    torch.manual_seed(0)
    ours, theirs = nn.Linear(4, 3).double(), nn.Linear(4, 3).double()
    theirs.load_state_dict(ours.state_dict())
    hand = sharded.ShardedAdamW(ours.parameters(), rank=0, world_size=1)
    reference = torch.optim.AdamW([{"params": [theirs.weight], "weight_decay": 0.1},
                                   {"params": [theirs.bias], "weight_decay": 0.0}],
                                  lr=0.1, betas=(0.9, 0.99), eps=1e-8, foreach=False)
    for step in range(3):
        for model in (ours, theirs):
            model.zero_grad(set_to_none=True)
            model(torch.full((2, 4), step + 1.0, dtype=torch.float64)).pow(2).sum().backward()
        hand.step(lr=0.1)
        reference.step()
    for a, b in zip(ours.parameters(), theirs.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-15)


def tiny_trainer(**config) -> train.Trainer:
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=7, context_length=8, n_layers=1, n_heads=1, d_model=8))
    ids = torch.tensor([0, 1, 2, 3, 4, 5, 6, 5, 4, 3, 2, 1]).repeat(20)
    settings = dict(batch_size=2, eval_batches=1, eval_every=2) | config
    return train.Trainer(model, *train.split_train_val(ids, 0.2), train.TrainConfig(**settings))


def test_the_history_holds_the_evaluated_losses():
    trainer = tiny_trainer()
    history = trainer.fit(steps=2, progress_bar=False)
    losses = trainer.evaluate()  # the same fixed batches, the same weights
    assert history.eval_steps == [2]
    assert history.train_losses == [losses["train"]] and history.val_losses == [losses["val"]]


@pytest.mark.parametrize("mask_dims", [2, 3])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("n_k", [4, 6])
def test_separate_heads_mask_as_the_fused_attention_does(mask_dims, causal, n_k):
    """SeparateHeadsAttention (and so each AttentionHead) against fuse_heads' MultiHeadAttention,
    with a padding mask that decides the answer, alone, with causality, and in cross-attention."""
    torch.manual_seed(0)
    separate = mh.SeparateHeadsAttention(8, 2).double()
    fused = mh.fuse_heads(separate).double()
    x = torch.randn(2, 4, 8, dtype=torch.float64)
    context = None if n_k == 4 else torch.randn(2, n_k, 8, dtype=torch.float64)
    mask = torch.ones(2, 4, n_k, dtype=torch.bool)
    mask[0, :, 0] = False  # the first key of the first sequence is padding
    mask = mask[0] if mask_dims == 2 else mask
    got = separate(x, context, mask=mask, causal=causal)
    torch.testing.assert_close(got, fused(x, context, mask=mask, causal=causal))
    assert not torch.allclose(got, separate(x, context, causal=causal))  # the mask matters
    if causal:
        assert not torch.allclose(got, separate(x, context, mask=mask))  # and so does causality
    assert separate.last_weights.shape == (2, 2, 4, n_k)
    # exactly: the padded key and (when causal) the last key change nothing they must not
    source = x if context is None else context
    for position, rows in ((0, slice(None)), (-1, slice(0, 3) if causal else slice(0, 0))):
        changed = source.clone()
        changed[0, position] += 1.0
        args = (changed, None) if context is None else (x, changed)
        if context is None and position == 0:  # x is also the queries: leave query 0 out
            rows = slice(1, None)
        after = separate(*args, mask=mask, causal=causal)
        if position == 0 or causal:
            assert torch.equal(after[0, rows], got[0, rows])


# --- 3. configuration: the defaults, and non-default values reaching the computation -------------

@pytest.mark.parametrize("path", PATHS)
def test_attention_is_not_causal_unless_asked(path):
    q, k, v = qkv(1, 6, 4, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(PATHS[path](q, k, v, block_q=4, block_k=4), reference(q, k, v))


def test_trace_tiles_is_not_causal_unless_asked():
    q, k, v = qkv(4, 4)
    assert len(tiled.trace_tiles(q, k, v, 2, 2)) == 4  # the causal trace skips the top-right tile
    assert len(tiled.trace_tiles(q, k, v, 2, 2, causal=True)) == 3


def test_the_algorithm_1_loop_tiles_by_64_unless_told():
    """Another tile size changes the bits (the merge order), so the default is seen exactly."""
    q, k, v = qkv(1, 130, 16)
    default = tiled.tiled_attention_fa1(q, k, v)
    assert torch.equal(default, tiled.tiled_attention_fa1(q, k, v, block_q=64, block_k=64))
    assert not torch.equal(default, tiled.tiled_attention_fa1(q, k, v, block_q=65))
    assert not torch.equal(default, tiled.tiled_attention_fa1(q, k, v, block_k=65))


def test_the_documented_tile_sizes_are_the_defaults():
    defaults = {name: p.default for name, p in
                inspect.signature(tiled.tiled_attention_fa1).parameters.items()}
    assert (defaults["block_q"], defaults["block_k"]) == (64, 64)
    for fn in (tiled.tiled_attention_fa2, tiled.flash_attention):
        parameters = inspect.signature(fn).parameters
        assert parameters["block_q"].default == tiled.DEFAULT_BLOCK_Q == 512
        assert parameters["block_k"].default == tiled.DEFAULT_BLOCK_K == 1024


@pytest.mark.parametrize("avx512, amx", [(True, False), (False, True), (False, False)])
def test_native_bf16_is_either_probe(monkeypatch, avx512, amx):
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx, raising=False)
    assert speed.cpu_has_native_bf16() is (avx512 or amx)


@pytest.mark.parametrize("missing", ["_is_avx512_bf16_supported", "_is_amx_tile_supported"])
def test_a_torch_without_a_probe_has_no_native_bf16_by_it(monkeypatch, missing):
    """torch >= 2.2 is allowed; a release without one of the probes counts it as absent."""
    other = {"_is_avx512_bf16_supported", "_is_amx_tile_supported"} - {missing}
    monkeypatch.setattr(torch.cpu, other.pop(), lambda: False, raising=False)
    monkeypatch.delattr(torch.cpu, missing, raising=False)
    assert speed.cpu_has_native_bf16() is False


def test_a_torch_without_torch_cpu_has_no_native_bf16(monkeypatch):
    monkeypatch.delattr(torch, "cpu")
    assert speed.cpu_has_native_bf16() is False


@pytest.mark.parametrize("model, matrices, vectors", [
    (nn.LayerNorm(4), 0, 2),          # vectors only: no decayed group at all
    (nn.Linear(3, 2, bias=False), 1, 0),  # matrices only: no undecayed group
    (nn.Linear(3, 2), 1, 1),
])
def test_the_weight_decay_split_has_no_empty_group(model, matrices, vectors):
    decayed, undecayed = speed.FlatWeights(model, torch.float32).matrices_and_vectors()
    assert (len(decayed), len(undecayed)) == (min(matrices, 1), min(vectors, 1))
    sizes = [p.numel() for p in model.parameters()]
    assert sum(t.numel() for t in decayed + undecayed) == sum(sizes)


def optimizer_settings(optimizer: torch.optim.Optimizer) -> list[tuple]:
    return [(g["lr"], g["betas"], g["weight_decay"], g["fused"], g["foreach"])
            for g in optimizer.param_groups]


def test_make_optimizer_takes_its_settings_and_the_fused_kernel_by_default():
    model = nn.Linear(3, 2)
    try:  # PyTorch has a fused CPU AdamW since 2.4; before, the foreach fallback is expected
        torch.optim.AdamW([nn.Parameter(torch.ones(1))], fused=True)
        fused, foreach = True, None
    except (RuntimeError, TypeError):
        fused, foreach = None, True
    default = speed.make_optimizer([model.weight], [model.bias], lr=0.25, weight_decay=0.3)
    assert optimizer_settings(default) == [(0.25, (0.9, 0.99), 0.3, fused, foreach),
                                           (0.25, (0.9, 0.99), 0.0, fused, foreach)]
    plain = speed.make_optimizer([model.weight], [], lr=0.5, weight_decay=0.2,
                                 betas=(0.8, 0.9), fused=False)
    assert optimizer_settings(plain) == [(0.5, (0.8, 0.9), 0.2, None, False)]


def test_without_a_fused_kernel_make_optimizer_takes_the_foreach_one(monkeypatch):
    real = torch.optim.AdamW

    def no_fused_kernel(*args, fused=None, **kwargs):
        if fused:
            raise RuntimeError("no fused AdamW for this device")
        return real(*args, **kwargs)

    monkeypatch.setattr(torch.optim, "AdamW", no_fused_kernel)
    model = nn.Linear(3, 2)
    optimizer = speed.make_optimizer([model.weight], [model.bias], lr=0.25, weight_decay=0.3,
                                     betas=(0.8, 0.9))
    assert optimizer_settings(optimizer) == [(0.25, (0.8, 0.9), 0.3, None, True),
                                             (0.25, (0.8, 0.9), 0.0, None, True)]


def test_auto_precision_is_the_default_and_reads_the_device(monkeypatch):
    """Only a CUDA device asks CUDA about bf16; a CPU asks its own probes."""
    monkeypatch.delenv("COURSE_PRECISION", raising=False)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    monkeypatch.setattr(speed, "cpu_has_native_bf16", lambda: False)
    assert speed.pick_dtype(torch.device("cpu")) == torch.float32
    assert speed.pick_dtype(torch.device("cuda")) == torch.bfloat16
    monkeypatch.setattr(speed, "cpu_has_native_bf16", lambda: True)
    assert speed.pick_dtype(torch.device("cpu")) == torch.bfloat16
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    assert speed.pick_dtype(torch.device("cuda")) == torch.float32


def test_zeroing_reattaches_a_gradient_that_was_replaced():
    model = nn.Linear(3, 2)
    flat = speed.FlatWeights(model, torch.float32)
    model.weight.grad = torch.ones_like(model.weight)  # not a view of the buffer any more
    flat.zero_gradients()
    assert model.weight.grad.data_ptr() == flat.gradients.data_ptr()  # matrices come first
    assert not model.weight.grad.any()


def test_compile_loss_compiles_the_loss_it_is_given(monkeypatch):
    monkeypatch.setattr(torch, "compile", lambda fn: ("compiled", fn))
    loss = lambda x, y: (x - y).sum()  # noqa: E731
    assert speed.compile_loss(loss) == ("compiled", loss)


def test_the_schedules_defaults_are_a_5_percent_warmup_and_a_10_percent_floor():
    for progress in (0.0, 0.025, 0.05, 0.3, 0.9, 1.0):
        assert train.learning_rate(progress, 2.0) == train.learning_rate(progress, 2.0, 0.05, 0.1)
    assert train.learning_rate(0.025, 2.0) == 1.0 and train.learning_rate(1.0, 2.0) == 0.2


def test_the_schedule_holds_outside_the_run_and_peaks_exactly_at_the_warmups_end():
    assert train.learning_rate(1.5, 0.7) == train.learning_rate(1.0, 0.7) == pytest.approx(0.07)
    assert train.learning_rate(-0.5, 0.7) == 0.0
    assert 0.7 * 0.05 / 0.05 != 0.7  # so the warm-up formula at its own end would be seen
    assert train.learning_rate(0.05, 0.7, warmup=0.05) == 0.7


def test_the_progress_bar_counts_steps_or_seconds_as_asked():
    bar = train._progress_bar(5, None, enabled=True)
    assert (bar.total, bar.unit, bar.disable, bar.mininterval) == (5, "step", False, 0.5)
    bar.close()
    bar = train._progress_bar(None, 3.0, enabled=True)
    assert (bar.total, bar.unit, bar.disable, bar.mininterval) == (3.0, "s", False, 0.5)
    assert "{n:.0f}/{total:.0f} s" in bar.bar_format
    bar.close()
    for steps, seconds in ((5, None), (None, 3.0)):
        assert train._progress_bar(steps, seconds, enabled=False).disable is True


def test_fit_shows_a_bar_with_both_losses_by_default(capsys):
    tiny_trainer().fit(steps=2)
    err = capsys.readouterr().err
    assert "2/2" in err and "step" in err and "train=" in err and "val=" in err


def test_encode_text_gives_int64_ids_even_for_no_text():
    class Letters:
        def encode(self, text):
            return [ord(c) - ord("a") for c in text]

    assert train.encode_text(Letters(), "cab").tolist() == [2, 0, 1]
    empty = train.encode_text(Letters(), "")
    assert empty.dtype == torch.int64 and empty.shape == (0,)


def test_heads_have_biases_and_see_every_key_unless_told():
    torch.manual_seed(0)
    head, separate = mh.AttentionHead(8, 4), mh.SeparateHeadsAttention(8, 2)
    fused = mh.MultiHeadAttention(8, 2)
    assert all(p.bias is not None for p in (head.q_proj, head.k_proj, head.v_proj))
    assert separate.out_proj.bias is not None and separate.heads[0].k_proj.bias is not None
    assert (head.d_model, head.head_dim) == (8, 4)
    mh.check_features("x", torch.ones(8), 8, torch.float32)  # one token's features, no batch
    plain = mh.AttentionHead(8, 4, bias=False)
    assert all(p.bias is None for p in (plain.q_proj, plain.k_proj, plain.v_proj))
    assert head.last_weights is None and fused.last_weights is None
    assert separate.last_weights is None
    x = torch.randn(1, 4, 8)
    assert torch.equal(head(x), head(x, causal=False))
    assert not torch.allclose(head(x), head(x, causal=True))
    q, k, v = (torch.randn(1, 2, 4, 4) for _ in range(3))
    assert torch.equal(fused.attend(q, k, v), fused.attend(q, k, v, causal=False))
    assert not torch.allclose(fused.attend(q, k, v), fused.attend(q, k, v, causal=True))


def test_a_kv_cache_entry_is_two_bytes_unless_told():
    assert mh.kv_cache_bytes_per_token(2, 3, 4) == 2 * 2 * 3 * 4 * 2
    assert mh.kv_cache_bytes_per_token(2, 3, 4, bytes_per_value=4) == 2 * 2 * 3 * 4 * 4


@pytest.mark.parametrize("path", PATHS)
def test_a_non_default_scale_reaches_every_path(path):
    q, k, v = qkv(2, 5, 4, dtype=torch.float64)
    with torch.no_grad():
        got = PATHS[path](q, k, v, scale=0.9, block_q=2, block_k=3)
    torch.testing.assert_close(got, reference(q, k, v, scale=0.9))


# --- 4. every check on every entry point ----------------------------------------------------------

@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("mask, error, message", [
    (torch.ones(4, 5), TypeError, "mask has dtype torch.float32, expected torch.bool"),
    (torch.ones(3, 5, dtype=torch.bool), ValueError, r"mask has shape \(3, 5\)"),
])
def test_every_path_checks_the_mask(path, mask, error, message):
    q, k, v = torch.randn(2, 4, 8), torch.randn(2, 5, 8), torch.randn(2, 5, 8)
    with pytest.raises(error, match=message):
        PATHS[path](q, k, v, mask=mask)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("k_batch, v_batch", [(1, 2), (2, 1)])
def test_tiles_need_equal_leading_dimensions_not_broadcast_ones(path, k_batch, v_batch):
    """Plain attention broadcasts (1, ...) against (2, ...); tiling does not, for k or v alike."""
    q, k, v = torch.randn(2, 4, 8), torch.randn(k_batch, 5, 8), torch.randn(v_batch, 5, 8)
    shapes = rf"\(2, 4, 8\), \({k_batch}, 5, 8\), \({v_batch}, 5, 8\)"
    with pytest.raises(ValueError, match=rf"^q, k, v have shapes {shapes}: expected the same "
                       r"leading \(batch, head\) dimensions$"):
        PATHS[path](q, k, v)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("blocks, message", [
    (dict(block_k=0), "block_k is 0"),
    (dict(block_q=True), "block_q is True"),
    (dict(block_k=2.5), "block_k is 2.5"),
])
def test_every_path_names_a_bad_tile_size(path, blocks, message):
    q, k, v = qkv(2, 4, 8)
    with pytest.raises(ValueError, match=rf"^{message}, expected a positive int \(rows per tile\)$"):
        PATHS[path](q, k, v, **blocks)


def test_check_causal_alone_checks_the_type_only():
    """Without sizes (the Triton wrapper's first call) it checks the flag's type, nothing else."""
    tiled.check_causal(True)
    tiled.check_causal(False)
    with pytest.raises(TypeError, match="causal is 1"):
        tiled.check_causal(1)


@pytest.mark.parametrize("needs_grad", ["q", "k", "v"])
def test_the_in_place_forward_refuses_any_one_input_that_needs_gradients(needs_grad):
    args = dict(zip("qkv", qkv(4, 8), strict=True))
    args[needs_grad].requires_grad_(True)
    with pytest.raises(ValueError, match=r"^q, k or v requires grad, but tiled_attention_fa2 reuses "
                       r"its tiles in place and has no autograd graph: call "
                       r"flash_attention\(q, k, v, \.\.\.\) instead$"):
        tiled.tiled_attention_fa2(**args)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("bad, error, message", [
    (dict(causal="no", scale=-1.0), TypeError, "causal is 'no'"),
    (dict(scale=-1.0, mask=torch.ones(4, 5)), ValueError, "scale is -1.0"),
])
def test_with_two_bad_arguments_every_path_names_the_same_one_first(path, bad, error, message):
    """The checks run in one order (q, k, v, tiles, causal, scale, mask) on every entry point, so
    a wrong call gets the same message whichever function it reached."""
    q, k, v = torch.randn(2, 4, 8), torch.randn(2, 5, 8), torch.randn(2, 5, 8)
    with pytest.raises(error, match=message):
        PATHS[path](q, k, v, **bad)


def test_a_bad_scale_is_named_before_the_gradient_rule():
    q, k, v = qkv(4, 8)
    with pytest.raises(ValueError, match="scale is -1.0"):
        tiled.tiled_attention_fa2(q.requires_grad_(True), k, v, scale=-1.0)


def test_trace_tiles_checks_its_arguments():
    q, k, v = qkv(4, 8)
    with pytest.raises(ValueError, match=r"^q has shape \(2, 4, 8\), expected one head \(N_q, d\)$"):
        tiled.trace_tiles(q.expand(2, 4, 8), k, v, 2, 2)
    with pytest.raises(TypeError, match=r"causal is 'no' \(str\), expected True or False"):
        tiled.trace_tiles(q, k, v, 2, 2, causal="no")
    with pytest.raises(ValueError, match="expected n_k >= n_q = 4 for causal attention"):
        tiled.trace_tiles(q, k[:3], v[:3], 2, 2, causal=True)


@pytest.mark.parametrize("call, error, message", [
    (lambda: attention.causal_mask(0), ValueError, "^n_q is 0, expected a positive int$"),
    (lambda: attention.causal_mask(2, 0), ValueError, "^n_k is 0, expected a positive int$"),
    (lambda: attention.bidirectional_mask(0), ValueError, "^n_q is 0, expected a positive int$"),
    (lambda: attention.bidirectional_mask(2, 0), ValueError, "^n_k is 0, expected a positive int$"),
    (lambda: attention.local_mask(0, 1), ValueError, "^n is 0, expected a positive int$"),
    (lambda: attention.strided_mask(0, 1), ValueError, "^n is 0, expected a positive int$"),
    (lambda: attention.global_mask(0, []), ValueError, "^n is 0, expected a positive int$"),
    (lambda: attention.padding_mask(torch.tensor([1]), 0), ValueError,
     "^n_k is 0, expected a positive int$"),
    (lambda: attention.padding_mask(torch.tensor([True]), 2), TypeError,
     r"^lengths has dtype torch.bool, expected an integer tensor of token counts \(a length of "
     r"2.5 tokens means nothing\): use lengths.long\(\)$"),
    (lambda: attention.softmax([1.0]), TypeError, "^x is a list, expected a torch.Tensor$"),
    (lambda: attention.softmax_jacobian([0.5]), ValueError,
     r"^a is list, expected a tensor of probabilities of shape \(\.\.\., n\)$"),
    (lambda: attention.softmax_jacobian(torch.tensor(1.0)), ValueError,
     r"^a is \(\), expected a tensor of probabilities"),
    (lambda: attention.check_scale(-1.0), ValueError,
     r"^scale is -1.0, expected a finite number > 0 such as 1/sqrt\(d_k\)$"),
])
def test_mask_and_softmax_helpers_name_the_bad_argument(call, error, message):
    with pytest.raises(error, match=message):
        call()


@pytest.mark.parametrize("change, error, message", [
    (dict(k=[1.0]), TypeError, "^k is a list, expected a torch.Tensor$"),
    (dict(v=torch.ones(3)), ValueError, r"^v has shape \(3,\), expected \(\.\.\., N, d\) with 2\+ dims$"),
    (dict(k=torch.ones(2, 5, 8, dtype=torch.long)), TypeError,
     "^k has dtype torch.int64, expected a floating-point tensor$"),
    (dict(q=torch.ones(2, 4, 0), k=torch.ones(2, 5, 0)), ValueError,
     r"^q has shape \(2, 4, 0\): d_k is 0, expected d_k >= 1$"),
    (dict(k=torch.ones(2, 0, 8), v=torch.ones(2, 0, 8)), ValueError,
     r"^k has shape \(2, 0, 8\): N_k is 0, expected at least one key$"),
    (dict(k=torch.ones(2, 5, 3)), ValueError, "must match, got 8 and 3$"),
    (dict(k=torch.ones(3, 5, 8)), ValueError, "do not broadcast$"),
    (dict(v=torch.ones(3, 5, 8)), ValueError, "do not broadcast$"),
    (dict(k=torch.ones(2, 5, 8, device="meta")), ValueError,
     r"^q is on cpu, k on meta and v on cpu: expected all three on one device \(move them with "
     r"\.to\(device\)\)$"),
    (dict(mask=[True]), TypeError, "^mask is a list, expected a boolean torch.Tensor$"),
    (dict(mask=torch.ones(4, 5)), TypeError, r"expected torch.bool \(True = may attend\); for a "
     r"0/1 mask use mask.bool\(\)$"),
    (dict(mask=torch.ones(3, 5, dtype=torch.bool)), ValueError,
     r"^mask has shape \(3, 5\), expected a shape broadcastable to \(\.\.\., 4, 5\) to match "
     r"scores of shape \(2, 4, 5\)$"),
])
def test_attention_names_the_bad_argument_exactly(change, error, message):
    args = dict(q=torch.ones(2, 4, 8), k=torch.ones(2, 5, 8), v=torch.ones(2, 5, 8))
    args.update(change)
    with pytest.raises(error, match=message):
        attention.scaled_dot_product_attention(**args)


def test_a_mask_of_another_shape_is_named_with_the_scores_last_two_sizes():
    """(..., N_q, N_k) are the scores' last two sizes, also in 4-D."""
    q, k = torch.ones(1, 2, 4, 8), torch.ones(1, 2, 5, 8)
    with pytest.raises(ValueError, match=r"broadcastable to \(\.\.\., 4, 5\)"):
        attention.scaled_dot_product_attention(q, k, k, mask=torch.ones(3, 5, dtype=torch.bool))


def test_the_fast_path_names_what_it_cannot_train():
    model = nn.Linear(3, 2)
    model.bias.requires_grad_(False)
    with pytest.raises(ValueError, match=r"^FlatWeights trains every parameter, and this model has "
                       r"frozen ones \(requires_grad=False\): use TrainConfig\(fast=False\)$"):
        speed.FlatWeights(model, torch.float32)
    flat = speed.FlatWeights(nn.Linear(3, 2), torch.float32)
    flat.params[0].data = flat.params[0].data.clone()
    with pytest.raises(RuntimeError, match=r"\(by \.to\(\), \.float\(\) or similar\): make a new "
                       r"Trainer$"):
        flat.zero_gradients()


def test_a_bad_course_precision_says_unset_is_fine(monkeypatch):
    monkeypatch.setenv("COURSE_PRECISION", "fp16")
    with pytest.raises(ValueError, match=r"expected one of fp32, bf16, auto \(or unset\)$"):
        speed.precision_from_environment()


@pytest.mark.parametrize("params, kwargs, message", [
    ([], {}, r"^params is empty or holds something other than tensors, expected the model's "
     r"parameters \(model.parameters\(\)\)$"),
    (["a"], {}, "^params is empty or holds something other than tensors"),
    (None, {"weight_decay": -1.0}, r"^weight_decay is -1.0, expected a number in \[0, inf\)$"),
    (None, {"weight_decay": float("inf")}, r"^weight_decay is inf, expected a number in \[0, inf\)$"),
])
def test_the_sharded_optimizer_names_what_is_wrong(params, kwargs, message):
    params = [nn.Parameter(torch.ones(2))] if params is None else params
    with pytest.raises(ValueError, match=message):
        sharded.ShardedAdamW(params, rank=0, world_size=1, **kwargs)


@pytest.mark.parametrize("world_size, checked", [(1, False), (2, True), (3, True)])
def test_the_sharded_optimizer_compares_shapes_across_ranks_when_there_are_several(
        monkeypatch, world_size, checked):
    """The cross-rank comparison itself needs two processes (tests/test_distributed.py); here,
    that the optimizer asks for it, with its parameters, exactly when there are other ranks."""
    calls = []
    monkeypatch.setattr(sharded, "check_same_shapes", lambda *args: calls.append(args))
    params = [nn.Parameter(torch.ones(2)), nn.Parameter(torch.ones(2, 2))]
    sharded.ShardedAdamW(params, rank=0, world_size=world_size)
    assert calls == ([(params, "params")] if checked else [])


def test_owners_need_a_positive_world_size():
    with pytest.raises(ValueError, match="^world_size is 0, expected a positive int$"):
        sharded.assign_owners([3, 2], 0)


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(progress="a"), TypeError, r"^progress is 'a' \(a str\), expected a number in \[-inf, inf\]$"),
    (dict(peak=0.0), ValueError, "^peak is 0.0, expected a finite number > 0$"),
    (dict(warmup=1.0), ValueError, r"^warmup is 1.0, expected a number in \[0, 1\)$"),
    (dict(warmup=1.5), ValueError, r"^warmup is 1.5, expected a number in \[0, 1\)$"),
    (dict(floor=1.5), ValueError, r"^floor is 1.5, expected a number in \[0, 1\]$"),
])
def test_the_schedule_names_a_bad_argument(kwargs, error, message):
    with pytest.raises(error, match=message):
        train.learning_rate(**(dict(progress=0.5, peak=1.0) | kwargs))


def test_fit_and_the_splits_name_a_bad_argument():
    with pytest.raises(TypeError, match="^progress_bar is 'yes'"):
        tiny_trainer().fit(steps=1, progress_bar="yes")
    with pytest.raises(ValueError, match="^ids is a list, expected a 1-D tensor of token ids$"):
        train.split_train_val([1, 2, 3])
    with pytest.raises(ValueError, match=r"^ids is of shape \(2, 2\), expected a 1-D tensor"):
        train.split_train_val(torch.zeros(2, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="^val_text has no non-blank lines, expected at least one$"):
        train.line_overlap("a", "\n \n")


def test_two_stories_split_and_keep_their_own_spaces():
    assert train.split_stories("  a\n\n b \n", 0.5) == ("  a\n\n", " b \n\n")


@pytest.mark.parametrize("call, error, message", [
    (lambda: mh.split_heads([1.0], 2), ValueError, r"^x has shape list, expected \(B, N, H \* D_H\)$"),
    (lambda: mh.split_heads(torch.ones(2, 3), 2), ValueError, r"^x has shape \(2, 3\), expected"),
    (lambda: mh.split_heads(torch.ones(1, 2, 4), 0), ValueError, "^n_heads is 0, expected a positive int$"),
    (lambda: mh.merge_heads([1.0]), ValueError, r"^x has shape list, expected \(B, H, N, D_H\)$"),
    (lambda: mh.merge_heads(torch.ones(2, 3)), ValueError, r"^x has shape \(2, 3\), expected"),
    (lambda: mh.check_head_counts(10, 4, 4), ValueError, "gets d_model / n_heads = 2.5 features, "
     "which must be a whole number$"),
    (lambda: mh.check_head_counts(12, 3, 2), ValueError, "serve the same number of query heads, got 1.5$"),
    (lambda: mh.check_head_counts(12, 3, 0), ValueError, "^n_kv_heads is 0, expected a positive int$"),
    (lambda: mh.kv_cache_bytes_per_token(1, 0, 1), ValueError, "^n_kv_heads is 0"),
    (lambda: mh.kv_cache_bytes_per_token(1, 1, 0), ValueError, "^head_dim is 0"),
    (lambda: mh.kv_cache_bytes_per_token(1, 1, 1, 0), ValueError, "^bytes_per_value is 0"),
    (lambda: mh.MultiHeadAttention(8, 2, dropout=1.0), ValueError,
     r"^dropout is 1.0, expected a number in \[0, 1\)$"),
    (lambda: mh.MultiHeadAttention(8, 2, dropout=1.5), ValueError, "^dropout is 1.5"),
    (lambda: mh.AttentionHead(0, 4), ValueError, "^d_model is 0, expected a positive int$"),
    (lambda: mh.AttentionHead(8, 0), ValueError, "^head_dim is 0, expected a positive int$"),
    (lambda: mh.AttentionHead(8, 4, bias="yes"), TypeError, "^bias is 'yes'"),
    (lambda: mh.AttentionHead(8, 4)([1.0]), TypeError,
     r"^x is a list, expected a torch.Tensor \(B, N, 8\)$"),
    (lambda: mh.AttentionHead(8, 4)(torch.ones(1, 0, 8)), ValueError,
     r"^x has shape \(1, 0, 8\): a sequence of 0 tokens, expected at least one token \(N >= 1\)$"),
    (lambda: mh.AttentionHead(8, 4)(torch.ones(1, 2, 8), torch.ones(1, 2, 4)), ValueError,
     r"^context has shape \(1, 2, 4\)"),
    (lambda: mh.AttentionHead(8, 4)(torch.ones(1, 2, 8), mask=torch.ones(1, 1, 2, 2, dtype=torch.bool)),
     ValueError, r"expected \(N, M\) or \(B, N, M\): a single head has no head axis$"),
    (lambda: mh.AttentionHead(8, 4)(torch.ones(1, 2, 8), [1.0]), TypeError,
     r"^context is a list, expected a torch.Tensor \(B, N, 8\)$"),
    (lambda: mh.check_features("x", torch.tensor(1.0), 4, torch.float32), ValueError,
     r"^x has shape \(\), expected \(\.\.\., 4\)"),
    (lambda: mh.check_features("x", [1.0], 4, torch.float32), TypeError,
     r"^x is a list, expected a torch.Tensor \(\.\.\., 4\)$"),
    (lambda: mh.attention_mask([True], False, 2, 2, "cpu"), TypeError,
     r"^mask is list, expected a torch.bool tensor \(True = may attend\)$"),
])
def test_the_attention_modules_name_what_is_wrong(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_the_mask_shapes_follow_their_arguments():
    assert attention.bidirectional_mask(2, 3).shape == (2, 3)
    assert attention.bidirectional_mask(2).shape == (2, 2)
    assert attention.strided_mask(4, 2, causal=False)[0].tolist() == [True, False, True, False]
    assert attention.strided_mask(4, 2)[0].tolist() == [True, False, False, False]


def test_global_tokens_given_as_a_small_integer_tensor_are_positions():
    """A uint8 tensor would index as a boolean mask; the positions are made long first."""
    expected = attention.global_mask(4, [0, 2])
    assert torch.equal(attention.global_mask(4, torch.tensor([0, 2], dtype=torch.uint8)), expected)


# --- 5. fixtures where the behaviour decides: tile sizes that change the bits --------------------

def test_flash_attention_tiles_as_it_is_told():
    """The forward of flash_attention is tiled_attention_fa2 with the same tiles, bit for bit; the
    fixture is chosen so that another key tile size changes the bits (the online softmax rounds
    differently), so a tile size lost on the way would show."""
    q, k, v = qkv(2, 9, 8, seed=3)
    k, v = torch.cat([k] * 4, 1), torch.cat([v] * 4, 1)
    with torch.no_grad():
        expected, _ = tiled.tiled_attention_fa2(q, k, v, block_q=5, block_k=8)
        got = tiled.flash_attention(q, k, v, block_q=5, block_k=8)
        for block_q in (8, 5):  # one key tile, whatever the query tiles
            one_key_tile, _ = tiled.tiled_attention_fa2(q, k, v, block_q=block_q, block_k=1024)
            assert not torch.equal(one_key_tile, expected)
    assert torch.equal(got, expected)
