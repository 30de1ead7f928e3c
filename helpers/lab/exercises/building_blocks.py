"""The course functions each exercise's answer may call: its building blocks.

An answer that calls any other function of the course's library fails its check by name
(watch.py): the grade counts what the student wrote. The building blocks of an exercise are the
course functions its own reference solution calls, the pieces of earlier notebooks it stands on
(the softmax of notebook 3 inside notebook 4's masked softmax), and the callables its checker
hands to the answer. The table is made by running every notebook's reference solutions with
COURSE_RECORD_CALLS set (see `helpers.lab.exercises.RECORD_CALLS`), and a test holds it to them.
"""

from __future__ import annotations

# Written by hand: course functions an exercise's text hands to the student although its reference
# solution happens not to call them, each with why (a method of an object the checker passes in, a
# function the notebook defines just above for the student to use).
INTERFACE: dict[str, tuple[str, ...]] = {
    # "merge_pair ... defined above", and the notebook shows it equal to the course's `merge`
    "tokenization.train_bpe": (
        "helpers.text.bpe.merge",
    ),
    # "split_heads and merge_heads (yours from above, or the course's) may help"
    "multihead_attention.mha_forward": (
        "helpers.model.multihead.split_heads",
        "helpers.model.multihead.merge_heads",
    ),
    # "from its ln1, attn, ln2 and mlp": the parts of the Block the checker passes in
    "layers.block_forward": (
        "helpers.model.layers.LayerNorm.forward",
        "helpers.model.layers.FeedForward.forward",
    ),
}

BUILDING_BLOCKS: dict[str, tuple[str, ...]] = {
    'distributed.average_gradients': (
        'helpers.lab.exercises._ranks.ThreadRing.all_reduce.<locals>.all_reduce',
    ),
    'embeddings.lookup_by_product': (
        'helpers.lab.exercises.embeddings._RowsUnreadable.__torch_function__',
        'helpers.model.embeddings.one_hot',
    ),
    'flash_attention.merge_softmax_states': (
        'helpers.flash.tiled.exp_shifted',
    ),
    'flash_attention.tile_step': (
        'helpers.flash.tiled.exp_shifted',
    ),
    'frontier_decoder.moe_forward': (
        'helpers.lab.exercises.frontier_decoder._experts.<locals>.make.<locals>.expert',
    ),
    'gpt.hand_adamw': (
        'helpers.training.by_hand.adamw_update',
    ),
    'gpt.next_token_loss': (
        'helpers.model.gpt.GPT.forward',
    ),
    'gpt.sample_tokens': (
        'helpers.lab.exercises._gpt_runs.FixedLogits.forward',
        'helpers.model.gpt.GPT.forward',
    ),
    'layers.block_forward': (
        'helpers.model.multihead.MultiHeadAttention.forward',
    ),
    'masking.causal_softmax': (
        'helpers.model.attention.softmax',
    ),
    'modern_decoder.alibi_attention': (
        'helpers.model.modern.alibi_slopes',
    ),
    'multihead_attention.fuse_heads': (
        'helpers.model.multihead.MultiHeadAttention.__init__',
    ),
    'tokenization.encode_text': (
        'helpers.text.chars.pre_split',
    ),
    'tokenization.train_bpe': (
        'helpers.text.bpe.count_pairs',
        'helpers.text.bpe.most_frequent_pair',
        'helpers.text.chars.pre_split',
    ),
}
