"""Exercises of notebook 3 (scaled dot-product attention): softmax, attention, its Jacobian, and
the two core ones, an attention layer with learned projections and the backward pass of attention."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor, nn

from helpers.lab.exercises import (
    SOFTMAX_CALLS,
    ExerciseFailed,
    exercise,
    expect_close,
    hidden_round,
    reseed,
    seeded,
)
from helpers.model import attention as reference


def _random(*shape: int, seed: int) -> Tensor:
    return torch.randn(*shape, generator=seeded(seed), dtype=torch.float64)


@exercise(hint="Shift every row so that its largest logit becomes 0 (softmax ignores a constant "
               "added to a whole row, and no exponent can overflow), then take the plain softmax of "
               "the shifted rows. Each row's number must broadcast against its own row.",
          task="Write a softmax over the last dimension, with torch.exp (not torch.softmax). The check "
               "tries one row, a (3, 5) batch and logits of size 1000.",
          forbidden=SOFTMAX_CALLS)
def stable_softmax(student: Callable[[Tensor], Tensor]) -> str:
    """The student's softmax(x) over the last dim must match ours, also for huge logits."""
    row = torch.tensor([2.0, 1.0, 0.1], dtype=torch.float64)
    if hidden_round():  # a longer row drawn from the hidden seed
        row = (3 * _random(7, seed=0)).round(decimals=2)
    expect_close(student(row), reference.softmax(row), f"softmax({row.tolist()})")
    batch = _random(3, 5, seed=1)
    got = student(batch)
    if isinstance(got, Tensor) and got.shape == batch.shape:
        sums = got.sum(dim=-1)
        if not torch.allclose(sums, torch.ones_like(sums)):
            raise ExerciseFailed("on a (3, 5) input your rows do not sum to 1.",
                                 fix="normalise along the last dimension (dim=-1), not over the whole "
                                     "tensor or the columns.")
    expect_close(got, reference.softmax(batch), "softmax of a (3, 5) tensor")
    huge = torch.tensor([1000.0, 0.0, -1000.0], dtype=torch.float64)
    got = student(huge)
    if isinstance(got, Tensor) and not torch.isfinite(got).all():
        raise ExerciseFailed("softmax([1000, 0, -1000]) gave NaN or inf: exp(1000) overflows.",
                             fix="Subtract the row maximum first; softmax does not change when every "
                                 "logit moves by the same amount.")
    expect_close(got, reference.softmax(huge), "softmax([1000, 0, -1000])")
    scales = torch.tensor([[1000.0, 999.0, 998.0], [0.1, 0.2, 0.3]], dtype=torch.float64)
    got = student(scales)
    if isinstance(got, Tensor) and got.shape == scales.shape and not torch.isfinite(got[1]).all() \
            and torch.isfinite(got[0]).all():
        raise ExerciseFailed("rows of very different scale, [[1000, 999, 998], [0.1, 0.2, 0.3]], give "
                             "NaN in the second row: you subtracted the largest logit of the whole "
                             "tensor, so every exp of the small row underflows to 0.",
                             fix="subtract each row's own maximum (over the last dimension, keeping it "
                                 "for broadcasting), not the maximum of the whole tensor.")
    expect_close(got, reference.softmax(scales), "softmax of rows of very different scale")
    return "It survives logits of 1000, where exp alone overflows."


@exercise(hint="a matrix with the probabilities on its diagonal, minus the outer product of the "
               "vector with itself (every a_i times every a_j).",
          task="Write the Jacobian (n, n) of softmax at the probabilities a (n,). The check compares "
               "at two points and refuses autograd's jacobian.",
          forbidden=("torch.autograd.functional.jacobian",))
