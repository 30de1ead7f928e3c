"""Mixture of experts: a router picks k of E SwiGLU experts for every token.

Defined in notebook 12, "The decoder of 2025-2026", section 1, in the order it derives them:

    route                    checks its arguments, then top-k of the router's scores by one of
                             three conventions, each a function of its own:
      "softmax_topk"  _softmax_then_top_k  softmax over all E, keep the k largest (Qwen3-MoE,
                                           DeepSeek-V2; the weights sum to less than 1)
      "topk_softmax"  _top_k_then_softmax  softmax over the k largest logits only (Mixtral:
                                           transformers computes it as softmax, top-k,
                                           renormalise, which is the same numbers)
      "sigmoid"       _sigmoid_top_k       sigmoid scores, top-k, renormalised (DeepSeek-V3),
                                           among the token's best expert groups (group_limit);
                                           a per-expert bias moves the choice, not the weights
    Experts                  E SwiGLU experts stored as three (E, ...) tensors
    Experts.loop             plain code: for each expert, its tokens, index_add back
    Experts.sorted           tokens sorted by expert into an (E, C, D) buffer, one batched product;
                             C = capacity drops the tokens past it, C = the largest load is dropless
    expert_capacity          ceil(factor x tokens x k / E)
    switch_aux_loss          the Switch Transformer's E x sum_i f_i P_i
    AddAuxLoss               adds a loss's gradient in backward without changing the forward
    MoELayer                 router + experts + optional shared expert, balancing by loss or bias

Model code: it imports torch and the course's model modules, never training, plots or lab.
Shapes: T tokens (B x N flattened), D = d_model, E experts, k experts per token, F an expert's
hidden width, C slots per expert.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from helpers import checks
from helpers.model.layers import SwiGLUFeedForward
from helpers.model.multihead import check_features

ROUTER_MODES = ("softmax_topk", "topk_softmax", "sigmoid")


def check_top_k(top_k: int, n_experts: int) -> None:
    checks.positive_int("n_experts", n_experts)
    checks.positive_int("top_k", top_k)
    if top_k > n_experts:
        raise ValueError(f"top_k is {top_k}, expected at most n_experts = {n_experts}: a token "
                         "cannot be sent to more experts than there are")


def check_groups(n_group: int, topk_group: int, n_experts: int, top_k: int) -> None:
    """Experts in n_group equal groups of at least 2, a token reaching topk_group of them."""
    checks.positive_int("n_group", n_group)
    checks.positive_int("topk_group", topk_group)
    if n_experts % n_group or n_experts // n_group < 2:
        raise ValueError(f"n_group is {n_group}, expected a divisor of n_experts = {n_experts} "
                         "that leaves at least 2 experts per group")
    if topk_group > n_group or top_k > topk_group * (n_experts // n_group):
        raise ValueError(f"topk_group is {topk_group}, expected at most n_group = {n_group} and "
                         f"enough groups to hold top_k = {top_k} experts")


def group_limit(choice: Tensor, n_group: int, topk_group: int) -> Tensor:
    """DeepSeek-V3's restriction: choice (T, E) with every expert outside the token's
    `topk_group` best groups (a group's score: the sum of its two best) set to -inf."""
    checks.tensor_shape("choice", choice, (None, None), "(T, E)")
    check_groups(n_group, topk_group, choice.shape[1], 1)
    t, e = choice.shape
    grouped = choice.view(t, n_group, e // n_group)                         # (T, G, E/G)
    best_groups = grouped.topk(2, dim=-1).values.sum(-1).topk(topk_group, dim=-1).indices
    keep = torch.zeros(t, n_group, dtype=torch.bool, device=choice.device)
    keep.scatter_(1, best_groups, True)
    return grouped.masked_fill(~keep[..., None], float("-inf")).view(t, e)


def check_group_mode(mode: str, n_group: int, topk_group: int, n_experts: int, top_k: int,
                     why: str = "") -> None:
    """Expert groups (n_group, topk_group not both 1) are checked, and allowed with "sigmoid" only."""
    if n_group != 1 or topk_group != 1:
        check_groups(n_group, topk_group, n_experts, top_k)
        if mode != "sigmoid":
            raise ValueError(f"n_group is {n_group} with mode {mode!r}, expected mode 'sigmoid'{why}")


def route(logits: Tensor, top_k: int, mode: str = "softmax_topk", bias: Tensor | None = None,
          normalize: bool = False, n_group: int = 1, topk_group: int = 1) -> tuple[Tensor, Tensor]:
    """logits (T, E) -> weights (T, k), experts (T, k) (long), by the router convention `mode`.

    bias (E,), optional: added to the scores only to choose the experts (DeepSeek-V3's
    loss-free balancing); the weights are the scores without it. normalize=True rescales the
    k weights to sum to 1 (Qwen3-MoE's norm_topk_prob, DeepSeek-V3's; "topk_softmax" always sums to 1).
    n_group > 1 ("sigmoid" only): the experts form n_group groups (on DeepSeek-V3, one per node
    of eight GPUs) and each token chooses among its topk_group best groups, which bounds how
    many nodes its hidden state travels to.
    NaN or inf logits are not checked here (the router runs at every forward pass, like every
    other layer): they propagate into the weights and choices; the trainer refuses the NaN loss.
    """
    checks.tensor_shape("logits", logits, (None, None), "(T, E): one score per token and expert")
    n_experts = logits.shape[1]
    check_top_k(top_k, n_experts)
    checks.one_of("mode", mode, ROUTER_MODES)
    checks.boolean("normalize", normalize)
    if bias is not None:
        checks.tensor_shape("bias", bias, (n_experts,), f"a tensor ({n_experts},): one per expert",
                            verb="is")
    check_group_mode(mode, n_group, topk_group, n_experts, top_k,
                     why=": only DeepSeek's router limits the groups")
    return _route(logits, top_k, mode, bias, normalize, n_group, topk_group)


def _route(logits: Tensor, top_k: int, mode: str, bias: Tensor | None, normalize: bool,
           n_group: int, topk_group: int) -> tuple[Tensor, Tensor]:
    """`route` on arguments already checked (by route, or once by MoELayer's constructor)."""
    if mode == "softmax_topk":
        return _softmax_then_top_k(logits, top_k, bias, normalize)
    if mode == "topk_softmax":
        return _top_k_then_softmax(logits, top_k, bias)
    return _sigmoid_top_k(logits, top_k, bias, normalize, n_group, topk_group)


def _softmax_then_top_k(logits: Tensor, top_k: int, bias: Tensor | None,
                        normalize: bool) -> tuple[Tensor, Tensor]:
    """Qwen3-MoE, DeepSeek-V2: softmax over all E experts, keep the k largest (route's checks)."""
    scores = torch.softmax(logits.float(), dim=-1)                          # (T, E)
    return _keep_top_k(scores, _plus(scores, bias), top_k, normalize, logits.dtype)


def _top_k_then_softmax(logits: Tensor, top_k: int, bias: Tensor | None) -> tuple[Tensor, Tensor]:
    """Mixtral: the k largest logits, then a softmax over those k only, so they sum to 1.
    (transformers computes softmax, top-k, renormalise: the same numbers.)"""
    experts = torch.topk(_plus(logits, bias), top_k, dim=-1).indices        # (T, k)
    chosen = logits.gather(1, experts)                                      # without the bias
    return torch.softmax(chosen.float(), dim=-1).to(logits.dtype), experts


def _sigmoid_top_k(logits: Tensor, top_k: int, bias: Tensor | None, normalize: bool,
                   n_group: int = 1, topk_group: int = 1) -> tuple[Tensor, Tensor]:
    """DeepSeek-V3: a sigmoid score per expert, the k largest among the token's topk_group best
    groups (n_group > 1), usually renormalised (route's checks)."""
    scores = logits.float().sigmoid()                                       # (T, E)
    choice = _plus(scores, bias)
    if n_group > 1:
        choice = group_limit(choice, n_group, topk_group)
    return _keep_top_k(scores, choice, top_k, normalize, logits.dtype)


def _plus(scores: Tensor, bias: Tensor | None) -> Tensor:
    """The scores the experts are chosen by: with the balancing bias, if there is one."""
    return scores if bias is None else scores + bias


def _keep_top_k(scores: Tensor, choice: Tensor, top_k: int, normalize: bool,
                dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """The k experts of largest `choice` (T, E) and their `scores`, summing to 1 if normalize."""
    experts = torch.topk(choice, top_k, dim=-1).indices                     # (T, k)
    weights = scores.gather(1, experts)
    if normalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights.to(dtype), experts


def expert_capacity(n_tokens: int, top_k: int, n_experts: int, capacity_factor: float) -> int:
    """Slots per expert: ceil(capacity_factor x n_tokens x top_k / n_experts); 1.0 is a fair share."""
    checks.positive_int("n_tokens", n_tokens)
    check_top_k(top_k, n_experts)
    checks.positive_float("capacity_factor", capacity_factor,
                          hint=" (1.0 = each expert holds exactly its fair share)")
    return math.ceil(capacity_factor * n_tokens * top_k / n_experts)


def check_expert_indices(experts: Tensor, n_experts: int) -> None:
    """experts: an integer tensor of indices in 0 .. n_experts - 1 (else bincount counts an
    expert that does not exist, or fails with a message that names no argument)."""
    checks.positive_int("n_experts", n_experts)
    if not isinstance(experts, Tensor) or experts.dtype not in (torch.int64, torch.int32):
        got = experts.dtype if isinstance(experts, Tensor) else type(experts).__name__
        raise TypeError(f"experts is {got}, expected an integer tensor (torch.long) of expert indices")
    if experts.numel() and (int(experts.min()) < 0 or int(experts.max()) >= n_experts):
        raise ValueError(f"experts holds {int(experts.min())} .. {int(experts.max())}, "
                         f"expected indices in 0 .. {n_experts - 1}")


def expert_load(experts: Tensor, n_experts: int) -> Tensor:
    """experts (T, k) -> (E,) the number of assignments each expert received (float)."""
    check_expert_indices(experts, n_experts)
    return _expert_load(experts, n_experts)


def _expert_load(experts: Tensor, n_experts: int) -> Tensor:
    return torch.bincount(experts.reshape(-1), minlength=n_experts).float()


def switch_aux_loss(logits: Tensor, experts: Tensor, n_experts: int) -> Tensor:
    """The Switch Transformer's balancing loss: E x sum_i f_i P_i.

    f_i: assignments to expert i per token (sums to k), P_i: the mean softmax probability of
    expert i. 1 x k when the load is uniform; larger when the router concentrates. Equal to
    transformers' `load_balancing_loss_func` for one layer.
    """
    checks.tensor_shape("logits", logits, (None, n_experts), f"(T, {n_experts})")
    check_expert_indices(experts, n_experts)
    if experts.dim() != 2 or experts.shape[0] != logits.shape[0]:
        raise ValueError(f"experts has shape {tuple(experts.shape)}, expected ({logits.shape[0]}, k)")
    return _switch_aux_loss(logits, experts, n_experts)


def _switch_aux_loss(logits: Tensor, experts: Tensor, n_experts: int) -> Tensor:
    f = _expert_load(experts, n_experts) / logits.shape[0]       # (E,) not differentiable
    p = torch.softmax(logits.float(), dim=-1).mean(dim=0)          # (E,) differentiable
    return n_experts * (f * p).sum()


class AddAuxLoss(torch.autograd.Function):
    """y = AddAuxLoss.apply(x, loss): y is x, and backward adds d(loss)/d(...) with weight 1.

    How DeepSeek-V2's code adds its balancing loss without touching the training loop: the
    loss rides along with the activations, and any trainer that backpropagates the language
    model's loss also backpropagates this one.
    """

    @staticmethod
    def forward(ctx, x: Tensor, loss: Tensor) -> Tensor:
        ctx.loss_shape, ctx.loss_dtype = loss.shape, loss.dtype
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, Tensor]:
        return grad, torch.ones(ctx.loss_shape, dtype=ctx.loss_dtype, device=grad.device)


class Experts(nn.Module):
    """E SwiGLU experts: gate, up (E, F, D) and down (E, D, F); expert e is down_e(silu(gate_e x) * up_e x)."""

    def __init__(self, n_experts: int, d_model: int, hidden: int) -> None:
        super().__init__()
        for name, value in (("n_experts", n_experts), ("d_model", d_model), ("hidden", hidden)):
            checks.positive_int(name, value)
        self.n_experts, self.d_model, self.hidden = n_experts, d_model, hidden
        self.gate = nn.Parameter(torch.randn(n_experts, hidden, d_model) * 0.02)
        self.up = nn.Parameter(torch.randn(n_experts, hidden, d_model) * 0.02)
        self.down = nn.Parameter(torch.randn(n_experts, d_model, hidden) * 0.02)

    def one(self, e: int, x: Tensor) -> Tensor:
        """Expert e on x (n, D) -> (n, D)."""
        return F.linear(F.silu(F.linear(x, self.gate[e])) * F.linear(x, self.up[e]), self.down[e])

    def _check(self, x: Tensor, weights: Tensor, experts: Tensor) -> None:
        check_features("x", x, self.d_model, self.gate.dtype)
        check_expert_indices(experts, self.n_experts)
        if not isinstance(weights, Tensor) or weights.dtype != x.dtype:
            got = weights.dtype if isinstance(weights, Tensor) else type(weights).__name__
            raise TypeError(f"weights is {got}, expected a tensor of x's dtype {x.dtype}")
        if x.dim() != 2 or weights.shape != experts.shape or experts.shape[0] != x.shape[0]:
            raise ValueError(f"x {tuple(x.shape)}, weights {tuple(weights.shape)} and experts "
                             f"{tuple(experts.shape)}: expected (T, D), (T, k) and (T, k)")

    def loop(self, x: Tensor, weights: Tensor, experts: Tensor) -> Tensor:
        """The plain form: x (T, D), weights and experts (T, k) -> (T, D), one expert at a time."""
        self._check(x, weights, experts)
        out = torch.zeros_like(x)
        for e in range(self.n_experts):
            token, slot = torch.where(experts == e)           # which tokens chose e, in which slot
            if token.numel():
                y = self.one(e, x[token]) * weights[token, slot, None]
                out = out.index_add(0, token, y)
        return out

    def sorted(self, x: Tensor, weights: Tensor, experts: Tensor,
               capacity: int | None = None) -> tuple[Tensor, int]:
        """The batched form: -> (out (T, D), number of dropped assignments).

        Every (token, slot) assignment is sorted by expert and given a row in its expert's
        buffer (E, C, D); the experts then run as three batched products. With capacity=None,
        C is the largest load (dropless); otherwise the assignments past C are dropped (the
        token keeps only its residual path for that slot), as in GShard and Switch.
        """
        self._check(x, weights, experts)
        if capacity is not None:
            checks.positive_int("capacity", capacity)
        return self._sorted(x, weights, experts, capacity)

    def _sorted(self, x: Tensor, weights: Tensor, experts: Tensor, capacity: int | None) -> tuple[Tensor, int]:
        """`sorted` on arguments already checked (MoELayer's router made them)."""
        flat = experts.reshape(-1)                                    # (T k,)
        order = torch.argsort(flat, stable=True)                      # assignments grouped by expert
        counts = torch.bincount(flat, minlength=self.n_experts)       # (E,)
        starts = torch.cumsum(counts, 0) - counts                     # first sorted row of each expert
        rank = torch.arange(flat.numel(), device=x.device) - starts[flat[order]]  # row in its expert
        slots = int(counts.max()) if capacity is None else capacity
        kept = rank < slots
        order, rank = order[kept], rank[kept]
        token = order // experts.shape[1]
        buffer = x.new_zeros(self.n_experts, max(slots, 1), self.d_model)   # (E, C, D)
        buffer[flat[order], rank] = x[token]
        h = F.silu(buffer @ self.gate.transpose(1, 2)) * (buffer @ self.up.transpose(1, 2))  # (E, C, F)
        y = h @ self.down.transpose(1, 2)                             # (E, C, D)
        y = y[flat[order], rank] * weights.reshape(-1)[order, None]
        return torch.zeros_like(x).index_add(0, token, y), int((~kept).sum())


class MoELayer(nn.Module):
    """The MLP of a MoE block: x (..., D) -> (..., D), sum over its k experts of weight x expert(x),
    plus a shared expert every token passes through (DeepSeek, Qwen2-MoE) if shared_hidden.

    balance: "none", "aux_loss" (Switch: aux_coef x switch_aux_loss added in backward) or
    "bias" (DeepSeek-V3: after each training forward, bias_e += bias_rate x sign(mean load -
    load_e), so an overloaded expert is chosen less; no gradient involved).
    routed_scale multiplies the routed experts' weights (DeepSeek-V3: 2.5).
    capacity_factor: None = dropless, else each expert takes at most expert_capacity(...) tokens.
    After every forward, `last_logits` (T, E) and `last_load` (E,) say what the router did.
    """

    def __init__(self, d_model: int, n_experts: int, top_k: int, hidden: int, *,
                 mode: str = "softmax_topk", normalize: bool = False, shared_hidden: int = 0,
                 capacity_factor: float | None = None, balance: str = "none",
                 aux_coef: float = 0.01, bias_rate: float = 1e-3, routed_scale: float = 1.0,
                 n_group: int = 1, topk_group: int = 1) -> None:
        super().__init__()
        check_top_k(top_k, n_experts)
        check_group_mode(mode, n_group, topk_group, n_experts, top_k)
        self.n_group, self.topk_group = n_group, topk_group
        checks.one_of("mode", mode, ROUTER_MODES)
        checks.boolean("normalize", normalize)
        checks.non_negative_int("shared_hidden", shared_hidden)
        if capacity_factor is not None:
            checks.positive_float("capacity_factor", capacity_factor,
                                  hint=" or None for dropless routing")
        checks.one_of("balance", balance, ("none", "aux_loss", "bias"))
        checks.number_in("aux_coef", aux_coef, 0.0, math.inf, high_open=True)
        checks.number_in("bias_rate", bias_rate, 0.0, math.inf, high_open=True)
        self.routed_scale = checks.positive_float("routed_scale", routed_scale)
        self.d_model, self.n_experts, self.top_k = d_model, n_experts, top_k
        self.mode, self.normalize, self.capacity_factor = mode, normalize, capacity_factor
        self.balance, self.aux_coef, self.bias_rate = balance, aux_coef, bias_rate
        self.router = nn.Linear(d_model, n_experts, bias=False)
        self.experts = Experts(n_experts, d_model, hidden)
        self.shared = SwiGLUFeedForward(d_model, shared_hidden) if shared_hidden else None
        self.register_buffer("bias", torch.zeros(n_experts))
        self.last_logits: Tensor | None = None
        self.last_load: Tensor | None = None
        self.last_dropped = 0

    def forward(self, x: Tensor) -> Tensor:
        check_features("x", x, self.d_model, self.router.weight.dtype)
        flat = x.reshape(-1, self.d_model)                                  # (T, D)
        logits = self.router(flat)                                          # (T, E)
        use_bias = self.bias if self.balance == "bias" else None
        # The constructor checked the router's settings and the router's experts are in range:
        # the bodies below run without their public checks (each a host sync on a GPU).
        weights, experts = _route(logits, self.top_k, self.mode, use_bias, self.normalize,
                                  self.n_group, self.topk_group)
        weights = weights * self.routed_scale        # DeepSeek-V3's routed_scaling_factor (2.5)
        capacity = None if self.capacity_factor is None else expert_capacity(
            flat.shape[0], self.top_k, self.n_experts, self.capacity_factor)
        out, self.last_dropped = self.experts._sorted(flat, weights, experts, capacity)
        self.last_logits, self.last_load = logits.detach(), _expert_load(experts, self.n_experts)
        if self.training and self.balance == "aux_loss" and self.aux_coef > 0:
            out = AddAuxLoss.apply(out, self.aux_coef * _switch_aux_loss(logits, experts, self.n_experts))
        if self.training and self.balance == "bias":
            with torch.no_grad():
                self.bias += self.bias_rate * torch.sign(self.last_load.mean() - self.last_load)
        if self.shared is not None:
            out = out + self.shared(flat)
        return out.reshape(x.shape)
