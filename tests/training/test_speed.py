"""helpers.training.speed: FlatWeights (one buffer, float32 master weights, gradient clipping as
clip_grad_norm_ does it, at norms where the 1e-6 shows), the bf16 probes, make_optimizer's
settings and kernels, the precision setting, and its refusals read in full.
"""

from __future__ import annotations

import shutil

import pytest
import torch
from shared_tools import small_gpt
from torch import nn

from helpers.model.gpt import GPT
from helpers.training import speed
from helpers.training import trainer as train
from helpers.training.speed import pick_dtype
from helpers.training.trainer import TrainConfig, Trainer, random_batch


def flat_with_gradients(gradient: list[float]) -> speed.FlatWeights:
    """FlatWeights of a 2 x 2 linear layer without bias, its gradient buffer set to `gradient`."""
    flat = speed.FlatWeights(nn.Linear(2, 2, bias=False), torch.float32)
    flat.gradients.copy_(torch.tensor(gradient))
    return flat


def test_gradients_under_the_limit_are_left_as_they_are():
    # norm 0.005, a hundred times under the limit: the factor is capped at 1, never above
    flat = flat_with_gradients([0.003, 0.004, 0.0, 0.0])
    norm = flat.clip_gradients(0.5)
    assert norm.item() == torch.tensor(0.005).item()
    assert flat.gradients.tolist() == torch.tensor([0.003, 0.004, 0.0, 0.0]).tolist()


def test_clipping_divides_by_the_norm_plus_1e_6_as_clip_grad_norm_does():
    # norm 5e-4 and max_norm 1e-4: the 1e-6 moves the factor by 0.2 %, so its sign shows
    gradient = [3e-4, 4e-4, 0.0, 0.0]
    flat = flat_with_gradients(gradient)
    norm = flat.clip_gradients(1e-4)
    copy = nn.Parameter(torch.zeros(2, 2))
    copy.grad = torch.tensor(gradient).view(2, 2)
    expected_norm = torch.nn.utils.clip_grad_norm_([copy], 1e-4)
    assert norm.item() == expected_norm.item()
    assert torch.equal(flat.gradients, copy.grad.view(-1))
    factor = 1e-4 / (5e-4 + 1e-6)
    assert abs(flat.gradients[0].item() - 3e-4 * factor) < 1e-10  # float32 rounding
    assert abs(flat.gradients[0].item() - 3e-4 * 1e-4 / (5e-4 - 1e-6)) > 1e-9


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


# --- the precision, the one-buffer path and compile, in the Trainer ------------------------

def test_precision_falls_back_to_float32_without_native_bf16(monkeypatch):
    cpu = torch.device("cpu")
    assert pick_dtype(cpu, "fp32") == torch.float32
    assert pick_dtype(cpu, "bf16") == torch.bfloat16
    monkeypatch.setattr(speed, "cpu_has_native_bf16", lambda: False)
    assert pick_dtype(cpu, "auto") == torch.float32
    monkeypatch.setattr(speed, "cpu_has_native_bf16", lambda: True)
    assert pick_dtype(cpu, "auto") == torch.bfloat16
    with pytest.raises(ValueError, match="precision is 'fp16', expected one of 'auto', 'bf16', 'fp32'"):
        pick_dtype(cpu, "fp16")


@pytest.mark.parametrize(("value", "native", "expected"), [
    ("fp32", True, torch.float32), ("bf16", False, torch.bfloat16), ("auto", True, torch.bfloat16),
    ("auto", False, torch.float32), ("", True, torch.bfloat16), (" FP32 ", True, torch.float32)])
def test_course_precision_decides_what_auto_means(monkeypatch, value, native, expected):
    monkeypatch.setattr(speed, "cpu_has_native_bf16", lambda: native)
    monkeypatch.setenv("COURSE_PRECISION", value)
    cpu = torch.device("cpu")
    assert pick_dtype(cpu, "auto") == expected
    # an explicit precision wins over the variable
    assert pick_dtype(cpu, "fp32") == torch.float32 and pick_dtype(cpu, "bf16") == torch.bfloat16


def test_course_precision_reaches_the_trainer(monkeypatch, model_and_data):
    monkeypatch.setattr(speed, "cpu_has_native_bf16", lambda: True)
    monkeypatch.setenv("COURSE_PRECISION", "fp32")
    model, train_ids, val_ids = model_and_data()
    assert Trainer(model, train_ids, val_ids, TrainConfig(batch_size=2)).dtype == torch.float32
    monkeypatch.setenv("COURSE_PRECISION", "bf16")
    model, train_ids, val_ids = model_and_data()
    assert Trainer(model, train_ids, val_ids, TrainConfig(batch_size=2)).dtype == torch.bfloat16


@pytest.mark.parametrize("value", ["fp16", "float32", "1"])
def test_course_precision_refuses_a_bad_value_naming_the_variable(monkeypatch, value):
    monkeypatch.setenv("COURSE_PRECISION", value)
    with pytest.raises(ValueError, match=f"COURSE_PRECISION is '{value}', expected one of fp32, bf16, auto"):
        pick_dtype(torch.device("cpu"), "auto")