def softmax_jacobian(student: Callable[[Tensor], Tensor]) -> str:
    """The student's Jacobian of softmax at probabilities a (n,) must equal diag(a) - a a^T."""
    cases = [[2.5, 0.0, -2.5], [0.3, -1.2, 0.7, 2.0]]
    if hidden_round():  # logits drawn from the hidden seed
        cases = [_random(5, seed=2).round(decimals=2).tolist()] + cases
    for logits in cases:
        a = reference.softmax(torch.tensor(logits, dtype=torch.float64))
        got = student(a)
        expected = reference.softmax_jacobian(a)
        if isinstance(got, Tensor) and got.shape == expected.shape and torch.allclose(got, torch.diag(a)):
            raise ExerciseFailed("you returned only diag(a).", fix="subtract the outer product a a^T too.")
        if isinstance(got, Tensor) and got.shape == expected.shape and torch.allclose(got, torch.diag(a) - a @ a):
            raise ExerciseFailed("you subtracted one number, the dot product of a with itself, from every "
                                 "entry, not the outer product a a^T (for a vector, transposing changes nothing).",
                                 fix="subtract the (n, n) matrix of every a_i times every a_j: a as a column "
                                     "(n, 1) times a as a row (1, n).")
        if isinstance(got, Tensor) and got.shape == expected.shape and torch.allclose(got, -expected):
            raise ExerciseFailed("every sign is flipped.",
                                 fix="the Jacobian is diag(a) - a a^T, positive on the diagonal (raising "
                                     "a logit raises its own probability).")
        expect_close(got, expected, f"the Jacobian at softmax({logits})", atol=1e-9)
    return "Each row of it sums to 0: adding a constant to every logit changes nothing."


@exercise(hint="Score every query against every key in one product (transposing the keys in their "
               "last two dimensions only), scale by one over the square root of d_k, turn each "
               "query's scores into weights over the keys, and let them average the values; return "
               "the output and the weights.",
          task="Write attention(q, k, v) returning (output, weights). The check tries "
               "self-attention, cross-attention and a batch of heads.")
def scaled_attention(student: Callable[[Tensor, Tensor, Tensor], tuple[Tensor, Tensor]]) -> str:
    """The student's attention(q, k, v) -> (output, weights) on self- and cross-attention shapes."""
    cases = {
        "self-attention, q, k, v of shape (4, 8)": ((4, 8), (4, 8), (4, 8)),
        "cross-attention, q (2, 8), k (5, 8), v (5, 3)": ((2, 8), (5, 8), (5, 3)),
        "a batch of heads, q (2, 3, 4, 6), k and v (2, 3, 5, 6)": ((2, 3, 4, 6), (2, 3, 5, 6), (2, 3, 5, 6)),
    }
    for seed, (what, (q_shape, k_shape, v_shape)) in enumerate(cases.items()):
        q, k, v = _random(*q_shape, seed=3 * seed), _random(*k_shape, seed=3 * seed + 1), _random(*v_shape, seed=3 * seed + 2)
        result = student(q, k, v)
        if not isinstance(result, tuple) or len(result) != 2:
            raise ExerciseFailed(f"for {what} you returned a {type(result).__name__}, not a pair.",
                                 fix="return a pair: return output, weights.")
        output, weights = result
        expected_out, expected_w = reference.scaled_dot_product_attention(q, k, v)
        _explain_wrong_weights(weights, q, k, what, d_v=v.shape[-1])
        expect_close(weights, expected_w, f"the weights for {what}")
        expect_close(output, expected_out, f"the output for {what}")
    return "Your function handles self-attention, cross-attention and batched heads alike."


