# %% [markdown] slideshow={"slide_type": "slide"}
# # 11. Beyond one machine: data, optimizer-state and tensor parallelism
#
# Everything so far ran in one Python process. Inside it, a lot already happens in parallel: the
# batch, the heads, the positions and the query tiles are all one batched matrix product. Models
# that outgrow one device are trained by many processes, one per GPU, that exchange tensors with
# `torch.distributed`. This notebook starts two real processes on your CPU, joins them with the
# `gloo` backend, and builds the three splits every large training run combines, each proven
# equal to one process doing all the work.
#
# **After this notebook you can**
# - say what a rank, a world size and a process group are, run the four collectives (broadcast,
#   all-reduce, all-gather, reduce-scatter) and count the bytes of a ring all-reduce;
# - write data parallelism by hand (broadcast the weights, all-reduce the gradients), overlap the
#   communication with `backward()` using gradient buckets, and check it against PyTorch's DDP;
# - shard AdamW's state across ranks (ZeRO-1), measure the memory it saves per rank, and use
#   `ZeroRedundancyOptimizer` and FSDP's `fully_shard`;
# - wrap any model, not only the course's, in FSDP (with a bfloat16 compute dtype) and any
#   optimizer in ZeRO-1, each equal to PyTorch's own, and save and resume any training run exactly;
# - split an MLP (column-parallel, then row-parallel) and the attention heads across ranks;
# - answer the USF notes' question "What are the aspects of Transformer parallelization?" with a
#   table of what each kind of parallelism splits and sends, computed for GPT-2 small and GPT-3.
#
# **It assumes** notebook 7 (the GPT, the training step by hand, AdamW) and notebook 5 (heads).

# %% [setup]

# %% slideshow={"slide_type": "fragment"}
import inspect
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F

# %% slideshow={"slide_type": "fragment"}
import helpers

from helpers.scale.data_parallel import (
    TINY_GPT,
    Run,
    average_gradients,
    data_parallel,
    loss_of,
    make_batch,
    make_model,
    max_difference,
    train_bucketed,
    train_single,
)


# %% slideshow={"slide_type": "fragment"}
from helpers.scale.workers import (
    WorkerFailed,
    Workers,
    collectives_demo,
    fail_on_rank,
    ring_all_reduce,
    ring_all_reduce_by_hand,
    ring_all_reduce_bytes,
)
from helpers.lab.exercises import check, yours_or
from helpers.model.gpt import GPTConfig, exact_parameters
from helpers.scale.parallelism import (
    bubble_fraction,
    communication_per_step,
    fit_latency_bandwidth,
    memory_per_rank,
    readable_bytes,
    time_all_reduce_warm,
)
from helpers.scale.sharded import train_fsdp, train_zero_by_hand, train_zero_torch
from helpers.scale.tensor_parallel import demo_block, dtensor_mlp, tensor_parallel_block
from helpers.timing import format_duration
from helpers.lab.sections import catch_up

torch.set_num_threads(1)  # two processes will share the cores with this one

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 1. Processes that talk: ranks, a process group, collectives (core)
#
# A distributed job is `world_size` copies of the same program. Each copy, a **rank**
# (0, 1, ...), calls `torch.distributed.init_process_group(backend)`; they meet at an address
# (`MASTER_ADDR:MASTER_PORT`) and from then on can run **collectives**: operations that every rank
# calls at the same point with a tensor of the same shape. The backend moves the bytes: `nccl`
# between GPUs, `gloo` between CPU processes (it is what runs here).
#
# On a cluster, `torchrun --nproc_per_node 8 train.py` starts the copies and gives each its rank
# in environment variables. A notebook cannot be run eight times, so `helpers.scale.workers.Workers`
# does `torchrun`'s job from inside it: it **spawns** `world_size` fresh Python processes, gives
# them a free port, joins them into one gloo group and keeps them alive; `workers.run(fn, *args)`
# calls `fn(rank, world_size, *args)` on every rank and returns the results to this notebook in
# rank order, which prints them (so the output does not depend on which process finished first).
#
# Two things follow from *spawning*. Starting is slow: each process is a new Python that imports
# `torch` (the cell below times it). And `fn` must travel: a function of a module, such as
# `helpers`, goes by name and the new process imports it; a function defined in a notebook cell
# has no module there, so its source goes instead (with the modules and values it reads) and the
# worker runs it (`helpers.scale.cell_functions`). Your own functions can run on the workers.

# %% slideshow={"slide_type": "fragment"}
workers = Workers(world_size=2, timeout=120.0)
start = time.perf_counter()
results = workers.run(collectives_demo)
print(f"starting 2 processes and running the first task "
      f"{format_duration(time.perf_counter() - start)}")
for name in results[0]:
    print(f"{name}:")
    for rank, result in enumerate(results):
        print(f"    rank {rank}: {result[name]}")

# %% [markdown] slideshow={"slide_type": "subslide"}
# Read each collective off the output (the source is `collectives_demo` in `helpers.scale.workers`):
#
# - **broadcast**: rank 0's tensor `[10, 20]` is copied to every rank (rank 1 started with zeros);
# - **all-reduce**: rank `r` holds `(r + 1) x [1, 2]`; afterwards every rank holds the sum `[3, 6]`;
# - **all-gather**: every rank ends with the list of all ranks' tensors, in rank order;
# - **reduce-scatter**: each rank offers one piece per rank; rank `r` receives the *sum over
#   ranks of piece r*, and only that: `0 + 10 = 10` on rank 0, `1 + 11 = 12` on rank 1.
#
# An all-reduce is a reduce-scatter followed by an all-gather: the ring below builds it so.
#
# (What happens when a worker raises is the last thing this notebook shows, since it stops the
# processes.) The next cell sends a function defined in this notebook; a lambda, which has no
# source of its own to send, is refused before any process is bothered:

# %% slideshow={"slide_type": "fragment"}
def my_task(rank: int, world_size: int) -> str:
    return f"rank {rank} of {world_size} ran a function defined in this notebook"


print(workers.run(my_task))
try:
    workers.run(lambda rank, world_size: rank)
except ValueError as error:
    print(error)

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### The ring all-reduce and what it costs
#
# How do `p` ranks sum a tensor of `n` bytes without one rank receiving everything? In a **ring**,
# rank `r` only ever sends to rank `r + 1`. Cut the tensor into `p` chunks. In the
# **reduce-scatter** phase, at each of `p - 1` steps every rank passes one chunk on and adds the
# chunk it receives to its own; after `p - 1` steps each rank holds the full sum of one chunk. In
# the **all-gather** phase the finished chunks go around the ring once more, `p - 1` steps. Each
# step sends `n / p` bytes. How many bytes does each rank send in all, and does that grow with
# `p`? The exercise after the next one asks you to count it. `ring_all_reduce_by_hand` simulates
# the ring in this process, step by step, and counts the values each rank sends:

# %% slideshow={"slide_type": "fragment"}
tensors = [torch.arange(6.0) * (rank + 1) for rank in range(3)]  # 3 ranks, 6 values each
results, values_sent = ring_all_reduce_by_hand(tensors)
for rank, result in enumerate(results):
    print(f"rank {rank} ends with {result.tolist()}")
assert all(torch.equal(result, sum(tensors)) for result in results)
print(f"each rank sent {values_sent} values of a tensor of 6, over 3 ranks")

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### Exercise: the ring all-reduce on real processes
#
# Now on the workers, with messages instead of a list: write `my_ring_all_reduce(rank,
# world_size, tensors)`. It runs on every rank; rank `r` starts from `tensors[r]` and may only
# exchange tensors with its neighbours, `dist.isend(tensor, dst)` and `dist.recv(tensor, src)`
# (no collective). Every rank returns the sum of all ranks' tensors, with the input's shape. The
# check runs it on three worker processes, with tensors whose length three does not divide, so
# the chunks are not all the same size; the cell after it sums with your function if it passes,
# else with the course's `ring_all_reduce`.
#
# <details><summary>Hint 1: the idea</summary>
#
# The simulation above, seen from one rank: a step is "send a chunk to the next rank, receive one
# from the previous rank". Send without waiting, then receive, then wait for the send: if every
# rank first waited for its own send to be received, nobody would ever receive.
# </details>
#
# <details><summary>Hint 2: the plan</summary>(1) Your tensor, copied and cut into one chunk per
# rank. (2) Reduce-scatter, one step fewer than ranks: each step send one chunk to the next rank and
# add what arrives from the previous rank to your own copy of that chunk; the chunks walk one place
# round the ring per step. (3) All-gather, as many steps, the same walk, now keeping what arrives.
# (4) Join the chunks in the input's shape.</details>
#
# <details><summary>Hint 3: closer</summary>After the reduce-scatter each rank holds the full sum of
# one chunk, and the all-gather starts by sending that one. Count a chunk's place relative to your
# rank and the step, round the ring. Send without waiting, receive, then wait for the
# send.</details>

# %% slideshow={"slide_type": "fragment"}
import torch.distributed as dist  # noqa: F401 - my_ring_all_reduce sends with it


