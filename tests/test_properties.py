"""Properties that must hold exactly, on every path and in every dtype, not only at a tolerance.

A fast path proven equal to the plain one at `atol=5e-2` cannot see a token that leaks through a
mask (at initialisation it moves the logits by less than that). These tests state what must be
bit-identical instead, on the plain, fused, bf16 and tiled paths alike:

- causality: changing a future token leaves every earlier output bit-identical;
- padding: changing the keys and values at padded positions changes nothing;
- ragged tiles: tiled attention equals plain attention for every remainder of N_q and N_k by the
  block, and every offset N_k - N_q, so the edge branches of the tiling run;

and, beside them, the configuration a run really uses (which parameters get weight decay, which
dtype the trainer picked) asserted with values other than the defaults.
"""

from __future__ import annotations

import math

import pytest
import torch

from helpers.flash.tiled import flash_attention, tiled_attention_fa1, tiled_attention_fa2
from helpers.model.attention import causal_mask, scaled_dot_product_attention
from helpers.model.gpt import GPT, GPTConfig
from helpers.model.kv_cache import KVCache
from helpers.model.modern import ModernConfig, ModernGPT, RopeTable
from helpers.model.multihead import MultiHeadAttention
from helpers.training.trainer import TrainConfig, Trainer

DTYPES = [torch.float32, torch.float64, torch.bfloat16]


def changed_at(ids: torch.Tensor, position: int, vocab_size: int) -> torch.Tensor:
    """ids (B, N) with the token at `position` replaced by another one in every row."""
    other = ids.clone()
    other[:, position] = (other[:, position] + 1) % vocab_size
    return other


def gpt(dtype: torch.dtype, **sizes) -> GPT:
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=31, context_length=16, n_layers=2, n_heads=2, d_model=32, **sizes)
    return GPT(config).to(dtype).eval()