def _explain_wrong_weights(weights: object, q: Tensor, k: Tensor, what: str, d_v: int | None = None) -> None:
    """Recognise the classic mistakes: no 1/sqrt(d_k), 1/d_k, 1/sqrt(d_v), the scale after the
    softmax, and the softmax over the wrong dim."""
    if not isinstance(weights, Tensor) or weights.shape[-2:] != (q.shape[-2], k.shape[-2]):
        return
    scores = q @ k.transpose(-2, -1)
    d_k = q.shape[-1]
    if torch.allclose(weights, reference.softmax(scores), atol=1e-9):
        raise ExerciseFailed(f"for {what} your weights are softmax(q k^T), the scores unscaled.",
                             fix=f"divide the scores by sqrt(d_k) = {math.sqrt(d_k):.3f} before the softmax.")
    d_v = d_k if d_v is None else d_v
    slips = {"your weights are softmax(q k^T / d_k).":
             (f"divide by sqrt(d_k) = {math.sqrt(d_k):.3f}, not by d_k = {d_k}.", reference.softmax(scores / d_k)),
             "your weights are softmax(q k^T) / sqrt(d_k): the scale comes after the softmax, so the "
             "rows no longer sum to 1.":
             ("the scale goes on the scores, before the softmax, so that each row still sums to 1.",
              reference.softmax(scores) / math.sqrt(d_k))}
    if d_v != d_k:
        slips[f"you divided the scores by sqrt(d_v) = {math.sqrt(d_v):.3f}."] = (
            f"the scale is sqrt(d_k) = {math.sqrt(d_k):.3f}, the size of the vectors in each dot product.",
            reference.softmax(scores / math.sqrt(d_v)))
    for slip, (fix, wrong) in slips.items():
        if torch.allclose(weights, wrong, atol=1e-9):
            raise ExerciseFailed(f"for {what} {slip}", fix=fix)
    if q.shape[-2] > 1 and torch.allclose(weights, reference.softmax(scores / math.sqrt(d_k), dim=-2), atol=1e-9):
        raise ExerciseFailed(f"for {what} your weights' columns sum to 1, not their rows.",
                             fix="each query (row) must get a distribution over the keys, so take the "
                                 "softmax over dim=-1.")


# --- core exercise 1: an attention layer with learned projections --------------------------------

D_IN, D_K, D_V = 6, 4, 3  # all different: a matrix's shape alone says which way it is stored
LAYER_CASES = {  # what: (x_query shape, x_data shape)
    "self-attention (x of shape (5, 6) as both inputs)": ((5, D_IN), None),
    "cross-attention (x_query (2, 6), x_data (7, 6))": ((2, D_IN), (7, D_IN)),
    "a batch (x_query (2, 3, 6), x_data (2, 5, 6))": ((2, 3, D_IN), (2, 5, D_IN)),
    "a batch of heads (x_query (2, 2, 3, 6), x_data (2, 2, 4, 6))": ((2, 2, 3, D_IN), (2, 2, 4, D_IN)),
}


def _projection(layer: nn.Module, name: str, d_out: int, label: str) -> tuple[Tensor, bool]:
    """The student's projection `name` as (its parameter, whether x @ parameter.T projects).

    Accepted: nn.Linear(d_in, d_out, bias=False), or an nn.Parameter of shape (d_in, d_out)
    (used as x @ w) or (d_out, d_in) (used as x @ w.T, F.linear's way).
    """
    store = getattr(layer, name, getattr(layer, name.upper(), None))
    if store is None:
        raise ExerciseFailed(f"your layer has no attribute {name}, so the check cannot set its values.",
                             fix="store the three projections as self.w_q, self.w_k and self.w_v (each "
                                 "an nn.Linear without bias or an nn.Parameter matrix).")
    if isinstance(store, nn.Linear):
        if store.bias is not None:
            raise ExerciseFailed(f"self.{name} has a bias: the projections are x W with no + b.",
                                 fix=f"build it as nn.Linear(d_in, {label}, bias=False).")
        if tuple(store.weight.shape) != (d_out, D_IN):
            raise ExerciseFailed(f"MyAttentionLayer({D_IN}, {D_K}, {D_V}).{name} is nn.Linear({store.in_features}, "
                                 f"{store.out_features}), expected nn.Linear(d_in, {label}) = "
                                 f"nn.Linear({D_IN}, {d_out}).",
                                 fix=f"build self.{name} from d_in to {label}.")
        return store.weight, True
    if isinstance(store, Tensor):
        if not isinstance(store, nn.Parameter):
            raise ExerciseFailed(f"self.{name} is a plain tensor, so it is not one of the layer's parameters "
                                 "(the optimizer would not train it, .to() would not move it).",
                                 fix="wrap it in nn.Parameter(...).")
        if tuple(store.shape) in ((D_IN, d_out), (d_out, D_IN)):
            return store, tuple(store.shape) == (d_out, D_IN)
        raise ExerciseFailed(f"in MyAttentionLayer({D_IN}, {D_K}, {D_V}) self.{name} has shape {tuple(store.shape)}, "
                             f"expected (d_in, {label}) = ({D_IN}, {d_out}) or its transpose.",
                             fix=f"make self.{name} a matrix of d_in rows and {label} columns.")
    raise ExerciseFailed(f"self.{name} is a {type(store).__name__}, expected an nn.Linear or an nn.Parameter.",
                         fix=f"store self.{name} as an nn.Linear without bias.")