def my_ring_all_reduce(rank: int, world_size: int, tensors: list[torch.Tensor]) -> torch.Tensor:
    """tensors: p tensors of the same shape, this rank reads tensors[rank] -> their sum."""
    ### BEGIN SOLUTION
    p = world_size
    chunks = list(tensors[rank].flatten().clone().tensor_split(p))

    def exchange(send: int, receive: int) -> torch.Tensor:
        """Send chunk `send` to the next rank, return what the previous rank sent for `receive`."""
        incoming = torch.empty_like(chunks[receive])
        request = dist.isend(chunks[send].contiguous(), (rank + 1) % p)  # do not wait yet
        dist.recv(incoming, (rank - 1) % p)
        request.wait()
        return incoming

    for s in range(p - 1):  # reduce-scatter: add what arrives
        chunks[(rank - s - 1) % p] += exchange((rank - s) % p, (rank - s - 1) % p)
    for s in range(p - 1):  # all-gather: keep what arrives
        chunks[(rank - s) % p] = exchange((rank + 1 - s) % p, (rank - s) % p)
    return torch.cat(chunks).reshape(tensors[rank].shape)
    ### END SOLUTION


# %% slideshow={"slide_type": "fragment"}
check("distributed.ring_all_reduce", my_ring_all_reduce)

# %% slideshow={"slide_type": "fragment"}
ring = yours_or("distributed.ring_all_reduce", my_ring_all_reduce, ring_all_reduce)
tensors = [torch.arange(6.0) * (rank + 1) for rank in range(2)]
results = workers.run(ring, tensors)
for rank, result in enumerate(results):
    print(f"rank {rank} ends with {result.tolist()}")
assert all(torch.equal(result, sum(tensors)) for result in results)

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### Exercise: the bytes of a ring all-reduce
#
# Write `ring_bytes(n_bytes, world_size)`: the bytes each rank sends in a ring all-reduce of a
# tensor of `n_bytes` over `world_size` ranks (one rank sends nothing).
#
# The measurement after it counts the bytes with your function once it passes.
#
# <details><summary>Hint 1: the idea</summary>
#
# Count the messages a rank sends: how many steps each phase of the ring takes, and how big one
# chunk is.
# </details>
#
# <details><summary>Hint 2: the plan</summary>
#
# There are two phases, each one step fewer than there are ranks; at every step a rank sends
# one chunk, a p-th of the tensor. Multiply the number of steps by the chunk's bytes.
# </details>

# %% slideshow={"slide_type": "fragment"}
def ring_bytes(n_bytes: float, world_size: int) -> float:
    """Bytes each rank sends in a ring all-reduce of an n_bytes tensor over world_size ranks."""
    ### BEGIN SOLUTION
    steps = 2 * (world_size - 1)  # reduce-scatter, then all-gather
    return steps * n_bytes / world_size  # one chunk of the tensor per step
    ### END SOLUTION


# %% slideshow={"slide_type": "fragment"}
check("distributed.ring_bytes", ring_bytes)

# %% [markdown] slideshow={"slide_type": "subslide"}
# Each rank sends `2 (p - 1) / p x n` bytes: almost `2n` whatever `p` is, so adding ranks does not
# make the all-reduce more expensive per rank.

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### Measured: how long one all-reduce takes here
#
# Two processes on one machine, so the "network" is shared memory and the times say more about
# `gloo` than about a cluster, where GPUs of a node talk over NVLink and nodes over InfiniBand.
# The bytes are exact; the times are this machine's. The first collectives of a process group
# also pay for setting up its connections, so `time_all_reduce_warm` runs the whole sweep of sizes
# untimed first, then keeps the best of 7 calls per size.
#
# A link is described by two numbers: a **latency** `α` paid by every message, and a
# **bandwidth** `β`, so that sending `n` bytes takes about `α + n / β`. Small messages measure
# `α`, large ones `β`; the cell fits both to the measured times. Below a few hundred kB the time
# is mostly latency, and on a busy machine two small sizes can swap places by the noise alone;
# the fit uses all five sizes, and the figure after the cell shows how well the two numbers
# describe them.

# %% slideshow={"slide_type": "fragment"}
sizes = [1_000, 10_000, 100_000, 1_000_000, 10_000_000]  # float32 values
times = workers.run(time_all_reduce_warm, sizes)
slowest = {size: max(t[size] for t in times) for size in sizes}  # done when the last rank is
count_sent = yours_or("distributed.ring_bytes", ring_bytes, ring_all_reduce_bytes)
sent = {size: count_sent(4 * size, 2) for size in sizes}
latency, bandwidth = fit_latency_bandwidth([sent[s] for s in sizes], [slowest[s] for s in sizes])
for size in sizes:
    print(f"{size:>10,} values = {readable_bytes(4 * size):>8}: each rank sends "
          f"{readable_bytes(sent[size]):>8}; measured: {format_duration(slowest[size])}, "
          f"latency + bytes / bandwidth: {format_duration(latency + sent[size] / bandwidth)}")
print(f"the fit: a message's latency {format_duration(latency)}; each MB sent "
      f"{format_duration(1e6 / bandwidth)}")

# %% slideshow={"slide_type": "fragment"}
figure, axis = plt.subplots(figsize=(8, 4.5), layout="constrained")
xs = [sent[s] for s in sizes]
axis.loglog(xs, [slowest[s] for s in sizes], "o", markersize=8, label="measured (best of 7)")
grid = torch.logspace(math.log10(xs[0]), math.log10(xs[-1]), 50).tolist()
axis.loglog(grid, [latency + x / bandwidth for x in grid], "-", label="latency + bytes / bandwidth")
axis.set(title="One all-reduce between 2 processes (gloo, this machine)",
         xlabel="bytes each rank sends",
         ylabel="seconds")
axis.legend()
plt.show()

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 2. Data parallelism: the same model everywhere, a slice of the batch each (optional)
#
# The loss of a batch is a **mean** over its rows. Split a batch of `B` rows into `p` equal
# slices: the mean over the batch is the average of the slices' means, and so is its gradient.
# So `p` processes, each with a full copy of the model and `B / p` rows, can compute the gradient
# of the whole batch: each computes its slice's gradient, then they average. If they start with
# the same weights and apply the same update, they stay identical forever.
#
# First in one process, with two copies of the course GPT (`TINY_GPT`: 2 blocks, `d_model = 32`,
# tied weights) standing in for the two ranks:

# %% slideshow={"slide_type": "fragment"}
catch_up("11_distributed", "2.")  # started here after a restart? this runs the sections above

# %% slideshow={"slide_type": "fragment"}
run = Run(model="gpt", batch_size=8)
inputs, targets = make_batch(run, step=0)          # (8, 16) token ids each
whole = make_model(run)
loss_of(whole, inputs, targets).backward()         # one process, the whole batch
ranks = [make_model(run), make_model(run)]
for rank, model in enumerate(ranks):               # "rank" r takes rows 4r ... 4r + 3
    loss_of(model, inputs[4 * rank:4 * rank + 4], targets[4 * rank:4 * rank + 4]).backward()
gap = max(((p0.grad + p1.grad) / 2 - p.grad).abs().max().item()
          for p0, p1, p in zip(ranks[0].parameters(), ranks[1].parameters(), whole.parameters(),
                               strict=True))
assert gap < 1e-6
print(TINY_GPT)
print("average of the two halves' gradients vs the whole batch's: max |diff| < 1e-6")

# %% [markdown] slideshow={"slide_type": "subslide"}
# On real processes the average is one all-reduce (sum) per gradient, divided by the world size.
# Before the first step, a broadcast gives every rank rank 0's weights (the workers below start
# from *different* random weights on purpose, so the broadcast has work to do).
#
# ### Exercise: the gradient all-reduce
#
# Write `my_average_gradients(model, all_reduce, world_size)`: afterwards every gradient of the
# model is the mean over the ranks. `all_reduce` sums a tensor in place across the ranks (on real
# processes that is `torch.distributed.all_reduce`; the check passes one that adds the other
# rank's gradient, with two ranks running your function at once). The check's model is a GPT
# with tied weights, so one matrix serves as the embedding and as the output layer.
#
# This exercise stands alone: no later cell runs on your answer (the training below runs the
# course's `average_gradients`, printed after the check to compare with yours).
#
# <details><summary>Hint 1: the idea</summary>
#
# The whole batch's gradient is the mean of the ranks' gradients: a sum over the ranks, then a
# division. Each gradient tensor must be reduced exactly once on every rank, in the same order.
# </details>
#
# <details><summary>Hint 2: the plan</summary>
#
# Go through the model's parameters (that list holds the tied matrix once), skip any without a
# gradient, sum each gradient over the ranks in place with the function you are given, then
# divide it by the number of ranks.
# </details>

