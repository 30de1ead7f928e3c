"""The core exercises of notebooks 1-7 (the pieces the notebooks then run on) accept every correct
formulation and name each usual mistake; `yours_or` picks the student's function or the helper.

Each wrong answer here is written the way a student would write it, independently of the
checker's own list of slips, so a test fails if the checker stops recognising the mistake. The
cases (CORE_CASES) are judged by tests/lab/exercises/test_checkers.py's test_checker_judges, beside the others.
"""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch
import torch.nn.functional as F

import helpers.lab.exercises as exercises
from helpers.model import multihead
from helpers.model.attention import (
    AttentionLayer,
    causal_mask,
    scaled_dot_product_attention,
)
from helpers.model.embeddings import TokenAndPositionEmbedding
from helpers.model.layers import LayerNorm
from helpers.model.multihead import MultiHeadAttention, merge_heads, split_heads
from helpers.text.bpe import count_pairs, merge, most_frequent_pair, textbook_merges
from helpers.text.chars import pre_split


def verdict(name: str, answer) -> tuple[bool, str]:
    return exercises.evaluate(name, answer, time_limit=60)


# --- 01: the BPE training loop -------------------------------------------------------------------

def bpe_loop(split: bool = True, tie: str = "bytes", recount: bool = True, as_lists: bool = False):
    """A student's training loop; `tie` and `recount` choose its slips (`as_lists`: each pair a list)."""
    def train_textbook(text: str, n_merges: int) -> list[tuple[int, int]]:
        chunks = [list(c.encode("utf-8")) for c in (pre_split(text) if split else [text])]
        vocab = [bytes([b]) for b in range(256)]
        merges = []
        counts = Counter()
        for ids in chunks:
            counts.update(count_pairs(ids))
        while len(merges) < n_merges:
            if recount:
                counts = Counter()
                for ids in chunks:
                    counts.update(count_pairs(ids))
            counts = +counts  # drop zero and negative counts
            if not counts:
                break
            if tie == "bytes":
                pair = most_frequent_pair(counts, vocab)
            elif tie == "first":
                pair = max(counts, key=counts.get)  # the first of the tied pairs counted
            else:
                pair = max(counts, key=lambda p: (counts[p], p))
            merges.append(pair)
            vocab.append(vocab[pair[0]] + vocab[pair[1]])
            chunks = [merge(ids, pair, 256 + len(merges) - 1) for ids in chunks]
            counts[pair] = 0
        return [list(pair) for pair in merges] if as_lists else merges
    return train_textbook


BPE_CASES = [
    (bpe_loop(), None),
    (bpe_loop(as_lists=True), None),  # lists for pairs are fine
    # the course's own loop is the exercise itself: refused by name (issue 50)
    (lambda text, n: [m.pair for m in textbook_merges(text, n)], "helpers.text.bpe.textbook_merges"),
    (bpe_loop(split=False), "merges across chunk boundaries"),
    (bpe_loop(tie="first"), "wrong pair on a tie (you took the first pair counted)"),
    (bpe_loop(tie="ids"), "wrong pair on a tie (you compared the ids)"),
    (bpe_loop(recount=False), "counts the pairs only once"),
    (lambda text, n: bpe_loop()(text, n)[:-1] if n else [], "keep going until n_merges"),
    (lambda text, n: tuple(bpe_loop()(text, n)), "expected a list"),
]



def test_bpe_loop_that_never_stops_early_is_refused_with_where_it_broke():
    def no_break(text, n_merges):
        chunks, merges = [list(c.encode()) for c in pre_split(text)], []
        for step in range(n_merges):
            counts = Counter()
            for ids in chunks:
                counts.update(count_pairs(ids))
            pair = most_frequent_pair(counts)  # raises once no pair is left
            merges.append(pair)
            chunks = [merge(ids, pair, 256 + step) for ids in chunks]
        return merges
    passed, said = verdict("tokenization.train_bpe", no_break)
    assert not passed and "raised" in said


# --- 02: the word vectors' training loop and the input layer --------------------------------------

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


# --- 03: scaled dot-product attention ------------------------------------------------------------

