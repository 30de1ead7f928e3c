"""What the checkers of notebook 7's optimizer and sampling exercises run the student's code
with: torch.optim.AdamW's steps as the reference, the usual AdamW slips, and a model with fixed
logits whose sampling distribution is known exactly. Kept apart from the checkers so each file
reads in one sitting."""

from __future__ import annotations

from collections.abc import Callable

import torch

from helpers.lab.exercises import ExerciseFailed
from helpers.model import gpt

HAND_BETAS = (0.9, 0.95)  # the settings the HandAdamW check runs with


def adamw_reference(p: torch.Tensor, g: torch.Tensor, steps: int, lr: float, betas: tuple[float, float],
                     eps: float, weight_decay: float) -> list[torch.Tensor]:
    """The parameter after each of `steps` steps of torch.optim.AdamW with the gradient g."""
    param = torch.nn.Parameter(p.clone())
    optimizer = torch.optim.AdamW([param], lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                                  foreach=False)
    out = []
    for _ in range(steps):
        param.grad = g.clone()
        optimizer.step()
        out.append(param.detach().clone())
    return out


def student_adamw(student: Callable, p: torch.Tensor, g: torch.Tensor, steps: int, lr: float,
                   betas: tuple[float, float], eps: float, weight_decay: float) -> list[torch.Tensor]:
    p, m, v = p.clone(), torch.zeros_like(p), torch.zeros_like(p)
    out = []
    for t in range(1, steps + 1):
        result = student(p.clone(), g.clone(), m.clone(), v.clone(), t, lr, betas, eps, weight_decay)
        if not (isinstance(result, tuple) and len(result) == 3
                and all(isinstance(r, torch.Tensor) for r in result)):
            raise ExerciseFailed(f"the result is a {type(result).__name__}, not a tuple of three tensors",
                                 fix="return the tuple (param, m, v) of three tensors: the caller "
                                     "keeps m and v for the next step.")
        p, m, v = result
        if p.shape != g.shape or m.shape != g.shape or v.shape != g.shape:
            raise ExerciseFailed(f"param, m and v have shapes {tuple(p.shape)}, {tuple(m.shape)}, "
                                 f"{tuple(v.shape)}, expected the parameter's shape {tuple(g.shape)}",
                                 fix="every operation of AdamW is element by element: nothing is "
                                     "summed or reshaped.")
        out.append(p.clone())
    return out


def adamw_mistake(got: torch.Tensor, p: torch.Tensor, g: torch.Tensor, lr: float,
                   betas: tuple[float, float], eps: float, decay: float) -> tuple[str, str] | None:
    """Name the usual slip that explains a wrong first step, if one does: (what, how to fix it)."""
    b1, b2 = betas
    m, v = (1 - b1) * g, (1 - b2) * g * g
    first = (1 - b1) / (1 - b2) ** 0.5  # the uncorrected first step over the corrected one
    candidates = {
        (f"no bias correction: m and v start at zero and shrink by different factors, so with betas "
         f"{betas} the first step is {first:.2f} times AdamW's (too {'large' if first > 1 else 'small'})",
         "divide m by one minus beta1 to the power t, and v by one minus beta2 to the power t "
         "(t counts from 1)."):
            p * (1 - lr * decay) - lr * m / (v.sqrt() + eps),
        ("weight decay is decoupled in AdamW, but you added it to the gradient (that is Adam with L2)",
         "leave the gradient alone and shrink the parameter itself by the factor one minus "
         "lr times weight_decay."):
            p - lr * ((1 - b1) * (g + decay * p) / (1 - b1)) / (
                ((1 - b2) * (g + decay * p) ** 2 / (1 - b2)).sqrt() + eps),
        ("the weight decay is missing",
         "shrink the parameter by the factor one minus lr times weight_decay."):
            p - lr * (m / (1 - b1)) / ((v / (1 - b2)).sqrt() + eps),
        ("the step divides by v-hat itself, not by its square root",
         "divide by the square root of v-hat, plus eps."):
            p * (1 - lr * decay) - lr * (m / (1 - b1)) / ((v / (1 - b2)) + eps),
    }
    for message, value in candidates.items():
        if torch.allclose(got, value, rtol=1e-5, atol=1e-7):
            return message
    return None


