"""FlashAttention: attention computed tile by tile, and what that saves (notebook 8).

Beside the model: it computes what `helpers.model.attention` defines, with less memory traffic.

    tiled             online softmax and tiled attention in PyTorch (forward, backward)
    costs             the HBM-traffic and FLOP counts of naive and tiled attention
    triton_attention  the same algorithm as Triton kernels (GPU, or the interpreter)
    triton_kernels    the kernels themselves, forward and backward
    gpu_blocks        the kernels' tiles, warps, stages and dtype for a GPU (T4 to H200)
    profiling         peak memory of a call, from the PyTorch profiler
    gpu_figures       the kernels' figures measured on an NVIDIA H200, read from data/
"""