def lies_in(tensor: torch.Tensor, buffer: torch.Tensor) -> bool:
    start = buffer.data_ptr()
    return start <= tensor.data_ptr() < start + buffer.numel() * buffer.element_size()


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_fast_path_keeps_weights_and_gradients_in_one_buffer_each(precision, model_and_data):
    model, train_ids, val_ids = model_and_data()
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    trainer = Trainer(model, train_ids, val_ids, TrainConfig(batch_size=4, precision=precision))
    flat = trainer.weights
    for name, param in model.named_parameters():  # moved into the buffer, values unchanged
        assert lies_in(param, flat.weights) and torch.equal(param, before[name]), name
    assert flat.weights.numel() == sum(p.numel() for p in model.parameters())
    trainer.train_step(1e-3)
    for param in trainer.working.parameters():
        assert lies_in(param, flat.working_weights) and lies_in(param.grad, flat.working_gradients)
    assert flat.working_gradients.abs().sum() > 0, "backward wrote into the gradient buffer"
    assert (trainer.working is model) == (precision == "fp32")


def test_clipping_the_buffer_equals_clip_grad_norm(model_and_data):
    model, train_ids, val_ids = model_and_data()
    trainer = Trainer(model, train_ids, val_ids, TrainConfig(batch_size=4, precision="fp32"))
    x, y = random_batch(train_ids, 4, 16, torch.Generator().manual_seed(5))
    trainer.loss_on(x, y).backward()
    params = list(model.parameters())
    copies = [torch.nn.Parameter(p.detach().clone()) for p in params]
    for copy, param in zip(copies, params, strict=True):
        copy.grad = param.grad.clone()
    expected_norm = torch.nn.utils.clip_grad_norm_(copies, 0.01)
    assert trainer.weights.clip_gradients(0.01).item() == pytest.approx(expected_norm.item(), rel=1e-6)
    assert expected_norm > 0.01, "the test must really clip"
    for param, copy in zip(params, copies, strict=True):
        torch.testing.assert_close(param.grad, copy.grad, atol=1e-9, rtol=1e-6)


def test_training_survives_model_zero_grad_and_refuses_a_moved_model(model_and_data):
    model, train_ids, val_ids = model_and_data()
    trainer = Trainer(model, train_ids, val_ids, TrainConfig(batch_size=4, precision="fp32"))
    trainer.train_step(1e-3)
    model.zero_grad()  # sets every .grad to None
    before = model.lm_head.weight.detach().clone()
    trainer.train_step(1e-3)
    assert not torch.equal(model.lm_head.weight, before), "the step still reached the weights"
    model.double()
    with pytest.raises(RuntimeError, match="moved or replaced after the Trainer was made"):
        trainer.train_step(1e-3)


def test_compile_needs_the_fast_path():
    with pytest.raises(ValueError, match="compile=True needs fast=True"):
        TrainConfig(compile=True, fast=False)


@pytest.mark.skipif(not any(shutil.which(c) for c in ("g++", "clang++", "c++")),
                    reason="torch.compile on a CPU needs a C++ compiler; this machine has none")
def test_compiled_trainer_computes_the_same_loss_and_trains(small_config, model_and_data):
    # Slow (the first call compiles, about 10 to 20 s here): it is the only test that compiles.
    model, train_ids, val_ids = model_and_data()
    twin = GPT(small_config)
    twin.load_state_dict(model.state_dict())
    config = dict(batch_size=4, precision="fp32")
    eager = Trainer(model, train_ids, val_ids, TrainConfig(**config))
    compiled = Trainer(twin, train_ids, val_ids, TrainConfig(**config, compile=True))
    x, y = random_batch(train_ids, 4, 16, torch.Generator().manual_seed(3))
    assert compiled.loss_on(x, y).item() == pytest.approx(eager.loss_on(x, y).item(), abs=1e-5)
    losses = [compiled.train_step(1e-2) for _ in range(20)]
    assert losses[-1] < losses[0]


@pytest.mark.parametrize("compile", [True, False])
def test_compile_true_and_only_it_compiles_the_working_loss(compile, monkeypatch, tiny_trainer):
    compiled = []
    monkeypatch.setattr(train, "compile_loss", lambda loss: compiled.append(loss) or "compiled")
    trainer = tiny_trainer(fast=True, compile=compile)
    assert compiled == ([trainer._working_loss] if compile else [])
    assert trainer._loss == ("compiled" if compile else trainer._working_loss)


@pytest.mark.parametrize("precision,expected", [("fp32", torch.float32), ("bf16", torch.bfloat16)])
def test_the_trainer_computes_in_the_precision_asked_for(precision, expected):
    model = small_gpt(torch.float32)
    ids = torch.randint(0, 31, (500,), generator=torch.Generator().manual_seed(0))
    trainer = Trainer(model, ids, ids, TrainConfig(precision=precision, batch_size=2))
    assert trainer.dtype == expected
    assert next(trainer.working.parameters()).dtype == expected
    assert next(model.parameters()).dtype == torch.float32  # the weights AdamW updates stay float32
