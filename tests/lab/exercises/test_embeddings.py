"""Notebook 2's checkers (helpers/lab/exercises/embeddings.py): every correct formulation passes,
each usual slip fails with a message that names it, and a stub hears what to write."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import helpers.lab.exercises as exercises
from helpers.model.embeddings import TokenAndPositionEmbedding

from .judging import (
    assert_cases_cover,
    assert_leaves_the_global_random_numbers_alone,
    assert_not_attempted_says_the_task,
    case_ids,
    exercise_names,
    judge,
)


def lookup_eye(token_ids, weight):
    return torch.eye(weight.shape[0], dtype=weight.dtype)[token_ids] @ weight


def lookup_by_index(token_ids, weight):
    return weight[token_ids]


def lookup_long_one_hot(token_ids, weight):
    return F.one_hot(token_ids, weight.shape[0]) @ weight


def similar_argsort(query, table, k):
    return F.cosine_similarity(table, query[None], dim=-1).argsort(descending=True)[:k]


def similar_dot(query, table, k):
    return (table @ query).topk(k).indices


def similar_ascending(query, table, k):
    return F.cosine_similarity(table, query[None], dim=-1).topk(k).indices.flip(0)


def sinusoids_loop(n_positions, d_model, base):
    table = torch.zeros(n_positions, d_model)
    for pos in range(n_positions):
        for i in range(d_model // 2):
            angle = pos / base ** (2 * i / d_model)
            table[pos, 2 * i], table[pos, 2 * i + 1] = math.sin(angle), math.cos(angle)
    return table


def sinusoids_broadcast(n_positions, d_model, base):
    angles = torch.arange(n_positions)[:, None] / base ** (torch.arange(0, d_model, 2) / d_model)
    return torch.stack([angles.sin(), angles.cos()], dim=-1).flatten(1)


def sinusoids_swapped(n_positions, d_model, base):
    return sinusoids_loop(n_positions, d_model, base).view(n_positions, -1, 2).flip(-1).reshape(n_positions, d_model)


def sinusoids_i_over_d(n_positions, d_model, base):
    return sinusoids_loop(n_positions, d_model, base ** 0.5)


def word_loop(zero_grad: str = "before", reduce: str = "sum", sign: float = -1.0, log: bool = True,
              dim: int = -1, step: bool = True, share: bool = True, adam_each_step: bool = False,
              only_embedding: bool = False):
    def train_word_vectors(embedding, predict_neighbour, counts, steps, lr=0.05):
        def make_adam():
            params = list(embedding.parameters())
            if not only_embedding:
                params += list(predict_neighbour.parameters())
            return torch.optim.Adam(params, lr=lr)

        optimizer = make_adam()
        weights = counts / counts.sum() if share else counts
        losses = []
        for _ in range(steps):
            if adam_each_step:
                optimizer = make_adam()
            logits = predict_neighbour(embedding.weight)  # every word's row: the same as embedding(arange(V))
            scores = logits.log_softmax(dim) if log else logits.softmax(dim)
            weighted = weights * scores
            loss = sign * (weighted.sum() if reduce == "sum" else weighted.mean())
            if zero_grad == "before":
                optimizer.zero_grad()
            loss.backward()
            if step:
                optimizer.step()
            if zero_grad == "after":
                optimizer.zero_grad()
            losses.append(loss.detach())  # 0-d tensors are accepted as the floats
        return losses
    return train_word_vectors


STEP_CASES = [
    (word_loop(), None),
    (word_loop(zero_grad="after"), None),
    (word_loop(zero_grad="never"), "never clears the gradients"),
    (word_loop(reduce="mean"), "averages over all V x V entries"),
    (word_loop(sign=1.0), "sign flipped"),
    (word_loop(log=False), "not their logarithm"),
    (word_loop(dim=0), "normalises over dim=0"),
    (word_loop(step=False), "never changes the parameters"),
    (word_loop(share=False), "raw counts"),
    (word_loop(adam_each_step=True), "new Adam at every step"),
    (word_loop(only_embedding=True), "trains the embedding only"),
    (lambda *args, **kwargs: word_loop()(*args, **kwargs)[-1], "expected a list of 4 losses"),
]


def input_layer(mistake: str = ""):
    """A student's token + position layer; `mistake` picks one of the usual slips."""
    class TokenAndPosition(torch.nn.Module):
        def __init__(self, vocab_size, context_length, d_model):
            super().__init__()
            self.token = torch.nn.Embedding(vocab_size, d_model)
            self.position = torch.nn.Embedding(context_length, d_model)

        def forward(self, token_ids):
            n = token_ids.size(-1)
            if mistake != "no checks" and (n > self.position.weight.shape[0]
                                           or bool((token_ids >= self.token.weight.shape[0]).any())):
                raise ValueError(f"token_ids {token_ids.tolist()} does not fit the tables")
            tokens = self.token(token_ids)
            if mistake == "by id":
                return tokens + self.position(token_ids)
            if mistake == "concatenated":
                return torch.cat([tokens, self.position.weight[:n].expand_as(tokens)], dim=-1)
            if mistake == "tokens only":
                return tokens
            if mistake == "no checks":
                return tokens + self.position(torch.arange(n))
            return tokens + self.position.weight[:n]
    return TokenAndPosition