# %% slideshow={"slide_type": "fragment"}
def my_average_gradients(model: torch.nn.Module, all_reduce, world_size: int) -> None:
    """Replace every p.grad by its mean over the ranks; all_reduce(t) sums t in place."""
    ### BEGIN SOLUTION
    for param in model.parameters():
        if param.grad is None:
            continue  # a parameter the loss did not reach
        all_reduce(param.grad)  # the sum over the ranks, in place
        param.grad /= world_size
    ### END SOLUTION


# %% slideshow={"slide_type": "fragment"}
check("distributed.average_gradients", my_average_gradients)

# %% [markdown] slideshow={"slide_type": "subslide"}
# The course's version, in `helpers.scale.data_parallel`, calls `torch.distributed.all_reduce`
# itself; compare it with yours:

# %% slideshow={"slide_type": "fragment"}
print(inspect.getsource(average_gradients))

# %% [markdown] slideshow={"slide_type": "subslide"}
# `train_by_hand` runs it on each rank: broadcast, then for each step forward and backward on its
# rows, `average_gradients`, SGD step. We train the small MLP and the GPT for 4 steps on both
# processes and compare with one process training on the whole batches (`train_single`).
#
# The optimiser is SGD with momentum, not AdamW. AdamW divides each gradient by its own size,
# and notebook 7 showed what that does to a weight whose true gradient is zero (the key biases):
# it moves by the learning rate in the direction of the round-off, so two runs that agree in
# exact arithmetic drift apart. With SGD, round-off stays round-off.

# %% slideshow={"slide_type": "fragment"}
for model_name in ("mlp", "gpt"):
    run = Run(model=model_name, batch_size=8, steps=4)
    weights = data_parallel(workers, "by hand", run)
    reference = train_single(run)
    assert max_difference(weights[0], weights[1]) == 0.0
    assert max_difference(weights[0], reference) < 1e-6
    assert max_difference(reference, make_model(run).state_dict()) > 1e-3  # training moved them
    print(f"{model_name}: after {run.steps} steps the 2 ranks are identical, and equal to 1 "
          f"process with "
          "the whole batch: max |diff| < 1e-6")

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### Overlap: start the all-reduce while backward is still running
#
# `average_gradients` waits for the whole backward pass, then communicates: the network idles
# during backward and the processors idle during the all-reduce. But backward finishes the last
# layer's gradients first. `GradientBuckets` groups the parameters, last layers first, into
# buckets of about `bucket_bytes` (printed below); a hook on each parameter
# (`register_post_accumulate_grad_hook`) fires
# when its gradient is complete, and when a bucket's last gradient arrives its all-reduce starts
# *asynchronously* (`async_op=True`), while backward goes on. After backward, `finish()` waits.
# Buckets also turn many small messages into a few large ones, which the network prefers.

# %% slideshow={"slide_type": "fragment"}
results = data_parallel(workers, "bucketed", Run(model="gpt", steps=4))
bucketed_weights, buckets, launches = results[0]
n_gradients = sum(len(bucket) for bucket in buckets)
print(f"bucket_bytes = {inspect.signature(train_bucketed).parameters['bucket_bytes'].default:,}")
for bucket, ready in launches:
    names = buckets[bucket]
    print(f"bucket {bucket}: all-reduce started when {ready:>2} of {n_gradients} gradients were "
          f"ready "
          f"({len(names)} tensors: {names[0]} ... {names[-1]})")
assert launches[0][1] < n_gradients
assert max_difference(bucketed_weights, train_single(Run(model="gpt", steps=4))) < 1e-6
print("bucketed run vs 1 process: max |diff| < 1e-6")

# %% [markdown] slideshow={"slide_type": "subslide"}
# The first bucket's all-reduce starts when only the final LayerNorm's and the last MLP's
# gradients exist; the token embedding, used first in the forward pass, is the last gradient
# backward completes. (It is also the output matrix: with tied weights its hook fires once, after
# both uses have added their part.)
#
# ### The real thing: `DistributedDataParallel`
#
# `torch.nn.parallel.DistributedDataParallel(model)` does all of the above: it broadcasts rank 0's
# weights when it wraps the model, and its backward hooks all-reduce buckets (of megabytes)
# during backward. The training loop does not change.

# %% slideshow={"slide_type": "fragment"}
for model_name in ("mlp", "gpt"):
    run = Run(model=model_name, steps=4)
    weights = data_parallel(workers, "torch DDP", run)
    assert max_difference(weights[0], train_single(run)) < 1e-6
    print(f"{model_name}: torch DDP on 2 processes vs 1 process: max |diff| < 1e-6")

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 3. Optimizer-state sharding (ZeRO-1) (optional)
#
# Data parallelism copies *everything* to every rank: the weights, the gradients and AdamW's two
# running averages `m` and `v`, which alone are twice the weights. ZeRO (Rajbhandari et al.,
# 2020) removes the copies in stages. Stage 1 splits the optimizer state: each parameter gets an
# **owner** rank, only the owner keeps its `m` and `v` and updates it, and then the owner
# broadcasts the new values. Per rank, for GPT-2 small over 8 ranks, counted two ways: in float32
# (4 bytes of weight, 4 of gradient, 8 of AdamW state per parameter), as this course trains, and
# as the ZeRO paper counts mixed-precision training (2 bytes of 16-bit weight, 2 of gradient, and
# 12 of optimizer state: a float32 master copy of the weights besides `m` and `v`). The state is
# the larger share in mixed precision, so sharding it saves more:

# %% slideshow={"slide_type": "fragment"}
catch_up("11_distributed", "3.")  # started here after a restart? this runs the sections above

# %% slideshow={"slide_type": "fragment"}
gpt2 = GPTConfig.gpt2_small()
by_precision = {precision: memory_per_rank(exact_parameters(gpt2), world_size=8,
                                           precision=precision)
                for precision in ("fp32", "mixed")}
print(f"{'':28s} {'float32 (4+4+8)':>18s} {'mixed (2+2+12)':>18s}")
for stage in by_precision["fp32"]:
    cells = [f"{readable_bytes(m[stage]):>9} ({m['data parallel'] / m[stage]:.1f}x)"
             for m in by_precision.values()]
    print(f"{stage:<28} " + " ".join(f"{c:>18s}" for c in cells))
assert round(by_precision["mixed"]["data parallel"] / by_precision["mixed"]["ZeRO-1 (optimizer "
                                                                            "state)"], 1) == 2.9

# %% [markdown] slideshow={"slide_type": "subslide"}
# `ShardedAdamW` in `helpers.scale.sharded` is notebook 7's `HandAdamW` with an owner per parameter
# (largest first, each to the least loaded rank). To check it, each rank also trains an unsharded
# twin with the same equations and gives it the same averaged gradient at every step: the sharded
# and unsharded weights must stay equal, while each rank holds about half the state.

# %% slideshow={"slide_type": "fragment"}
run = Run(model="gpt", steps=4, lr=0.01)
results_zero = workers.run(train_zero_by_hand, run)
for rank, result in enumerate(results_zero):
    assert result["max_gap"] < 1e-6
    print(f"rank {rank}: owns {result['owned']} of {result['parameters']} tensors, AdamW state "
          f"{result['state_bytes']:,} bytes instead of {result['full_state_bytes']:,}")
assert sum(r["state_bytes"] for r in results_zero) == results_zero[0]["full_state_bytes"]
print("sharded vs unsharded AdamW, same gradients, 4 steps: max |diff| < 1e-6")

# %% [markdown] slideshow={"slide_type": "subslide"}
# The two ranks' shares add up to exactly the unsharded state, split about evenly. The price of
# this hand-written version is one broadcast of every parameter per step on top of the gradient
# all-reduce: `3 (p - 1) / p` of the weights' bytes against plain data parallelism's
# `2 (p - 1) / p`, 1.5 times as much. Real implementations avoid that: each rank needs only its
# own shard's averaged gradient, so they **reduce-scatter** the gradients (`(p - 1) / p`) and
# all-gather the updated weights (`(p - 1) / p`), which together send exactly the bytes of one
# all-reduce, since an all-reduce *is* a reduce-scatter followed by an all-gather. ZeRO-1 and
# ZeRO-2 (which also drops the gradients of the other shards) send the same bytes as DDP; only
# ZeRO-3 sends more (section 5). The cell counts it for GPT-2 small's bf16 weights over 8 ranks:

# %% slideshow={"slide_type": "fragment"}
p, weight_bytes = 8, 2 * exact_parameters(gpt2)
ddp_sends = ring_all_reduce_bytes(weight_bytes, p)
zero12_sends = 2 * (p - 1) / p * weight_bytes           # reduce-scatter + all-gather
by_hand_sends = ddp_sends + (p - 1) / p * weight_bytes  # all-reduce + a broadcast from each owner
for name, n in (("DDP (all-reduce)", ddp_sends), ("ZeRO-1/2 (reduce-scatter + all-gather)",
                                                  zero12_sends),
                ("this notebook's ShardedAdamW (all-reduce + broadcast)", by_hand_sends)):
    print(f"{name:<54} {readable_bytes(n):>8} per rank per step ({n / ddp_sends:.1f}x DDP)")
