"""save_run / load_run (helpers.training.resume): any model, any optimizer, resumed exactly.

A run interrupted after k steps, saved, and resumed into a freshly built model and optimizer
continues with the same losses, bit for bit, as the run that was never interrupted (dropout and
the data order included, through torch's random state). The file is read without running code,
is checksummed, and a model or optimizer that does not match it is refused by name.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import torch
from shared_tools import finishes_within
from torch import nn

from helpers.model.checkpoints import CheckpointError
from helpers.scale.sharded import ShardedAdamW
from helpers.training.by_hand import HandAdamW, adamw_update
from helpers.training.muon import MuonWithAdamW, muon_param_groups, split_for_muon
from helpers.training.resume import _run_checksum, load_run, save_run
from helpers.training.trainer import matrices_and_vectors

LR = 1e-2
# Each optimizer over a model's parameters: torch's, and the course's hand-written ones (whose
# step takes the rate).
OPTIMIZERS = {
    "AdamW": lambda model: torch.optim.AdamW(model.parameters(), lr=LR),
    "SGD": lambda model: torch.optim.SGD(model.parameters(), lr=LR),
    "Adagrad": lambda model: torch.optim.Adagrad(model.parameters(), lr=LR),
    "HandAdamW": lambda model: HandAdamW(adamw_update, *matrices_and_vectors(model)),
    "ShardedAdamW": lambda model: ShardedAdamW(model.parameters(), rank=0, world_size=1),
}


def build(width: int = 8, optimizer: str = "AdamW"):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, width), nn.Dropout(0.2), nn.GELU(), nn.Linear(width, 1))
    return model, OPTIMIZERS[optimizer](model)


def step(model: nn.Module, optimizer) -> float:
    x = torch.randn(16, 4)  # from torch's global generator, as a shuffled loader would
    loss = (model(x) - x.sum(dim=1, keepdim=True)).pow(2).mean()
    model.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step(*([LR] if isinstance(optimizer, HandAdamW | ShardedAdamW) else []))
    return loss.item()


@pytest.mark.parametrize("optimizer", list(OPTIMIZERS))
def test_a_resumed_run_continues_with_the_same_losses(tmp_path, optimizer):
    # k = 3 steps, saved, loaded into a fresh model and optimizer, m = 5 more: the k + m losses
    # and the final weights of the run that was never interrupted, bit for bit
    model, opt = build(optimizer=optimizer)
    uninterrupted = [step(model, opt) for _ in range(8)]
    final = [p.clone() for p in model.parameters()]
    model, opt = build(optimizer=optimizer)
    first = [step(model, opt) for _ in range(3)]
    save_run(tmp_path / "run.pt", model, opt, 3, epoch=0, note="half way")
    torch.manual_seed(99)  # whatever happened in between
    model, opt = build(optimizer=optimizer)
    state = load_run(tmp_path / "run.pt", model, opt)
    assert state.step == 3 and state.extra == {"epoch": 0, "note": "half way"}
    assert first + [step(model, opt) for _ in range(state.step, 8)] == uninterrupted
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), final, strict=True))


def muon_pair(model: nn.Module, lr: float = 1e-2) -> MuonWithAdamW:
    """Muon for the hidden matrices of `model`, AdamW for the rest (no embeddings here)."""
    return MuonWithAdamW(muon_param_groups(*split_for_muon(model, head_names=()), muon_lr=0.02, adamw_lr=lr),
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
                                        r"with state_dict\(\), load_state_dict\(\) and param_groups"):
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


def saved_run(optimizer: str, folder: Path) -> Path:
    model, opt = build(optimizer=optimizer)
    for _ in range(2):
        step(model, opt)
    return save_run(folder / "run.pt", model, opt, 2, note="x", position=[3, 4])


def tensor_places(state, place=()) -> list[tuple]:
    """The keys leading to every tensor of a loaded run file: weights, moments, random state."""
    if isinstance(state, torch.Tensor):
        return [place]
    items = state.items() if isinstance(state, dict) else enumerate(state) if isinstance(state, list | tuple) else ()
    return [found for key, item in items for found in tensor_places(item, (*place, key))]


def every_tensor_of_a_run() -> list[tuple[str, tuple]]:
    with tempfile.TemporaryDirectory() as folder:
        return [(optimizer, place) for optimizer in ("AdamW", "HandAdamW")
                for place in tensor_places(torch.load(saved_run(optimizer, Path(folder)), weights_only=True))]


def change(state, place: tuple, how) -> None:
    *parents, last = place
    for key in parents:
        state = state[key]
    state[last] = how(state[last])


@pytest.mark.parametrize("optimizer, place", every_tensor_of_a_run(),
                         ids=lambda value: "/".join(map(str, value)) if isinstance(value, tuple) else value)
def test_a_change_to_any_tensor_of_the_file_is_caught_by_the_checksum(tmp_path, optimizer, place):
    # each weight, each moment of each parameter (the first's as surely as the last's), the
    # step counts and torch's random state
    path = saved_run(optimizer, tmp_path)
    state = torch.load(path, weights_only=True)
    change(state, place, lambda t: t ^ 1 if t.dtype == torch.uint8 else t + 1)
    torch.save(state, path)
    with pytest.raises(CheckpointError, match="is corrupted: its tensors and values do not match"):
        load_run(path, *build(optimizer=optimizer))


def test_the_places_changed_above_are_every_tensor_of_the_run():
    # 4 weights and torch's random state in each file; AdamW's m, v and step for each of the 4
    # weights, HandAdamW's m and v
    assert len(every_tensor_of_a_run()) == 2 * (4 + 1) + 4 * 3 + 4 * 2


@pytest.mark.parametrize("place, value", [
    (("step",), 5), (("extra", "note"), "y"), (("extra", "position", 1), 5),
    (("optimizer", "param_groups", 0, "lr"), 1.0), (("optimizer_weights", 0), "2.weight"),
])
def test_a_change_to_any_other_value_of_the_file_is_caught_by_the_checksum(tmp_path, place, value):
    path = saved_run("AdamW", tmp_path)
    state = torch.load(path, weights_only=True)
    change(state, place, lambda _: value)
    torch.save(state, path)
    with pytest.raises(CheckpointError, match="is corrupted"):
        load_run(path, *build())


def test_an_optimizer_over_the_same_weights_in_another_order_is_refused(tmp_path):
    # its state names weights by position only: layer 0's moments would land on layer 1
    model, opt = build()
    step(model, opt)
    path = save_run(tmp_path / "run.pt", model, opt, 1)
    model, _ = build()
    reordered = torch.optim.AdamW([model[3].weight, model[3].bias, model[0].weight, model[0].bias], lr=LR)
    before = [p.clone() for p in model.parameters()]
    with pytest.raises(CheckpointError, match=r"holds the optimizer state of '0.weight' as weight 0, but the "
                                              r"optimizer lists '3.weight' there: build it over the weights"):
        load_run(path, model, reordered)
    assert all(torch.equal(p, q) for p, q in zip(before, model.parameters(), strict=True))
    assert reordered.state_dict()["state"] == {}


def bomb() -> list:
    """41 lists, each holding the next one twice: 2^40 paths through 8 KB of pickle."""
    value = [1]
    for _ in range(40):
        value = [value, value]
    return value


def test_a_run_file_sharing_one_list_2_to_the_40_times_saves_and_loads_at_once(tmp_path):
    path = tmp_path / "bomb.pt"
    with finishes_within(10):  # the plain-value check and the checksum walk once took 2^40 steps
        save_run(path, nn.Linear(2, 1), None, 0, bomb=bomb(), again=bomb())
        extra = load_run(path, nn.Linear(2, 1)).extra
    assert extra["bomb"][0] is extra["bomb"][1] and path.stat().st_size < 20_000
    state = torch.load(path, weights_only=True)
    state["extra"]["bomb"][1] = [state["extra"]["bomb"][1]]  # one level more on one side only
    torch.save(state, path)
    with finishes_within(10), pytest.raises(CheckpointError, match="is corrupted"):
        load_run(path, nn.Linear(2, 1))


def test_an_optimizer_state_of_nested_shared_dicts_is_not_walked(tmp_path):
    # a file whose checksum is right (anyone can compute one) but whose optimizer entry is
    # 40 levels of {"a": d, "b": d}: comparing its groups once walked all 2^40 paths
    model, opt = build()
    path = save_run(tmp_path / "run.pt", model, opt, 0)
    state = torch.load(path, weights_only=True)
    nested = {"param_groups": "not a list"}
    for _ in range(40):
        nested = {"a": nested, "b": nested}
    state["optimizer"] = nested
    state["checksum"] = _run_checksum(state)
    torch.save(state, path)
    with finishes_within(10), pytest.raises(CheckpointError, match=r"holds an optimizer over parameter "
                                                                    r"groups of sizes \[\], but the optimizer's are \[4\]"):
        load_run(path, *build())


def test_a_value_nested_too_deep_to_save_is_refused_by_name(tmp_path):
    model, opt = build()
    deep = [1]
    for _ in range(100):
        deep = [deep]
    with pytest.raises(ValueError, match=r"^extra value 'deep'(\[0\]){100} is nested more than 100 levels deep"):
        save_run(tmp_path / "run.pt", model, opt, 0, deep=deep)
    assert not (tmp_path / "run.pt").exists()


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
    (lambda p, m, o: save_run(5, m, o, 1), TypeError, r"^path is 5 \(int\), expected a str or Path$"),
    (lambda p, m, o: load_run(save_run(p, m, None, 1), m, o), CheckpointError,
     r"holds no optimizer state \(it was saved with optimizer=None\), but a AdamW was given"),
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
