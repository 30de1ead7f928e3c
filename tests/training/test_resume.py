"""save_run / load_run (helpers.training.resume): any model, any optimizer, resumed exactly.

A run interrupted after k steps, saved, and resumed into a freshly built model and optimizer
continues with the same losses, bit for bit, as the run that was never interrupted (dropout and
the data order included, through torch's random state). The file is read without running code,
is checksummed, and a model or optimizer that does not match it is refused by name.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from helpers.model.checkpoints import CheckpointError
from helpers.training.muon import MuonWithAdamW, split_for_muon
from helpers.training.resume import load_run, save_run


def build(width: int = 8, optimizer: type = torch.optim.AdamW):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, width), nn.Dropout(0.2), nn.GELU(), nn.Linear(width, 1))
    return model, optimizer(model.parameters(), lr=1e-2)


def step(model: nn.Module, optimizer: torch.optim.Optimizer) -> float:
    x = torch.randn(16, 4)  # from torch's global generator, as a shuffled loader would
    loss = (model(x) - x.sum(dim=1, keepdim=True)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.item()


@pytest.mark.parametrize("optimizer", [torch.optim.AdamW, torch.optim.SGD, torch.optim.Adagrad])
def test_a_resumed_run_continues_with_the_same_losses(tmp_path, optimizer):
    model, opt = build(optimizer=optimizer)
    uninterrupted = [step(model, opt) for _ in range(8)]
    model, opt = build(optimizer=optimizer)
    first = [step(model, opt) for _ in range(3)]
    save_run(tmp_path / "run.pt", model, opt, 3, epoch=0, note="half way")
    torch.manual_seed(99)  # whatever happened in between
    model, opt = build(optimizer=optimizer)
    state = load_run(tmp_path / "run.pt", model, opt)
    assert state.step == 3 and state.extra == {"epoch": 0, "note": "half way"}
    assert first + [step(model, opt) for _ in range(state.step, 8)] == uninterrupted


def muon_pair(model: nn.Module, lr: float = 1e-2) -> MuonWithAdamW:
    """Muon for the hidden matrices of `model`, AdamW for the rest (no embeddings here)."""
    return MuonWithAdamW(*split_for_muon(model, head_names=()), muon_lr=0.02, adamw_lr=lr,
                         ns_dtype=torch.float32)


def test_a_resumed_muon_run_continues_with_the_same_losses(tmp_path):
    model, _ = build()
    opt = muon_pair(model)
    uninterrupted = [step(model, opt) for _ in range(6)]
    model, _ = build()
    opt = muon_pair(model)
    first = [step(model, opt) for _ in range(3)]
    save_run(tmp_path / "run.pt", model, opt, 3)
    model, _ = build()
    opt = muon_pair(model)
    assert load_run(tmp_path / "run.pt", model, opt).step == 3
    assert first + [step(model, opt) for _ in range(3, 6)] == uninterrupted


def test_an_optimizer_without_a_state_dict_is_refused_by_name(tmp_path):
    model, _ = build()
    with pytest.raises(TypeError, match="^optimizer is a list, expected a torch.optim.Optimizer or an object "
                                        r"with state_dict\(\) and load_state_dict\(\)"):
        save_run(tmp_path / "run.pt", model, [], 0)


def test_without_the_optimizer_state_the_run_diverges(tmp_path):
    """The check above can fail: resuming the weights alone gives other losses."""
    model, opt = build()
    uninterrupted = [step(model, opt) for _ in range(6)]
    model, opt = build()
    for _ in range(3):
        step(model, opt)
    save_run(tmp_path / "run.pt", model, opt, 3)
    model, opt = build()
    load_run(tmp_path / "run.pt", model)  # a fresh AdamW: m and v start at zero again
    assert [step(model, opt) for _ in range(3)] != uninterrupted[3:]


def test_a_model_of_other_sizes_or_names_is_refused_before_loading(tmp_path):
    model, opt = build()
    save_run(tmp_path / "run.pt", model, opt, 1)
    other, other_opt = build(width=16)
    before = [p.clone() for p in other.parameters()]
    with pytest.raises(CheckpointError, match=r"holds 0.weight of shape \(8, 4\), but the model's is \(16, 4\)"):
        load_run(tmp_path / "run.pt", other, other_opt)
    assert all(torch.equal(p, q) for p, q in zip(before, other.parameters(), strict=True))
    with pytest.raises(CheckpointError, match="saved from another model"):
        load_run(tmp_path / "run.pt", nn.Linear(4, 1))
    with pytest.raises(CheckpointError, match="holds the state of a AdamW optimizer, but a SGD was given"):
        load_run(tmp_path / "run.pt", model, torch.optim.SGD(model.parameters(), lr=0.1))


def test_a_changed_byte_is_caught_by_the_checksum(tmp_path):
    model, opt = build()
    path = save_run(tmp_path / "run.pt", model, opt, 2)
    state = torch.load(path, weights_only=True)
    state["model"]["0.weight"][0, 0] += 1.0
    torch.save(state, path)
    with pytest.raises(CheckpointError, match="is corrupted"):
        load_run(path, *build())


def test_a_pickled_object_is_never_unpickled(tmp_path):
    class Evil:
        def __reduce__(self):
            return (print, ("ran code",))

    torch.save({"format": "course-run/1", "model": Evil()}, tmp_path / "evil.pt")
    with pytest.raises(CheckpointError, match="could run code"):
        load_run(tmp_path / "evil.pt", *build())


@pytest.mark.parametrize("call, error, message", [
    (lambda p, m, o: save_run(p, "model", o, 1), TypeError, "^model is a str, expected a torch.nn.Module$"),
    (lambda p, m, o: save_run(p, m, "adam", 1), TypeError, "^optimizer is a str, expected a torch.optim.Optimizer"),
    (lambda p, m, o: save_run(p, m, o, -1), ValueError, "^step is -1, expected an int >= 0$"),
    (lambda p, m, o: save_run(p, m, o, 1, where=p), TypeError, "^extra value 'where' is "),
    (lambda p, m, o: save_run(p.parent / "no" / "run.pt", m, o, 1), ValueError, "lies in a folder that does not exist"),
    (lambda p, m, o: load_run(p.parent / "missing.pt", m, o), FileNotFoundError, "no such file"),
    (lambda p, m, o: load_run(p, m, o, restore_rng="no"), TypeError, "^restore_rng is 'no'"),
])
def test_bad_arguments_are_refused_by_name(tmp_path, call, error, message):
    model, opt = build()
    path = tmp_path / "run.pt"
    save_run(path, model, opt, 1)
    with pytest.raises(error, match=message):
        call(path, model, opt)


def test_a_file_of_another_kind_is_named(tmp_path):
    from helpers.model.checkpoints import save_checkpoint
    from helpers.model.gpt import GPT, GPTConfig

    path = save_checkpoint(tmp_path / "gpt.pt", GPT(GPTConfig(vocab_size=8, context_length=8, n_layers=1,
                                                              n_heads=1, d_model=8)))
    with pytest.raises(CheckpointError, match=r"is not a saved run \(format None\)"):
        load_run(path, *build())
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(CheckpointError, match="is a JSON file"):
        load_run(tmp_path / "config.json", *build())
