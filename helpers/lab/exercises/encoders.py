"""Exercises of notebook 10 (encoders): the cross-attention shapes, a source padding mask, one
beam-search step, BERT's 80/10/10 corruption of a batch."""

from __future__ import annotations

from collections.abc import Callable

import torch

from helpers.lab.exercises import ExerciseFailed, exercise, expect_close


@exercise(hint="Queries come from the target tokens, keys and values from the source tokens; "
               "each head works in D // H features; the weights pair every query with every key; "
               "the output has one vector of width D per target token.",
          task="Write cross_attention_shapes(b, n, m, d, h) returning the shapes of q, k, v, the "
               "weights and the output. The check tries two sets of sizes, with n != m.")
def cross_attention_shapes(student: Callable[[int, int, int, int, int], dict]) -> str:
    for b, n, m, d, h in ((2, 5, 7, 16, 4), (1, 9, 3, 12, 3)):
        got = student(b, n, m, d, h)
        expected = {"q": (b, h, n, d // h), "k": (b, h, m, d // h), "v": (b, h, m, d // h),
                    "weights": (b, h, n, m), "output": (b, n, d)}
        if not isinstance(got, dict) or set(got) != set(expected):
            raise ExerciseFailed(f"return a dict with the keys {sorted(expected)}, got {got!r}.")
        for name, shape in expected.items():
            if tuple(got[name]) != shape:
                extra = " Keys and values come from the source (M tokens)." if name in "kv" else ""
                raise ExerciseFailed(f"with B={b}, N={n}, M={m}, D={d}, H={h}, {name} should be "
                                     f"{shape}, got {tuple(got[name])}.{extra}")
    return "Those are the USF notes' shapes, with a batch and a head axis in front."


@exercise(hint="True marks a real token (not padding); two axes of size 1 between the batch and "
               "the keys let one mask serve every head and every query.",
          task="Write source_key_mask(source, pad_id) returning the decoder's mask over the source "
               "keys. The check tries a batch with padded rows and checks dtype, shape and values.")
def source_key_mask(student: Callable[[torch.Tensor, int], torch.Tensor]) -> str:
    source = torch.tensor([[5, 6, 7, 0, 0], [8, 0, 0, 0, 0], [3, 4, 5, 6, 9]])
    got = student(source, 0)
    expected = (source != 0)[:, None, None, :]
    if not isinstance(got, torch.Tensor):
        raise ExerciseFailed(f"return a tensor, got {type(got).__name__}.")
    if got.dtype != torch.bool:
        raise ExerciseFailed(f"the mask should be torch.bool (True = may attend), got {got.dtype}.")
    if got.shape != expected.shape:
        raise ExerciseFailed(f"the mask should have shape (B, 1, 1, M) = {tuple(expected.shape)}, "
                             f"got {tuple(got.shape)}.")
    if torch.equal(got, ~expected):
        raise ExerciseFailed("True and False are swapped: True marks the real tokens, which may be attended.")
    if not torch.equal(got, expected):
        raise ExerciseFailed("some positions are wrong: only the padding id should be False.")
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
                    "table, so a strong prefix may give several children and a weak one none. "
                    "Flatten the table before topk.")
    return None


@exercise(hint="Every child's score is its prefix's score plus the new word's log-probability; "
               "the beam keeps the `width` best children over all prefixes together, and each "
               "child's flat index says which row and which token it came from.",
          task="Write beam_step(scores, log_probs, width) returning the kept children's scores, "
               "their rows and their tokens. The check compares with a search over every child, "
               "including a beam where one prefix keeps several children.")
