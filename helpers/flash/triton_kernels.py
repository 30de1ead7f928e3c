"""The FlashAttention-2 kernels in Triton: the forward pass and the two backward kernels.

    fold_key_tiles               the online softmax over a range of key tiles (helpers.flash.tiled.tile_step)
    flash_forward_kernel         one program per query tile: output tile and log-sum-exp, written once
    recompute_probs              a tile of P = exp(S - lse), rebuilt from q, k and the saved lse
    flash_backward_dk_dv_kernel  one program per key tile: dK and dV over the query tiles that see it
    flash_backward_dq_kernel     one program per query tile: dQ over the key tiles it sees

`helpers.flash.triton_attention.triton_attention` launches them (notebook 8, sections 8 and 9); read that
module's docstring for the algorithm and for running them without a GPU (TRITON_INTERPRET=1,
which must be set before this module is imported, because `@triton.jit` reads it).

Scores are kept in log2 units (times LOG2_E) so that the GPU's fast exp2 replaces exp.
Offsets into the tensors are int64, as in Triton's fused-attention tutorial: the (batch, head)
number is cast once with `.to(tl.int64)` and every offset computed from it follows. In int32 an
offset overflows past 2^31 elements (a (16, 32, 8192, 128) tensor has 2^29; a long context with
many heads passes 2^31), and the kernel would read the wrong memory without any error.
Importing this module never fails: without Triton, `triton` and `tl` are None and no kernel exists.
"""

from __future__ import annotations

try:
    import triton
    import triton.language as tl
except ImportError:  # no Triton (macOS, Windows, a minimal install): the module still imports
    triton = None
    tl = None

LOG2_E = 1.4426950408889634  # exp(x) = 2^(x log2 e): the GPU's exp2 is its fast instruction


