"""Exercises of notebook 10 (encoders): the cross-attention shapes, cross-attention by hand (core),
a source padding mask, one beam-search step, BERT's 80/10/10 corruption of a batch (core)."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from helpers.lab.exercises import (
    ExerciseFailed,
    exercise,
    expect_close,
    hidden_round,
    reseed,
    seeded,
)
from helpers.model.multihead import MultiHeadAttention


@exercise(hint="Queries come from the target tokens, keys and values from the source tokens; "
               "each head works in the width divided by the number of heads; the weights pair "
               "every query with every key; the output has one full-width vector per target token.",
          task="Write cross_attention_shapes(b, n, m, d, h) returning the shapes of q, k, v, the "
               "weights and the output. The check tries two sets of sizes, with n != m.")
def cross_attention_shapes(student: Callable[[int, int, int, int, int], dict]) -> str:
    cases = ((2, 5, 7, 16, 4), (1, 9, 3, 12, 3))
    if hidden_round():  # sizes drawn from the hidden seed, one source token included
        b, n, m, per_head, h = torch.randint(1, 10, (5,), generator=seeded(21)).tolist()
        cases = ((b, n, m, per_head * h, h), (3, 4, 1, 8, 2)) + cases
    for b, n, m, d, h in cases:
        got = student(b, n, m, d, h)
        expected = {"q": (b, h, n, d // h), "k": (b, h, m, d // h), "v": (b, h, m, d // h),
                    "weights": (b, h, n, m), "output": (b, n, d)}
        if not isinstance(got, dict) or set(got) != set(expected):
            raise ExerciseFailed(f"you returned {got!r}, not a dict with the keys {sorted(expected)}.",
                                 fix="return a dict with exactly those five keys, each a shape tuple.")
        for name, shape in expected.items():
            if tuple(got[name]) != shape:
                extra = " Keys and values come from the source (M tokens)." if name in "kv" else ""
                raise ExerciseFailed(f"with B={b}, N={n}, M={m}, D={d}, H={h}, {name} should be "
                                     f"{shape}, got {tuple(got[name])}.",
                                     fix=f"ask which sequence feeds {name}, and how many features one "
                                     f"head has.{extra}")
    return "Those are the USF notes' shapes, with a batch and a head axis in front."


CrossAttention = Callable[[MultiHeadAttention, torch.Tensor, torch.Tensor, "torch.Tensor | None"], torch.Tensor]


def cross_attention_variant(layer: MultiHeadAttention, x: torch.Tensor, memory: torch.Tensor,
                            key_mask: torch.Tensor | None = None, mistake: str = "") -> torch.Tensor:
    """Cross-attention by hand with `layer`'s projections, right or with one named `mistake` (the
    checker compares a wrong answer with each): x (B, N, D) target, memory (B, M, D) source,
    key_mask (B, 1, 1, M) True on real source tokens -> (B, N, D)."""
    b, n, d = x.shape
    m, h = memory.shape[1], layer.n_heads
    d_h = d // h
    q = layer.q_proj(x).view(b, n, h, d_h).transpose(1, 2)                 # (B, H, N, D_H)
    k = layer.k_proj(memory).view(b, m, h, d_h).transpose(1, 2)            # (B, H, M, D_H)
    v = layer.v_proj(memory).view(b, m, h, d_h).transpose(1, 2)
    scale = {"no scale": 1.0, "scale by D": math.sqrt(d)}.get(mistake, math.sqrt(d_h))
    scores = q @ k.transpose(-2, -1) / scale                               # (B, H, N, M)
    if key_mask is not None and mistake != "mask ignored":
        scores = scores.masked_fill(~key_mask, -math.inf)
    weights = scores.softmax(dim=-2 if mistake == "softmax over queries" else -1)
    heads = weights @ v                                                    # (B, H, N, D_H)
    merged = heads.reshape(b, n, d) if mistake == "no transpose" else heads.transpose(1, 2).reshape(b, n, d)
    return merged if mistake == "no out_proj" else layer.out_proj(merged)


CROSS_ATTENTION_MISTAKES = {  # mistake: (what is wrong, how to fix it)
    "no scale": ("the scores are not scaled: softmax(Q K^T) instead of softmax(Q K^T / sqrt(D_H)).",
                 "divide the scores by the square root of one head's width."),
    "scale by D": ("the scores are divided by the square root of the model's width D.",
                   "divide by the square root of one head's width, D_H = D / H, the width of the "
                   "vectors whose dot products they are."),
    "softmax over queries": ("the softmax runs over the queries: each target token's weights must "
                             "sum to 1 over the source tokens.",
                             "take the softmax along the last axis, the keys."),
    "mask ignored": ("the padded source tokens still receive attention: the key mask is ignored.",
                     "set the scores of masked keys to minus infinity before the softmax."),
    "no out_proj": ("the heads are merged but not projected: the layer ends with its output "
                    "projection.", "pass the merged heads through the layer's out_proj."),
    "no transpose": ("the heads were merged by a reshape alone, which mixes tokens with heads.",
                     "move the head axis back behind the token axis before reshaping to (B, N, D)."),
}


@exercise(hint="The queries are projected from the target, the keys and values from the source; "
               "each is split into heads. Scores are scaled dot products between every query and "
               "every key; masked keys get minus infinity; a softmax over the keys gives the "
               "weights; the weighted values are merged back into one vector per target token and "
               "projected once more.",
          task="Write my_cross_attention(layer, x, memory, key_mask) with the layer's q_proj, k_proj, "
               "v_proj and out_proj. The check compares with MultiHeadAttention(x, context=memory, "
               "mask=key_mask), with and without padded source tokens.",
          points=3,
          forbidden=("torch.nn.functional.scaled_dot_product_attention",
                     "helpers.model.multihead.MultiHeadAttention.forward",
                     "helpers.model.attention.scaled_dot_product_attention"))
def cross_attention(student: CrossAttention) -> str:
    """student(layer, x, memory, key_mask) -> (B, N, D) must equal the layer with context=memory."""
    with torch.random.fork_rng(devices=[]):  # the student's random stream stays untouched
        reseed(10)
        layer = MultiHeadAttention(16, 4)
    gen = seeded(100)
    x, memory = torch.randn(2, 5, 16, generator=gen), torch.randn(2, 7, 16, generator=gen)
    key_mask = torch.ones(2, 1, 1, 7, dtype=torch.bool)
    key_mask[1, ..., 4:] = False  # the second source sentence has 3 padding tokens
    with torch.no_grad():
        for mask, what in ((None, "without a mask"), (key_mask, "with padded source tokens")):
            expected = layer(x, context=memory, mask=mask)
            got = student(layer, x.clone(), memory.clone(), mask)
            if isinstance(got, torch.Tensor) and got.shape == (2, 7, 16):
                raise ExerciseFailed("your output has one vector per source token: the queries came "
                                     "from the source.", fix="project the queries from x, the target, "
                                     "and the keys and values from memory.")
            if isinstance(got, torch.Tensor) and got.shape == expected.shape and not torch.allclose(
                    got, expected, atol=1e-5):
                for mistake, (message, fix) in CROSS_ATTENTION_MISTAKES.items():
                    wrong = cross_attention_variant(layer, x, memory, mask, mistake)
                    if torch.allclose(got, wrong, atol=1e-5):
                        raise ExerciseFailed(f"{what}: {message}", fix=fix)
            expect_close(got, expected, f"the output {what}", atol=1e-5)
    return "Every target token now reads every source token directly, one head at a time."


@exercise(hint="True marks a real token (not padding); two axes of size 1 between the batch and "
               "the keys let one mask serve every head and every query.",
          task="Write source_key_mask(source, pad_id) returning the decoder's mask over the source "
               "keys. The check tries a batch with padded rows and checks dtype, shape and values.")
def source_key_mask(student: Callable[[torch.Tensor, int], torch.Tensor]) -> str:
    cases = [(torch.tensor([[5, 6, 7, 0, 0], [8, 0, 0, 0, 0], [3, 4, 5, 6, 9]]), 0)]
    if hidden_round():  # another padding id, random lengths, a row of padding only and one of no padding
        pad_id, lengths = 3, torch.randint(1, 7, (4,), generator=seeded(22)).tolist() + [0, 7]
        ids = torch.randint(4, 50, (len(lengths), 7), generator=seeded(23))
        cases.insert(0, (ids.masked_fill(torch.arange(7) >= torch.tensor(lengths)[:, None], pad_id), pad_id))
    for source, pad_id in cases:
        got = student(source, pad_id)
        expected = (source != pad_id)[:, None, None, :]
        if not isinstance(got, torch.Tensor):
            raise ExerciseFailed(f"you returned a {type(got).__name__}, not a tensor.",
                                 fix="compare the ids with the padding id, which gives a tensor.")
        if got.dtype != torch.bool:
            raise ExerciseFailed(f"the mask should be torch.bool (True = may attend), got {got.dtype}.",
                                 fix="a comparison gives booleans already: do not convert it to numbers.")
        if got.shape != expected.shape:
            raise ExerciseFailed(f"the mask should have shape (B, 1, 1, M) = {tuple(expected.shape)}, "
                                 f"got {tuple(got.shape)}.", fix="add two axes of size 1 between the batch "
                                 "axis and the key axis, one for the heads and one for the queries.")
        if torch.equal(got, ~expected):
            raise ExerciseFailed("True and False are swapped.", fix="True marks the real tokens, which may "
                                 "be attended: compare for 'not equal to the padding id'.")
        if not torch.equal(got, expected):
            raise ExerciseFailed("some positions are wrong.", fix="only the padding id should be False.")
    return "Every head and every query of the decoder now skips the padding."


def _per_row_mistake(new_scores: object, total: torch.Tensor, width: int) -> str | None:
    """Name the slip when the scores are the best `width` of each row, or each row's best only."""
    if not isinstance(new_scores, torch.Tensor) or not new_scores.is_floating_point():
        return None
    got = new_scores.detach().flatten().sort(descending=True).values
    per_row = total.topk(min(width, total.shape[1]), dim=1).values.flatten().sort(descending=True).values
    best_each = total.max(dim=1).values.sort(descending=True).values
    right = total.flatten().topk(min(width, total.numel())).values
    if got.shape == right.shape and torch.allclose(got, right):
        return None
    for candidate in (per_row, per_row[:width], best_each[:width]):
        if got.shape == candidate.shape and torch.allclose(got, candidate):
            return ("you chose the best children of each prefix separately (a per-row top-k, or each "
                    "row's best word): a beam keeps the `width` best children of the whole (k, V) "
                    "table, so a strong prefix may give several children and a weak one none.")
    return None


