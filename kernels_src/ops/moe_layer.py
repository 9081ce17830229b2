"""Mixture of Experts, part 4: the whole MoE layer, forward and backward (chapter 18). Letters and the padded slot
layout are defined in moe_route.py's docstring; the stages are the ops of moe_route, moe_align and moe_gemm.

  moe_layer      x (T,d), Wr (d,E), Wg, Wu (E,d,f), W2 (E,f,d), k, renorm -> out (T,d)
                 router -> align -> grouped gate and up products -> SwiGLU -> grouped down product
                 -> weighted combine. out[t] = sum_j w[t,j] * (silu(x_t Wg[e]) * (x_t Wu[e])) @ W2[e]
  moe_layer_bwd  dout (T,d), x, Wr, Wg, Wu, W2, k, renorm -> dx (T,d), dWr (d,E), dWg, dWu (E,d,f), dW2 (E,f,d)
                 (the forward recomputed, then the stages' backward ops in reverse; the router's dx and dWr
                 are chapter 3's two products of dlogits)

Cost: 6*S*d*f FLOPs forward (S = T*k) plus the router's 2*T*d*E; twice that backward.

Ladder (moe_layer): cpu/torch_loop and gpu/torch_loop baselines (the loop over experts a user writes:
  where, gather, three products, index_add_); cpu/course rung 1 and gpu/course rung 1 (the course's kernels,
  no host synchronisation between them: every buffer is sized by the bound P); gpu/gemv rung 2 (few tokens:
  no align, gate/up+SwiGLU and down+combine as two GEMV-shaped kernels over each slot's expert; the
  dispatcher's "moe" role gives it T*k <= 8 slots); gpu/graph rung 3 (rung 1 replayed as one CUDA graph).
Ladder (moe_layer_bwd): cpu/course rung 1, gpu/course rung 1 (the stages' backward rungs in a row).
"""
import math

import numpy as np

from ..compiler import cuda, float32, njit, prange
from .. import device
from ..device import ceil_div
from ..registry import define_op, register
from . import activations
from .moe_align import (ONE_BLOCK_MAX_SLOTS, align_cpu, align_gpu, align_one_block_gpu, combine_bwd_gpu,
                        combine_bwd_prange, combine_prange, combine_vec_gpu)
from .moe_gemm import (TILE_GPU, WARPTILE_GPU, SIG_WT, F3, dw_kernel, grouped_prange, grouped_smem,
                       make_dw_kernel, make_smem, make_warptile, SIG_SMEM, sum_slots_kernel, warptile)
from .moe_route import (EPS32, F1, F2, I1, I2, _buf, aux_bwd_cpu, aux_bwd_gpu, padded_rows, quantized,
                        reference_aux_bwd, reference_router,
                        reference_router_bwd, router_bwd_kernel, router_bwd_prange, router_gemm_gpu, router_prange,
                        _threads)


# ------------------------------------------------------------------------------------------ the layer
def _silu(g):
    return g / (1.0 + np.exp(-g))


def reference_layer(x, Wr, Wg, Wu, W2, k, renorm):
    """float64: route, then each token's k experts' SwiGLU MLPs, weighted by the router."""
    _, w, ids = reference_router(x, Wr, k, renorm)
    T, d = x.shape
    out = np.zeros((T, W2.shape[2]))
    for e in range(Wg.shape[0]):
        t, j = np.nonzero(ids == e)
        if t.size:
            xe = x[t]
            with np.errstate(over="ignore", invalid="ignore"):
                h = _silu(xe @ Wg[e]) * (xe @ Wu[e])
            np.add.at(out, t, w[t, j][:, None] * (h @ W2[e]))
    return out


def make_inputs_layer(size, dtype, rng):
    """x and Wr quantized (exact logits: the router's tie rule decides, not rounding); expert weights scaled
    by 1/sqrt(fan-in), so every intermediate is O(1)."""
    T, d, f, E, k = size
    x = quantized((T, d), rng, 0.25, 2.0)
    Wr = quantized((d, E), rng, 1 / 16, 1.0)
    Wg = (rng.standard_normal((E, d, f)) / math.sqrt(d)).astype(np.float32)
    Wu = (rng.standard_normal((E, d, f)) / math.sqrt(d)).astype(np.float32)
    W2 = (rng.standard_normal((E, f, d)) / math.sqrt(f)).astype(np.float32)
    return x, Wr, Wg, Wu, W2, int(k), 1