def _build_layer(student: Callable[[int, int, int], nn.Module]) -> tuple[nn.Module, list[Tensor]]:
    """The student's layer (d_in, d_k, d_v) = (6, 4, 3) in float64, with the check's own weights set;
    returns it and the matrices (d_in, d) that project x as x @ matrix (W_Q, W_K, W_V)."""
    if isinstance(getattr(student, "__wrapped__", student), nn.Module):  # check wraps a callable answer
        raise ExerciseFailed("you passed a layer built from MyAttentionLayer, not the class: the check "
                             "builds its own with d_in, d_k, d_v all different.",
                             fix="pass the class MyAttentionLayer itself.")
    with torch.random.fork_rng():  # leave the notebook's random numbers as they were
        reseed(0)
        try:
            layer = student(D_IN, D_K, D_V)
        except AttributeError as error:
            if "Module.__init__() call" in str(error):
                raise ExerciseFailed("nn.Module was not set up before the layer stored its projections.",
                                     fix="call super().__init__() first in __init__.") from None
            raise
    if not isinstance(layer, nn.Module):
        raise ExerciseFailed(f"MyAttentionLayer({D_IN}, {D_K}, {D_V}) gave a {type(layer).__name__}, expected "
                             "an nn.Module.", fix="write class MyAttentionLayer(nn.Module).")
    sizes = {"w_q": (D_K, "d_k"), "w_k": (D_K, "d_k"), "w_v": (D_V, "d_v")}
    stores = {name: _projection(layer, name, d, label) for name, (d, label) in sizes.items()}
    for name, (parameter, _) in stores.items():
        if not torch.isfinite(parameter).all():
            raise ExerciseFailed(f"a new layer's self.{name} holds inf or NaN: torch.empty leaves memory "
                                 "uninitialised.", fix="start from random values (torch.randn, or nn.Linear).")
        if not parameter.detach().any():
            raise ExerciseFailed(f"a new layer's self.{name} is all zeros: every score would be 0 and every "
                                 "query would spread its attention evenly.", fix="start from random values.")
    expected = D_IN * (2 * D_K + D_V)
    total = sum(p.numel() for p in layer.parameters())
    if total != expected:
        raise ExerciseFailed(f"MyAttentionLayer({D_IN}, {D_K}, {D_V}) has {total} learned numbers, expected "
                             f"d_in x (2 d_k + d_v) = {expected}.",
                             fix="hold the three projection matrices and nothing else.")
    layer.double()
    generator = seeded(11)
    matrices = []
    for name, (d, label) in sizes.items():
        parameter, transposed = _projection(layer, name, d, label)
        matrix = torch.randn(D_IN, d, generator=generator, dtype=torch.float64) / math.sqrt(D_IN)
        with torch.no_grad():
            parameter.copy_(matrix.T if transposed else matrix)
        matrices.append(matrix)
    return layer, matrices


