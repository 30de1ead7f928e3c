"""The paged KV cache: keys and values in fixed-size blocks, found through a block table.

Defined in notebook 14, "Serving the model", sections 3 (pages) and 5 (prefix sharing), in
vLLM's words (the PagedAttention paper):

    block           block_size token slots of every layer's keys and values
    block table     per sequence, the list of its blocks: token t lives in block
                    table[t // block_size], slot t % block_size (`lookup`)
    free pool       the blocks no sequence holds; a sequence takes one when its last fills up
    copy on write   sequences may share blocks (a common prompt, `fork`); a shared block is
                    copied before one of them writes into it, so the others never see the write

    PagedKVCache    the pool, the tables, reference counts; `store_hook` is the `kv_store` the
                    blocks call, `forward` feeds a batch of sequences through a GPT
    contiguous_waste / paged_waste   token slots reserved but unused, for a mix of lengths

The cache owns its state (tables, lengths, free pool); tests/serve/test_paged.py proves its logits
equal the contiguous cache's. Shapes: B batch, n new tokens, M keys, L = n_layers,
H_KV key/value heads, D_H = head_dim.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Hashable, Sequence

import torch
from torch import Tensor, nn

from helpers import checks
from helpers.model.multihead import KVStore
from helpers.serve.batching import forward_rows


def lookup(block_table: Sequence[int], position: int, block_size: int) -> tuple[int, int]:
    """Where token `position` of a sequence lives: (block id, slot within the block)."""
    block_size = checks.positive_int("block_size", block_size)
    position = checks.non_negative_int("position", position)
    if position // block_size >= len(block_table):
        raise ValueError(f"position {position} needs block {position // block_size} of the "
                         f"sequence, but its block table holds {len(block_table)} blocks")
    return block_table[position // block_size], position % block_size


class PagedKVCache:
    """Keys and values of many sequences in a shared pool of blocks.

    keys, values: (L, n_blocks, H_KV, block_size, D_H). A sequence is a block table (list of
    block ids) and a length; `ref_counts[b]` says how many tables hold block b.
    """

    def __init__(self, n_layers: int, n_kv_heads: int, head_dim: int, block_size: int,
                 n_blocks: int, dtype: torch.dtype = torch.float32) -> None:
        for name, value in (("n_layers", n_layers), ("n_kv_heads", n_kv_heads),
                            ("head_dim", head_dim), ("block_size", block_size),
                            ("n_blocks", n_blocks)):
            checks.positive_int(name, value)
        shape = (n_layers, n_blocks, n_kv_heads, block_size, head_dim)
        self.keys, self.values = torch.zeros(shape, dtype=dtype), torch.zeros(shape, dtype=dtype)
        self.block_size, self.n_blocks = block_size, n_blocks
        self.free: deque[int] = deque(range(n_blocks))
        self.ref_counts = [0] * n_blocks
        self.tables: dict[Hashable, list[int]] = {}
        self.lengths: dict[Hashable, int] = {}
        self.copies = 0  # blocks copied on write, for the notebook's count

    @classmethod
    def for_model(cls, model: nn.Module, block_size: int, n_blocks: int) -> PagedKVCache:
        attn = model.blocks[0].attn
        return cls(len(model.blocks), attn.n_kv_heads, attn.head_dim, block_size, n_blocks,
                   model.lm_head.weight.dtype)

    # --- sequences and blocks ---------------------------------------------------------------
    def add_sequence(self, seq: Hashable) -> None:
        if seq in self.tables:
            raise ValueError(f"sequence {seq!r} is already in the cache")
        self.tables[seq], self.lengths[seq] = [], 0

    def fork(self, parent: Hashable, child: Hashable) -> None:
        """`child` starts as a copy of `parent`, sharing every block (no data is copied)."""
        self._known(parent)
        self.add_sequence(child)
        self.tables[child] = list(self.tables[parent])
        self.lengths[child] = self.lengths[parent]
        for block in self.tables[child]:
            self.ref_counts[block] += 1

    def free_sequence(self, seq: Hashable) -> None:
        """Forget `seq`; each of its blocks no other sequence holds goes back to the free pool."""
        self._known(seq)
        for block in self.tables.pop(seq):
            self.ref_counts[block] -= 1
            if self.ref_counts[block] == 0:
                self.free.append(block)
        del self.lengths[seq]

    def blocks_needed(self, n_tokens: int) -> int:
        return math.ceil(checks.non_negative_int("n_tokens", n_tokens) / self.block_size)

    def blocks_in_use(self) -> int:
        return self.n_blocks - len(self.free)

    def reserve(self, seq: Hashable, n_new: int) -> None:
        """Make room for n_new more tokens of `seq`: take blocks from the free pool, and copy the
        last block first if another sequence shares it (copy on write)."""
        self._known(seq)
        length, table = self.lengths[seq], self.tables[seq]
        if length % self.block_size and self.ref_counts[table[-1]] > 1:
            table[-1] = self._copy(table[-1])
        missing = self.blocks_needed(length + n_new) - len(table)
        if missing > len(self.free):
            raise ValueError(f"sequence {seq!r} needs {missing} more blocks of {self.block_size} "
                             f"tokens for {n_new} new tokens, but only {len(self.free)} of "
                             f"{self.n_blocks} are free: the request is longer than the cache")
        for _ in range(missing):
            table.append(self._take())

    def _take(self) -> int:
        block = self.free.popleft()
        self.ref_counts[block] = 1
        return block

    def _copy(self, block: int) -> int:
        if not self.free:
            raise ValueError("copy on write needs a free block, and none is left")
        fresh = self._take()
        self.keys[:, fresh], self.values[:, fresh] = self.keys[:, block], self.values[:, block]
        self.ref_counts[block] -= 1
        self.copies += 1
        return fresh

    def _known(self, seq: Hashable) -> None:
        if seq not in self.tables:
            raise KeyError(f"sequence {seq!r} is not in the cache (known: {list(self.tables)[:8]})")

    # --- the attention's view ---------------------------------------------------------------
    def store_hook(self, layer: int, seqs: Sequence[Hashable]) -> KVStore:
        """The `kv_store` of `layer` for a batch of sequences, each feeding n new tokens.

        It writes the new keys and values (B, H_KV, n, D_H) into their slots and returns every
        sequence's keys and values, gathered from its blocks and padded to the longest: (B,
        H_KV, M, D_H) with M = the most blocks any sequence holds x block_size.
        """
        def store(keys: Tensor, values: Tensor) -> tuple[Tensor, Tensor]:
            n = keys.shape[2]
            where = [lookup(self.tables[s], self.lengths[s] + i, self.block_size)
                     for s in seqs for i in range(n)]
            blocks, slots = (torch.tensor(column) for column in zip(*where, strict=True))
            flat = lambda t: t.permute(0, 2, 1, 3).reshape(-1, *t.shape[1:2], t.shape[3])  # noqa: E731
            self.keys[layer, blocks, :, slots] = flat(keys)      # (B n, H_KV, D_H) into slots
            self.values[layer, blocks, :, slots] = flat(values)
            return self._gather(self.keys[layer], seqs), self._gather(self.values[layer], seqs)
        return store

    def _gather(self, pool: Tensor, seqs: Sequence[Hashable]) -> Tensor:
        """pool (n_blocks, H_KV, S, D_H) -> (B, H_KV, M, D_H): each sequence's blocks, in order."""
        width = max(len(self.tables[s]) for s in seqs)
        index = torch.tensor([self.tables[s] + [0] * (width - len(self.tables[s])) for s in seqs])
        blocks = pool[index]  # (B, width, H_KV, S, D_H); padding blocks are masked out
        b, w, h, s, d = blocks.shape
        return blocks.permute(0, 2, 1, 3, 4).reshape(b, h, w * s, d)

    @torch.no_grad()
    def forward(self, model: nn.Module, seqs: Sequence[Hashable], token_ids: Tensor) -> Tensor:
        """Feed token_ids (B, n), the next n tokens of each sequence in `seqs`: logits (B, n, V).

        Query i of sequence b sits at position lengths[b] + i and sees keys 0 ... lengths[b] + i.
        """
        if token_ids.dim() != 2 or token_ids.shape[0] != len(seqs):
            raise ValueError(f"token_ids has shape {tuple(token_ids.shape)}, expected "
                             f"({len(seqs)}, n): one row per sequence")
        n = token_ids.shape[1]
        for seq in seqs:
            self.reserve(seq, n)
        starts = torch.tensor([self.lengths[s] for s in seqs]).view(-1, 1)   # (B, 1)
        positions = starts + torch.arange(n)                                 # (B, n)
        width = max(len(self.tables[s]) for s in seqs) * self.block_size
        mask = torch.arange(width).view(1, 1, -1) <= positions.unsqueeze(-1)  # (B, n, M)
        stores = [self.store_hook(layer, seqs) for layer in range(len(model.blocks))]
        logits = forward_rows(model, token_ids, positions, mask, stores)
        for seq in seqs:
            self.lengths[seq] += n
        return logits


def contiguous_waste(lengths: Sequence[int], max_length: int) -> int:
    """Slots reserved but unused when each request gets max_length slots up front."""
    checks.positive_int("max_length", max_length)
    if any(length > max_length for length in lengths):
        raise ValueError(f"a request of {max(lengths)} tokens is longer than max_length = {max_length}")
    return sum(max_length - length for length in lengths)


def paged_waste(lengths: Sequence[int], block_size: int) -> int:
    """Slots reserved but unused with pages: only the unfilled end of each last block."""
    checks.positive_int("block_size", block_size)
    return sum(-length % block_size for length in lengths)