if triton is not None:

    @triton.jit
    def fold_key_tiles(acc, row_sum, row_max, visited, q, k_start_ptr, v_start_ptr, stride_kn,
                        stride_vn, rows, dims, key_start, key_stop, n_k, causal_offset, qk_scale,
                        HEAD_DIM: tl.constexpr, BLOCK_K: tl.constexpr, MASKED: tl.constexpr,
                        CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr):
        """The online softmax over key tiles [key_start, key_stop): helpers.flash.tiled.tile_step.

        Scores are in log2 units (multiplied by log2 e), so exp2 replaces exp. MASKED is False
        for tiles that every query of this tile sees in full: they skip the mask arithmetic.
        `visited` counts the key tiles loaded (see key_tiles_visited).
        """
        dim_ok = dims < HEAD_DIM
        for start in range(key_start, key_stop, BLOCK_K):
            cols = start + tl.arange(0, BLOCK_K)
            load_ok = dim_ok[None, :]
            if MASKED:
                load_ok = load_ok & (cols[:, None] < n_k)
            k = tl.load(k_start_ptr + cols[:, None] * stride_kn + dims[None, :], mask=load_ok, other=0.0)
            v = tl.load(v_start_ptr + cols[:, None] * stride_vn + dims[None, :], mask=load_ok, other=0.0)
            scores = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
            if MASKED:
                visible = cols[None, :] < n_k
                if CAUSAL:
                    visible = visible & (cols[None, :] <= rows[:, None] + causal_offset)
                scores = tl.where(visible, scores, float("-inf"))
            new_max = tl.maximum(row_max, tl.max(scores, 1))
            # A row that has seen only hidden keys keeps max -inf: shift it by 0, so exp2 gives 0.
            shift = tl.where(new_max == float("-inf"), 0.0, new_max)
            probs = tl.math.exp2(scores - shift[:, None])
            correction = tl.math.exp2(row_max - shift)
            row_sum = row_sum * correction + tl.sum(probs, 1)
            acc = acc * correction[:, None] + tl.dot(probs.to(v.dtype), v, input_precision=DOT_PRECISION)
            row_max = new_max
            visited += 1
        return acc, row_sum, row_max, visited

    @triton.jit
    def flash_forward_kernel(Q, K, V, Out, Lse, Visits,
                              stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn,
                              stride_vb, stride_vh, stride_vn, stride_ob, stride_oh, stride_on,
                              n_heads, n_q, n_k, qk_scale,
                              HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                              BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr,
                              CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr,
                              ACC_DTYPE: tl.constexpr, COUNT_TILES: tl.constexpr):
        """One program: query tile program_id(0) of (batch, head) number program_id(1)."""
        query_tile = tl.program_id(0)
        batch_head = tl.program_id(1).to(tl.int64)  # int64 offsets: see the module docstring
        batch, head = batch_head // n_heads, batch_head % n_heads
        first_row = query_tile * BLOCK_Q
        rows = first_row + tl.arange(0, BLOCK_Q)
        dims = tl.arange(0, BLOCK_D)  # BLOCK_D is d rounded up to a power of two; extra dims are 0
        q_ok = (rows[:, None] < n_q) & (dims[None, :] < HEAD_DIM)
        q = tl.load(Q + batch * stride_qb + head * stride_qh + rows[:, None] * stride_qn + dims[None, :],
                    mask=q_ok, other=0.0)
        k_start = K + batch * stride_kb + head * stride_kh
        v_start = V + batch * stride_vb + head * stride_vh

        acc = tl.zeros((BLOCK_Q, BLOCK_D), dtype=ACC_DTYPE)
        row_sum = tl.zeros((BLOCK_Q,), dtype=ACC_DTYPE)
        row_max = tl.full((BLOCK_Q,), float("-inf"), dtype=ACC_DTYPE)
        visited = 0

        # Query i sees key j when j <= i + causal_offset (the course's bottom-right triangle).
        causal_offset = n_k - n_q
        if CAUSAL:
            seen_by_all = tl.minimum(first_row + causal_offset + 1, n_k)  # keys every row sees
            seen_by_any = tl.minimum(first_row + BLOCK_Q + causal_offset, n_k)  # tiles past: skipped
        else:
            seen_by_all = n_k
            seen_by_any = n_k
        unmasked_stop = tl.maximum(seen_by_all, 0) // BLOCK_K * BLOCK_K  # whole tiles only
        masked_stop = tl.maximum(seen_by_any, 0)
        acc, row_sum, row_max, visited = fold_key_tiles(
            acc, row_sum, row_max, visited, q, k_start, v_start, stride_kn, stride_vn, rows, dims,
            0, unmasked_stop, n_k, causal_offset, qk_scale,
            HEAD_DIM, BLOCK_K, False, CAUSAL, DOT_PRECISION)
        acc, row_sum, row_max, visited = fold_key_tiles(
            acc, row_sum, row_max, visited, q, k_start, v_start, stride_kn, stride_vn, rows, dims,
            unmasked_stop, masked_stop, n_k, causal_offset, qk_scale,
            HEAD_DIM, BLOCK_K, True, CAUSAL, DOT_PRECISION)

        # Divide once at the end; a query that saw no key keeps output 0 and lse -inf.
        safe_sum = tl.where(row_sum == 0.0, 1.0, row_sum)
        out = acc / safe_sum[:, None]
        tl.store(Out + batch * stride_ob + head * stride_oh + rows[:, None] * stride_on + dims[None, :],
                 out.to(Out.dtype.element_ty), mask=q_ok)
        lse = tl.where(row_sum == 0.0, float("-inf"), row_max + tl.math.log2(safe_sum))
        lse = lse * 0.6931471805599453  # from log2 units back to natural log: times ln 2
        tl.store(Lse + batch_head * n_q + rows, lse, mask=rows < n_q)
        if COUNT_TILES:
            tl.store(Visits + batch_head * tl.num_programs(0) + query_tile, visited)

    @triton.jit
    def recompute_probs(q, k, lse_log2, rows, cols, n_q, n_k, causal_offset, qk_scale,
                         CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr):
        """The tile P = exp(S - lse) (BLOCK_Q, BLOCK_K) of the forward pass, rebuilt from q, k and
        the saved log-sum-exp (in log2 units); 0 where a key is hidden or out of range."""
        scores = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
        visible = (rows[:, None] < n_q) & (cols[None, :] < n_k)
        if CAUSAL:
            visible = visible & (cols[None, :] <= rows[:, None] + causal_offset)
        scores = tl.where(visible, scores, float("-inf"))
        # A query that saw no key has lse -inf and only hidden scores: shift by 0, exp2 gives 0.
        shift = tl.where(lse_log2 == float("-inf"), 0.0, lse_log2)
        return tl.math.exp2(scores - shift[:, None])

    @triton.jit
    def flash_backward_dk_dv_kernel(Q, K, V, dO, Lse, Delta, dK, dV, n_q, n_k, qk_scale, scale,
                                     HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                                     BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr,
                                     CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr,
                                     ACC_DTYPE: tl.constexpr):
        """One program: key tile program_id(0) of (batch, head) program_id(1). It keeps its K, V
        tile on chip and walks the query tiles that see it:
            dV += P^T dO,  dP = dO V^T,  dS = P * (dP - D),  dK += scale dS^T Q.
        Tensors are contiguous (B, H, N, d); Lse and Delta are (B, H, N_q)."""
        key_tile = tl.program_id(0)
        batch_head = tl.program_id(1).to(tl.int64)  # int64 offsets: see the module docstring
        first_col = key_tile * BLOCK_K
        cols = first_col + tl.arange(0, BLOCK_K)
        dims = tl.arange(0, BLOCK_D)
        dim_ok = dims[None, :] < HEAD_DIM
        kv_offsets = batch_head * n_k * HEAD_DIM + cols[:, None] * HEAD_DIM + dims[None, :]
        kv_ok = (cols[:, None] < n_k) & dim_ok
        k = tl.load(K + kv_offsets, mask=kv_ok, other=0.0)
        v = tl.load(V + kv_offsets, mask=kv_ok, other=0.0)
        dk = tl.zeros((BLOCK_K, BLOCK_D), dtype=ACC_DTYPE)
        dv = tl.zeros((BLOCK_K, BLOCK_D), dtype=ACC_DTYPE)

        causal_offset = n_k - n_q
        first_row = 0
        if CAUSAL:  # query i sees key j when i >= j - offset: earlier query tiles see none of ours
            first_row = tl.maximum(first_col - causal_offset, 0) // BLOCK_Q * BLOCK_Q
        for start in range(first_row, n_q, BLOCK_Q):
            rows = start + tl.arange(0, BLOCK_Q)
            row_ok = rows < n_q
            q_offsets = batch_head * n_q * HEAD_DIM + rows[:, None] * HEAD_DIM + dims[None, :]
            q = tl.load(Q + q_offsets, mask=row_ok[:, None] & dim_ok, other=0.0)
            do = tl.load(dO + q_offsets, mask=row_ok[:, None] & dim_ok, other=0.0)
            lse = tl.load(Lse + batch_head * n_q + rows, mask=row_ok, other=0.0) * 1.4426950408889634
            delta = tl.load(Delta + batch_head * n_q + rows, mask=row_ok, other=0.0)
            probs = recompute_probs(q, k, lse, rows, cols, n_q, n_k, causal_offset, qk_scale,
                                     CAUSAL, DOT_PRECISION)
            dv += tl.dot(tl.trans(probs.to(do.dtype)), do, input_precision=DOT_PRECISION)
            dprobs = tl.dot(do, tl.trans(v), input_precision=DOT_PRECISION)
            dscores = probs * (dprobs - delta[:, None])
            dk += tl.dot(tl.trans(dscores.to(q.dtype)), q, input_precision=DOT_PRECISION)
        tl.store(dK + kv_offsets, (dk * scale).to(dK.dtype.element_ty), mask=kv_ok)
        tl.store(dV + kv_offsets, dv.to(dV.dtype.element_ty), mask=kv_ok)

    @triton.jit
    def flash_backward_dq_kernel(Q, K, V, dO, Lse, Delta, dQ, n_q, n_k, qk_scale, scale,
                                  HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                                  BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr,
                                  CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr,
                                  ACC_DTYPE: tl.constexpr):
        """One program: query tile program_id(0) of (batch, head) program_id(1). It keeps its
        Q, dO tile on chip and walks the key tiles it sees, as the forward does:
            dP = dO V^T,  dS = P * (dP - D),  dQ += scale dS K."""
        query_tile = tl.program_id(0)
        batch_head = tl.program_id(1).to(tl.int64)  # int64 offsets: see the module docstring
        first_row = query_tile * BLOCK_Q
        rows = first_row + tl.arange(0, BLOCK_Q)
        row_ok = rows < n_q
        dims = tl.arange(0, BLOCK_D)
        dim_ok = dims[None, :] < HEAD_DIM
        q_offsets = batch_head * n_q * HEAD_DIM + rows[:, None] * HEAD_DIM + dims[None, :]
        q_ok = row_ok[:, None] & dim_ok
        q = tl.load(Q + q_offsets, mask=q_ok, other=0.0)
        do = tl.load(dO + q_offsets, mask=q_ok, other=0.0)
        lse = tl.load(Lse + batch_head * n_q + rows, mask=row_ok, other=0.0) * 1.4426950408889634
        delta = tl.load(Delta + batch_head * n_q + rows, mask=row_ok, other=0.0)
        dq = tl.zeros((BLOCK_Q, BLOCK_D), dtype=ACC_DTYPE)

        causal_offset = n_k - n_q
        key_stop = n_k
        if CAUSAL:  # the key tiles past the last row's diagonal are hidden from the whole tile
            key_stop = tl.maximum(tl.minimum(first_row + BLOCK_Q + causal_offset, n_k), 0)
        for start in range(0, key_stop, BLOCK_K):
            cols = start + tl.arange(0, BLOCK_K)
            kv_offsets = batch_head * n_k * HEAD_DIM + cols[:, None] * HEAD_DIM + dims[None, :]
            kv_ok = (cols[:, None] < n_k) & dim_ok
            k = tl.load(K + kv_offsets, mask=kv_ok, other=0.0)
            v = tl.load(V + kv_offsets, mask=kv_ok, other=0.0)
            probs = recompute_probs(q, k, lse, rows, cols, n_q, n_k, causal_offset, qk_scale,
                                     CAUSAL, DOT_PRECISION)
            dprobs = tl.dot(do, tl.trans(v), input_precision=DOT_PRECISION)
            dscores = probs * (dprobs - delta[:, None])
            dq += tl.dot(dscores.to(k.dtype), k, input_precision=DOT_PRECISION)
        tl.store(dQ + q_offsets, (dq * scale).to(dQ.dtype.element_ty), mask=q_ok)