def _explain_wrong_layer(weights: object, x_query: Tensor, x_data: Tensor, matrices: list[Tensor], what: str) -> None:
    """Name the slips a layer adds to those of scaled attention: the keys projected with W_Q,
    the queries taken from x_data, the weights returned transposed, scaling by d_in."""
    if not isinstance(weights, Tensor) or not weights.is_floating_point():
        return
    weights = weights.double()
    w_q, w_k, _ = matrices
    q, k = x_query @ w_q, x_data @ w_k
    expected = reference.softmax(q @ k.transpose(-2, -1) / math.sqrt(D_K))
    if weights.shape == expected.shape and torch.allclose(weights, expected, atol=1e-9):
        return  # right (in self-attention, "swapped inputs" would match it too)
    if weights.shape == expected.mT.shape and torch.allclose(weights, expected.mT, atol=1e-9):
        raise ExerciseFailed(f"for {what} your weights are transposed, (N_x, N_q).",
                             fix="return them as (..., N_q, N_x), one row per query, each row summing to 1.")
    slips = {
        "your keys are projected with w_q.": ("the keys are x_data through w_k.",
                                              reference.softmax(q @ (x_data @ w_q).transpose(-2, -1) / math.sqrt(D_K))),
        "your keys come from x_query.": ("the keys and the values come from x_data, the sequence being "
                                         "searched; only the queries come from x_query.",
                                         reference.softmax(q @ (x_query @ w_k).transpose(-2, -1) / math.sqrt(D_K))),
        "your queries come from x_data and your keys from x_query.":
            ("layer(x_query, x_data) takes the queries from its first argument, the keys and values from its second.",
             reference.softmax((x_data @ w_q) @ (x_query @ w_k).transpose(-2, -1) / math.sqrt(D_K))),
        f"you divided the scores by sqrt(d_in) = {math.sqrt(D_IN):.3f}.":
            (f"the scale is sqrt(d_k) = {math.sqrt(D_K):.3f}, the size of the projected vectors in each dot product.",
             reference.softmax(q @ k.transpose(-2, -1) / math.sqrt(D_IN))),
    }
    for slip, (fix, wrong) in slips.items():
        if weights.shape == wrong.shape and torch.allclose(weights, wrong, atol=1e-9):
            raise ExerciseFailed(f"for {what} {slip}", fix=fix)
    _explain_wrong_weights(weights, q, k, what, d_v=D_V)


@exercise(hint="In the constructor: set up the module first, then three linear maps without bias, "
               "queries and keys from d_in to d_k and values from d_in to d_v, under the names w_q, "
               "w_k and w_v. In forward: the queries from the first input, the keys and the values "
               "from the second; then scaled dot-product attention as in exercise 2; return the "
               "output and the weights.",
          task="Write class MyAttentionLayer(nn.Module): MyAttentionLayer(d_in, d_k, d_v) holds the "
               "projections self.w_q, self.w_k, self.w_v (nn.Linear or nn.Parameter), and "
               "layer(x_query, x_data) returns (output, weights). The check builds one with d_in, "
               "d_k, d_v all different, sets its weights, and tries self-attention, cross-attention "
               "and batches.",
          points=3)