assert zero12_sends == ddp_sends and by_hand_sends == 1.5 * ddp_sends
#
# ### PyTorch's own: `ZeroRedundancyOptimizer` and FSDP's `fully_shard`
#
# `torch.distributed.optim.ZeroRedundancyOptimizer` wraps any optimizer the same way; we check it
# against `torch.optim.AdamW` with the same gradients. Both run on CPU with gloo.

# %% slideshow={"slide_type": "fragment"}
results = workers.run(train_zero_torch, run)
for rank, result in enumerate(results):
    assert result["max_gap"] < 1e-6
    print(f"rank {rank}: AdamW state {result['state_bytes']:,} bytes "
          f"instead of {result['full_state_bytes']:,}")
print("ZeroRedundancyOptimizer vs torch.optim.AdamW: max |diff| < 1e-6")

# %% [markdown] slideshow={"slide_type": "subslide"}
# FSDP (fully sharded data parallel, ZeRO-3) splits the weights and gradients too. With FSDP2's
# `fully_shard`, each block is a unit whose weights are all-gathered just before it runs and
# freed after; gradients are reduce-scattered, so each rank keeps the average of its own slice,
# and the optimizer only ever sees the slices (its weights become `DTensor`s). Trained with SGD,
# it must end where one process does:

# %% slideshow={"slide_type": "fragment"}
run = Run(model="gpt", steps=4)
results = workers.run(train_fsdp, run)
for rank, result in enumerate(results):
    print(f"rank {rank}: holds {result['local_bytes']:,} of the model's {result['full_bytes']:,} "
          f"bytes "
          f"of weights (as {result['kind']})")
assert max_difference(results[0]["weights"], train_single(run)) < 1e-6
print("FSDP2 on 2 processes vs 1 process: max |diff| < 1e-6")

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### What `ShardedAdamW` grows into: any optimizer, sharded
#
# Nothing in ZeRO-1 depends on AdamW's equations: a rank only has to *own* some parameters, step
# them, and broadcast them. `helpers.scale.zero.ShardedOptimizer(params, optimizer_class,
# **settings)` builds the optimizer you name over the owned parameters only, so only the owner
# ever holds their state, as DeepSpeed's stage 1 and `ZeroRedundancyOptimizer` do. Each
# parameter's update reads only its own gradient and state, so the result should be the unsharded
# optimizer's *exactly*, not merely close. The check runs it around `torch.optim.AdamW` on a model
# the course did not write, PyTorch's own `nn.TransformerEncoder` (two pre-norm layers), and
# compares with an unsharded AdamW given the same averaged gradients, with `torch.equal`:

# %% slideshow={"slide_type": "fragment"}
from helpers.scale import any_model

results = workers.run(any_model.train_sharded_optimizer_any, "encoder", 3)
for rank, result in enumerate(results):
    assert result["equal_after"] == [True, True, True]
    print(f"rank {rank}: AdamW state {result['state_bytes']:,} bytes of "
          f"{result['full_state_bytes']:,}; "
          f"weights equal to unsharded AdamW after each of 3 steps: {result['equal_after']}")
assert sum(r["state_bytes"] for r in results) == results[0]["full_state_bytes"]

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 4. Tensor parallelism: split every matrix (optional)
#
# Data parallelism needs the whole model on each device. When one layer is too big, split the
# layer. The MLP is `down(gelu(up(x)))` with `up` of shape `(hidden, D)` and `down` of shape
# `(D, hidden)`. Give rank `r` a block of `hidden / p` hidden units:
#
# - **column-parallel `up`**: rank `r` keeps those rows of `W_up` (and of its bias), and computes
#   its hidden units for every token. GELU acts on each unit alone, so no communication yet.
# - **row-parallel `down`**: rank `r` keeps the matching columns of `W_down` and multiplies its
#   hidden units by them: a `(..., D)` *partial sum* of the output.
# - **one all-reduce** adds the partial sums; the bias of `down` is added once, after it.
#
# ### Exercise: split an MLP's weights for one rank
#
# Write `split_mlp(up_weight, up_bias, down_weight, rank, world_size)`: rank `rank`'s
# `(up_weight, up_bias, down_weight)` when `world_size` ranks share the hidden units equally. The
# check adds the ranks' partial outputs for two and three ranks and compares with the whole
# MLP; the cell after it splits a block's MLP in two with your function, once it passes.
#
# <details><summary>Hint 1: the idea</summary>
#
# Each rank keeps whole hidden units: a unit is a row of the up projection (with its bias entry)
# and the matching column of the down projection.
# </details>
#
# <details><summary>Hint 2: the plan</summary>(1) Each rank's share: an equal block of the hidden
# units. (2) The block that belongs to this rank. (3) Those units' rows of the up projection and
# entries of its bias, and the same units' columns of the down projection.</details>

# %% slideshow={"slide_type": "fragment"}
catch_up("11_distributed", "4.")  # started here after a restart? this runs the sections above