INPUT_CASES = [
    (input_layer(), None),
    (TokenAndPositionEmbedding, "helpers.model.embeddings.TokenAndPositionEmbedding"),  # the course's own layer
    (input_layer("by id"), "looked the positions up by the token ids"),
    (input_layer("concatenated"), "concatenated"),
    (input_layer("tokens only"), "token vectors alone"),
    (input_layer("no checks"), "IndexError"),
]


def table_by_broadcast(n_positions, d_model, base=10000.0):
    angles = torch.arange(n_positions)[:, None] / base ** (torch.arange(0, d_model, 2) / d_model)
    return torch.stack([angles.sin(), angles.cos()], dim=-1).flatten(1)


def table_by_loop(n_positions, d_model, base=10000.0):
    rows = []
    for pos in range(n_positions):
        angles = pos / base ** (torch.arange(0, d_model, 2) / d_model)
        rows.append(torch.stack([angles.sin(), angles.cos()], dim=-1).flatten())
    return torch.stack(rows)


def test_a_sinusoidal_table_that_loops_over_positions_fails_and_one_broadcast_passes():
    torch.testing.assert_close(table_by_loop(9, 6), table_by_broadcast(9, 6))
    passed, said = exercises.evaluate("embeddings.sinusoidal_table", table_by_loop, time_limit=None)
    assert not passed and "loops over the positions" in said, said
    passed, said = exercises.evaluate("embeddings.sinusoidal_table", table_by_broadcast, time_limit=None)
    assert passed, said


CASES = [
    ("embeddings.lookup_by_product", lookup_eye, None),
    ("embeddings.lookup_by_product", lookup_by_index, "by index"),
    ("embeddings.lookup_by_product", lookup_long_one_hot, "weight's dtype"),
    ("embeddings.most_similar", similar_argsort, None),
    ("embeddings.most_similar", similar_dot, "ranked by dot product"),
    ("embeddings.most_similar", similar_ascending, "most similar first"),
    ("embeddings.sinusoidal_table", sinusoids_broadcast, None),
    ("embeddings.sinusoidal_table", sinusoids_loop, "loops over the positions"),
    ("embeddings.sinusoidal_table", sinusoids_swapped, "swapped"),
    ("embeddings.sinusoidal_table", sinusoids_i_over_d, "not i/d_model"),
]
CASES += [("embeddings.train_word_vectors", answer, message) for answer, message in STEP_CASES]
CASES += [("embeddings.token_and_position", answer, message) for answer, message in INPUT_CASES]


@pytest.mark.parametrize("name, answer, message", CASES, ids=case_ids(CASES))
def test_checker_judges(name, answer, message):
    judge(name, answer, message)


def test_the_checkers_leave_the_global_random_numbers_alone():
    assert_leaves_the_global_random_numbers_alone([("embeddings.train_word_vectors", word_loop()), ("embeddings.token_and_position", input_layer())])


def test_every_checker_has_a_right_and_two_wrong_cases():
    assert_cases_cover("embeddings", CASES)


@pytest.mark.parametrize("name", exercise_names("embeddings"))
def test_not_attempted_says_the_task_not_the_recipe(name):
    assert_not_attempted_says_the_task(name)
