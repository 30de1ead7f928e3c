"""helpers.training.speed: FlatWeights.clip_gradients at norms where a planted bug shows.

Written for the mutation run (benchmarks/mutation.py, issue 30), after @torch.no_grad() functions
were mutated too: each test fails on a planted one-line bug that test_train.py and the property
tests let through.
"""

from __future__ import annotations

import torch
from torch import nn

from helpers.training import speed


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
