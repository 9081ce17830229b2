"""Scaled dot-product attention, forward and backward (chapter 9).

Shapes (letters fixed for the whole chapter):
    Q (B,H,S,D)        queries: B sequences, H query heads, S query positions, head size D
    K, V (B,Hkv,T,D)   keys and values: Hkv key/value heads, T key positions
    kv_len (B,) int32  key-padding mask: keys j >= kv_len[b] do not exist for sequence b
    causal (int 0/1)   causal mask, aligned bottom-right: query i sees key j iff j <= i + (T - S)
                       (S = T: the usual lower triangle; S = 1: one decode step sees every key)
    -> O (B,H,S,D), L (B,H,S)

Grouped-query attention (GQA): H = g * Hkv, and query head h reads key/value head h // g. Hkv = H is
multi-head attention; Hkv = 1 is multi-query attention. GQA exists to shrink K and V (and the KV cache)
by g while keeping H query heads.

Math, per (b, h), with scale = 1/sqrt(D) and "visible(i, j)" the two masks:
    s_ij = scale * q_i . k_j            (-inf where not visible)      scores (S,T)
    L_i  = log sum_j exp(s_ij)          the per-row logsumexp          (S,)
    P_ij = exp(s_ij - L_i)              softmax of each row            (S,T)
    O_i  = sum_j P_ij v_j                                                (S,D)
A fully masked row (no visible key) has no softmax: it is DEFINED as O_i = 0 and L_i = -inf, the
convention of chapter 8's softmax, so no NaN reaches the next layer.

Cost: 4*D FLOPs per visible (i, j) pair per head (2D for q.k, 2D for P v): 4*S*T*D per head without
masks, about half that with a causal mask. Bytes that must move: Q, K, V and O once (plus L) -- the S x T
score matrix never has to. That is the whole point of the chapter: at S = T = 2048, H = 16, B = 4 the
scores are 1 GiB in float32, while Q, K, V and O together are 128 MiB.

Backward (P recomputed from the saved L, as in FlashAttention), given dO (B,H,S,D), Q, K, V, O and L:
    Dr_i  = sum_d dO_id * O_id                     (B,H,S)   one dot per row, once
    P_ij  = exp(s_ij - L_i)                        recomputed from the saved L: no S x T buffer
    dV_j  = sum_i P_ij dO_i                        summed over the g query heads of the group too
    dP_ij = dO_i . v_j
    dS_ij = P_ij (dP_ij - Dr_i)
    dQ_i  = scale * sum_j dS_ij k_j
    dK_j  = scale * sum_i dS_ij q_i                summed over the group's heads
Useful FLOPs: 8*D per visible pair per head (four matrix products); a flash backward also recomputes
a fifth, Q K^T, so it does at least 10*D = 2.5x the forward's 4*D. FlashAttention-2's backward (Dao 2023,
arXiv 2307.08691, Alg. 2) reaches that minimum with ONE kernel per key tile that builds dK and dV and
adds each tile's share of dQ into DRAM with atomic adds. Ours uses TWO kernels and no atomics: one owns a
tile of keys and loops over every query tile (and every head of its group) to build dK and dV; another
owns a tile of queries and loops over keys for dQ. Both recompute s and dP, so a pair costs 14*D (3.5x the
forward) instead of 10*D, but each output element is written by exactly one thread: the result is bitwise
reproducible.

Size tuple (what the registry, bench and tests pass around): (B, H, Hkv, S, T, D, mask) with
mask = 0 none, 1 causal, 2 key padding, 3 causal + key padding. make_inputs turns it into
(Q, K, V, kv_len, causal); with padding, kv_len is 2T/3 for even b and T for odd b.

Ladder (forward; op ``attention``)
  cpu/naive        rung 1   per (b, h) the S x T score matrix materialized, then softmax, then P V
  cpu/online       rung 2   one query row at a time, online softmax over the keys: O(D) extra memory
  cpu/prange       rung 3   rung 2 with (b, h, row block) spread over the cores
  cpu/blocked      rung 4   16 query rows x 64-key tiles: each K/V tile is reused by 16 rows from cache
  cpu/simd         rung 5   rung 4 in SIMD: score and P V tiles register-blocked 2 rows x 4 keys, the
                            exp from cpumath (no libm call), the tile max an integer max
  cpu/numpy        baseline the formula with NumPy matmuls in float32 (the S x T scores materialized)
  cpu/torch        baseline torch.nn.functional.scaled_dot_product_attention on the CPU
  gpu/three_kernels rung 1  scores (tiled GEMM) -> DRAM -> softmax -> DRAM -> P V (tiled GEMM)
  gpu/row          rung 2   one block per query row, online softmax: no S x T buffer at all
  gpu/flash        rung 3   Br x Bc flash tiling, running max/sum/unnormalized O in registers
  gpu/flash_causal rung 4   rung 3 that never loads tiles above the causal diagonal (or past kv_len)
  gpu/flash_tuned  rung 5   rung 4 with the tile shape chosen per head size D
  gpu/sdpa_math    baseline torch SDPA, math backend, TF32 off
  gpu/sdpa_default baseline torch SDPA as a user calls it (fp32: the memory-efficient backend)
Backward (op ``attention_bwd``): cpu/prange; gpu/flash2 (rung 1: pre-pass + dK/dV kernel + dQ kernel);
gpu/flash2_vec (rung 2: the same three kernels written like forward rungs 6-7: 16-byte shared loads,
unrolled loops, <= 128 registers, masks only where needed); and the torch autograd baselines sdpa_math /
sdpa_default.

The torch baselines produce O through F.scaled_dot_product_attention, exactly as a user calls it.
SDPA does not return L, so for ``kernels check`` they also compute L (and zero fully masked rows)
with extra torch work. With the environment variable KERNELS_SDPA_O_ONLY=1 (set for benchmarks) they
skip that extra work, so the timings are those of SDPA itself (their L is then not written).

Other ops here: ``attention_scores`` (the masked, scaled score matrix: the first kernel of gpu rung 1,
and an exercise) and ``attention_bwd_dv`` (dV alone: an exercise).

The family lives in eight files, each one idea: attention_ref (the oracle, inputs, tolerances and the ops),
attention_cpu, attention_fwd (GPU rungs 1-5), attention_flash2 (GPU rungs 6-7), attention_bwd and
attention_bwd_vec (the GPU backward, rungs 1 and 2), attention_torch (the SDPA yardsticks) and
attention_speedup (the causal speed-up prediction). A new variant touches one of them and its test. This
module hands their names on, for the chapters and figures (``attention.reference``, ``attention.flash``, ...).
"""
from .attention_ref import (MASKS, SIZES, SIZE_NAMES, _flops, kv_lengths, make_edge_inputs,
                            make_edge_inputs_bwd, make_inputs, make_inputs_bwd, reference, reference_bwd,
                            scores_reference, tol, tol_bwd, visible, visible_pairs)  # noqa: F401