def attention_answer(scale: str = "sqrt_dk"):
    def my_attention(q, k, v):
        scores = q @ k.transpose(-2, -1)
        if scale == "sqrt_dk":
            scores = scores / math.sqrt(q.shape[-1])
        elif scale == "dk":
            scores = scores / q.shape[-1]
        elif scale == "sqrt_dv":
            scores = scores / math.sqrt(v.shape[-1])
        weights = scores.softmax(-1)
        if scale == "after":
            weights = weights / math.sqrt(q.shape[-1])
        return weights @ v, weights
    return my_attention


ATTENTION_CASES = [
    (attention_answer(), None),
    (lambda q, k, v: (F.scaled_dot_product_attention(q, k, v),
                      (q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5).softmax(-1)), None),
    (attention_answer("none"), "divide the scores by"),
    (attention_answer("dk"), "not by d_k"),
    (attention_answer("sqrt_dv"), "sqrt(d_v)"),
    (attention_answer("after"), "before the softmax"),
]



def layer_answer(slip: str = ""):
    """A student's MyAttentionLayer; `slip` chooses how the projections are stored or what goes wrong."""
    class MyAttentionLayer(torch.nn.Module):
        def __init__(self, d_in: int, d_k: int, d_v: int) -> None:
            if slip != "no_super":
                super().__init__()
            if slip.startswith("param"):  # nn.Parameter matrices, (d_in, d) or F.linear's (d, d_in)
                shape = (lambda d: (d_in, d)) if slip == "param_in_out" else (lambda d: (d, d_in))
                self.w_q, self.w_k, self.w_v = (torch.nn.Parameter(torch.randn(*shape(d)) / math.sqrt(d_in))
                                                for d in (d_k, d_k, d_v))
            elif slip == "plain_tensor":
                self.w_q, self.w_k, self.w_v = (torch.randn(d_in, d) for d in (d_k, d_k, d_v))
            else:
                width_v = d_k if slip == "values_dk" else d_v
                self.w_q, self.w_k = (torch.nn.Linear(d_in, d_k, bias=slip == "bias") for _ in range(2))
                self.w_v = torch.nn.Linear(d_in, width_v, bias=slip == "bias")
                if slip == "zeros":
                    torch.nn.init.zeros_(self.w_k.weight)

        def project(self, name: str, x: torch.Tensor) -> torch.Tensor:
            w = getattr(self, name)
            if slip == "param_in_out" or slip == "plain_tensor":
                return x @ w
            return F.linear(x, w) if slip == "param_out_in" else w(x)

        def forward(self, x_query, x_data):
            q = self.project("w_q", x_query)
            k = self.project("w_q" if slip == "keys_wq" else "w_k", x_data)
            v = self.project("w_v", x_data)
            if slip == "swapped":  # the arguments read the other way round: layer(x_data, x_query)
                q, k, v = self.project("w_q", x_data), self.project("w_k", x_query), self.project("w_v", x_query)
            if slip == "torch":
                weights = (q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5).softmax(-1)
                return F.scaled_dot_product_attention(q, k, v), weights
            size = {"unscaled": 1, "d_v": v.shape[-1], "d_in": x_query.shape[-1]}.get(slip, q.shape[-1])
            scores = (q @ (k.T if slip == "dot_T" else k.transpose(-2, -1))) / math.sqrt(size)
            weights = torch.softmax(scores, dim=-2 if slip == "columns" else -1)
            return weights @ v, weights.transpose(-2, -1) if slip == "transposed" else weights
    return MyAttentionLayer


LAYER_CASES = [
    (layer_answer(), None),
    (AttentionLayer, "helpers.model.attention.AttentionLayer"),  # the helper the notebook falls back to
    (layer_answer("param_in_out"), None),
    (layer_answer("param_out_in"), None),
    (layer_answer("torch"), None),
    (layer_answer("unscaled"), "divide the scores by sqrt(d_k)"),
    (layer_answer("d_v"), "sqrt(d_v)"),
    (layer_answer("d_in"), "sqrt(d_in)"),
    (layer_answer("columns"), "columns sum to 1"),
    (layer_answer("bias"), "has a bias"),
    (layer_answer("keys_wq"), "keys are projected with w_q"),
    (layer_answer("swapped"), "your queries come from x_data"),
    (layer_answer("dot_T"), "Leading (batch) dims must pass through"),
    (layer_answer("transposed"), "your weights are transposed"),
    (layer_answer("values_dk"), "expected nn.Linear(d_in, d_v)"),
    (layer_answer("plain_tensor"), "wrap it in nn.Parameter"),
    (layer_answer("zeros"), "all zeros"),
    (layer_answer("no_super"), "super().__init__()"),
]