def attention_layer(student: Callable[[int, int, int], nn.Module]) -> str:
    """The student's class MyAttentionLayer(d_in, d_k, d_v): its layer(x_query, x_data) must give
    softmax(Q K^T / sqrt(d_k)) V with Q = x_query W_Q, K = x_data W_K, V = x_data W_V."""
    layer, matrices = _build_layer(student)
    for seed, (what, (query_shape, data_shape)) in enumerate(LAYER_CASES.items()):
        x_query = _random(*query_shape, seed=20 + 2 * seed)
        x_data = x_query if data_shape is None else _random(*data_shape, seed=21 + 2 * seed)
        try:
            with torch.no_grad():
                result = layer(x_query, x_data)
        except NotImplementedError:
            raise
        except Exception as error:
            if x_query.dim() == 2:
                raise
            raise ExerciseFailed(
                f"your layer works on (N, d_in) inputs but stops on {what} with {type(error).__name__}: "
                f"{error}.", fix="Leading (batch) dims must pass through: use k.transpose(-2, -1) rather "
                "than k.T or .t(), @ rather than torch.mm, and dim=-1 rather than a fixed dim.") from None
        if not isinstance(result, tuple) or len(result) != 2:
            raise ExerciseFailed(f"for {what} forward returned a {type(result).__name__}, not a pair.",
                                 fix="return a pair (output, weights) from forward.")
        output, weights = result
        q, k, v = (x @ matrix for x, matrix in zip((x_query, x_data, x_data), matrices, strict=True))
        expected_out, expected_w = reference.scaled_dot_product_attention(q, k, v)
        _explain_wrong_layer(weights, x_query, x_data, matrices, what)
        expect_close(weights, expected_w, f"the weights for {what}")
        if isinstance(output, Tensor) and output.shape[-1] == D_K != D_V:
            raise ExerciseFailed(f"for {what} the output has d_k = {D_K} features, expected d_v = {D_V}.",
                                 fix="the values are x_data projected with w_v, from d_in to d_v.")
        expect_close(output, expected_out, f"the output for {what}")
    return "One layer, two uses: layer(x, x) is self-attention, layer(decoder, encoder) cross-attention."


# --- core exercise 2: the backward pass of attention, by hand ------------------------------------

BACKWARD_CASES = {  # what: (q shape, k shape, v shape, scale)
    "self-attention, q, k, v of shape (4, 8), scale 1/sqrt(8)": ((4, 8), (4, 8), (4, 8), 1 / math.sqrt(8)),
    "cross-attention, q (2, 6), k (5, 6), v (5, 3), scale 0.5": ((2, 6), (5, 6), (5, 3), 0.5),
    "a batch of heads, q (2, 3, 4, 5), k (2, 3, 6, 5), v (2, 3, 6, 4), scale 1": ((2, 3, 4, 5), (2, 3, 6, 5), (2, 3, 6, 4), 1.0),
}


def backward_variant(q: Tensor, k: Tensor, v: Tensor, grad_output: Tensor, scale: float, *,
                     jacobian: str = "full", scaled: bool = True, transpose_v: bool = True,
                     transpose_k: bool = True, swap_qk: bool = False) -> tuple[Tensor, Tensor, Tensor]:
    """The gradients of attention, right by default, or with one of the usual slips (to name it)."""
    weights = reference.softmax(q @ k.transpose(-2, -1) * scale)
    grad_v = (weights.transpose(-2, -1) if transpose_v else weights) @ grad_output
    grad_weights = grad_output @ v.transpose(-2, -1)
    weighted = weights * grad_weights
    grad_scores = weighted - weights * weighted.sum(dim=-1, keepdim=True) if jacobian == "full" else weighted
    grad_scores = grad_scores * (scale if scaled else 1.0)
    grad_q = grad_scores @ (q if swap_qk else k)
    grad_k = (grad_scores.transpose(-2, -1) if transpose_k else grad_scores) @ (k if swap_qk else q)
    return grad_q, grad_k, grad_v


BACKWARD_SLIPS = {  # what is wrong: (how to fix it, the slip's knobs)
    "takes the softmax's Jacobian as diag(a) only, without the - a a^T part.":
        ("from each entry of the weights' gradient subtract its row's average weighted by the weights, "
         "then multiply by the weights.", {"jacobian": "diagonal"}),
    "forgot the scale: the scores are scale * q k^T, so their gradient reaches q and k times scale.":
        ("multiply the scores' gradient by scale before it goes on to q and k.", {"scaled": False}),
    "takes the gradient of q through q itself and that of k through k: each factor of q k^T passes "
    "the gradient on through the other one.":
        ("grad_q comes from the scores' gradient times k, grad_k from its transpose times q.", {"swap_qk": True}),
}