# %% slideshow={"slide_type": "fragment"}
def split_mlp(up_weight: torch.Tensor, up_bias: torch.Tensor, down_weight: torch.Tensor,
              rank: int, world_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """up_weight (hidden, D), up_bias (hidden,), down_weight (D, hidden) -> this rank's slices,
    (hidden / p, D), (hidden / p,) and (D, hidden / p)."""
    ### BEGIN SOLUTION
    k = up_weight.shape[0] // world_size
    rows = slice(rank * k, (rank + 1) * k)
    return up_weight[rows], up_bias[rows], down_weight[:, rows]
    ### END SOLUTION


# %% slideshow={"slide_type": "fragment"}
check("distributed.split_mlp", split_mlp)

# %% [markdown] slideshow={"slide_type": "subslide"}
# In one process, a block's MLP split in two, each half computed as its rank would (the course's
# `helpers.scale.tensor_parallel.split_mlp_weights` stands in until yours passes):

# %% slideshow={"slide_type": "fragment"}
from helpers.scale.tensor_parallel import split_mlp_weights

split = yours_or("distributed.split_mlp", split_mlp, split_mlp_weights)
block, x, probe = demo_block()                     # Block(d_model=32, n_heads=4), x: (2, 8, 32)
mlp = block.mlp
up_w, up_b, down_w = mlp.up.weight.detach(), mlp.up.bias.detach(), mlp.down.weight.detach()
partials = []
for r in range(2):
    w_up, b_up, w_down = split(up_w, up_b, down_w, r, 2)
    hidden = F.gelu(x @ w_up.T + b_up)             # (2, 8, 64): column-parallel up, then GELU
    partials.append(hidden @ w_down.T)             # (2, 8, 32): row-parallel down, a partial sum
with torch.no_grad():
    split_gap = (partials[0] + partials[1] + mlp.down.bias - mlp(x)).abs().max().item()
assert split_gap < 1e-6
print(f"W_up {tuple(up_w.shape)} -> 2 x {tuple(w_up.shape)}; W_down {tuple(down_w.shape)} -> "
      f"2 x {tuple(w_down.shape)}")
print("sum of the 2 partial outputs + bias vs the MLP: max |diff| < 1e-6")

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### The heads, and the whole block, on two processes
#
# Attention splits the same way, by heads (notebook 5): the rows of `W_Q`, `W_K`, `W_V` that
# produce heads `r H/p ...` are column-parallel, each rank attends with its own heads, and the
# matching columns of `W_O` are row-parallel: one all-reduce per attention layer. Backward needs
# the mirror image: the input `x` feeds every rank's branch, so its gradient is the all-reduced
# sum of the ranks' (Megatron-LM's `f` and `g` operators: `copy_to_ranks` and `sum_over_ranks` in
# `helpers.scale.tensor_parallel`). `TensorParallelBlock` puts the two together, with the LayerNorms
# on every rank. We run it forward and backward and compare with the block on one process:

# %% slideshow={"slide_type": "fragment"}
results = workers.run(tensor_parallel_block)
x.requires_grad_(True)
out = block(x)
(out * probe).sum().backward()                      # the same loss as the workers'
k = block.mlp.up.out_features // 2
n_block = sum(p.numel() for p in block.parameters())
for rank, result in enumerate(results):
    assert (result["out"] - out).abs().max() < 1e-6 and (result["x_grad"]
                                                         - x.grad).abs().max() < 1e-6
    assert (result["up_grad"] - block.mlp.up.weight.grad[rank * k:(rank + 1)
                                                         * k]).abs().max() < 1e-6
    print(f"rank {rank}: {result['parameters']:,} of the block's {n_block:,} parameters; output, "
          f"input "
          "gradient and its W_up gradient rows vs 1 process: max |diff| < 1e-6")

# %% [markdown] slideshow={"slide_type": "subslide"}
# Each rank holds about half the block (the LayerNorms and the output biases are copies). The
# price is two all-reduces of the `(B, N, D)` activations per block forward, and two backward:
# on every layer, on the critical path. That is why tensor parallelism stays inside one node,
# where GPUs are joined by NVLink.
#
# `torch.distributed.tensor` does the same split from a plan. `parallelize_module` turns `up`'s
# weight into a `DTensor` sharded by rows (`ColwiseParallel`) and `down`'s by columns
# (`RowwiseParallel`) on a one-axis device mesh; it runs on CPU with gloo:

# %% slideshow={"slide_type": "fragment"}
results = workers.run(dtensor_mlp)
with torch.no_grad():
    expected = block.mlp(x)
for rank, result in enumerate(results):
    assert (result["out"] - expected).abs().max() < 1e-6
    print(f"rank {rank}: up.weight is a {result['kind']}, local {result['up_local']}; "
          f"down.weight local {result['down_local']}; output vs the MLP: max |diff| < 1e-6")

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 5. The aspects of Transformer parallelization (optional)
#
# The USF notes close their questions with "What are the aspects of Transformer
# parallelization?". Inside one device: the batch, the heads and the positions are computed at
# once (a Transformer, unlike an RNN, has no step that waits for the previous token during
# training), and FlashAttention splits the queries into tiles (notebook 8). Across devices there
# are five things to split: the batch, the weight matrices, the layers, the tokens and the
# experts; the batch can be split with or without sharding the training state, so the table
# has six rows. It counts, from the formulas in `helpers.scale.parallelism`, the bytes each
# rank sends in one training step with 8 ranks in the split, 8 sequences of a full context per
# rank and bf16 values (2 bytes). GPT-3's sizes: 96 layers, `d_model = 12288`, 2048 tokens.

# %% slideshow={"slide_type": "fragment"}
catch_up("11_distributed", "5.")  # started here after a restart? this runs the sections above

# %% slideshow={"slide_type": "fragment"}
gpt3 = GPTConfig(vocab_size=50257, context_length=2048, n_layers=96, n_heads=96, d_model=12288)
models = {"GPT-2 small": gpt2, "GPT-3 175B": gpt3}
for name, config in models.items():
    print(f"{name}: {exact_parameters(config):,} parameters, {config.n_layers} layers, "
          f"d_model {config.d_model}, {config.context_length} tokens")
rows = {name: communication_per_step(config, batch_size=8, world_size=8) for name,
        config in models.items()}
print(f"\n{'parallelism':<36}{'GPT-2 small':>12}{'GPT-3 175B':>12}   sends")
for i, row in enumerate(rows["GPT-2 small"]):
    print(f"{row.name:<36}{readable_bytes(row.bytes_per_rank):>12}"
          f"{readable_bytes(rows['GPT-3 175B'][i].bytes_per_rank):>12}   {row.sends}")
print()
for row in rows["GPT-2 small"]:
    print(f"{row.name}: splits {row.splits}; use when {row.use_when}")
data_bytes, sharded_bytes = (row.bytes_per_rank for row in rows["GPT-2 small"][:2])
print(f"\nsharded data / data: {sharded_bytes / data_bytes:.1f} x")

# %% [markdown] slideshow={"slide_type": "subslide"}
# How to read it:
#
# - **data** parallelism sends the gradients once per step, whatever the batch: cheap relative
#   to the compute when the batch per rank is large, and it can overlap backward (section 2).
#   It needs the whole model on each device.
# - **sharded data** parallelism (ZeRO-3 / FSDP) sends 1.5 x as much as plain data parallelism
#   (two all-gathers and a reduce-scatter: 3 `(p-1)/p` of the weights against 2 `(p-1)/p`) and
#   divides the memory of the training state by `p` (section 3).
# - **tensor** parallelism sends activations, four all-reduces per layer per step, growing with
#   the batch and the context. Each one blocks the next layer, so they barely overlap with
#   compute; it lives inside a node, on the fastest links (section 4).
# - **pipeline** parallelism sends only the activations at the boundaries between stages, the
#   fewest bytes, but a stage idles while it waits for the previous one (the "bubble"), which
#   micro-batches shrink: with `p` stages and the batch cut into `m` micro-batches, a step lasts
#   `m + p - 1` micro-batch slots (`p - 1` to fill the pipeline and `p - 1` to drain it), of which
#   each stage works `m`, so the idle share is `(p - 1) / (m + p - 1)` (GPipe; the cell below
#   computes it). It suits the slow links between nodes.
# - **sequence / context** parallelism splits the tokens: MLPs and LayerNorms need nothing, but
#   attention needs every earlier key and value, passed around a ring. Needed for long contexts.
# - **expert** parallelism places the experts of a mixture-of-experts layer on different ranks
#   and sends each token to its expert and back (all-to-all). It applies to MoE models only; the
#   counts assume one MoE layer per block, one expert per rank.
#
# Large runs combine them ("3D parallelism"): tensor parallelism inside a node of 8 GPUs,
# pipeline stages across nodes, data (or sharded data) parallelism over everything else.

# %% slideshow={"slide_type": "fragment"}
micro_batches = [1, 2, 4, 8, 16, 32, 64]
figure, axis = plt.subplots(figsize=(8, 4.5), layout="constrained")
for stages in (2, 4, 8):
    fractions = [bubble_fraction(stages, m) for m in micro_batches]
    axis.plot(micro_batches, fractions, "o-", label=f"{stages} stages")
    print(f"{stages} stages: idle share " + ", ".join(f"m={m}: {f:.0%}" for m,
            f in zip(micro_batches, fractions, strict=True)))
axis.set(xscale="log", title="Pipeline bubble: (p - 1) / (m + p - 1)",
         xlabel="micro-batches m per step",
         ylabel="share of the step a stage idles", xticks=micro_batches, xticklabels=micro_batches)
axis.legend()
plt.show()

# %% [markdown] slideshow={"slide_type": "slide"}
#
# ## 6. Started by `torchrun`, on GPUs with `nccl` (optional)
#
# The worker functions of `helpers` do not care how their process was started. `torchrun` starts
# `N` copies of a script and tells each its rank in environment variables;
# `helpers.scale.workers.init_from_environment()` reads them and joins the group, with `nccl` and
# one GPU per process (`LOCAL_RANK`) when there are GPUs, `gloo` otherwise. `helpers.scale.data_parallel`
# has such a script at its end (`main`): it runs the same `train_by_hand` on every process and
# compares with one process. Here it runs on the CPU, started by `torchrun` exactly as on a
# cluster (`python -m torch.distributed.run` is `torchrun`):

# %% slideshow={"slide_type": "fragment"}
catch_up("11_distributed", "6.")  # started here after a restart? this runs the sections above

# %% slideshow={"slide_type": "fragment"}
package_root = str(Path(helpers.__file__).resolve().parent.parent)  # so the processes find helpers
command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "helpers.scale.data_parallel"]  # --standalone: one machine, a free port
start = time.perf_counter()
done = subprocess.run(command, capture_output=True, text=True, timeout=300,
                      env={**os.environ, "PYTHONPATH": package_root, "OMP_NUM_THREADS": "1"})
assert done.returncode == 0, done.stderr[-2000:]
print("torchrun --standalone --nproc_per_node 2 -m helpers.scale.data_parallel")
print("   ", done.stdout.strip().splitlines()[-1], "|", format_duration(time.perf_counter()
                                                                        - start))

# %% [markdown] slideshow={"slide_type": "slide"}
# On a machine with `N` GPUs the same command with `--nproc_per_node N` runs the same code on
# the GPUs with `nccl`, and `torchrun --nnodes M --node_rank i --rdzv_endpoint host:port ...`
# spreads it over machines. That is stated, not measured: no machine with several GPUs was
# available to this course. Two differences matter in practice: `nccl` moves tensors from GPU
# to GPU without the CPU (far faster than `gloo`), and each process must own its own GPU.
#
# ## What was measured here (optional)
#
# The all-reduce times of section 1 (two CPU processes, gloo) and the memory per rank of section
# 3, gathered again:

# %% slideshow={"slide_type": "fragment"}
catch_up("11_distributed", "What")  # started here after a restart? this runs the sections above

# %% slideshow={"slide_type": "fragment"}
for size in sizes:
    print(f"all-reduce of {readable_bytes(4 * size):>8} on 2 processes: "
          f"{format_duration(slowest[size])}")
print(f"the fit: a message's latency {format_duration(latency)}; each MB sent "
      f"{format_duration(1e6 / bandwidth)}")
print(f"ZeRO-1, AdamW state per rank of the tiny GPT: {results_zero[0]['state_bytes']:,} and "
      f"{results_zero[1]['state_bytes']:,} bytes (unsharded "
      f"{results_zero[0]['full_state_bytes']:,})")

# %% [markdown] slideshow={"slide_type": "slide"}
# ## 7. Part two: FSDP, pipelines and rings, by hand (optional)
#
# Three more ways to split a training step, each written with the collectives of section 1 and
# proven equal to one process on the same two workers.
#
# **FSDP (ZeRO-3) by hand** (`helpers.scale.fsdp`). Each unit (a block; the embeddings, `ln_f`
# and the tied output matrix form the root unit) keeps its parameters as one flat vector cut in
# `p` equal pieces, and a rank stores only its piece. Before a unit's forward the ranks
# all-gather the pieces into the full weights, run the unit, and free them. The backward
# all-gathers again, runs the unit's backward, and *reduce-scatters* the gradient: each rank
# receives the mean over ranks of its own piece only. AdamW then updates the piece. (Here the
# backward reruns the unit's forward from its saved input, so no full weight survives between
# the passes; torch's FSDP keeps the graph and refills the freed storage instead.) This is what
# section 3's `fully_shard` did on the same workers; here every collective is in plain sight.