def beam_step(student: Callable[[torch.Tensor, torch.Tensor, int], tuple]) -> str:
    generator = torch.Generator().manual_seed(0)
    scores = torch.tensor([-0.5, -1.0, -2.5])
    log_probs = torch.randn(3, 6, generator=generator).log_softmax(dim=-1)
    total = scores[:, None] + log_probs
    for width in (1, 3, 4):
        got = student(scores, log_probs, width)
        if not isinstance(got, tuple) or len(got) != 3:
            raise ExerciseFailed(f"return (new_scores, rows, tokens), got {got!r}.")
        best, flat = total.flatten().topk(width)
        new_scores, rows, tokens = got
        alone = log_probs.flatten().topk(width).values
        if isinstance(new_scores, torch.Tensor) and new_scores.shape == alone.shape and \
                torch.allclose(new_scores, alone):
            raise ExerciseFailed("add each prefix's score to its row of log_probs before choosing: "
                                 "a child's score is its prefix's score plus the new word's log-probability.")
        mistake = _per_row_mistake(new_scores, total, width)
        if mistake:
            raise ExerciseFailed(f"with width {width}, {mistake}")
        expect_close(new_scores, best, f"the new scores with width {width}")
        rows, tokens = torch.as_tensor(rows), torch.as_tensor(tokens)
        if torch.equal(rows, flat // 6) and torch.equal(tokens, flat % 6):
            continue
        if torch.equal(rows, flat % 6) and torch.equal(tokens, flat // 6):
            raise ExerciseFailed("rows and tokens are swapped: the row is index // V, the token index % V.")
        raise ExerciseFailed(f"with width {width} the rows should be {(flat // 6).tolist()} and the "
                             f"tokens {(flat % 6).tolist()}, got {rows.tolist()} and {tokens.tolist()}.")
    return "That is one step of helpers.families.seq2seq.beam_search."


def _mask_batch() -> tuple[torch.Tensor, int, int, int, int]:
    """A large batch (real words 4..49, padding 0 at the rows' ends), <mask> = 1, 4 specials."""
    gen = torch.Generator().manual_seed(10)
    ids = torch.randint(4, 50, (300, 60), generator=gen)
    lengths = torch.randint(20, 61, (300,), generator=gen)
    ids[torch.arange(60)[None, :] >= lengths[:, None]] = 0
    return ids, 1, 50, 4, 0


def _share(part: torch.Tensor, whole: torch.Tensor) -> float:
    return (part.sum() / whole.sum().clamp(min=1)).item()


@exercise(hint="Pick each real token with probability rate; labels are the ids where picked, IGNORE "
               "elsewhere. One more uniform draw per position splits the picked ones: below 0.8 "
               "<mask>, from 0.8 to 0.9 a random word from first_word_id..vocab_size - 1, the rest "
               "unchanged. Draw everything with generator=generator.",
          task="Write my_mask_tokens(ids, mask_id, vocab_size, first_word_id, generator, rate, pad_id) "
               "returning (inputs, labels) as BERT corrupts a batch. The check counts the shares on "
               "a batch of 18 000 tokens, the labels, the padding, and that the generator decides.")
def mask_tokens(student: Callable[..., tuple[torch.Tensor, torch.Tensor]]) -> str:
    from helpers.families.mlm import IGNORE
    ids, mask_id, vocab_size, first_word, pad_id = _mask_batch()
    got = student(ids.clone(), mask_id, vocab_size, first_word, torch.Generator().manual_seed(1), 0.15, pad_id)
    if not isinstance(got, tuple) or len(got) != 2 or not all(isinstance(t, torch.Tensor) for t in got):
        raise ExerciseFailed("return two tensors, (inputs, labels).")
    inputs, labels = got
    for name, tensor in (("inputs", inputs), ("labels", labels)):
        if tensor.shape != ids.shape or tensor.dtype != ids.dtype:
            raise ExerciseFailed(f"{name} has shape {tuple(tensor.shape)} and dtype {tensor.dtype}, "
                                 f"expected ids' {tuple(ids.shape)} and {ids.dtype}.")
    real, picked = ids != pad_id, labels != IGNORE
    if picked.all() or torch.equal(labels, ids):
        raise ExerciseFailed("labels are the ids everywhere: they should be IGNORE (-100) where a token "
                             "was not picked, so that the loss counts the picked tokens only.")
    if not torch.equal(labels[picked], ids[picked]):
        raise ExerciseFailed("where a token is picked its label should be the original id (the word "
                             "to predict), not the corrupted input.")
    if (picked & ~real).any():
        raise ExerciseFailed("padding positions were picked: only real tokens (ids != pad_id) may be.")
    if not torch.equal(inputs[~picked], ids[~picked]):
        raise ExerciseFailed("tokens that were not picked were changed: only the picked ones are corrupted.")
    share = _share(picked, real)
    if abs(share - 0.15) > 0.012:
        raise ExerciseFailed(f"{share:.1%} of the real tokens were picked, expected about 15 % (rate).")
    masked = picked & (inputs == mask_id)
    kept = picked & (inputs == ids)
    randomised = picked & ~masked & ~kept
    shares = {"<mask>": _share(masked, picked), "random": _share(randomised, picked), "kept": _share(kept, picked)}
    said = ", ".join(f"{name} {value:.0%}" for name, value in shares.items())
    if abs(shares["<mask>"] - 0.8) > 0.03 or abs(shares["random"] - 0.1) > 0.025 or abs(shares["kept"] - 0.1) > 0.025:
        raise ExerciseFailed(f"the mask token 80 % / random 10 % / keep 10 % proportions are off: of the "
                             f"picked tokens you made {said}.")
    if (inputs[randomised] < first_word).any() or (inputs[randomised] >= vocab_size).any():
        raise ExerciseFailed("some random replacements are special tokens or outside the vocabulary: "
                             "draw them from first_word_id to vocab_size - 1.")
    again = student(ids.clone(), mask_id, vocab_size, first_word, torch.Generator().manual_seed(1), 0.15, pad_id)
    other = student(ids.clone(), mask_id, vocab_size, first_word, torch.Generator().manual_seed(2), 0.15, pad_id)
    if not (torch.equal(again[0], inputs) and torch.equal(again[1], labels)) or torch.equal(other[0], inputs):
        raise ExerciseFailed("the same generator seed should give the same corruption and another seed "
                             "another: draw every random number with generator=generator.")
    return f"Of the picked tokens: {said}. The model cannot tell which inputs to trust."
