"""ShardedOptimizer (helpers.scale.zero): ZeRO-1 around any torch.optim class.

On real gloo processes, with the gradients averaged as data parallelism does, ShardedOptimizer
around torch.optim.AdamW ends every step with exactly the unsharded AdamW's weights
(torch.equal), with tied weights and without, while each rank holds only part of the state.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from helpers.scale import any_model
from helpers.scale.workers import launch
from helpers.scale.zero import ShardedOptimizer


@pytest.mark.parametrize("name", ["tied_mlp", "encoder"])
@pytest.mark.processes
@pytest.mark.slow
def test_equal_to_the_unsharded_optimizer_bit_for_bit(name):
    ranks = launch(any_model.train_sharded_optimizer_any, 2, name, 3, timeout=300)
    for result in ranks:
        assert result["equal_after"] == [True, True, True]
    held = [r["state_bytes"] for r in ranks]
    assert sum(held) == ranks[0]["full_state_bytes"] and max(held) < ranks[0]["full_state_bytes"]


def test_one_process_is_the_wrapped_optimizer_itself():
    torch.manual_seed(0)
    model, twin = nn.Linear(3, 2), nn.Linear(3, 2)
    twin.load_state_dict(model.state_dict())
    sharded = ShardedOptimizer(model.parameters(), torch.optim.SGD, lr=0.1, momentum=0.9)
    plain = torch.optim.SGD(twin.parameters(), lr=0.1, momentum=0.9)
    for _ in range(3):
        for m, opt in ((model, sharded), (twin, plain)):
            opt.zero_grad()
            m(torch.ones(4, 3)).pow(2).sum().backward()
            opt.step()
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), twin.parameters(), strict=True))
    assert sharded.state_dict()["state"].keys() == plain.state_dict()["state"].keys()


def test_parameter_groups_keep_their_own_settings():
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    sharded = ShardedOptimizer([{"params": model[0].parameters(), "lr": 0.5},
                                {"params": model[1].parameters()}], torch.optim.SGD, lr=0.1)
    assert [g["lr"] for g in sharded.local.param_groups] == [0.5, 0.1]


def test_a_weight_in_two_parameter_groups_is_refused_as_torch_refuses_it():
    # it used to drop the weight from the second group, whose settings were then never used
    model = nn.Sequential(nn.Linear(2, 3), nn.Linear(3, 2))
    groups = [{"params": model[0].parameters(), "lr": 0.5},
              {"params": [model[1].weight, model[0].bias], "lr": 0.1}]
    with pytest.raises(ValueError, match=r"^parameter group 1 lists weight 1 \(shape \(3,\)\), which parameter "
                                         "group 0 lists too: expected each weight in one group only"):
        ShardedOptimizer(groups, torch.optim.SGD, lr=0.1)
    with pytest.raises(ValueError, match="some parameters appear in more than one parameter group"):
        torch.optim.SGD([{"params": model[0].parameters()}, {"params": [model[0].bias]}], lr=0.1)


def test_a_tied_weight_is_stepped_once():
    model = any_model.make("tied_mlp")
    sharded = ShardedOptimizer(list(model.parameters()) + [model.head.weight], torch.optim.AdamW)
    assert len(sharded.params) == len(list(model.parameters()))


@pytest.mark.parametrize("params, cls, error, message", [
    (lambda: nn.Linear(2, 2).parameters(), torch.optim.AdamW(nn.Linear(1, 1).parameters()), TypeError,
     "^optimizer_class is AdamW"),
    (lambda: nn.Linear(2, 2).parameters(), dict, TypeError, "^optimizer_class is <class 'dict'>"),
    (lambda: [], torch.optim.AdamW, ValueError, "^params is empty"),
    (lambda: torch.zeros(2, requires_grad=True), torch.optim.AdamW, TypeError, "^params is a single tensor"),
    (lambda: [torch.zeros(2, dtype=torch.long)], torch.optim.AdamW, ValueError,
     "^parameter group 0 holds torch.int64, expected floating-point tensors"),
    (lambda: [{"lr": 0.1}], torch.optim.AdamW, ValueError, "^parameter group 0 has no 'params'"),
])
def test_bad_arguments_are_refused_by_name(params, cls, error, message):
    with pytest.raises(error, match=message):
        ShardedOptimizer(params(), cls)