# %% slideshow={"slide_type": "fragment"}
catch_up("11_distributed", "7.")  # started here after a restart? this runs the sections above

# %% slideshow={"slide_type": "fragment"}
from helpers.scale.fsdp import memory_table, train_fsdp_by_hand, train_reference

run_fsdp = Run(model="gpt", steps=3, lr=0.01)
results_fsdp = workers.run(train_fsdp_by_hand, run_fsdp)
reference_fsdp = train_reference(run_fsdp)  # one process, torch.optim.AdamW, float64
gap = max(max_difference(r["weights"], reference_fsdp) for r in results_fsdp)
assert gap < 1e-12
print(f"FSDP by hand on 2 processes vs 1 process, {run_fsdp.steps} AdamW steps in float64: max "
      f"|diff| < 1e-12")
for rank, r in enumerate(results_fsdp):
    print(f"rank {rank} holds {r['held_bytes']:,} bytes (weights, gradients, m, v of its pieces); "
          f"one process {r['single_bytes']:,}; full weights alive at once at most "
          f"{r['peak_full_bytes']:,}")

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### Exercise: FSDP's gradient step
#
# Write `my_grad_piece(rank, world_size, grads)`: rank `r`'s flat gradient is `grads[r]` `(P,)`;
# every rank returns `(P / p,)`, its own piece of the mean over ranks, with one collective. The
# check runs it on three worker processes; the cell after it uses your function if it passes,
# else the course's `gradient_piece`.
#
# <details><summary>Hint 1: the idea</summary>
#
# An all-reduce followed by keeping one piece would be right, but every rank would receive all
# `P` values only to drop most of them. Which collective of section 1 delivers to each rank just
# the sum of its own piece?
# </details>
#
# <details><summary>Hint 2: the plan</summary>(1) Your gradient cut into one equal piece per rank.
# (2) The collective of section 1 that gives each rank the sum of its own piece only, into a tensor
# of one piece's size. (3) The mean: divide by the number of ranks, before or after.</details>

# %% slideshow={"slide_type": "fragment"}
import torch.distributed as dist  # noqa: F401 - my_grad_piece communicates with it


def my_grad_piece(rank: int, world_size: int, grads: list[torch.Tensor]) -> torch.Tensor:
    """grads: p flat gradients (P,), this rank reads grads[rank] -> (P / p,) its piece of the
    mean."""
    ### BEGIN SOLUTION
    shares = [piece / world_size for piece in grads[rank].chunk(world_size)]  # divide first
    mean_piece = torch.zeros_like(shares[0])
    dist.reduce_scatter(output=mean_piece, input_list=shares, op=dist.ReduceOp.SUM)
    return mean_piece
    ### END SOLUTION


# %% slideshow={"slide_type": "fragment"}
check("distributed.fsdp_grad_piece", my_grad_piece)

# %% slideshow={"slide_type": "fragment"}
from helpers.scale.fsdp import gradient_piece

grad_piece = yours_or("distributed.fsdp_grad_piece", my_grad_piece, gradient_piece)
grads = [torch.arange(8.0) * (rank + 1) for rank in range(2)]
pieces = workers.run(grad_piece, grads)
for rank, piece in enumerate(pieces):
    print(f"rank {rank} keeps {piece.tolist()}")
assert torch.equal(torch.cat(pieces), sum(grads) / 2)
print("together the pieces are the mean gradient; no rank ever held all of it")

# %% [markdown] slideshow={"slide_type": "subslide"}
# The ZeRO paper counts memory in mixed precision: 2 bytes a parameter of bf16 weights, 2 of
# gradients and 12 of optimizer state (a float32 master copy, `m`, `v`), `16 Psi` in all for
# `Psi` parameters. On `N` ranks stage 1 keeps `4 Psi + 12 Psi / N`, stage 2 `2 Psi + 14 Psi / N`,
# stage 3 (FSDP) `16 Psi / N`. In plain code first, then the helper:

# %% slideshow={"slide_type": "fragment"}
n_ranks = 64
for name, config in (("GPT-2 small", GPTConfig.gpt2_small()),
                     ("GPT-3 175B", GPTConfig(vocab_size=50257, context_length=2048, n_layers=96,
                                              n_heads=96, d_model=12288))):
    psi = exact_parameters(config)
    by_hand = [16 * psi, 4 * psi + 12 * psi / n_ranks, 2 * psi + 14 * psi / n_ranks, 16
               * psi / n_ranks]
    from_helper = list(memory_table(n_ranks)[name].values())
    assert all(math.isclose(a, b) for a, b in zip(by_hand, from_helper, strict=True))
    print(f"{name} ({psi / 1e9:.3g} B parameters), per rank on {n_ranks} ranks: data parallel "
          f"{readable_bytes(by_hand[0])}, ZeRO-1 {readable_bytes(by_hand[1])}, ZeRO-2 "
          f"{readable_bytes(by_hand[2])}, ZeRO-3 / FSDP {readable_bytes(by_hand[3])}")

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### The same as a wrapper for any model
#
# `helpers.scale.fsdp_module.FSDP(module, compute_dtype=None, units=None)` is the by-hand FSDP
# above as a wrapper you can put around any `nn.Module`, used the way PyTorch's `fully_shard` is:
# every parameter is cut into per-rank float32 pieces, which become the wrapper's only
# parameters, so any `torch.optim` optimizer steps them. Each submodule the `units` policy picks
# is gathered on its own, just before it runs, and again in the backward (its forward is
# recomputed, so its full weights do not stay alive in between); a weight shared by two units,
# such as a tied embedding, is gathered with the root. With `compute_dtype=torch.bfloat16` the
# gathered weights and each unit's inputs are cast to bfloat16, while the pieces and the reduction
# of the gradients stay float32: mixed precision. Against `fully_shard` with the same units and
# `MixedPrecisionPolicy(param_dtype=..., reduce_dtype=torch.float32)`, on `nn.TransformerEncoder`
# and on an MLP language model whose output matrix is its embedding, three AdamW steps:

# %% slideshow={"slide_type": "fragment"}
for name, dtype in (("encoder", "float32"), ("encoder", "bfloat16"), ("tied_mlp", "bfloat16")):
    ours = workers.run(any_model.train_fsdp_any, name, dtype)
    theirs = workers.run(any_model.train_fully_shard_any, name, dtype)
    gap = max(float((ours[0]["weights"][k] - w).abs().max()) for k,
              w in theirs[0]["weights"].items())
    assert ours[0]["losses"] == theirs[0]["losses"] and gap == 0.0
    print(f"{name:>8}, compute {dtype:>8}: {len(ours[0]['losses'])} losses and every weight equal "
          "to fully_shard's, bit for bit")

# %% [markdown] slideshow={"slide_type": "subslide"}
# Equal to the last bit: both gather the same float32 pieces, cast them the same way, and reduce
# the same gradients in the same order. Against one process with whole batches, the sums are
# taken in another order, so only round-off separates them (plain SGD here: Adam divides by the
# gradient's size, which can turn a round-off difference in a near-zero gradient into a whole step):

# %% slideshow={"slide_type": "fragment"}
ours = workers.run(any_model.train_fsdp_any, "encoder", "float32", 3, 0.05, "sgd")[0]
alone = any_model.train_one_process_any("encoder", 3, 0.05, "sgd")
scale = max(float(w.abs().max()) for w in alone["weights"].values())
gap = max(float((ours["weights"][k] - w).abs().max()) for k, w in alone["weights"].items())
assert gap <= 1e-5 * scale
print("FSDP on 2 processes vs 1 process, 3 SGD steps: largest weight difference < 1e-5 x the "
      "largest weight")

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### Saving and resuming any run
#
# A long run stops: a job's time is up, a machine fails. `helpers.training.resume.save_run(path,
# model, optimizer, step, **extra)` writes what a fresh process cannot rebuild: the weights, the
# optimizer's state (AdamW's `m` and `v`, and its step count), how many steps were taken, and
# torch's random state (dropout and the data order draw from it). `load_run(path, model,
# optimizer)` puts it back into a model and optimizer built again the same way. As with the
# course's checkpoints, the file is read with `torch.load(weights_only=True)`, which never runs
# code from it, a checksum catches a changed byte, and a model of other sizes is refused by name.
# The proof of a resume is that it changes nothing: eight steps in one go against three, a save, a
# fresh model, and five more.

# %% slideshow={"slide_type": "fragment"}
import tempfile
from pathlib import Path

from helpers.training.resume import load_run, save_run