def test_the_layer_checker_says_not_attempted_for_the_notebooks_stub():
    class MyAttentionLayer(torch.nn.Module):
        def __init__(self, d_in: int, d_k: int, d_v: int) -> None:
            super().__init__()
            raise NotImplementedError

    passed, said = verdict("attention.attention_layer", MyAttentionLayer)
    assert not passed and "not attempted yet" in said and "MyAttentionLayer(d_in, d_k, d_v)" in said


def test_the_layer_checker_raises_exercise_failed_itself_for_a_wrong_layer():
    """Called directly (not through check), the checker raises; `evaluate` turns that into the verdict."""
    from helpers.lab.exercises.attention import attention_layer

    with pytest.raises(exercises.ExerciseFailed, match="has a bias"):
        attention_layer(layer_answer("bias"))
    attention_layer(layer_answer())  # and a right one passes without raising


def test_the_layer_checker_wants_the_class_not_a_layer():
    passed, said = verdict("attention.attention_layer", layer_answer()(6, 4, 3))
    assert not passed and "pass the class MyAttentionLayer itself" in said


def test_the_layer_checker_names_a_matmul_that_drops_the_batch_dims():
    torch_mm = layer_answer()

    class TwoDimOnly(torch_mm):
        def forward(self, x_query, x_data):
            q, k, v = self.w_q(x_query), self.w_k(x_data), self.w_v(x_data)
            weights = torch.softmax(torch.mm(q, k.t()) / math.sqrt(q.shape[-1]), dim=-1)
            return torch.mm(weights, v), weights

    passed, said = verdict("attention.attention_layer", TwoDimOnly)
    assert not passed and "works on (N, d_in) inputs" in said and "torch.mm" in said


def backward_answer(slip: str = ""):
    """A student's attention backward pass; `slip` chooses the usual mistake."""
    def my_attention_backward(q, k, v, grad_output, scale):
        scores = torch.einsum("...qd,...kd->...qk", q, k) * scale
        weights = scores.softmax(-1)
        grad_v = (weights if slip == "no_transpose_v" else weights.mT) @ grad_output
        g = grad_output @ v.mT
        if slip == "diagonal":
            grad_scores = weights * g
        else:  # J g with J = diag(a) - a a^T, built explicitly
            jacobian = torch.diag_embed(weights) - weights[..., :, None] * weights[..., None, :]
            grad_scores = (jacobian @ g[..., None])[..., 0]
        if slip != "unscaled":
            grad_scores = grad_scores * scale
        if slip == "swapped":
            return grad_scores @ q, grad_scores.mT @ k, grad_v
        return grad_scores @ k, (grad_scores if slip == "no_transpose_k" else grad_scores.mT) @ q, grad_v
    return my_attention_backward


def backward_by_autograd(q, k, v, grad_output, scale):
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    (((q @ k.mT * scale).softmax(-1) @ v) * grad_output).sum().backward()
    return q.grad, k.grad, v.grad


BACKWARD_CASES = [
    (backward_answer(), None),
    (backward_answer("diagonal"), "diag(a) only"),
    (backward_answer("unscaled"), "forgot the scale"),
    (backward_answer("swapped"), "through the other one"),
    (backward_answer("no_transpose_v"), "weights untransposed"),
    (backward_answer("no_transpose_k"), "gradient untransposed"),
    (lambda q, k, v, g, scale: backward_answer()(q, k, v, g, scale)[:2], "not three gradients"),
    (backward_by_autograd, "torch.autograd.backward, which this exercise asks you to write yourself"),
]


# --- 04: attention with a causal and a padding mask ----------------------------------------------