def weights(generator: torch.Generator) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Two matrices and two vectors (a bias, a gain) that require grad, as a model's would."""
    shapes = [(3, 4), (2, 3)], [(3,), (2,)]
    return tuple([torch.nn.Parameter(torch.randn(*shape, generator=generator, dtype=torch.float64))
                  for shape in group] for group in shapes)


def hand_adamw_run(matrices: list[torch.Tensor], vectors: list[torch.Tensor],
                    grads: list[list[torch.Tensor]], rates: list[float], decays: tuple[float, float],
                    t_of: Callable[[int], int] = lambda step: step, keep_state: bool = True,
                    ) -> list[list[torch.Tensor]]:
    """Every weight after each step of AdamW done by hand, with the slips the checker names:
    decays (on the matrices, on the vectors), the step number t_of(step), m and v kept or not."""
    from helpers.training.by_hand import adamw_update

    params = [p.detach().clone() for p in (*matrices, *vectors)]
    state = [(torch.zeros_like(p), torch.zeros_like(p)) for p in params]
    after = []
    for step, (grad, lr) in enumerate(zip(grads, rates, strict=True), start=1):
        for i, p in enumerate(params):
            m, v = state[i] if keep_state else (torch.zeros_like(p), torch.zeros_like(p))
            decay = decays[0] if i < len(matrices) else decays[1]
            params[i], m, v = adamw_update(p, grad[i], m, v, t_of(step), lr, HAND_BETAS, 1e-8, decay)
            state[i] = (m, v)
        after.append([p.clone() for p in params])
    return after


def sampling_probabilities(logits: torch.Tensor, temperature: float, top_k: int | None) -> torch.Tensor:
    """The distribution a sampler should draw from: logits (V,) -> probabilities (V,), float64."""
    scaled = logits.double() / temperature
    if top_k is not None:
        scaled = scaled.masked_fill(scaled < scaled.topk(top_k).values[-1], float("-inf"))
    return scaled.softmax(-1)


class FixedLogits(torch.nn.Module):
    """A stand-in language model whose logits are `table[position]` at every row: ids (B, N) ->
    (B, N, V), so that the distribution a sampler draws from is known and sharp."""

    def __init__(self, table: torch.Tensor) -> None:
        super().__init__()
        self.table = table
        self.config = gpt.GPTConfig(vocab_size=table.shape[1], context_length=table.shape[0], n_layers=1,
                                    n_heads=1, d_model=4)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if ids.shape[1] > self.config.context_length:
            raise ValueError(f"ids has {ids.shape[1]} tokens, more than context_length "
                             f"{self.config.context_length}")
        return self.table[:ids.shape[1]].expand(ids.shape[0], -1, -1)


def call_sampler(student: Callable, model: gpt.GPT, prompt: torch.Tensor, n_new: int, **settings) -> torch.Tensor:
    """The student's ids, checked to be the prompt followed by n_new tokens."""
    try:
        with torch.no_grad():
            got = student(model, prompt.clone(), n_new, **settings)
    except ValueError as error:
        if "context_length" in str(error):
            raise ExerciseFailed(f"after {prompt.shape[1]} prompt tokens and more new ones the sequence "
                                 "outgrew the model's context of 8, and the model refused it",
                                 fix="before each step keep only the last context_length tokens of "
                                     "the sequence for the model to read.") from None
        raise
    want = (prompt.shape[0], prompt.shape[1] + n_new)
    if not isinstance(got, torch.Tensor):
        raise ExerciseFailed(f"the result is a {type(got).__name__}, expected a tensor of ids {want}",
                             fix="return the whole sequence: the prompt followed by the new tokens.")
    if tuple(got.shape) == (prompt.shape[0], n_new):
        raise ExerciseFailed(f"the result has shape {tuple(got.shape)}: the new tokens only",
                             fix="return the prompt followed by the new tokens, as generate does.")
    if tuple(got.shape) != want:
        raise ExerciseFailed(f"with a prompt {tuple(prompt.shape)} and {n_new} new tokens the result has "
                             f"shape {tuple(got.shape)}, expected {want}",
                             fix="append one token per row at each step, along the token axis.")
    if not torch.equal(got[:, :prompt.shape[1]], prompt):
        raise ExerciseFailed("the result does not start with the prompt",
                             fix="keep the prompt and append each new token after it.")
    return got