# --- causality, exactly --------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("fast", [False, True], ids=["plain", "fused"])
@pytest.mark.parametrize("position", [1, 7, 15])
def test_a_future_token_leaves_every_earlier_logit_of_the_gpt_bit_identical(dtype, fast, position):
    model = gpt(dtype)
    ids = torch.randint(0, 31, (3, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        before = model(ids, fast=fast)
        after = model(changed_at(ids, position, 31), fast=fast)
    assert torch.equal(before[:, :position], after[:, :position])
    assert not torch.equal(before[:, position:], after[:, position:])  # the change is seen later


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("fast", [False, True], ids=["plain", "fused"])
def test_the_cached_forward_is_causal_exactly_too(dtype, fast):
    model = gpt(dtype)
    ids = torch.randint(0, 31, (2, 12), generator=torch.Generator().manual_seed(2))
    outputs = []
    for sequence in (ids, changed_at(ids, 8, 31)):
        cache = KVCache.for_model(model, batch_size=2)
        outputs.append(torch.cat([model.forward_cached(sequence[:, t:t + 1], cache, fast=fast)
                                  for t in range(12)], dim=1))
    assert torch.equal(outputs[0][:, :8], outputs[1][:, :8])
    assert not torch.equal(outputs[0][:, 8:], outputs[1][:, 8:])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n_kv_heads", [4, 2, 1], ids=["MHA", "GQA", "MQA"])
def test_a_future_token_leaves_the_modern_decoder_bit_identical(dtype, n_kv_heads):
    torch.manual_seed(0)
    model = ModernGPT(ModernConfig(vocab_size=29, context_length=16, n_layers=2, n_heads=4,
                                   n_kv_heads=n_kv_heads, d_model=32)).to(dtype).eval()
    ids = torch.randint(0, 29, (2, 16), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        before, after = model(ids), model(changed_at(ids, 10, 29))
    assert torch.equal(before[:, :10], after[:, :10])
    assert not torch.equal(before[:, 10:], after[:, 10:])


TILED_PATHS = {
    "fa1": lambda q, k, v, causal, mask=None: tiled_attention_fa1(q, k, v, mask=mask, causal=causal,
                                                                  block_q=4, block_k=4),
    "fa2": lambda q, k, v, causal, mask=None: tiled_attention_fa2(q, k, v, mask=mask, causal=causal,
                                                                  block_q=4, block_k=4)[0],
    "autograd": lambda q, k, v, causal, mask=None: flash_attention(q, k, v, mask=mask, causal=causal,
                                                                   block_q=4, block_k=4),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("path", list(TILED_PATHS))
def test_tiled_attention_is_causal_exactly(dtype, path):
    q, k, v = (torch.randn(2, 13, 8, dtype=dtype, generator=torch.Generator().manual_seed(s))
               for s in range(3))
    k2, v2 = k.clone(), v.clone()
    k2[:, 9], v2[:, 9] = torch.randn(8, dtype=dtype), torch.randn(8, dtype=dtype)
    with torch.no_grad():
        before = TILED_PATHS[path](q, k, v, True)
        after = TILED_PATHS[path](q, k2, v2, True)
    assert torch.equal(before[:, :9], after[:, :9]) and not torch.equal(before[:, 9:], after[:, 9:])


# --- padding, exactly ----------------------------------------------------------------------

def padding_mask(lengths: list[int], n: int) -> torch.Tensor:
    """(B, 1, N) bool: key j of row b is real when j < lengths[b]."""
    return (torch.arange(n)[None, :] < torch.tensor(lengths)[:, None])[:, None, :]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_padded_keys_change_nothing_in_plain_and_multihead_attention(dtype):
    n, lengths = 10, [10, 6, 3]
    mask = padding_mask(lengths, n)
    q, k, v = (torch.randn(3, n, 8, generator=torch.Generator().manual_seed(s)).to(dtype) for s in range(3))
    k2, v2 = k.clone(), v.clone()
    for row, length in enumerate(lengths):
        k2[row, length:] += 100.0  # anything at all in the padded slots
        v2[row, length:] -= 100.0
    assert torch.equal(scaled_dot_product_attention(q, k, v, mask)[0],
                       scaled_dot_product_attention(q, k2, v2, mask)[0])
    torch.manual_seed(0)
    mha = MultiHeadAttention(8, 2).to(dtype).eval()
    x, x2 = q, q.clone()
    for row, length in enumerate(lengths):
        x2[row, length:] = torch.randn(n - length, 8).to(dtype)
    with torch.no_grad():
        out, out2 = mha(x, mask=mask), mha(x2, mask=mask)
    for row, length in enumerate(lengths):  # the real queries see the real keys only
        assert torch.equal(out[row, :length], out2[row, :length])


@pytest.mark.parametrize("path", list(TILED_PATHS))
def test_padded_keys_change_nothing_in_tiled_attention(path):
    n, lengths = 11, [11, 5, 2]
    mask = padding_mask(lengths, n)
    q, k, v = (torch.randn(3, n, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(s))
               for s in range(3))
    k2, v2 = k.clone(), v.clone()
    for row, length in enumerate(lengths):
        k2[row, length:], v2[row, length:] = 50.0, -50.0
    with torch.no_grad():
        assert torch.equal(TILED_PATHS[path](q, k, v, False, mask), TILED_PATHS[path](q, k2, v2, False, mask))


# --- ragged tiles: every remainder and every causal offset ---------------------------------

@pytest.mark.parametrize("block_q,block_k", [(4, 4), (4, 8), (8, 4)])
def test_tiled_attention_equals_plain_attention_for_every_remainder_and_offset(block_q, block_k):
    generator = torch.Generator().manual_seed(0)
    for n_q in range(1, 2 * block_q + 2):
        for n_k in range(n_q, n_q + block_k + 2):  # causal needs n_k >= n_q; every offset mod block_k
            q = torch.randn(n_q, 8, dtype=torch.float64, generator=generator)
            k, v = (torch.randn(n_k, 8, dtype=torch.float64, generator=generator) for _ in range(2))
            for causal in (False, True):
                mask = causal_mask(n_q, n_k) if causal else None
                expected, _ = scaled_dot_product_attention(q, k, v, mask)
                fa1 = tiled_attention_fa1(q, k, v, causal=causal, block_q=block_q, block_k=block_k)
                fa2, _ = tiled_attention_fa2(q, k, v, causal=causal, block_q=block_q, block_k=block_k)
                for name, out in (("fa1", fa1), ("fa2", fa2)):
                    torch.testing.assert_close(out, expected, rtol=0, atol=1e-12,
                                               msg=f"{name} n_q={n_q} n_k={n_k} causal={causal}")


def test_the_tiled_backward_equals_autograd_on_ragged_sizes():
    generator = torch.Generator().manual_seed(1)
    for n_q, n_k in ((5, 5), (3, 7), (9, 14), (1, 6)):
        q = torch.randn(2, n_q, 8, dtype=torch.float64, generator=generator, requires_grad=True)
        k, v = (torch.randn(2, n_k, 8, dtype=torch.float64, generator=generator, requires_grad=True)
                for _ in range(2))
        grad_out = torch.randn(2, n_q, 8, dtype=torch.float64, generator=generator)
        tiled = torch.autograd.grad(flash_attention(q, k, v, causal=True, block_q=4, block_k=4),
                                    (q, k, v), grad_out)
        plain = torch.autograd.grad(scaled_dot_product_attention(q, k, v, causal_mask(n_q, n_k))[0],
                                    (q, k, v), grad_out)
        for name, a, b in zip("qkv", tiled, plain, strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-10, msg=f"d{name}, n_q={n_q} n_k={n_k}")


# --- configuration, asserted with values other than the defaults ---------------------------

@pytest.mark.parametrize("fast", [False, True])
def test_weight_decay_reaches_the_matrices_only_at_the_configured_value(fast):
    model = gpt(torch.float32)
    ids = torch.randint(0, 31, (500,), generator=torch.Generator().manual_seed(0))
    trainer = Trainer(model, ids, ids, TrainConfig(weight_decay=0.37, learning_rate=3e-3,
                                                   fast=fast, precision="fp32", batch_size=2))
    groups = trainer.optimizer.param_groups
    assert [g["weight_decay"] for g in groups] == [0.37, 0.0]
    assert all(g["lr"] == 3e-3 for g in groups)
    decayed = sum(p.numel() for p in groups[0]["params"])
    not_decayed = sum(p.numel() for p in groups[1]["params"])
    matrices = sum(p.numel() for p in model.parameters() if p.dim() >= 2)
    vectors = sum(p.numel() for p in model.parameters() if p.dim() < 2)
    assert (decayed, not_decayed) == (matrices, vectors)  # the tied matrix counted once


@pytest.mark.parametrize("precision,expected", [("fp32", torch.float32), ("bf16", torch.bfloat16)])
def test_the_trainer_computes_in_the_precision_asked_for(precision, expected):
    model = gpt(torch.float32)
    ids = torch.randint(0, 31, (500,), generator=torch.Generator().manual_seed(0))
    trainer = Trainer(model, ids, ids, TrainConfig(precision=precision, batch_size=2))
    assert trainer.dtype == expected
    assert next(trainer.working.parameters()).dtype == expected
    assert next(model.parameters()).dtype == torch.float32  # the weights AdamW updates stay float32


def test_config_values_other_than_the_defaults_reach_the_model():
    model = gpt(torch.float32, bias=False, tie_weights=False, activation="relu")
    assert all(p.dim() >= 2 for name, p in model.named_parameters()
               if ".attn." in name or ".mlp." in name)  # no bias anywhere in attention or MLP
    assert model.lm_head.weight is not model.embed.token.weight
    x = torch.tensor([[-1.0, 2.0]])
    assert torch.equal(model.blocks[0].mlp.activation(x), torch.relu(x))
    modern = ModernGPT(ModernConfig(vocab_size=29, context_length=16, n_layers=1, n_heads=4,
                                    n_kv_heads=2, d_model=32, norm_eps=1e-3, rope_base=500.0,
                                    mlp_hidden=48))
    block = modern.blocks[0]
    assert block.attn.n_kv_heads == 2 and block.attn.k_proj.weight.shape == (2 * 8, 32)
    assert {m.eps for m in modern.modules() if type(m).__name__ == "RMSNorm"} == {1e-3}
    assert torch.equal(modern.rope.cos, RopeTable.build(8, 16, 500.0).cos)  # theta's base 500
    assert not torch.equal(modern.rope.cos, RopeTable.build(8, 16, 10000.0).cos)
    assert block.mlp.gate.weight.shape == (48, 32)


# --- a beam-search fixture where the search itself decides the answer -----------------------

class ScriptedDecoder:
    """A stand-in encoder-decoder whose next-token probabilities depend on the prefix only.

    Tokens: 0 <pad>, 1 <bos>, 2 <eos>, 3 "A", 4 "B". After <bos>: A 0.6, B 0.4. After <bos> A:
    <eos> 0.30, A 0.36, B 0.34. After <bos> B: <eos> 0.95. Any longer prefix: <eos> 0.99.
    Greedy takes A, then A, then <eos>: 0.6 x 0.36 x 0.99 = 0.214. The best sequence, B <eos>,
    has 0.4 x 0.95 = 0.38, and only a search that keeps the second choice of step 1 finds it.
    """

    config = type("Config", (), {"target_vocab_size": 5, "pad_id": 0, "bos_id": 1, "eos_id": 2,
                                 "context_length": 16})()
    TABLE = {(1,): [0, 0, 0, 0.6, 0.4], (1, 3): [0, 0, 0.30, 0.36, 0.34], (1, 4): [0, 0, 0.95, 0.025, 0.025]}

    def encode(self, source: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.zeros(1, len(source), 4), torch.ones(1, len(source), dtype=torch.bool)

    def decode(self, prefixes: torch.Tensor, memory: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        rows = [self.TABLE.get(tuple(p), [0, 0, 0.99, 0.005, 0.005]) for p in prefixes.tolist()]
        probs = torch.tensor(rows, dtype=torch.float64).clamp_min(1e-12)
        return probs.log()[:, None, :].expand(-1, prefixes.shape[1], -1)  # (k, t, V) logits


def test_beam_search_finds_the_sequence_greedy_misses_over_several_steps():
    from helpers.families.seq2seq import beam_search

    model, source = ScriptedDecoder(), torch.tensor([5, 6, 7])
    greedy, greedy_logp = beam_search(model, source, beam_width=1, max_length=5)
    beam, beam_logp = beam_search(model, source, beam_width=2, max_length=5)
    assert greedy.tolist() == [3, 3, 2] and abs(greedy_logp - math.log(0.6 * 0.36 * 0.99)) < 1e-9
    assert beam.tolist() == [4, 2] and abs(beam_logp - math.log(0.4 * 0.95)) < 1e-9


# --- hand-written pieces against PyTorch's own, not only against themselves ----------------

def test_the_sharded_optimizer_on_one_rank_is_torchs_adamw():
    """ZeRO-1's AdamW, owning every parameter, takes the same steps as torch.optim.AdamW with
    decay on the matrices only (sharded-vs-one-rank tests prove the sharding, this the optimizer)."""
    from helpers.scale.sharded import ShardedAdamW

    ours, theirs = gpt(torch.float64), gpt(torch.float64)
    theirs.load_state_dict(ours.state_dict())
    hand = ShardedAdamW(ours.parameters(), rank=0, world_size=1, betas=(0.8, 0.95), eps=1e-7,
                        weight_decay=0.2)
    matrices = [p for p in theirs.parameters() if p.dim() >= 2]
    vectors = [p for p in theirs.parameters() if p.dim() < 2]
    reference = torch.optim.AdamW([{"params": matrices, "weight_decay": 0.2},
                                   {"params": vectors, "weight_decay": 0.0}],
                                  lr=3e-3, betas=(0.8, 0.95), eps=1e-7, foreach=False)
    generator = torch.Generator().manual_seed(0)
    for _ in range(4):
        ids = torch.randint(0, 31, (2, 16), generator=generator)
        for model in (ours, theirs):
            model.zero_grad(set_to_none=True)
            model(ids).logsumexp(-1).mean().backward()
        hand.step(lr=3e-3)
        reference.step()
    for (name, a), b in zip(ours.named_parameters(), theirs.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12, msg=name)