@exercise(hint="Every child's score is its prefix's score plus the new word's log-probability; "
               "the beam keeps the width best children over all prefixes together, and each "
               "child's position in the flattened table says which row and which token it came from.",
          task="Write beam_step(scores, log_probs, width) returning the kept children's scores, "
               "their rows and their tokens. The check compares with a search over every child, "
               "including a beam where one prefix keeps several children.")
def beam_step(student: Callable[[torch.Tensor, torch.Tensor, int], tuple]) -> str:
    generator = seeded(0)
    scores = torch.tensor([-0.5, -1.0, -2.5])
    log_probs = torch.randn(3, 6, generator=generator).log_softmax(dim=-1)
    total = scores[:, None] + log_probs
    for width in (1, 3, 4):
        got = student(scores, log_probs, width)
        if not isinstance(got, tuple) or len(got) != 3:
            raise ExerciseFailed(f"you returned {got!r}, not (new_scores, rows, tokens).",
                                 fix="return the three tensors together, separated by commas.")
        best, flat = total.flatten().topk(width)
        new_scores, rows, tokens = got
        alone = log_probs.flatten().topk(width).values
        if isinstance(new_scores, torch.Tensor) and new_scores.shape == alone.shape and \
                torch.allclose(new_scores, alone):
            raise ExerciseFailed("your scores are the words' log-probabilities alone, without their "
                                 "prefixes' scores.", fix="add each prefix's score to its row of "
                                 "log_probs before choosing: a child's score is its prefix's score "
                                 "plus the new word's log-probability.")
        mistake = _per_row_mistake(new_scores, total, width)
        if mistake:
            raise ExerciseFailed(f"with width {width}, {mistake}", fix="Flatten the table of "
                                 "children into one row before choosing the best, then recover each "
                                 "child's row and token from its position.")
        expect_close(new_scores, best, f"the new scores with width {width}")
        rows, tokens = torch.as_tensor(rows), torch.as_tensor(tokens)
        if torch.equal(rows, flat // 6) and torch.equal(tokens, flat % 6):
            continue
        if torch.equal(rows, flat % 6) and torch.equal(tokens, flat // 6):
            raise ExerciseFailed("rows and tokens are swapped.", fix="in the flattened table the row is "
                                 "the position divided by V (rounded down), the token the remainder.")
        raise ExerciseFailed(f"with width {width} the rows should be {(flat // 6).tolist()} and the "
                             f"tokens {(flat % 6).tolist()}, got {rows.tolist()} and {tokens.tolist()}.",
                             fix="in the flattened table the row is the position divided by V "
                             "(rounded down), the token the remainder.")
    return "That is one step of helpers.families.seq2seq.beam_search."


def _mask_batch() -> tuple[torch.Tensor, int, int, int, int]:
    """A large batch (real words 4..49, padding 0 at the rows' ends), <mask> = 1, 4 specials."""
    gen = seeded(10)
    ids = torch.randint(4, 50, (300, 60), generator=gen)
    lengths = torch.randint(20, 61, (300,), generator=gen)
    ids[torch.arange(60)[None, :] >= lengths[:, None]] = 0
    return ids, 1, 50, 4, 0


def _share(part: torch.Tensor, whole: torch.Tensor) -> float:
    return (part.sum() / whole.sum().clamp(min=1)).item()


@exercise(hint="Pick each real token with probability rate; the labels are the ids where picked "
               "and IGNORE elsewhere. One more uniform draw per position splits the picked ones: "
               "the lowest 80 percent become the mask token, the next 10 percent a random word "
               "that is not a special token, the rest stay. Draw every random number with the "
               "generator you are given.",
          points=3,
          task="Write my_mask_tokens(ids, mask_id, vocab_size, first_word_id, generator, rate, pad_id) "
               "returning (inputs, labels) as BERT corrupts a batch. The check counts the shares on "
               "a batch of 18 000 tokens, the labels, the padding, and that the generator decides.")
def mask_tokens(student: Callable[..., tuple[torch.Tensor, torch.Tensor]]) -> str:
    from helpers.families.mlm import IGNORE
    ids, mask_id, vocab_size, first_word, pad_id = _mask_batch()
    got = student(ids.clone(), mask_id, vocab_size, first_word, seeded(1), 0.15, pad_id)
    if not isinstance(got, tuple) or len(got) != 2 or not all(isinstance(t, torch.Tensor) for t in got):
        raise ExerciseFailed("you did not return two tensors.", fix="return (inputs, labels), both "
                             "shaped like ids.")
    inputs, labels = got
    for name, tensor in (("inputs", inputs), ("labels", labels)):
        if tensor.shape != ids.shape or tensor.dtype != ids.dtype:
            raise ExerciseFailed(f"{name} has shape {tuple(tensor.shape)} and dtype {tensor.dtype}, "
                                 f"expected ids' {tuple(ids.shape)} and {ids.dtype}.",
                                 fix=f"build {name} from ids (a copy with some entries replaced).")
    real, picked = ids != pad_id, labels != IGNORE
    if picked.all() or torch.equal(labels, ids):
        raise ExerciseFailed("labels are the ids everywhere.", fix="they should be IGNORE (-100) where "
                             "a token was not picked, so that the loss counts the picked tokens only.")
    if not torch.equal(labels[picked], ids[picked]):
        raise ExerciseFailed("where a token is picked its label is not the original id.", fix="take "
                             "the labels from ids (the word to predict), not from the corrupted input.")
    if (picked & ~real).any():
        raise ExerciseFailed("padding positions were picked.", fix="only real tokens, those not equal "
                             "to the padding id, may be picked.")
    if not torch.equal(inputs[~picked], ids[~picked]):
        raise ExerciseFailed("tokens that were not picked were changed.", fix="only the picked ones "
                             "are corrupted; every other input stays its id.")
    share = _share(picked, real)
    if abs(share - 0.15) > 0.012:
        raise ExerciseFailed(f"{share:.1%} of the real tokens were picked, expected about 15 % (rate).",
                             fix="pick a real token where a uniform draw falls below rate.")
    masked = picked & (inputs == mask_id)
    kept = picked & (inputs == ids)
    randomised = picked & ~masked & ~kept
    shares = {"<mask>": _share(masked, picked), "random": _share(randomised, picked), "kept": _share(kept, picked)}
    said = ", ".join(f"{name} {value:.0%}" for name, value in shares.items())
    if abs(shares["<mask>"] - 0.8) > 0.03 or abs(shares["random"] - 0.1) > 0.025 or abs(shares["kept"] - 0.1) > 0.025:
        raise ExerciseFailed(f"the mask token 80 % / random 10 % / keep 10 % proportions are off: of the "
                             f"picked tokens you made {said}.", fix="split the picked tokens by a "
                             "second uniform draw: below 0.8 the mask token, from 0.8 to 0.9 a random "
                             "word, the rest unchanged.")
    if (inputs[randomised] < first_word).any() or (inputs[randomised] >= vocab_size).any():
        raise ExerciseFailed("some random replacements are special tokens or outside the vocabulary.",
                             fix="draw them from first_word_id up to, not including, vocab_size.")
    again = student(ids.clone(), mask_id, vocab_size, first_word, seeded(1), 0.15, pad_id)
    other = student(ids.clone(), mask_id, vocab_size, first_word, seeded(2), 0.15, pad_id)
    if not (torch.equal(again[0], inputs) and torch.equal(again[1], labels)) or torch.equal(other[0], inputs):
        raise ExerciseFailed("the same generator seed does not give the same corruption, or another "
                             "seed gives the same.", fix="draw every random number with the "
                             "generator you are given (generator=generator).")
    return f"Of the picked tokens: {said}. The model cannot tell which inputs to trust."
