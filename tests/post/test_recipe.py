"""helpers.post.recipe.prose_accuracy: notebook 13's measure (the notebook asserts it agrees with
its own cell), and its refusals."""

from __future__ import annotations

import pytest
import torch

from helpers.model.gpt import GPT
from helpers.post import recipe


def test_prose_accuracy_is_a_share_of_the_facts():
    # Its agreement with notebook 13's own cell is asserted in the notebook.
    setting = recipe.make_setting()
    torch.manual_seed(0)
    model = GPT(recipe.model_config(setting)).eval()
    facts = setting.held_facts[:4]
    share = recipe.prose_accuracy(model, setting.tokenizer, facts)
    assert 0.0 <= share <= 1.0 and (share * len(facts)).is_integer()


@pytest.mark.parametrize("args, said", [
    (("gpt", None, None), "^model is 'gpt'"),
    ((torch.nn.Linear(1, 1), "tok", None), "^tokenizer is 'tok'"),
])
def test_prose_accuracy_refuses_what_is_not_a_model_or_a_tokenizer(args, said):
    with pytest.raises(TypeError, match=said):
        recipe.prose_accuracy(*args)


def test_prose_accuracy_refuses_an_empty_list_of_facts():
    setting = recipe.make_setting()
    with pytest.raises(TypeError, match=r"^facts is \[\], expected a non-empty list of tasks.Fact"):
        recipe.prose_accuracy(torch.nn.Linear(1, 1), setting.tokenizer, [])