def _expect_grad(got: object, expected: Tensor, name: str, what: str,
                 slips: dict[str, tuple[str, Tensor]]) -> None:
    """Fail naming the slip `got` matches, else as expect_close would."""
    if isinstance(got, Tensor) and got.shape == expected.shape and not torch.allclose(got.double(), expected, atol=1e-9):
        for slip, (fix, wrong) in slips.items():
            if wrong.shape == expected.shape and torch.allclose(got.double(), wrong, atol=1e-9):
                raise ExerciseFailed(f"for {what} your {name} {slip}", fix=fix)
    expect_close(got, expected, f"{name} for {what}", atol=1e-9)


@exercise(hint="Walk the forward pass backwards: recompute the weights; back through the last "
               "product to the values and the weights; back through the softmax row by row (its "
               "Jacobian applied to a row has the shortcut of Hint 1) and the scale to the scores; "
               "back through the first product to the queries and the keys. A product hands the "
               "gradient to each factor through the other one, transposed in the last two "
               "dimensions only.",
          task="Write attention_backward(q, k, v, grad_output, scale) returning (grad_q, grad_k, grad_v) "
               "for output = softmax(scale q k^T) v, without autograd. The check compares with autograd "
               "on self-attention, cross-attention and a batch of heads.",
          points=3,
          forbidden=("torch.autograd.grad", "torch.autograd.backward", "torch.autograd.functional.jacobian",
                     "torch.autograd.functional.vjp"))
def attention_backward(student: Callable[..., tuple[Tensor, Tensor, Tensor]]) -> str:
    """The student's attention_backward(q, k, v, grad_output, scale) -> (grad_q, grad_k, grad_v)
    must equal autograd's gradients of softmax(scale q k^T) v."""
    for seed, (what, (q_shape, k_shape, v_shape, scale)) in enumerate(BACKWARD_CASES.items()):
        q, k, v = (_random(*shape, seed=40 + 4 * seed + i) for i, shape in enumerate((q_shape, k_shape, v_shape)))
        grad_output = _random(*q_shape[:-1], v_shape[-1], seed=43 + 4 * seed)
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        with torch.enable_grad():
            output, _ = reference.scaled_dot_product_attention(*leaves, scale=scale)
            expected = torch.autograd.grad(output, leaves, grad_output)
        result = student(q.clone(), k.clone(), v.clone(), grad_output.clone(), scale)
        if not isinstance(result, tuple | list) or len(result) != 3:
            raise ExerciseFailed(f"for {what} you returned a {type(result).__name__}, not three gradients.",
                                 fix="return grad_q, grad_k, grad_v, in that order.")
        grad_q, grad_k, grad_v = result
        wrong_v = {"has the weights untransposed: grad_v must be (N_k, d_v), one row per key.":
                   ("multiply the output's gradient by the weights transposed in their last two dimensions.",
                    backward_variant(q, k, v, grad_output, scale, transpose_v=False)[2])} if q_shape == k_shape else {}
        _expect_grad(grad_v, expected[2], "grad_v", what, wrong_v)
        slips = {}
        for slip, (fix, knobs) in BACKWARD_SLIPS.items():
            try:
                slips[slip] = (fix, backward_variant(q, k, v, grad_output, scale, **knobs))
            except RuntimeError:  # a slip whose shapes do not fit this case
                continue
        _expect_grad(grad_q, expected[0], "grad_q", what, {s: (f, wrong[0]) for s, (f, wrong) in slips.items()})
        if q_shape == k_shape:
            slips["has the scores' gradient untransposed: grad_k gathers, for each key, the column of "
                  "scores that key took part in."] = (
                "multiply the transpose (last two dimensions) of the scores' gradient by q.",
                backward_variant(q, k, v, grad_output, scale, transpose_k=False))
        _expect_grad(grad_k, expected[1], "grad_k", what, {s: (f, wrong[1]) for s, (f, wrong) in slips.items()})
    return "Your gradients equal autograd's: backpropagation through attention holds no magic."