def masked_answer(slip: str = ""):
    """A student's masked attention; `slip` chooses the usual mistake. Right, it uses a finite fill
    and then zeroes the rows with nothing to see."""
    def my_masked_attention(q, k, v, real):
        n = q.shape[-2]
        scores = q @ k.transpose(-2, -1)
        if slip != "unscaled":
            scores = scores / math.sqrt(q.shape[-1])
        causal = torch.ones(n, n).tril().bool()
        if slip == "upside_down":
            causal = torch.ones(n, n).triu().bool()
        if slip == "no_causal":
            causal = torch.ones(n, n).bool()
        if slip == "no_padding":
            real = torch.ones_like(real)
        allowed = causal & (real[:, None, :, None] if slip == "rows" else real[:, None, None, :])
        if slip == "after":
            weights = scores.softmax(-1).masked_fill(~allowed, 0.0)
        elif slip == "nan":
            weights = scores.masked_fill(~allowed, -math.inf).softmax(-1)
        else:
            weights = scores.masked_fill(~allowed, 0.0 if slip == "zero" else -1e9).softmax(-1)
            if slip != "uniform":
                weights = weights * allowed.any(dim=-1, keepdim=True)
        return weights @ v, weights
    return my_masked_attention


def masked_with_torch(q, k, v, real):
    n = q.shape[-2]
    mask = torch.ones(n, n, dtype=torch.bool).tril() & real[:, None, None, :]
    weights = (q @ k.mT / q.shape[-1] ** 0.5).masked_fill(~mask, -math.inf).softmax(-1).nan_to_num(0.0)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask), weights


def masked_nan_to_zero(q, k, v, real):
    n = q.shape[-2]
    allowed = torch.ones(n, n, dtype=torch.bool).tril() & real[:, None, None, :]
    scores = (q @ k.mT / q.shape[-1] ** 0.5).masked_fill(~allowed, -math.inf)
    weights = scores.softmax(-1).nan_to_num(0.0)
    return weights @ v, weights


def masked_by_the_course(q, k, v, real):
    """The course's causal mask and attention: what the exercise asks the student to write."""
    return scaled_dot_product_attention(q, k, v, mask=causal_mask(q.shape[-2]) & real[:, None, None, :])


MASKED_CASES = [
    (masked_answer(), None),  # a large finite fill is fine once the rows with nothing to see are zeroed
    (masked_with_torch, None),
    (masked_nan_to_zero, None),
    (masked_by_the_course, "helpers.model.attention.causal_mask"),
    (masked_answer("after"), "mask after the softmax"),
    (masked_answer("zero"), "exp(0) = 1"),
    (masked_answer("unscaled"), "forgot the 1/sqrt(d) scale"),
    (masked_answer("no_causal"), "has no causal mask"),
    (masked_answer("upside_down"), "upside down"),
    (masked_answer("no_padding"), "lets real tokens see the pads"),
    (masked_answer("rows"), "pad queries (rows) instead of the pad keys"),
    (masked_answer("nan"), "gets NaN weights"),
    (masked_answer("uniform"), "spreads its weight evenly"),
]


# --- 05: the multi-head attention forward --------------------------------------------------------