def encoder_steps(model, optimizer, steps: range) -> list[float]:
    losses = []
    for step in steps:
        optimizer.zero_grad()
        loss = any_model.loss_of(model, *any_model.batch("encoder", step))
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def fresh_encoder():
    model = any_model.make("encoder")
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


# %% slideshow={"slide_type": "fragment"}
uninterrupted = encoder_steps(*fresh_encoder(), range(8))
model, optimizer = fresh_encoder()
first = encoder_steps(model, optimizer, range(3))
with tempfile.TemporaryDirectory() as folder:
    save_run(Path(folder) / "run.pt", model, optimizer, step=3)
    model, optimizer = fresh_encoder()
    resumed = load_run(Path(folder) / "run.pt", model, optimizer)
rest = encoder_steps(model, optimizer, range(resumed.step, 8))
assert first + rest == uninterrupted
print(f"resumed at step {resumed.step}: all {len(uninterrupted)} losses equal the uninterrupted "
      "run's, bit for bit")

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### Pipeline parallelism: GPipe and 1F1B
#
# `helpers.scale.pipeline` gives rank 0 the embeddings and the first half of the blocks, rank 1
# the rest, `ln_f` and the output matrix. The batch is cut into `m` micro-batches; rank 0 sends
# each micro-batch's activations `(b, N, D)` to rank 1 with a point-to-point `send`, and rank 1
# sends their gradient back. GPipe runs all forwards, then all backwards (it keeps `m`
# micro-batches of activations); 1F1B starts backwards as soon as it can and keeps at most `p - r`.
# The tied token matrix lives on both ends: one all-reduce adds its two gradients.

# %% slideshow={"slide_type": "fragment"}
from helpers.scale.pipeline import (
    gpipe_order,
    measure_bubble,
    one_f_one_b_order,
    reference_gradients,
    run_pipeline,
    timeline,
    timeline_bubble,
)

print("1F1B, 2 stages, 4 micro-batches:")
for rank, ops in enumerate(one_f_one_b_order(2, 4)):
    print(f"  rank {rank}: " + " ".join(f"{kind}{i}" for kind, i in ops))
reference_pipe = reference_gradients(batch_size=8)
for schedule in ("gpipe", "1f1b"):
    results_pipe = run_pipeline(workers, schedule, micro_batches=4, batch_size=8)
    gap = max((g - reference_pipe[name]).abs().max().item() for r in results_pipe for name,
              g in r["grads"].items())
    assert gap < 1e-12
    print(f"{schedule}: gradients of 2 stages vs 1 process (float64): max |diff| < 1e-12")

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### Exercise: the 1F1B order
#
# Write `one_f_one_b(stages, micro_batches)`: for each rank, the order in which it runs its
# forwards `("F", i)` and backwards `("B", i)` in a 1F1B step (the order printed above, for any
# sizes). A rank `r` can start micro-batch `i`'s backward only once every later stage has run
# that micro-batch's forward, and 1F1B starts each backward as early as that allows. The check
# compares your orders with the course's for pipelines of one to four stages; the timeline
# figure after it draws your order once it passes.
#
# <details><summary>Hint 1: the idea</summary>
#
# Three phases per rank: a warm-up of forwards that fills the pipe below it, a steady state of
# one forward then one backward, and a cool-down of the backwards that are left.
# </details>
#
# <details><summary>Hint 2: the plan</summary>(1) For each rank, how many forwards it runs before
# its first backward (warm-up). (2) The steady state: one forward, then one backward, while forwards
# remain. (3) The cool-down: the backwards still missing, oldest first.</details>
#
# <details><summary>Hint 3: closer</summary>The warm-up is one forward per stage after the rank,
# never more than the micro-batches.</details>

# %% slideshow={"slide_type": "fragment"}
def one_f_one_b(stages: int, micro_batches: int) -> list[list[tuple[str, int]]]:
    """For each rank r < stages, its ops in order: ("F", i) and ("B", i) for i < micro_batches."""
    ### BEGIN SOLUTION
    orders = []
    for rank in range(stages):
        warmup = min(stages - 1 - rank, micro_batches)  # forwards before the first backward
        ops = []
        for i in range(warmup):
            ops.append(("F", i))
        for i in range(micro_batches - warmup):  # steady state: one forward, one backward
            ops.append(("F", warmup + i))
            ops.append(("B", i))
        for i in range(micro_batches - warmup, micro_batches):  # cool-down
            ops.append(("B", i))
        orders.append(ops)
    return orders
    ### END SOLUTION


# %% slideshow={"slide_type": "fragment"}
check("distributed.one_f_one_b", one_f_one_b)

# %% [markdown] slideshow={"slide_type": "subslide"}
# The two schedules on a timeline, 1F1B in your order once it passes:

# %% slideshow={"slide_type": "fragment"}
your_order = yours_or("distributed.one_f_one_b", one_f_one_b, one_f_one_b_order)
figure, axes = plt.subplots(2, 1, figsize=(10, 4.5), layout="constrained", sharex=True)
for axis, (name, order) in zip(axes, (("GPipe", gpipe_order), ("1F1B", your_order)), strict=True):
    events = timeline(order(4, 6))
    for rank, slot, kind, i in events:
        axis.barh(rank, 1, left=slot, color="tab:blue" if kind == "F" else "tab:orange",
                  edgecolor="white")
        axis.text(slot + 0.5, rank, f"{kind}{i}", ha="center", va="center", color="white",
                  fontsize=9)
    axis.set(title=f"{name}, 4 stages, 6 micro-batches: idle share {timeline_bubble(events):.0%} "
                   f"= (p - 1) / (m + p - 1)", ylabel="stage (rank)", yticks=range(4))
    axis.invert_yaxis()
    assert math.isclose(timeline_bubble(events), bubble_fraction(4, 6))
axes[-1].set_xlabel("time slot (one forward or backward of one micro-batch)")
plt.show()

# %% [markdown] slideshow={"slide_type": "subslide"}
# The bubble, measured: a step of 16 sequences on the two processes, in float32, for several `m`.
# Each rank times its own computation; the rest of the step it waited. The figure shows the
# measured idle share beside the formula (timings differ between machines, so only the figure
# shows them; the step times are printed rounded).

# %% slideshow={"slide_type": "fragment"}
measured = measure_bubble(workers, "1f1b", [1, 2, 4, 8], batch_size=16, repeats=2)
figure, axis = plt.subplots(figsize=(7, 4), layout="constrained")
ms = list(measured)
axis.plot(ms, [measured[m]["formula"] for m in ms], "o-", label="formula (p - 1) / (m + p - 1)")
axis.plot(ms, [measured[m]["measured"] for m in ms], "s--",
          label="measured: 1 - compute time / step time")
axis.set(xscale="log", xticks=ms, xticklabels=ms,
         title="1F1B on 2 CPU processes: the bubble shrinks with m",
         xlabel="micro-batches m", ylabel="share of the step a rank idles")
axis.legend()
plt.show()
for m in ms:
    print(f"m = {m}: one step {format_duration(measured[m]['wall'])}")

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### Context parallelism: ring attention
#
# `helpers.scale.ring_attention` splits the *tokens*: each rank keeps the queries, keys and values
# of its slice of the sequence. The key/value block travels around the ring; at each step a rank
# scores its queries against the block it holds and folds the result into its running output
# with notebook 8's online softmax (each row's log-sum-exp is all the merge needs), then passes
# the block on. For causal attention the zig-zag split gives rank `r` chunks `r` and `2p - 1 - r`,
# so both ranks do the same work. The backward runs through the ring too: the gradient of a key
# block is sent back the other way.

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### Exercise: one step of the ring
#
# At each step a rank holds its running output `out` `(B, H, c, D_H)` with each row's
# log-sum-exp `lse` `(B, H, c)`, and the attention `o_b`, `lse_b` of its queries to the block
# that just arrived. Write `ring_merge(out, lse, o_b, lse_b)`: the attention over the keys of
# both, and its log-sum-exp. The check compares with attention over all the keys at once.
#
# This exercise stands alone: no later cell runs on your answer (the ring attention below runs the
# course's merge on worker processes).
#
# <details><summary>Hint 1: the idea</summary>
#
# The exponential of a log-sum-exp is that part's softmax denominator. The merged denominator is
# their sum, and each part's output counts in proportion to its own denominator.
# </details>
#
# <details><summary>Hint 2: the plan</summary>(1) The merged log-sum-exp, from the two parts',
# computed stably. (2) Each part's share of the merged denominator. (3) The two outputs, each
# weighted by its share, added.</details>
#
# <details><summary>Hint 3: closer</summary>PyTorch has one stable function for the log of a sum of
# two exponentials. A share is e to the power (the part's log-sum-exp minus the merged one), with a
# trailing axis of size one to weight the output row by row.</details>

