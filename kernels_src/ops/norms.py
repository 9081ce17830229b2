"""LayerNorm  x (M,N), gamma (N,), beta (N,) -> y (M,N), mean (M,), rstd (M,)
           mean_i = sum_j x_ij / N;  var_i = sum_j (x_ij - mean_i)^2 / N   (biased, as in PyTorch)
           rstd_i = 1 / sqrt(var_i + eps)                                   (eps INSIDE the square root)
           y_ij = (x_ij - mean_i) * rstd_i * gamma_j + beta_j
           backward: dy, x, mean, rstd, gamma -> dx (M,N), dgamma (N,), dbeta (N,)
RMSNorm    x (M,N), gamma (N,) -> y (M,N), rstd (M,)
           rstd_i = 1 / sqrt(sum_j x_ij^2 / N + eps);  y_ij = x_ij * rstd_i * gamma_j
           backward: dy, x, rstd, gamma -> dx (M,N), dgamma (N,)
eps = 1e-5 for both (EPS below). mean and rstd are saved by the forward for the backward, as PyTorch
and llm.c do.

Cost: forward ~7 (LayerNorm) / ~4 (RMSNorm) FLOPs per element; at least 2MN elements move (read x,
write y; gamma, beta, mean and rstd are O(M + N)). Memory-bound, judged against copy bandwidth.

Ladder (forward; RMSNorm has the same rungs)
  cpu/loop        rung 1   @njit, row by row: mean, then variance around it (two passes), then write
  cpu/prange      rung 2   rows split over cores
  gpu/row_smem    rung 1   one block per row, threads stride over it, shared-memory trees; x read 3x
  gpu/regs        rung 2   the row held in registers, one Welford merge: x read once (simulator path)
  gpu/regs_shfl   rung 3   rung 2 with warp-shuffle reductions, optionally several rows per block (real
                           GPU only); values per thread and rows per block were chosen by measurement
                           (PER_THREAD, ROWS below; book/data/bench/rowwise_explore_gpu.json)
  gpu/vec4        rung 4   the row in registers with 16-byte loads and stores (kernels_src.vec), mean and
                           variance as two plain sums over registers; shuffles on a GPU, shared-memory
                           trees in the simulator; rows of length % 4 != 0 use guarded scalar loads
  gpu/torch       baseline torch.native_layer_norm / rms_norm, then copied into our buffers; the
                           same-run torch-eager timing without the copy is in chapter 7's benchmark
Backward
  cpu/loop        rung 1   row by row, dgamma/dbeta accumulated across rows
  gpu/stream      rung 1   any row length: strips of rows per block, two walks per row, partial
                           dgamma/dbeta rows in global memory; the register rungs fall back to it
  gpu/regs        rung 2   kernel 1: blocks own every G-th row, compute dx and keep per-column partial
                           dgamma/dbeta in registers; kernel 2: sums the partials over the blocks
  gpu/regs_shfl   rung 3   rung 2 with warp-shuffle row sums and twice the blocks per SM (real GPU only)
  gpu/vec4        rung 4   strips of consecutive rows, one block per resident slot, 16-byte accesses,
                           the next row loaded before this one is reduced; a column-sum kernel after

Precision: variance is computed around the mean (two passes over values already in registers), never
as E[x^2] - E[x]^2, which cancels catastrophically when |mean| >> std. float32 kernels still overflow
when x^2 does (|x| > ~1.8e19); the reference, in float64, does not.

The family lives in four files, each one idea: norms_ref (the oracle, inputs, edge cases, tolerances and the
four ops), norms_cpu (the CPU rungs and yardsticks), norms_fwd (the GPU forward ladder and its tuning) and
norms_bwd (the GPU backward ladder). A new variant touches one of them and its test. This module hands
their names on, for the chapters (``norms.ln_reference``, ``norms.make_ln_vec_kernel``, ...); the switches
that a launch reads (ROWS_IN_SIM, THREADS in norms_fwd; BWD_REG_MAX_N, VEC_BWD_BLOCKS_PER_SM in norms_bwd)
are set on the module that reads them, so they are not repeated here.
"""
from .norms_ref import (EDGE_CASES, EPS, EPS32, SIZES, _x, bwd_tol, edge_inputs, edge_tol, edge_x,
                        fwd_tol, ln_bwd_make_inputs, ln_bwd_reference, ln_make_inputs, ln_reference,
                        rms_bwd_make_inputs, rms_bwd_reference, rms_make_inputs, rms_reference)  # noqa: F401
from .norms_cpu import (REASSOC, _ln_row, layernorm_bwd_loop, layernorm_bwd_numpy, layernorm_bwd_prange,
                        layernorm_bwd_rows, layernorm_bwd_rows_prange, layernorm_bwd_torch_cpu,
                        layernorm_loop, layernorm_numpy, layernorm_prange, layernorm_rows,
                        layernorm_rows_prange, layernorm_rows_simd, layernorm_simd, layernorm_torch_cpu,
                        rmsnorm_bwd_loop, rmsnorm_bwd_numpy, rmsnorm_bwd_prange, rmsnorm_bwd_rows,
                        rmsnorm_bwd_rows_prange, rmsnorm_bwd_torch_cpu, rmsnorm_loop, rmsnorm_numpy,
                        rmsnorm_prange, rmsnorm_rows, rmsnorm_rows_prange, rmsnorm_rows_simd,
                        rmsnorm_simd, rmsnorm_torch_cpu)  # noqa: F401
from .norms_fwd import (BWD_VEC_PER_THREAD, PER_THREAD, PTX_STREAM, ROWS, SIG_LN, SIG_RMS,
                        VEC_MAX_GROUPS, VEC_PER_THREAD, VEC_ROWS, apply_tuning, eager_bwd,
                        eager_layernorm, eager_rmsnorm, kernel, layernorm_regs, layernorm_regs_shfl,
                        layernorm_row_smem, layernorm_torch, layernorm_vec4, make_ln_regs_kernel,
                        make_ln_stream_kernel, make_ln_vec_kernel, make_rms_regs_kernel,
                        make_rms_stream_kernel, make_rms_vec_kernel, rmsnorm_regs, rmsnorm_regs_shfl,
                        rmsnorm_row_smem, rmsnorm_torch, rmsnorm_vec4, vec_config)  # noqa: F401
from .norms_bwd import (BWD_BLOCKS_PER_SM, BWD_MAX_ITEMS, BWD_MAX_THREADS, COLSUM, SIG_COLSUM,
                        SIG_COLSUM2, SIG_LN_BWD, SIG_LN_BWD_V, SIG_RMS_BWD, SIG_RMS_BWD_V,
                        STREAM_THREADS, colsum_kernel, column_sum_kernel, layernorm_bwd_gpu,
                        layernorm_bwd_shfl, layernorm_bwd_stream, layernorm_bwd_vec4, make_colsum_kernel,
                        make_ln_bwd_kernel, make_ln_bwd_stream_kernel, make_ln_bwd_vec_kernel,
                        make_rms_bwd_kernel, make_rms_bwd_stream_kernel, make_rms_bwd_vec_kernel,
                        rmsnorm_bwd_gpu, rmsnorm_bwd_shfl, rmsnorm_bwd_stream, rmsnorm_bwd_vec4)  # noqa: F401