from .attention_cpu import (BC_CPU, BC_SIMD, BR_CPU, BR_SIMD, ROWS_PER_TASK, _online_row, _simd_cpu,
                            attention_blocked_cpu, attention_bwd_cpu, attention_bwd_dv_cpu,
                            attention_naive_cpu, attention_numpy_cpu, attention_online_cpu,
                            attention_prange_cpu, attention_scores_cpu, attention_simd_cpu,
                            attention_torch_cpu)  # noqa: F401
from .attention_fwd import (FLASH_CFG, FLASH_CFG_WIDE, ROW_THREADS, SIG_FWD, SIG_SCORES, SMEM_LIMIT,
                            SM_THREADS, TILE, TILE_P, TUNED, _base_cfg, _tuned_cfg, attention_flash,
                            attention_flash_causal, attention_flash_tuned, attention_pv_kernel,
                            attention_row, attention_scores_gpu, attention_softmax_kernel,
                            attention_three_kernels, flash, free_workspace, make_flash_kernel,
                            make_row_kernel, make_scores_kernel, row_kernel, scores_kernel, workspace)  # noqa: F401
from .attention_flash2 import (FLASH2_REGS, SMEM_ALIGN, attention_flash_shfl, attention_flash_vec,
                               flash2, flash2_config, flash2_fits, make_flash2_kernel)  # noqa: F401
from .attention_bwd import (PARTS, SIG_BWD_PRE, SIG_DKDV, SIG_DQ, _scratch, attention_bwd_dv_gpu,
                            attention_bwd_flash2, attention_bwd_pre_kernel, dkdv_kernel, dq_kernel,
                            make_dkdv_kernel, make_dq_kernel)  # noqa: F401
from .attention_bwd_vec import (BWD2_CFG, BWD2_THREADS, attention_bwd_flash2_vec, bwd2, dkdv2, dq2,
                                make_dkdv2_kernel, make_dq2_kernel)  # noqa: F401
from .attention_torch import (O_ONLY, attention_bwd_sdpa_default, attention_bwd_sdpa_math,
                              attention_sdpa_default, attention_sdpa_math)  # noqa: F401
from .attention_speedup import (H100_DIR, SPEEDUP_BAND, causal_speedup_model, causal_tile_model,
                                measured_causal_speedup, measured_causal_speedups, reference_speedup)  # noqa: F401