# %% slideshow={"slide_type": "fragment"}
def ring_merge(out: torch.Tensor, lse: torch.Tensor, o_b: torch.Tensor,
               lse_b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) and (o_b, lse_b) over disjoint keys -> (out, lse) over all of them."""
    ### BEGIN SOLUTION
    merged = torch.logaddexp(lse, lse_b)  # the log of the two denominators' sum
    share_a, share_b = (torch.exp(part - merged)[..., None] for part in (lse, lse_b))
    return share_a * out + share_b * o_b, merged
    ### END SOLUTION


# %% slideshow={"slide_type": "fragment"}
check("distributed.ring_merge", ring_merge)

# %% slideshow={"slide_type": "fragment"}
from helpers.scale.ring_attention import (
    full_attention_reference,
    run_ring_attention,
    split_sequence,
)

shape = (2, 2, 16, 8)  # B, H, N, D_H
reference_ring = full_attention_reference(shape)
for zigzag in (False, True):
    results_ring = run_ring_attention(workers, shape, zigzag=zigzag)
    gap = max((r[name] - split_sequence(reference_ring[name], rank, 2, zigzag)).abs().max().item()
              for rank, r in enumerate(results_ring) for name in ("out", "q", "k", "v"))
    assert gap < 1e-6
    print(f"{'zig-zag' if zigzag else 'contiguous'} split: output and gradients of q, k, v vs full "
          f"attention: max |diff| < 1e-6; scores computed per rank "
          f"{[r['work'] for r in results_ring]}")

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### On one device: gradient accumulation and recomputation
#
# Two ways to cut the activations a step keeps for its backward, on the tiny GPT: accumulate the
# gradient over `k` pieces of the batch, or save only each block's input and rerun the block in
# the backward (`torch.utils.checkpoint`). The bytes are counted with autograd's saved-tensor
# hooks (`helpers.scale.recompute`); the gradients are the same (checked in tests/scale/test_recompute.py).

# %% slideshow={"slide_type": "fragment"}
from helpers.scale.recompute import compare_memory_and_time

torch.manual_seed(0)
ids_rc = torch.randint(0, TINY_GPT.vocab_size, (16, TINY_GPT.context_length + 1))
table_rc = compare_memory_and_time(make_model(Run(model="gpt")), ids_rc[:, :-1], ids_rc[:, 1:],
                                   accumulation=4)
for name, row in table_rc.items():
    print(f"{name:>14}: activations kept at most {readable_bytes(row['peak_bytes']):>8}, "
          f"a step {format_duration(row['seconds'])}")

# %% [markdown] slideshow={"slide_type": "subslide"}
# ### When a worker fails
#
# If a worker raises, its traceback comes back to the notebook as a `WorkerFailed`, and all the
# processes are stopped, including the one that waits forever in an all-reduce for the rank
# that failed: without that, the notebook would hang. `fail_on_rank` makes rank 1 raise. (A
# later `workers.run` would start two fresh processes.)

# %% slideshow={"slide_type": "fragment"}
try:
    workers.run(fail_on_rank, 1)
except WorkerFailed as error:
    print(f"rank {error.rank} failed; the last line of its traceback:")
    print("   ", error.worker_traceback.strip().splitlines()[-1])
print("processes still running:", len(workers.processes))

# %% [markdown] slideshow={"slide_type": "slide"}
# ## Check your understanding (optional)
#
# **1. The USF notes: what are the aspects of Transformer parallelization?**
#
# <details><summary>Answer</summary>
#
# Within one device: every position of a sequence is processed at once during training (no
# recurrence: the causal mask, not a loop, keeps the future out), the heads run as one batched
# product, the batch is one more axis, and FlashAttention splits the queries into tiles. Across
# devices: data parallelism (the batch), sharded data parallelism (the batch, and the training
# state split by ZeRO/FSDP), tensor parallelism (each matrix: MLP units, heads), pipeline
# parallelism (the layers), sequence/context parallelism (the tokens) and expert parallelism (the
# experts of an MoE layer). Section 5's table gives what each sends per step.
# </details>

# %% slideshow={"slide_type": "fragment"}
catch_up("11_distributed", "Check")  # started here after a restart? this runs the sections above

# %% [markdown] slideshow={"slide_type": "subslide"}
# **2. Why do 2 processes with half the batch each end with the same weights as 1 process?**
#
# <details><summary>Answer</summary>
#
# The loss is a mean over the batch, so the whole batch's gradient is the average of the halves'
# gradients. The broadcast makes the starting weights equal, the all-reduce makes the gradient
# equal to the whole batch's, and the same optimizer step then keeps them equal, step after
# step. Only round-off differs (the sums are added in another order): below `1e-6` here.
# </details>

# %% [markdown] slideshow={"slide_type": "subslide"}
# **3. Does a ring all-reduce get slower per rank with more ranks?**
#
# <details><summary>Answer</summary>
#
# Barely in bytes: each rank sends `2 (p - 1) / p x n`, from `n` at `p = 2` towards `2n` (the
# cell below prints `p = 2, 8, 1024` for GPT-2 small's bf16 gradient). Latency does grow with
# the `2 (p - 1)` steps, which is why large clusters use trees or hierarchical rings.
# </details>

# %% [markdown] slideshow={"slide_type": "subslide"}
# **4. What does ZeRO-1 save, and what does it cost?**
#
# <details><summary>Answer</summary>
#
# The AdamW state is divided by `p`. In float32 it is 8 of the 16 bytes per parameter: GPT-2 small
# on 8 ranks goes from about 1.99 GB to 1.12 GB per rank, 1.8x less. In the ZeRO paper's mixed
# precision it is 12 of 16 (master weights, `m`, `v`), and the saving is 2.9x (section 3, and the
# cell below). The cost in bytes is nothing beyond DDP's if the gradients are reduce-scattered
# and the new weights all-gathered (1.5x DDP for this notebook's all-reduce + broadcast), and
# each rank must know who owns what.
# </details>

# %% [markdown] slideshow={"slide_type": "subslide"}
# **5. Why does a tensor-parallel MLP need only one all-reduce in its forward pass?**
#
# <details><summary>Answer</summary>
#
# The column-parallel `up` gives each rank whole hidden units, and GELU works unit by unit, so
# nothing needs exchanging between `up` and `down`. The row-parallel `down` gives partial sums of
# the output; adding them is the one all-reduce. Splitting `up` by rows of its input instead
# would need an all-reduce before the GELU as well.
# </details>

# %% slideshow={"slide_type": "fragment"}
gradient_bytes = 2 * exact_parameters(gpt2)  # bf16
for p in (2, 8, 1024):
    print(f"p = {p:>4}: each rank sends {readable_bytes(ring_all_reduce_bytes(gradient_bytes, p))} "
          f"of a {readable_bytes(gradient_bytes)} gradient")
memory = memory_per_rank(exact_parameters(gpt2), world_size=8)
mixed = by_precision["mixed"]
mixed_ratio = mixed["data parallel"] / mixed["ZeRO-1 (optimizer state)"]
print(
    f"GPT-2 small, 8 ranks: data parallel {readable_bytes(memory['data parallel'])}, "
    f"ZeRO-1 {readable_bytes(memory['ZeRO-1 (optimizer state)'])} per rank "
    f"({memory['data parallel'] / memory['ZeRO-1 (optimizer state)']:.1f}x); mixed precision: "
    f"{mixed_ratio:.1f}x"
)

# %% [markdown] slideshow={"slide_type": "subslide"}
# **6. FSDP all-gathers every weight twice per step. Why not keep the gathered weights from the
# forward pass for the backward?**
#
# <details><summary>Answer</summary>
#
# Then every rank would hold all the weights at once at the end of the forward pass, which is
# what FSDP exists to avoid: the model's 16-bit weights alone may not fit (GPT-3's are 2 bytes x
# 175 B parameters). Gathering again costs bytes on the link, not memory; a unit's weights are
# alive only while it runs (section 7 prints the peak, a fraction of the whole model). ZeRO-2 is
# the trade the other way: weights kept whole, gradients and state split.
# </details>

# %% [markdown] slideshow={"slide_type": "subslide"}
# **7. GPipe and 1F1B have the same bubble. What does 1F1B buy, and what shrinks the bubble?**
#
# <details><summary>Answer</summary>
#
# Both fill and drain the pipe in `p - 1` slots, so both idle `(p - 1) / (m + p - 1)` of the step
# (section 7's timeline counts it). 1F1B runs each backward as early as it can, so rank `r` keeps
# the activations of at most `p - r` micro-batches instead of all `m`: the memory no longer grows
# with `m`. Only more micro-batches (or interleaved stages, several small stages per rank)
# shrink the bubble, and smaller micro-batches run less efficiently, as the step times show.
# </details>

# %% [markdown] slideshow={"slide_type": "subslide"}
# **8. Why does ring attention need each row's log-sum-exp, and not only the partial outputs?**
#
# <details><summary>Answer</summary>
#
# A partial output is normalised by its own block's softmax denominator. To merge two, each must
# be re-weighted by its block's share of the total denominator, `exp(lse_block - lse_total)`, and
# the log-sum-exp is exactly that denominator (notebook 8's online softmax). With the zig-zag split
# every rank scores as many query-key pairs as the other (section 7 prints the counts).
# </details>
