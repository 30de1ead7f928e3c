"""Beyond one machine: processes, collectives and the parallelisms (notebook 11).

Built on `helpers.model`; each parallel version is proven equal to one process.

    workers          local processes with gloo, collectives, clean failures
    cell_functions   a function defined in a notebook cell, sent to the workers as source
    data_parallel    data parallelism by hand: all-reduce, bucketed hooks, torchrun entry
    sharded          ZeRO-1 by hand: each rank keeps the optimizer state of its shard
    tensor_parallel  column- and row-parallel MLP, attention heads split across ranks
    parallelism      what each kind of parallelism splits and sends, in bytes per step
    expert_parallel  experts split across ranks, tokens sent by all-to-all (notebook 12)
    fsdp             FSDP (ZeRO-3) by hand: flat shards all-gathered per unit, gradients
                     reduce-scattered, AdamW on the shard; the ZeRO paper's memory table
    fsdp_module      the same as a wrapper for any nn.Module (FSDP(module, compute_dtype,
                     units)), which any torch.optim optimizer steps
    zero             ZeRO-1 around any optimizer class (ShardedOptimizer)
    any_model        the wrappers on models the course did not write, against fully_shard,
                     one process and the unsharded optimizer
    pipeline         the blocks split into stages, GPipe and 1F1B with point-to-point sends,
                     their timeline and bubble, measured
    ring_attention   context parallelism: key/value blocks around a ring, the online softmax,
                     the zig-zag split for causal attention
    recompute        gradient accumulation and activation recomputation: saved bytes and time
"""