def mha_answer(slip: str = ""):
    def my_mha_forward(x, mha, causal=False):
        b, n, d = x.shape
        h = mha.n_heads
        if slip == "split_view":
            q, k, v = (p(x).reshape(b, h, n, d // h) for p in (mha.q_proj, mha.k_proj, mha.v_proj))
        else:
            q, k, v = (split_heads(p(x), h) for p in (mha.q_proj, mha.k_proj, mha.v_proj))
        scale = {"model": d ** -0.5, "none": 1.0}.get(slip, (d // h) ** -0.5)
        scores = q @ k.transpose(-2, -1) * scale
        later = ~causal_mask(n) if slip == "course_mask" else torch.ones(n, n, dtype=torch.bool).triu(1)
        if causal and slip != "no_causal":
            scores = scores.masked_fill(later, -math.inf)
        heads = scores.softmax(-1) @ v
        if slip == "course_attention":
            heads = scaled_dot_product_attention(q, k, v, mask=~later if causal else None)[0]
        merged = heads.reshape(b, n, d) if slip == "merge_view" else merge_heads(heads)
        return merged if slip == "no_out" else mha.out_proj(merged)
    return my_mha_forward


def mha_with_torch(x, mha, causal=False):
    reference = torch.nn.MultiheadAttention(mha.d_model, mha.n_heads, batch_first=True, dtype=x.dtype)
    with torch.no_grad():
        reference.in_proj_weight.copy_(torch.cat([mha.q_proj.weight, mha.k_proj.weight, mha.v_proj.weight]))
        reference.in_proj_bias.copy_(torch.cat([mha.q_proj.bias, mha.k_proj.bias, mha.v_proj.bias]))
        reference.out_proj.load_state_dict(mha.out_proj.state_dict())
    mask = torch.ones(x.shape[1], x.shape[1], dtype=torch.bool).triu(1) if causal else None  # True: hidden
    return reference(x, x, x, attn_mask=mask, need_weights=False)[0]


MHA_CASES = [
    (mha_answer(), None),
    (mha_with_torch, None),
    (mha_answer("model"), "1/sqrt(d_model)"),
    (mha_answer("none"), "forgot the 1/sqrt(head_dim) scale"),
    (mha_answer("split_view"), "splits the heads by reading"),
    (mha_answer("merge_view"), "merges the heads by reading"),
    (mha_answer("no_out"), "forgot the output projection"),
    (mha_answer("no_causal"), "ignores causal=True"),
    (lambda x, mha, causal=False: mha(x, causal=causal), "MultiHeadAttention.forward"),
    # the scores, the mask and the softmax are the exercise: the course's versions are refused by name
    (mha_answer("course_mask"), "helpers.model.attention.causal_mask"),
    (mha_answer("course_attention"), "helpers.model.attention.scaled_dot_product_attention"),
    (lambda x, mha, causal=False: mha.attend(*(split_heads(p(x), mha.n_heads) for p in (mha.q_proj, mha.k_proj, mha.v_proj)),
                                             causal=causal), "MultiHeadAttention.attend"),
]


# --- 05: one fused module from a list of heads ---------------------------------------------------

def fuse_answer(slip: str = ""):
    """A student's fuse_heads; `slip` picks a usual mistake."""
    def my_fuse_heads(separate):
        has_bias = separate.out_proj.bias is not None
        fused = MultiHeadAttention(separate.d_model, separate.n_heads,
                                   bias=True if slip == "always_bias" else has_bias)
        with torch.no_grad():
            for name in ("q_proj", "k_proj", "v_proj"):
                source = {"q_proj": "k_proj", "k_proj": "q_proj"}.get(name, name) if slip == "swap_qk" else name
                parts = [getattr(head, source) for head in separate.heads]
                if slip == "interleave":
                    weight = torch.stack([p.weight for p in parts], dim=1).flatten(0, 1)
                elif slip == "transpose":
                    weight = torch.cat([p.weight.T for p in parts], dim=1)
                else:
                    weight = torch.cat([p.weight for p in parts])
                if slip == "backwards":
                    for h, p in enumerate(parts):
                        p.weight.copy_(getattr(fused, name).weight[h * p.weight.shape[0]:(h + 1) * p.weight.shape[0]])
                    continue
                getattr(fused, name).weight.copy_(weight)
                if has_bias and slip != "no_bias":
                    getattr(fused, name).bias.copy_(torch.cat([p.bias for p in parts]))
            if slip != "no_out":
                fused.out_proj.weight.copy_(separate.out_proj.weight)
                if has_bias:
                    fused.out_proj.bias.copy_(separate.out_proj.bias)
        return fused
    return my_fuse_heads


def fuse_by_state_dict(separate):
    """Another right answer: rename and stack the entries of the state dict."""
    fused = MultiHeadAttention(separate.d_model, separate.n_heads, bias=separate.out_proj.bias is not None)
    state = {f"out_proj.{k}": v for k, v in separate.out_proj.state_dict().items()}
    for key in fused.state_dict():
        proj, _, kind = key.partition(".")
        if proj != "out_proj":
            state[key] = torch.cat([head.state_dict()[f"{proj}.{kind}"] for head in separate.heads])
    fused.load_state_dict(state)
    return fused


FUSE_CASES = [
    (fuse_answer(), None),
    (fuse_by_state_dict, None),
    (fuse_answer("always_bias"), "has no biases"),
    (fuse_answer("no_bias"), "bias is not the heads' biases"),
    (fuse_answer("interleave"), "interleave the heads"),
    (fuse_answer("transpose"), "is transposed"),
    (fuse_answer("swap_qk"), "q_proj holds the heads' k_proj weights"),
    (fuse_answer("no_out"), "output projection W_O"),
    (fuse_answer("backwards"), "changed the weights of separate"),
    (lambda separate: separate, "returns a SeparateHeadsAttention"),
    (lambda separate: multihead.fuse_heads(separate), "calls helpers.model.multihead.fuse_heads"),
]



# --- 06: the transformer block, Pre-LN and Post-LN -----------------------------------------------

def block_answer(slip: str = ""):
    """A student's block; `slip` picks a usual mistake ("always_pre": ignores block.pre_norm)."""
    def my_block_forward(x, block, causal=True):
        ln2 = block.ln1 if slip == "ln1_twice" else block.ln2
        act = {"relu": F.relu, "tanh": lambda t: F.gelu(t, approximate="tanh")}.get(slip, F.gelu)
        attend = causal and slip != "no_causal"
        if slip == "post" or (not block.pre_norm and slip != "always_pre"):
            x = block.ln1(x + block.attn(x, causal=attend))
            return ln2(x + block.mlp.down(act(block.mlp.up(x))))
        h = block.ln1(x)
        base = {"no_attn_residual": 0.0, "normed_residual": h}.get(slip, x)
        x = base + block.attn(h, causal=attend)
        branch = block.mlp.down(act(block.mlp.up(ln2(x))))
        out = branch if slip == "no_mlp_residual" else x + branch
        return block.ln2(out) if slip == "final_norm" else out
    return my_block_forward


def block_by_hand(x, block, causal=True):
    """Another right answer: LayerNorm and the FFN's products written out, both orders."""
    def norm(t, ln):
        centred = t - t.mean(-1, keepdim=True)
        return centred * torch.rsqrt(centred.pow(2).mean(-1, keepdim=True) + ln.eps) * ln.weight + ln.bias

    def ffn(t):
        return F.gelu(t @ block.mlp.up.weight.T + block.mlp.up.bias) @ block.mlp.down.weight.T + block.mlp.down.bias

    if block.pre_norm:
        x = x + block.attn(norm(x, block.ln1), causal=causal)
        return x + ffn(norm(x, block.ln2))
    x = norm(x + block.attn(x, causal=causal), block.ln1)
    return norm(x + ffn(x), block.ln2)


BLOCK_CASES = [
    (block_answer(), None),
    (block_by_hand, None),
    (lambda x, block, causal=True: block(x, causal=causal), "calls helpers.model.layers.Block.forward"),
    (block_answer("post"), "Post-LN, 2017"),
    (block_answer("always_pre"), "uses the Pre-LN order, but this block is Post-LN"),
    (block_answer("no_attn_residual"), "no residual around attention"),
    (block_answer("normed_residual"), "adds the attention branch to the normalised x"),
    (block_answer("no_mlp_residual"), "no residual around the FFN"),
    (block_answer("ln1_twice"), "uses ln1 for the FFN too"),
    (block_answer("relu"), "uses ReLU"),
    (block_answer("tanh"), "tanh approximation"),
    (block_answer("no_causal"), "ignores causal=True"),
    (block_answer("final_norm"), "normalises the block's output"),
]


# --- 06: GPT-2's initialisation ------------------------------------------------------------------

def init_answer(slip: str = ""):
    """A student's GPT-2 initialisation; `slip` picks a usual mistake."""
    @torch.no_grad()
    def my_gpt2_init(blocks, n_layers, std=0.02):
        divisor = {"no_factor": 1.0, "sqrt_n": math.sqrt(n_layers), "two_n": 2 * n_layers}.get(
            slip, math.sqrt(2 * n_layers))
        for module in blocks.modules():
            if isinstance(module, torch.nn.Linear):
                module.weight.normal_(0.0, std / divisor if slip == "scale_all" else std)
                if slip != "keep_bias":
                    module.bias.zero_()
            if slip == "touch_norms" and isinstance(module, LayerNorm):
                module.weight.normal_(0.0, std)
        for block in blocks:
            residual = (block.attn.out_proj, block.mlp.down) if slip != "scale_up" else (block.attn.out_proj, block.mlp.up)
            for layer in residual:
                layer.weight.normal_(0.0, std / divisor)
        return blocks
    return my_gpt2_init


def init_by_names(blocks, n_layers, std=0.02):
    """Another right answer: by parameter name, with torch.nn.init."""
    for name, param in blocks.named_parameters():
        if name.endswith("bias") and "ln" not in name:
            torch.nn.init.zeros_(param)
        elif name.endswith(("out_proj.weight", "down.weight")):
            torch.nn.init.normal_(param, std=std / math.sqrt(2 * n_layers))
        elif "ln" not in name:
            torch.nn.init.normal_(param, std=std)
    return blocks


def init_by_the_course(blocks, n_layers, std=0.02):
    """The course's helper, which the exercise asks the student to write."""
    from helpers.model.layers import init_gpt2_

    return init_gpt2_(blocks, n_layers, std)


INIT_CASES = [
    (init_answer(), None),
    (init_by_names, None),
    (init_answer("no_factor"), "without the 1/sqrt(2N) factor"),
    (init_answer("sqrt_n"), "std / sqrt(N)"),
    (init_answer("two_n"), "divides by 2N, not by its square root"),
    (init_answer("scale_all"), "that is the residual projections' std"),
    (init_answer("scale_up"), "mlp.up.weight in block 0"),
    (init_answer("keep_bias"), "is not zero"),
    (init_answer("touch_norms"), "no longer has weight 1 and bias 0"),
    (lambda blocks, n_layers, std=0.02: None, "default initialisation"),
    (init_by_the_course, "calls helpers.model.layers.init_gpt2_"),
]


# For tests/lab/exercises/test_checkers.py, which wants a right and two wrong cases of every checker it owns.
CORE_CASES = [(name, answer, message) for name, cases in (
    ("tokenization.train_bpe", BPE_CASES), ("embeddings.train_word_vectors", STEP_CASES),
    ("embeddings.token_and_position", INPUT_CASES),
    ("attention.scaled_attention", ATTENTION_CASES), ("attention.attention_layer", LAYER_CASES),
    ("attention.attention_backward", BACKWARD_CASES),
    ("masking.masked_attention", MASKED_CASES),
    ("multihead_attention.mha_forward", MHA_CASES), ("multihead_attention.fuse_heads", FUSE_CASES),
    ("layers.block_forward", BLOCK_CASES), ("layers.gpt2_init", INIT_CASES))
    for answer, message in cases]


# --- the notebooks run on the student's function, or say why they do not ------------------------

def test_yours_or_picks_the_passing_answer_and_says_so(capsys):
    mine = block_answer()
    assert exercises.yours_or("layers.block_forward", mine, print) is mine
    assert "using your my_block_forward" in capsys.readouterr().out


def test_yours_or_falls_back_to_the_helper_and_says_why(capsys, monkeypatch):
    monkeypatch.setattr(exercises, "STRICT", False)

    def my_block_forward(x, block, causal=True):
        raise NotImplementedError

    helper = block_answer()
    assert exercises.yours_or("layers.block_forward", my_block_forward, helper) is helper
    said = capsys.readouterr().out
    assert "using the course's" in said and "not attempted yet" in said
    assert exercises.yours_or("layers.block_forward", block_answer("post"), helper) is helper
    assert "does not pass its check yet" in capsys.readouterr().out


def test_yours_or_raises_in_strict_mode_so_the_solution_tests_prove_it_was_used(monkeypatch):
    monkeypatch.setattr(exercises, "STRICT", True)
    with pytest.raises(AssertionError, match="Post-LN"):
        exercises.yours_or("layers.block_forward", block_answer("post"), block_answer())


def test_the_checkers_leave_the_global_random_numbers_alone():
    torch.manual_seed(123)
    before = torch.get_rng_state()
    for name, answer in (("multihead_attention.mha_forward", mha_answer()), ("layers.block_forward", block_answer()),
                         ("layers.gpt2_init", init_answer()), ("multihead_attention.fuse_heads", fuse_answer()),
                         ("embeddings.train_word_vectors", word_loop()),
                         ("embeddings.token_and_position", input_layer()), ("attention.attention_layer", layer_answer())):
        assert verdict(name, answer)[0]
    assert torch.equal(torch.get_rng_state(), before)