def make_edge_inputs_layer(size, dtype, rng):
    """A NaN in some tokens' x: those tokens' outputs are NaN (the NaN rule), every other token's is not."""
    x, Wr, Wg, Wu, W2, k, renorm = make_inputs_layer(size, dtype, rng)
    T = x.shape[0]
    for t in rng.permutation(T)[: max(1, T // 5)]:
        x[t, rng.integers(0, x.shape[1])] = np.nan
    return x, Wr, Wg, Wu, W2, k, renorm


def layer_tol(size, dtype):
    """Three chained products of length d, f and the k-term combine: ~(sqrt(d) + sqrt(f)) eps of O(1) values."""
    T, d, f, E, k = size
    return (1e-5, 16 * EPS32 * (math.sqrt(d) + math.sqrt(f)) + 1e-6)


LAYER_SIZES = {"check": [(1, 4, 4, 1, 1), (7, 8, 12, 3, 3), (33, 16, 20, 7, 2), (100, 32, 24, 13, 4),
                         (64, 20, 8, 8, 8)],
               "check_sim": [(1, 4, 4, 1, 1), (6, 8, 8, 3, 2), (9, 4, 8, 5, 5)],
               "bench": [(512, 256, 512, 8, 2)],
               "bench_gpu": [(4096, 1024, 3584, 8, 2), (4096, 1024, 512, 64, 8), (1, 1024, 3584, 8, 2),
                             (64, 1024, 3584, 8, 2)],
               "bench_sim": [(6, 8, 8, 3, 2)]}

define_op("moe_layer", reference=reference_layer, make_inputs=make_inputs_layer, chapter=18,
          title="MoE layer forward (router, align, grouped SwiGLU experts, combine)",
          size_names=("T", "d", "f", "E", "k"), kind="compute", tol=layer_tol, output_names=("out",),
          sizes=LAYER_SIZES, edge_inputs=make_edge_inputs_layer,
          flops=lambda s: 6 * s[0] * s[4] * s[1] * s[2] + 2 * s[0] * s[1] * s[3],
          bytes=lambda s, b: (2 * s[0] * s[1] + s[1] * s[3] + 3 * s[3] * s[1] * s[2]) * b)


def _layer_bufs(prefix, T, d, f, E, k, B, host):
    S = T * k
    P = padded_rows(S, E, B)
    if host:
        def mk(name, shape, dt):
            return np.empty(shape, dt)
    else:
        def mk(name, shape, dt):
            return _buf(prefix + name, int(np.prod(shape)), dt).reshape(shape)
    return dict(logits=mk("lg", (T, E), np.float32), w=mk("w", (T, k), np.float32),
                ids=mk("ids", (T, k), np.int32), sorted_ids=mk("si", (P,), np.int32),
                block_expert=mk("be", (P // B,), np.int32), offsets=mk("off", (E + 1,), np.int32),
                slot_row=mk("sr", (S,), np.int32), G=mk("G", (P, f), np.float32), U=mk("U", (P, f), np.float32),
                H=mk("H", (P, f), np.float32), Y=mk("Y", (P, d), np.float32))


def layer_cpu(out, x, Wr, Wg, Wu, W2, k, renorm, B=16):
    T, d = x.shape
    E, _, f = Wg.shape
    S = T * k
    b = _layer_bufs("", T, d, f, E, k, B, True)
    router_prange(b["logits"], b["w"], b["ids"], x, Wr, k, renorm)
    align_cpu(b["sorted_ids"], b["block_expert"], b["offsets"], b["slot_row"], b["ids"], E, B, 0)
    grouped_prange(b["G"], x, Wg, b["sorted_ids"], b["block_expert"], k, S, True)
    grouped_prange(b["U"], x, Wu, b["sorted_ids"], b["block_expert"], k, S, True)
    activations.CPU_LOOPS["swiglu"](b["H"].reshape(-1), b["G"].reshape(-1), b["U"].reshape(-1))
    grouped_prange(b["Y"], b["H"], W2, b["sorted_ids"], b["block_expert"], k, S, False)
    combine_prange(out, b["Y"], b["w"], b["slot_row"])
    return b


@register("moe_layer", "cpu", "course", rung=1)
def layer_cpu_course(out, x, Wr, Wg, Wu, W2, k, renorm):
    """The course's CPU kernels in a row: router (prange), align (chapter 15's histogram, scan and radix
    sort), grouped gate and up products, SwiGLU (chapter 6's loop), grouped down product, combine. The
    grouped products are unblocked ikj loops: predict chapter 5's ikj/prange rate, far below torch's BLAS."""
    layer_cpu(out, x, Wr, Wg, Wu, W2, k, renorm)


def layer_gpu(out, x, Wr, Wg, Wu, W2, k, renorm):
    T, d = x.shape
    E, _, f = Wg.shape
    S = T * k
    if T == 0:
        return None
    wt, wt_direct = warptile(True), warptile(False)
    B = wt.BM
    b = _layer_bufs("layer_", T, d, f, E, k, B, False)
    router_gemm_gpu(b["logits"], b["w"], b["ids"], x, Wr, k, renorm)
    align = align_one_block_gpu if S <= ONE_BLOCK_MAX_SLOTS else align_gpu  # one launch for small S
    align(b["sorted_ids"], b["block_expert"], b["offsets"], b["slot_row"], b["ids"], E, B, 0)
    wt(b["G"], x, Wg, b["sorted_ids"], b["block_expert"], k, S)
    wt(b["U"], x, Wu, b["sorted_ids"], b["block_expert"], k, S)
    n = b["H"].size
    th = 32 if device.SIMULATED else 256
    activations.GPU_KERNELS["swiglu"][ceil_div(n, th), th](b["H"].reshape(n), b["G"].reshape(n),
                                                           b["U"].reshape(n))
    wt_direct(b["Y"], b["H"], W2, b["sorted_ids"], b["block_expert"], k, S)
    combine_vec_gpu(out, b["Y"], b["w"], b["slot_row"])
    return b


@register("moe_layer", "gpu", "course", rung=1,
          ptx=[(make_warptile(**WARPTILE_GPU, gather=True).kernel, SIG_WT)])
def layer_gpu_course(out, x, Wr, Wg, Wu, W2, k, renorm):
    """Router (chapter 5's GEMM for the logits, a thread per token for softmax and top-k), align (rung 2, one
    block, up to 16384 slots; above, chapter 15's GPU histogram, scans and radix sort), two grouped warptile products (gate, up) with the gather in
    the load, chapter 6's SwiGLU kernel, the grouped down product, the 16-byte combine. No host
    synchronisation: every buffer is sized by the bound P. At T 4096, d 1024, f 3584, E 8, k 2 the products
    are 180 GFLOP: predict ~5 ms at rung 2's ~35 TFLOP/s, against the torch loop's 5.7 ms (its products run
    on cuBLAS): near 1x, not 1.5x. With 64 experts of f 512 the loop is launch-bound (17 ms measured):
    predict >= 5x there. (The first H100 run, with the router's rung 1 and align rung 1, measured 0.92x and
    1.66x; at E = 64 the three grouped products, timed alone, are 2.9 of the layer's 8.9 ms. This rung now
    uses the router's rung 2 and, up to 16384 slots, align rung 2: measured 1.05x at E 8 and 6.2x at E 64;
    Nsight Compute puts 92 % of the E 8 layer in the three grouped products, moe_layer_ncu_e8.json.)"""
    layer_gpu(out, x, Wr, Wg, Wu, W2, k, renorm)


def _torch_loop(out, x, Wr, Wg, Wu, W2, k, renorm, to):
    """The loop over experts a user writes (torch eager)."""
    import torch

    tx = to(x)
    logits = tx @ to(Wr)
    p = torch.softmax(logits, dim=-1)
    w, ids = torch.sort(p, dim=-1, descending=True, stable=True)  # torch.topk's order among ties is unspecified
    w, ids = w[:, :k], ids[:, :k]
    if renorm:
        w = w / w.sum(dim=-1, keepdim=True)
    res = torch.zeros_like(tx)
    tWg, tWu, tW2 = to(Wg), to(Wu), to(W2)
    for e in range(Wg.shape[0]):
        tok, j = torch.where(ids == e)
        if tok.numel() == 0:  # a host synchronisation per expert, as in the usual loop
            continue
        xe = tx[tok]
        h = torch.nn.functional.silu(xe @ tWg[e]) * (xe @ tWu[e])
        res.index_add_(0, tok, (h @ tW2[e]) * w[tok, j].unsqueeze(1))
    to(out).copy_(res)


def _torch_cpu():
    from .cpu_baselines import torch_cpu

    return torch_cpu()


def _torch_gpu():
    from .reductions import torch_gpu

    return torch_gpu()


@register("moe_layer", "cpu", "torch_loop", baseline=True, requires=_torch_cpu)
def layer_torch_loop_cpu(out, x, Wr, Wg, Wu, W2, k, renorm):
    """torch eager on the CPU: softmax, a stable sort for the top-k (the tie rule), then for each expert
    where / gather / gate, up and down products / index_add_."""
    import torch

    _torch_loop(out, x, Wr, Wg, Wu, W2, k, renorm, lambda a: torch.from_numpy(a))


@register("moe_layer", "gpu", "torch_loop", baseline=True, requires=_torch_gpu)
def layer_torch_loop_gpu(out, x, Wr, Wg, Wu, W2, k, renorm):
    """torch eager on the GPU, the same loop (cuBLAS products, TF32 off as everywhere in the course's
    benches; one host synchronisation per expert in ``tok.numel()``)."""
    import torch

    from .reductions import torch_view

    torch.backends.cuda.matmul.allow_tf32 = False
    _torch_loop(out, x, Wr, Wg, Wu, W2, k, renorm, torch_view)


# ------------------------------------------------------------------ rung 2: few tokens (decode), no align
GV_COLS = 32  # output columns per block: a warp wide, so each K row of W is one 128-byte read per warp
GV_WARPS = 2 if device.SIMULATED else 8  # warps splitting the reduction of each column (summed in shared memory)
GEMV_MAX_SLOTS = 8  # the dispatcher's default: T*k slots up to this take rung 2 (each slot reads its experts)


def make_gemv_kernels(COLS, WARPS):
    @cuda.jit(cache=True)
    def gateup_kernel(H, x, Wg, Wu, ids, k):
        # H (S,f): slot s = (token t, choice j) gets silu(x_t Wg[e]) * (x_t Wu[e]), e = ids[t, j]. Grid x over
        # column tiles of f, y over slots; warp wy sums rows wy, wy + WARPS, ... of the d-long reduction.
        sg = cuda.shared.array((WARPS, COLS), float32)
        su = cuda.shared.array((WARPS, COLS), float32)
        lane = cuda.threadIdx.x % COLS
        wy = cuda.threadIdx.x // COLS
        s = cuda.blockIdx.y
        t = s // k
        e = ids[t, s % k]
        col = cuda.blockIdx.x * COLS + lane
        f = H.shape[1]
        g = float32(0.0)
        u = float32(0.0)
        if col < f:
            for kk in range(wy, x.shape[1], WARPS):
                xv = x[t, kk]
                g += xv * Wg[e, kk, col]
                u += xv * Wu[e, kk, col]
        sg[wy, lane] = g
        su[wy, lane] = u
        cuda.syncthreads()
        if wy == 0 and col < f:
            g = float32(0.0)
            u = float32(0.0)
            for w_ in range(WARPS):  # a fixed order: deterministic
                g += sg[w_, lane]
                u += su[w_, lane]
            H[s, col] = g / (float32(1.0) + math.exp(-g)) * u

    @cuda.jit(cache=True)
    def down_combine_kernel(out, H, W2, w, ids, k):
        # out (T,d): token t's sum over its k choices of w[t,j] * (H[t*k+j] @ W2[e]): the down product and
        # the weighted combine in one pass, no slot buffer Y. Grid x over column tiles of d, y over tokens.
        sp = cuda.shared.array((WARPS, COLS), float32)
        lane = cuda.threadIdx.x % COLS
        wy = cuda.threadIdx.x // COLS
        t = cuda.blockIdx.y
        col = cuda.blockIdx.x * COLS + lane
        d = out.shape[1]
        acc = float32(0.0)
        if col < d:
            for j in range(k):
                e = ids[t, j]
                s = t * k + j
                part = float32(0.0)
                for kk in range(wy, H.shape[1], WARPS):
                    part += H[s, kk] * W2[e, kk, col]
                acc += w[t, j] * part
        sp[wy, lane] = acc
        cuda.syncthreads()
        if wy == 0 and col < d:
            acc = float32(0.0)
            for w_ in range(WARPS):
                acc += sp[w_, lane]
            out[t, col] = acc

    return gateup_kernel, down_combine_kernel


gateup_gemv_kernel, down_combine_gemv_kernel = make_gemv_kernels(GV_COLS, GV_WARPS)
SIG_GATEUP = f"void({F2}, {F2}, {F3}, {F3}, {I2}, int64)"
SIG_DOWN = f"void({F2}, {F2}, {F3}, {F2}, {I2}, int64)"


def layer_gemv_gpu(out, x, Wr, Wg, Wu, W2, k, renorm):
    T, d = x.shape
    E, _, f = Wg.shape
    S = T * k
    if T == 0:
        return None
    b = dict(logits=_buf("gv_lg", T * E, np.float32).reshape(T, E), w=_buf("gv_w", S, np.float32).reshape(T, k),
             ids=_buf("gv_ids", S, np.int32).reshape(T, k), H=_buf("gv_H", S * f, np.float32).reshape(S, f))
    router_gemm_gpu(b["logits"], b["w"], b["ids"], x, Wr, k, renorm)
    th = GV_COLS * GV_WARPS
    gateup_gemv_kernel[(ceil_div(f, GV_COLS), S), th](b["H"], x, Wg, Wu, b["ids"], k)
    down_combine_gemv_kernel[(ceil_div(d, GV_COLS), T), th](out, b["H"], W2, b["w"], b["ids"], k)
    return b


@register("moe_layer", "gpu", "gemv", rung=2,
          ptx=[(make_gemv_kernels(32, 8)[0], SIG_GATEUP), (make_gemv_kernels(32, 8)[1], SIG_DOWN)])
def layer_gpu_gemv(out, x, Wr, Wg, Wu, W2, k, renorm):
    """Few tokens (decode): no align, no padded slots. The router (rung 2), then one launch for every slot's
    gate and up products with SwiGLU (a block per 32 columns of f and slot; 8 warps split the d-long sum) and
    one for the down product fused with the weighted combine (a block per 32 columns of d and token). Four
    launches, against rung 1's eight with two 128-row tiles per expert that are almost all padding. Each slot
    reads its experts' weights itself: at T 1, k 2 that is 2 x 3 x d x f x 4 bytes = 88 MB at d 1024, f 3584,
    so predict ~40 us at ~2.5 TB/s plus ~20 us of launches, >= 10x the torch loop (0.85 ms, a host sync per
    expert). Above a few tokens the slots re-read shared experts' weights: at T 64 (128 slots) 5.6 GB, so
    the dispatcher keeps this rung to T*k <= 8 slots and rung 1 above."""
    layer_gemv_gpu(out, x, Wr, Wg, Wu, W2, k, renorm)


# ------------------------------------------------------------- rung 3: rung 1's launches as one CUDA graph
_graphs: dict = {}  # (argument addresses, shapes, k, renorm) -> (StepRunner, scratch addresses it was recorded on)


def _scratch_addresses():
    from ..runtime.graphs import device_pointer
    from .moe_route import _scratch

    return {key: device_pointer(a) for key, a in _scratch.items()}


def layer_graph_gpu(out, x, Wr, Wg, Wu, W2, k, renorm):
    """Rung 1 recorded once per (arguments, shapes) and replayed as one CUDA graph (kernels_src.runtime.graphs).
    A graph replays the same addresses, so it is recorded again whenever a scratch buffer moved. Above the
    one-block align (S > ONE_BLOCK_MAX_SLOTS or E > its table) align rung 1 runs chapter 15's scans, which may
    allocate: there the rung runs rung 1 eagerly. In the simulator (no graphs) it runs rung 1 eagerly."""
    from ..runtime.graphs import StepRunner, available, device_pointer
    from .moe_align import one_block_kernel

    T = x.shape[0]
    E = Wg.shape[0]
    if (T == 0 or not available()[0] or T * k > ONE_BLOCK_MAX_SLOTS or one_block_kernel(E)[0] is None):
        return layer_gpu(out, x, Wr, Wg, Wu, W2, k, renorm)
    key = (tuple(device_pointer(a) for a in (out, x, Wr, Wg, Wu, W2)),
           tuple(a.shape for a in (out, x, Wr, Wg, Wu, W2)), int(k), int(renorm))
    have = _graphs.get(key)
    if have is not None:
        runner, seen = have
        now = _scratch_addresses()
        if all(now.get(name) == ptr for name, ptr in seen.items()):
            runner()  # one cuGraphLaunch
            return None
    if len(_graphs) > 16:  # each graph holds driver resources: keep the recent few
        _graphs.clear()
    runner = StepRunner(lambda: layer_gpu(out, x, Wr, Wg, Wu, W2, k, renorm), mode="graph", quiet=True)
    runner()  # records (runs rung 1 eagerly) and captures the graph
    runner()  # and replays it once, so that every call's output comes from the graph's path
    _graphs[key] = (runner, _scratch_addresses())
    return None


@register("moe_layer", "gpu", "graph", rung=3,
          ptx=[(make_warptile(**WARPTILE_GPU, gather=False).kernel, SIG_WT)])  # rung 1's kernels (listed there)
def layer_gpu_graph(out, x, Wr, Wg, Wu, W2, k, renorm):
    """Rung 1's eight launches (router GEMM and top-k, one-block align, gate, up, SwiGLU, down, combine)
    captured once and replayed as one CUDA graph: the host's per-launch cost (~5-10 us each through numba)
    goes, the kernels stay. At T 64 the first run's layer took 1.66 ms, of which the kernels' sum (ncu) is
    what remains: predict a gain of ~50 us, a few percent, so launches are not what keeps T 64 near 1x; at
    T 1 the same ~50 us against ~1.2 ms. Above ONE_BLOCK_MAX_SLOTS slots it is rung 1, run eagerly."""
    layer_graph_gpu(out, x, Wr, Wg, Wu, W2, k, renorm)


# --------------------------------------------------------------------------------------- backward
def _sigmoid(g):
    return 1.0 / (1.0 + np.exp(-g))


def reference_layer_bwd(dout, x, Wr, Wg, Wu, W2, k, renorm, aux=(0.0, 0.0)):
    """float64: the gradients of sum(dout * out) with respect to x and the four weight arrays. Routing (the
    experts chosen) has no gradient; the router's weights do, through the softmax (reference_router_bwd).
    aux = (a, b) adds the gradients of a * lb + b * z (moe_route's load-balancing loss and z-loss of this
    layer's router logits), as a model that trains with them needs."""
    logits, w, ids = reference_router(x, Wr, k, renorm)
    T, d = x.shape
    dx = np.zeros(x.shape)
    dWg, dWu, dW2 = np.zeros(Wg.shape), np.zeros(Wu.shape), np.zeros(W2.shape)
    dw = np.zeros(w.shape)
    with np.errstate(over="ignore", invalid="ignore"):
        for e in range(Wg.shape[0]):
            t, j = np.nonzero(ids == e)
            if t.size == 0:
                continue
            xe = x[t]
            g, u = xe @ Wg[e], xe @ Wu[e]
            s = _sigmoid(g)
            h = g * s * u
            y = h @ W2[e]
            dy = w[t, j][:, None] * dout[t]
            dw[t, j] = (dout[t] * y).sum(axis=1)
            dW2[e] = h.T @ dy
            dh = dy @ W2[e].T
            dg = dh * u * s * (1.0 + g * (1.0 - s))
            du = dh * g * s
            dWg[e] = xe.T @ dg
            dWu[e] = xe.T @ du
            np.add.at(dx, t, dg @ Wg[e].T + du @ Wu[e].T)
        dlogits = reference_router_bwd(dw, logits, ids, renorm)
        if aux[0] or aux[1]:
            dlb, dz = reference_aux_bwd(logits, ids)
            dlogits = dlogits + aux[0] * dlb + aux[1] * dz
    return dx + dlogits @ Wr.T, x.T @ dlogits, dWg, dWu, dW2


def make_inputs_layer_bwd(size, dtype, rng):
    x, Wr, Wg, Wu, W2, k, renorm = make_inputs_layer(size, dtype, rng)
    return (rng.standard_normal(x.shape).astype(np.float32), x, Wr, Wg, Wu, W2, k, renorm)


def layer_bwd_tol(size, dtype):
    """Sums over up to T*k rows (the weight gradients) of products of three chained products: the forward's
    model with sqrt(T*k) added."""
    T, d, f, E, k = size
    return (1e-4, 32 * EPS32 * (math.sqrt(d) + math.sqrt(f) + math.sqrt(T * k)) + 1e-6)


define_op("moe_layer_bwd", reference=reference_layer_bwd, make_inputs=make_inputs_layer_bwd, chapter=18,
          title="MoE layer backward (combine, grouped products, SwiGLU, router)",
          size_names=("T", "d", "f", "E", "k"), kind="compute", tol=layer_bwd_tol,
          output_names=("dx", "dWr", "dWg", "dWu", "dW2"),
          sizes={"check": [(1, 4, 4, 1, 1), (7, 8, 12, 3, 3), (33, 16, 20, 7, 2), (64, 20, 8, 8, 8)],
                 "check_sim": [(1, 4, 4, 1, 1), (6, 8, 8, 3, 2)],
                 "bench": [(512, 256, 512, 8, 2)], "bench_gpu": [(4096, 1024, 3584, 8, 2), (4096, 1024, 512, 64, 8)],
                 "bench_sim": [(6, 8, 8, 3, 2)]},
          flops=lambda s: 12 * s[0] * s[4] * s[1] * s[2] + 4 * s[0] * s[1] * s[3],
          bytes=lambda s, b: (4 * s[0] * s[1] + 2 * s[1] * s[3] + 6 * s[3] * s[1] * s[2]) * b)


@njit(parallel=True, cache=True)
def grouped_bwd_rows(dA, dW, dY, A, W, sorted_ids, offsets, k, S, gather):
    # dA (P,K) padded layout: dA[r] = dY[r] @ W[e]^T (0 for padding); dW[e] = sum over e's rows of A(r)^T dY[r]
    P, K = dA.shape
    E, _, n = W.shape
    for r in prange(P):
        for i in range(K):
            dA[r, i] = 0.0
    for e in prange(E):
        for i in range(K):
            for c in range(n):
                dW[e, i, c] = 0.0
        for r in range(offsets[e], offsets[e + 1]):
            s = sorted_ids[r]
            if s >= S:
                continue
            src = s // k if gather else r
            for i in range(K):
                acc = 0.0
                a = A[src, i]
                for c in range(n):
                    acc += dY[r, c] * W[e, i, c]
                    dW[e, i, c] += a * dY[r, c]
                dA[r, i] = acc


@njit(parallel=True, cache=True)
def router_products_cpu(dx, dWr, x, Wr, dlogits):
    # dx (T,d) += dlogits (T,E) @ Wr^T;  dWr (d,E) = x^T @ dlogits
    T, d = x.shape
    E = Wr.shape[1]
    for t in prange(T):
        for i in range(d):
            acc = 0.0
            for e in range(E):
                acc += dlogits[t, e] * Wr[i, e]
            dx[t, i] += acc
    for i in prange(d):
        for e in range(E):
            acc = 0.0
            for t in range(T):
                acc += x[t, i] * dlogits[t, e]
            dWr[i, e] = acc


@njit(cache=True)
def add_aux_cpu(dlogits, dlb, dz, a, b):
    for t in range(dlogits.shape[0]):
        for e in range(dlogits.shape[1]):
            dlogits[t, e] += a * dlb[t, e] + b * dz[t, e]


def layer_bwd_cpu(dx, dWr, dWg, dWu, dW2, dout, x, Wr, Wg, Wu, W2, k, renorm, B=16, aux=(0.0, 0.0)):
    T, d = x.shape
    E, _, f = Wg.shape
    S = T * k
    b = layer_cpu(np.empty((T, d), np.float32), x, Wr, Wg, Wu, W2, k, renorm, B)  # forward, keeping its buffers
    P = b["sorted_ids"].size
    dY, dw = np.empty((P, d), np.float32), np.empty((T, k), np.float32)
    combine_bwd_prange(dY, dw, dout, b["Y"], b["w"], b["slot_row"], b["sorted_ids"])
    dH = np.empty((P, f), np.float32)
    grouped_bwd_rows(dH, dW2, dY, b["H"], W2, b["sorted_ids"], b["offsets"], k, S, False)
    dG, dU = np.empty((P, f), np.float32), np.empty((P, f), np.float32)
    activations.CPU_LOOPS["swiglu_bwd"](dG.reshape(-1), dU.reshape(-1), dH.reshape(-1), b["G"].reshape(-1),
                                        b["U"].reshape(-1))
    dXg, dXu = np.empty((P, d), np.float32), np.empty((P, d), np.float32)
    grouped_bwd_rows(dXg, dWg, dG, x, Wg, b["sorted_ids"], b["offsets"], k, S, True)
    grouped_bwd_rows(dXu, dWu, dU, x, Wu, b["sorted_ids"], b["offsets"], k, S, True)
    dXg += dXu
    combine_prange(dx, dXg, np.ones((T, k), np.float32), b["slot_row"])  # each token's k rows, in order
    dlogits = np.empty((T, E), np.float32)
    router_bwd_prange(dlogits, dw, b["logits"], b["ids"], renorm)
    if aux[0] or aux[1]:  # the load-balancing and z-loss gradients of this layer's router logits
        dlb, dz = np.empty((T, E), np.float32), np.empty((T, E), np.float32)
        aux_bwd_cpu(dlb, dz, b["logits"], b["ids"])
        add_aux_cpu(dlogits, dlb, dz, float(aux[0]), float(aux[1]))
    router_products_cpu(dx, dWr, x, Wr, dlogits)


@register("moe_layer_bwd", "cpu", "course", rung=1)
def layer_bwd_cpu_course(dx, dWr, dWg, dWu, dW2, dout, x, Wr, Wg, Wu, W2, k, renorm):
    """The forward recomputed with the course's CPU rungs, then combine backward, the down product's dH and
    dW2, chapter 6's SwiGLU backward, the gate and up products' dX and dW, the router backward and its two
    products. Unblocked loops: predict a few GFLOP/s per core, like the forward."""
    layer_bwd_cpu(dx, dWr, dWg, dWu, dW2, dout, x, Wr, Wg, Wu, W2, k, renorm)


@cuda.jit
def add_inplace_kernel(a, b):
    i = cuda.grid(1)
    if i < a.size:
        a[i] += b[i]


@cuda.jit
def router_dx_kernel(dx, dlogits, Wr):
    # dx (T,d) += dlogits (T,E) @ Wr^T: a thread per element of dx; grid x over tokens, y over columns
    i = cuda.blockIdx.y * cuda.blockDim.x + cuda.threadIdx.x
    t = cuda.blockIdx.x
    if i < dx.shape[1]:
        acc = float32(0.0)
        for e in range(Wr.shape[1]):
            acc += dlogits[t, e] * Wr[i, e]
        dx[t, i] += acc


@cuda.jit
def router_dw_kernel(dWr, x, dlogits):
    # dWr (d,E) = x^T @ dlogits: a thread per element, the T terms in order (deterministic)
    e = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    i = cuda.blockIdx.y
    if e < dWr.shape[1]:
        acc = float32(0.0)
        for t in range(x.shape[0]):
            acc += x[t, i] * dlogits[t, e]
        dWr[i, e] = acc


@cuda.jit
def add_aux_kernel(dlogits, dlb, dz, a, b):
    i = cuda.grid(1)
    if i < dlogits.size:
        dlogits[i] += a * dlb[i] + b * dz[i]


def layer_bwd_gpu(dx, dWr, dWg, dWu, dW2, dout, x, Wr, Wg, Wu, W2, k, renorm, aux=(0.0, 0.0)):
    T, d = x.shape
    E, _, f = Wg.shape
    S = T * k
    if T == 0:
        return
    b = layer_gpu(_buf("layer_out", T * d, np.float32).reshape(T, d), x, Wr, Wg, Wu, W2, k, renorm)
    sid, be, off, sr = b["sorted_ids"], b["block_expert"], b["offsets"], b["slot_row"]
    P = sid.size
    th = 32 if device.SIMULATED else 256
    dY = _buf("lb_dY", P * d, np.float32).reshape(P, d)
    dw = _buf("lb_dw", T * k, np.float32).reshape(T, k)
    combine_bwd_gpu(dY, dw, dout, b["Y"], b["w"], sr, sid)
    dH = _buf("lb_dH", P * f, np.float32).reshape(P, f)
    grouped_smem(dH, dY, W2, sid, be, k, S, False, transb=True)  # dH[r] = dY[r] @ W2[e]^T
    kd, TL = dw_kernel(False)
    kd[(ceil_div(d, TL), ceil_div(f, TL), E), (TL, TL)](dW2, dY, b["H"], sid, off, k, S)
    dG = _buf("lb_dG", P * f, np.float32).reshape(P, f)
    dU = _buf("lb_dU", P * f, np.float32).reshape(P, f)
    n = P * f
    activations.GPU_KERNELS["swiglu_bwd"][ceil_div(n, th), th](dG.reshape(n), dU.reshape(n), dH.reshape(n),
                                                               b["G"].reshape(n), b["U"].reshape(n))
    dXg = _buf("lb_dXg", P * d, np.float32).reshape(P, d)
    dXu = _buf("lb_dXu", P * d, np.float32).reshape(P, d)
    grouped_smem(dXg, dG, Wg, sid, be, k, S, False, transb=True)
    grouped_smem(dXu, dU, Wu, sid, be, k, S, False, transb=True)
    kg, TL = dw_kernel(True)
    kg[(ceil_div(f, TL), ceil_div(d, TL), E), (TL, TL)](dWg, dG, x, sid, off, k, S)
    kg[(ceil_div(f, TL), ceil_div(d, TL), E), (TL, TL)](dWu, dU, x, sid, off, k, S)
    add_inplace_kernel[ceil_div(P * d, th), th](dXg.reshape(P * d), dXu.reshape(P * d))
    sum_slots_kernel[(T, ceil_div(d, th)), th](dx, dXg, sr)  # each token's k rows, in order
    dlogits = _buf("lb_dlogits", T * E, np.float32).reshape(T, E)
    router_bwd_kernel[ceil_div(T, _threads()), _threads()](dlogits, dw, b["logits"], b["ids"], renorm)
    if aux[0] or aux[1]:  # the load-balancing and z-loss gradients of this layer's router logits
        dlb = _buf("lb_dlb", T * E, np.float32).reshape(T, E)
        dz = _buf("lb_dz", T * E, np.float32).reshape(T, E)
        aux_bwd_gpu(dlb, dz, b["logits"], b["ids"])
        add_aux_kernel[ceil_div(T * E, th), th](dlogits.reshape(T * E), dlb.reshape(T * E), dz.reshape(T * E),
                                                float32(aux[0]), float32(aux[1]))
    router_dx_kernel[(T, ceil_div(d, th)), th](dx, dlogits, Wr)
    router_dw_kernel[(ceil_div(E, th), d), th](dWr, x, dlogits)


@register("moe_layer_bwd", "gpu", "course", rung=1,
          ptx=[(make_smem(TILE_GPU, False, True), SIG_SMEM),
               (make_dw_kernel(TILE_GPU, False), f"void({F3}, {F2}, {F2}, {I1}, {I1}, int64, int64)"),
               (add_inplace_kernel, f"void({F1}, {F1})"), (router_dx_kernel, f"void({F2}, {F2}, {F2})"),
               (router_dw_kernel, f"void({F2}, {F2}, {F2})"), (add_aux_kernel, f"void({F1}, {F1}, {F1}, float32, float32)")])
def layer_bwd_gpu_course(dx, dWr, dWg, dWu, dW2, dout, x, Wr, Wg, Wu, W2, k, renorm):
    """The forward recomputed (gpu/course), then the stages' GPU backward rungs in reverse: combine backward,
    the transposed grouped products (rung 1's shared-memory kernel) and K-grouped dW per expert, chapter 6's
    SwiGLU backward, a fixed-order sum of each token's k rows, the router backward and its two products.
    Deterministic (no atomics anywhere). The products are rung-1 kernels: predict ~15-20 % of the dense
    warptile GEMM's rate for the backward's 2x FLOPs."""
    layer_bwd_gpu(dx, dWr, dWg, dWu, dW2, dout, x, Wr, Wg, Wu, W2, k, renorm)
