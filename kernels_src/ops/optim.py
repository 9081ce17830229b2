"""Optimizer steps: SGD with momentum (heavy-ball and Nesterov), Adam, AdamW, and fused AdamW with
global-norm gradient clipping (chapter 12).

An optimizer step is elementwise over the N parameters, with a little state per parameter:

  SGD + momentum  p, g, b (N,) -> p', b'      g~ = g + wd p            (L2 decay, as torch.optim.SGD)
                                              b' = mu b + g~
                                              p' = p - lr (g~ + mu b')  (Nesterov)  or  p - lr b'  (heavy-ball)
  Adam            p, g, m, v (N,) -> p', m', v'   g~ = g + wd p        (L2 decay, as torch.optim.Adam)
  AdamW           p, g, m, v (N,) -> p', m', v'   p~ = p (1 - lr wd)   (decoupled decay, as torch.optim.AdamW)
                    m' = b1 m + (1 - b1) g        v' = b2 v + (1 - b2) g^2
                    p' = p~ - (lr / (1 - b1^t)) m' / (sqrt(v') / sqrt(1 - b2^t) + eps)
  clipping        s = min(1, max_norm / (||g||_2 + 1e-6)) over ALL N gradients, then AdamW with s g

How it fits the registry's calling convention ``fn(*outputs, *inputs)``: a training loop updates p, m, v
in place, but the registry checks that inputs come back unchanged, so every step here is written
functionally: outputs (p_new, m_new, v_new), inputs (p, g, m, v, step, lr, beta1, beta2, eps, wd). The
kernels are elementwise, so calling one with the outputs aliased to the inputs,
``adamw_fused(p, m, v, p, g, m, v, ...)``, is the in-place step; it moves exactly the same bytes. ``step``
is t = 1, 2, ... (the step being taken, as torch counts after its increment).

Cost per parameter, fp32: AdamW reads p, g, m, v and writes p, m, v: 7 x 4 = 28 bytes and ~12 FLOPs.
That is ~0.4 FLOP/byte: deeply memory-bound, so the roof is copy bandwidth. SGD+momentum: 20 bytes.
Clipping adds one more read of g (the norm pass): 32 bytes.

Edge cases (tested in tests/test_ch12_optimizers.py):
  * zero gradient: m and v decay, p only decays (AdamW) and moves by lr * m_hat / (sqrt(v_hat) + eps);
    with m = v = 0 as well, the Adam step is exactly 0 (eps keeps 0/0 away);
  * huge gradients: Adam's step is scale-free, |p' - p| <= ~lr. In fp32, g^2 overflows to inf for
    |g| > ~1.8e19; below that (the edge inputs use 1e18) every rung matches the reference;
  * wd = 0: AdamW and Adam coincide;
  * first step (t = 1): m' = (1 - b1) g and m_hat = g exactly, v_hat = g^2, so the step is lr * g / (|g| + eps)
    ~ lr * sign(g). Without bias correction it would be (1 - b1)/sqrt(1 - b2) = 3.16x bigger at
    (0.9, 0.999);
  * infinite weight: torch's rule. torch.optim.Adam/AdamW touch p in the decay term only when wd != 0
    (``if weight_decay != 0``), and AdamW's decay is p <- p (1 - lr wd): an infinite weight stays infinite,
    with its sign, and its m, v are those of its gradient (NaN only where lr wd = 1: 0 * inf). Every rung
    follows it: the kernels add Adam's L2 term ``l2 * p`` only when l2 != 0 (AdamW passes l2 = 0, and
    ``g + 0 * inf`` was NaN, which also made m and v NaN). Adam's L2 decay with wd != 0 makes the gradient
    infinite, so m, v are infinite and the step inf/inf is NaN: that parameter is NaN, as in torch;
  * NaN gradient: CHOSEN BEHAVIOUR: the NaN propagates, as in torch: p', m', v' of that element become
    NaN and every other element is unaffected (the step is elementwise). Skipping the step on a non-finite
    gradient is the job of a loss scaler (torch.amp.GradScaler checks before stepping; optim_mixed.py has
    one), not of the update kernel. With global-norm clipping, one NaN makes the norm NaN and therefore EVERY
    parameter NaN; one inf makes the scale 0 (see ``clip_scale``).

Ladder
  sgd_momentum  cpu/loop        rung 1  one @njit loop, heavy-ball or Nesterov by a flag
  sgd_momentum  cpu/prange      rung 2  the same loop split over cores
  sgd_momentum  cpu/stream      rung 3  16-float vectors, p' and b' by streaming stores (no read of the lines
                                        before they are written: 20 B/param through the bus, not 28)
  sgd_momentum  gpu/fused       rung 1  one thread per parameter, 20 B/param
  sgd_momentum  gpu/torch       base    torch.optim.SGD(momentum=..., nesterov=...), foreach
  adam          cpu/loop, gpu/fused     Adam with L2 decay folded into the gradient
  adamw         cpu/loop        rung 1  one @njit loop
  adamw         cpu/prange      rung 2  split over cores
  adamw         cpu/stream      rung 3  16-float vectors, p', m', v' by streaming stores: 28 B/param through
                                        the bus instead of 40 (adam and adamw_clip have the same rung 3)
  adamw         gpu/unfused     rung 1  four elementwise kernels (decay, m, v, update): 48 B/param
  adamw         gpu/fused       rung 2  one kernel, one thread per parameter: 28 B/param
  adamw         gpu/fused_ilp4  rung 3  each thread updates 4 parameters a block apart: same bytes, more
                                        loads in flight per thread, a quarter of the blocks
  adamw         gpu/torch       base    torch.optim.AdamW(fused=True) (+3 copies: see its docstring)
  adamw_multi   gpu/per_tensor  rung 1  T tensors packed in one buffer, one launch per tensor
  adamw_multi   gpu/flat        rung 2  one launch over the whole buffer (possible because it is packed)
  adamw_multi   gpu/multi_tensor rung 3 one launch over an (offset, length) table of 2048-parameter chunks
                                        (torch's and apex's multi_tensor_apply use 65,536-element chunks)
  adamw_multi   gpu/torch       base    torch.optim.AdamW(fused=True) over the T tensors
  adamw_clip    cpu/loop        rung 1  norm loop, then the update loop with the scale
  adamw_clip    gpu/unfused     rung 1  norm (reduction), g*s written to a buffer, fused update: 40 B/param
  adamw_clip    gpu/fused       rung 2  reduction pass, then the update scales g on the fly: 32 B/param
  adamw_clip    gpu/two_pass    rung 3  rung 2 with a deterministic norm: per-block partials stored, then
                                        summed by one block in a fixed order (no float atomics)

Non-finite gradients under clipping (one rule for the reference, the CPU and the GPU variants, torch's): see
``clip_scale``. NaN anywhere: every output NaN. An inf (no NaN): the scale is 0, finite gradients become 0
and the infinite one NaN, so only that parameter (and its m, v) is NaN.

Small ops behind the chapter's exercises: ``adam_first_update`` (the first step with and without bias
correction), ``fp16_update_vanishes`` (does p + u round back to p in float16?), and
``adamw_per_tensor_time``, whose "reference" is the committed H100 measurement of the per-tensor rung
(book/data/bench/h100/adamw_multi_gpu.json): a prediction passes within +-50 %.
"""
from __future__ import annotations

import functools
import math

import numpy as np
from ..compiler import (cuda, float32, get_num_threads, njit, prange, sfence, stream_head, vabs16, vadd16, vdiv16,
                        vload16, vmul16, vsplat16, vsqrt16, vstore16, vstream16, vsub16)

from ..paths import BENCH_DATA
from ..device import ceil_div
from ..registry import define_op, register

THREADS = 256  # block size of every elementwise kernel here
ILP = 4  # parameters per thread in the fused_ilp4 rung
CHUNK = 2048  # parameters per chunk of the multi-tensor table (one block per chunk: 8 per thread)
CLIP_EPS = 1e-6  # as torch.nn.utils.clip_grad_norm_: scale = max_norm / (norm + 1e-6), at most 1

HYPER = dict(lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, wd=0.01)  # torch.optim.AdamW's defaults


# ================================================================================== references
def sgd_momentum_reference(p, g, b, lr, momentum, wd, nesterov):
    """float64 oracle of one SGD step with momentum (torch.optim.SGD, dampening 0, b starting at 0)."""
    gt = g + wd * p if wd != 0 else g  # as torch: no decay term at wd = 0 (0 * inf would be NaN)
    b_new = momentum * b + gt
    d = gt + momentum * b_new if nesterov else b_new
    return p - lr * d, b_new


def adam_reference(p, g, m, v, step, lr, beta1, beta2, eps, wd, decoupled=True):
    """float64 oracle of one Adam (decoupled=False: L2 decay in the gradient) or AdamW step. As in torch, the
    decay touches p only when wd != 0: with wd = 0 an infinite weight stays infinite (0 * inf would be NaN)."""
    if wd != 0 and decoupled:
        p = p * (1.0 - lr * wd)
    elif wd != 0:
        g = g + wd * p
    m_new = beta1 * m + (1.0 - beta1) * g
    v_new = beta2 * v + (1.0 - beta2) * g * g
    m_hat = m_new / (1.0 - beta1**step)
    v_hat = v_new / (1.0 - beta2**step)
    return p - lr * m_hat / (np.sqrt(v_hat) + eps), m_new, v_new


def adamw_reference(p, g, m, v, step, lr, beta1, beta2, eps, wd):
    return adam_reference(p, g, m, v, step, lr, beta1, beta2, eps, wd, decoupled=True)


def adam_l2_reference(p, g, m, v, step, lr, beta1, beta2, eps, wd):
    return adam_reference(p, g, m, v, step, lr, beta1, beta2, eps, wd, decoupled=False)


def adamw_multi_reference(p, g, m, v, lengths, step, lr, beta1, beta2, eps, wd):
    """T tensors packed back to back: the same elementwise step (the layout does not change the math)."""
    assert sum(lengths) == p.size
    return adamw_reference(p, g, m, v, step, lr, beta1, beta2, eps, wd)


def clip_scale(g, max_norm):
    """torch.nn.utils.clip_grad_norm_'s factor, s = min(1, max_norm / (||g||_2 + 1e-6)), with its rule for
    non-finite gradients (THE rule of every adamw_clip variant):

      * a NaN anywhere: the norm is NaN and s is NaN, so every scaled gradient, and every parameter, is NaN;
      * an inf (and no NaN): the norm is inf and s = max_norm / inf = 0. Every finite gradient becomes
        0 * g = +-0 (that parameter takes a step with a zero gradient: it decays, and moves by its momentum),
        and the infinite one becomes 0 * inf = NaN, so that parameter alone (and its m, v) is NaN.

    torch does exactly this: clip_grad_norm_ multiplies the gradients in place by the clamped coefficient
    (torch.clamp(NaN, max=1) stays NaN), and AdamW turns the NaN gradient into a NaN parameter."""
    norm = np.sqrt(np.sum(np.asarray(g, dtype=np.float64) ** 2))
    if np.isnan(norm):
        return norm
    return min(1.0, max_norm / (norm + CLIP_EPS))  # norm = inf gives exactly 0.0


def adamw_clip_reference(p, g, m, v, step, lr, beta1, beta2, eps, wd, max_norm):
    """float64 oracle: clip the gradient to global norm max_norm, then one AdamW step."""
    with np.errstate(invalid="ignore"):  # 0 * inf = NaN: the rule of clip_scale
        gs = clip_scale(g, max_norm) * np.asarray(g, dtype=np.float64)
    return adamw_reference(p, gs, m, v, step, lr, beta1, beta2, eps, wd)


def trajectory(step_fn, state, grads, hyper, with_step=True):
    """Run ``step_fn`` once per gradient in ``grads``, feeding its outputs back in; returns the states after
    each step. Adam-style: ``state = (p, m, v)``, called as ``step_fn(p, g, m, v, t, *hyper)`` for
    t = 1, 2, ...; SGD-style (``with_step=False``): ``state = (p, b)``, ``step_fn(p, g, b, *hyper)``."""
    out = []
    for t, g in enumerate(grads, start=1):
        p, *rest = state
        state = tuple(np.asarray(s) for s in step_fn(p, g, *rest, *((t,) if with_step else ()), *hyper))
        out.append(state)
    return out


# ====================================================================================== inputs
def _state(n, rng, dtype):
    p = rng.standard_normal(n)
    g = rng.standard_normal(n)
    m = 0.1 * rng.standard_normal(n)
    v = m * m + 0.01 * rng.standard_normal(n) ** 2  # v >= m^2, as the two moving averages keep it
    return [a.astype(dtype) for a in (p, g, m, v)]


# Check inputs use a large lr (0.05) so an error in the update is not hidden under p's own rounding.
CHECK_HYPER = dict(lr=0.05, beta1=0.9, beta2=0.999, eps=1e-8, wd=0.1)


def make_inputs_adamw(size, dtype, rng):
    """p, g ~ N(0,1), m ~ 0.1 N(0,1), v ~ 0.01 chi2; step 1..10 (chosen from the size so step 1 occurs)."""
    (n,) = size
    p, g, m, v = _state(n, rng, dtype)
    step = 1 + (n % 10)
    h = CHECK_HYPER
    return p, g, m, v, step, h["lr"], h["beta1"], h["beta2"], h["eps"], h["wd"]


def make_inputs_sgd(size, dtype, rng):
    """p, g ~ N(0,1), b ~ 0.1 N(0,1); lr 0.05, momentum 0.9, wd 0.01; ``nesterov`` from the size."""
    n, nesterov = size
    p, g, b, _ = _state(n, rng, dtype)
    return p, g, b, 0.05, 0.9, 0.01, int(nesterov)


def tensor_lengths(t, n, seed=0):
    """``t`` tensor lengths summing to ``n``: log-uniform between 1 and 2n/t (uneven, like a model's
    tensors), each >= 1."""
    if t > n:
        raise ValueError(f"{t} tensors cannot hold {n} parameters")
    r = np.random.default_rng(seed)
    w = np.exp(r.uniform(0.0, math.log(max(2.0, 2.0 * n / t)), t))
    lens = np.maximum(1, np.floor(w / w.sum() * n)).astype(np.int64)
    lens[np.argmax(lens)] += n - lens.sum()  # the largest absorbs the rounding
    assert lens.min() >= 1 and lens.sum() == n
    return tuple(int(x) for x in lens)


def gpt_lengths(layers=12, d=768, vocab=50257, ctx=1024):
    """The parameter tensors of a GPT-2-style model (GPT-2 small by default: 148 tensors, 124 M params):
    token and position embeddings, per layer two norms (weight, bias), the attention's qkv (d,3d)+bias,
    its output projection (d,d)+bias, the MLP (d,4d)+bias and (4d,d)+bias; a final norm."""
    lens = [vocab * d, ctx * d]
    for _ in range(layers):
        lens += [d, d, d * 3 * d, 3 * d, d * d, d, d, d, d * 4 * d, 4 * d, 4 * d * d, d]
    lens += [d, d]
    return tuple(lens)


def make_inputs_multi(size, dtype, rng):
    t, n = size
    p, g, m, v = _state(n, rng, dtype)
    h = CHECK_HYPER
    return p, g, m, v, tensor_lengths(t, n), 1 + (n % 10), h["lr"], h["beta1"], h["beta2"], h["eps"], h["wd"]


def make_inputs_clip(size, dtype, rng):
    """AdamW inputs plus max_norm = 0.5 sqrt(n): the gradient (norm ~ sqrt(n)) is scaled by ~0.5."""
    (n,) = size
    return (*make_inputs_adamw(size, dtype, rng), 0.5 * math.sqrt(n))


def make_edge_inputs_clip(size, dtype, rng):
    """Clipping's edge values: one infinite gradient (sign drawn), zeros, -0.0 and 1e-30 elsewhere. By the
    rule of ``clip_scale`` the norm is inf, the scale 0: finite gradients become +-0 and the infinite one NaN,
    so exactly one parameter comes out NaN. (A NaN gradient makes every output NaN: tested apart.) Two
    weights are +-inf (where the gradient is finite): they stay +-inf (see ``_inf_weights``)."""
    inputs = list(make_inputs_clip(size, dtype, rng))
    g = inputs[1]
    vals = [float(rng.choice([np.inf, -np.inf])), 0.0, -0.0, 1e-30, -1e-30]
    pos = rng.permutation(g.size)[: len(vals)]
    for k, x in zip(pos, vals):
        g[k] = x
    _inf_weights(inputs[0], np.setdiff1d(np.arange(g.size), pos[:1]), rng)
    return tuple(inputs)


def _inf_weights(p, where, rng):
    """+inf and -inf into two weights chosen among ``where``: AdamW keeps them infinite (torch's rule: the
    decay multiplies p by 1 - lr wd, and no term multiplies p by 0); Adam's L2 decay turns them into NaN."""
    for k, x in zip(rng.permutation(where)[:2], (np.inf, -np.inf)):
        p[k] = x


def make_edge_inputs_multi(size, dtype, rng):
    """``make_edge_inputs`` of ``adamw`` over the packed buffer of T tensors (size (T, n)), with the lengths of
    ``make_inputs_multi``: zero, huge, tiny and NaN gradients, a zero state, +-inf weights, step 1."""
    t, n = size
    p, g, m, v, step, *h = make_edge_inputs((n,), dtype, rng)
    return p, g, m, v, tensor_lengths(t, n), step, *h


def make_edge_inputs(size, dtype, rng):
    """Gradients an update must survive: exact zeros (with m = v = 0 on some of them), +-1e18 (g^2 =
    1e36 still fits fp32), 1e-30 (g^2 underflows), and NaN (which must come out NaN, only there);
    step 1 (the largest bias correction); for Adam/AdamW also weights of +inf and -inf (AdamW keeps them
    infinite, as torch does; Adam's L2 decay makes them NaN). Serves ``sgd_momentum`` (size (n, nesterov)) and ``adamw``
    (size (n,)), told apart by the length of ``size``."""
    if len(size) == 2:
        inputs = list(make_inputs_sgd(size, dtype, rng))
        g = inputs[1]
        huge = 1e30  # SGD never squares g: 1e30 * 0.05 still fits fp32
    else:
        inputs = list(make_inputs_adamw(size, dtype, rng))
        inputs[4] = 1
        g = inputs[1]
        huge = 1e18
    n = g.size
    vals = [0.0, huge, -huge, 1e-30, np.nan, 0.0, -0.0]
    pos = rng.permutation(n)[: len(vals)]
    for k, i in zip(pos, vals):
        g[k] = i
    if len(size) == 1 and n > 1:  # a zero gradient with zero state: the step must be exactly 0
        z = pos[0]
        inputs[2][z] = 0.0
        inputs[3][z] = 0.0
        # a small gradient on a zero state: sqrt(v_hat) = 1e-5 is only 1000 eps, so epsilon moved inside
        # the square root (sqrt(v_hat + eps) = 1e-4) changes the step 30-fold (found by tests/test_grading_mutants.py)
        rest = np.setdiff1d(np.arange(n), pos)
        if rest.size:
            g[rest[0]] = 1e-5
            inputs[2][rest[0]] = 0.0
            inputs[3][rest[0]] = 0.0
        _inf_weights(inputs[0], rest[1:], rng)
    return tuple(inputs)


def _adam_coeffs(step, lr, beta1, beta2, eps, wd, decoupled=True):
    """Host-side scalars (float64 math, handed to kernels as float32): decay factor, step size lr/bc1,
    1/sqrt(bc2), and the L2 coefficient. Bias corrections are computed once per step, not per element;
    1 - beta is rounded once from float64 (1 - float32(0.999) would be off by 1.3e-5 relative)."""
    bc1 = 1.0 - beta1**step
    bc2 = 1.0 - beta2**step
    decay = 1.0 - lr * wd if decoupled else 1.0
    l2 = 0.0 if decoupled else wd
    f = np.float32
    return (f(decay), f(l2), f(beta1), f(1.0 - beta1), f(beta2), f(1.0 - beta2), f(lr / bc1),
            f(1.0 / math.sqrt(bc2)), f(eps))


# =========================================================================================== ops
SIZES_1D = {"check": [(1,), (2,), (7,), (31,), (1000,), (4099,), (65537,)],
            "check_sim": [(1,), (7,), (300,)],
            "bench": [(1 << 20,), (1 << 24,)],
            "bench_gpu": [(1 << 24,), (100_000_000,)],
            "bench_sim": [(300,)]}
# fp32: each output is a handful of float32 operations on O(1) values; the default (1e-5, 1e-6) is ~80
# float32 ulps. Huge-gradient edge cases stay within it because Adam's update ratio is scale-free.
TOL = (1e-5, 1e-6)
ADAM_OUT = ("p_new", "m_new", "v_new")

define_op("sgd_momentum", reference=sgd_momentum_reference, make_inputs=make_inputs_sgd, chapter=12,
          title="SGD with momentum (heavy-ball / Nesterov)", size_names=("n", "nesterov"), kind="memory",
          tol=TOL, output_names=("p_new", "b_new"),
          sizes={"check": [(1, 0), (1, 1), (7, 1), (31, 0), (1000, 1), (4099, 0), (65537, 1)],
                 "check_sim": [(1, 0), (7, 1), (300, 0)], "bench": [(1 << 24, 0)],
                 "bench_gpu": [(1 << 24, 0), (100_000_000, 1)], "bench_sim": [(300, 1)]},
          flops=lambda s: 5 * s[0], bytes=lambda s, b: 5 * s[0] * b)
define_op("adam", reference=adam_l2_reference, make_inputs=make_inputs_adamw, chapter=12,
          title="Adam step (L2 decay in the gradient)", size_names=("n",), kind="memory", tol=TOL,
          edge_inputs=make_edge_inputs, output_names=ADAM_OUT, sizes=SIZES_1D, flops=lambda s: 13 * s[0], bytes=lambda s, b: 7 * s[0] * b)
define_op("adamw", reference=adamw_reference, make_inputs=make_inputs_adamw, chapter=12,
          title="AdamW step (decoupled weight decay)", size_names=("n",), kind="memory", tol=TOL,
          edge_inputs=make_edge_inputs, output_names=ADAM_OUT, sizes=SIZES_1D, flops=lambda s: 13 * s[0], bytes=lambda s, b: 7 * s[0] * b)
N_SWEEP = 1 << 24
define_op("adamw_multi", reference=adamw_multi_reference, make_inputs=make_inputs_multi, chapter=12,
          title="AdamW over T tensors", size_names=("T", "n"), kind="memory", tol=TOL, output_names=ADAM_OUT,
          edge_inputs=make_edge_inputs_multi,
          sizes={"check": [(1, 1), (3, 7), (5, 1000), (17, 4099), (40, 70001)],
                 "check_sim": [(1, 1), (3, 7), (4, 300)],
                 "bench": [(1, 1 << 20), (64, 1 << 20)],
                 "bench_gpu": [(t, N_SWEEP) for t in (1, 8, 64, 256, 1024, 4096)],
                 "bench_sim": [(4, 300)]},
          flops=lambda s: 13 * s[1], bytes=lambda s, b: 7 * s[1] * b)
define_op("adamw_clip", reference=adamw_clip_reference, make_inputs=make_inputs_clip, chapter=12,
          title="AdamW with global-norm gradient clipping", size_names=("n",), kind="memory",
          tol=(2e-5, 2e-6),  # + the scale, a sum of n squares in fp32 partials (relative error ~ 1e-7 log n)
          edge_inputs=make_edge_inputs_clip, output_names=ADAM_OUT, sizes=SIZES_1D, flops=lambda s: 15 * s[0], bytes=lambda s, b: 8 * s[0] * b)


# ========================================================================================== CPU
@njit(cache=True)
def _sgd_loop(p_new, b_new, p, g, b, lr, mu, wd, nesterov):
    for i in range(p.size):
        gt = g[i] + wd * p[i] if wd != 0 else g[i]
        bi = mu * b[i] + gt
        b_new[i] = bi
        p_new[i] = p[i] - lr * (gt + mu * bi if nesterov else bi)


@njit(cache=True, parallel=True)
def _sgd_prange(p_new, b_new, p, g, b, lr, mu, wd, nesterov):
    for i in prange(p.size):
        gt = g[i] + wd * p[i] if wd != 0 else g[i]
        bi = mu * b[i] + gt
        b_new[i] = bi
        p_new[i] = p[i] - lr * (gt + mu * bi if nesterov else bi)


@register("sgd_momentum", "cpu", "loop", rung=1)
def sgd_momentum_loop(p_new, b_new, p, g, b, lr, momentum, wd, nesterov):
    """One @njit loop over the parameters: read p, g, b, write p, b (20 B/param); heavy-ball or Nesterov
    by a flag that is the same for every element (the branch predictor learns it)."""
    _sgd_loop(p_new, b_new, p, g, b, lr, momentum, wd, bool(nesterov))


@register("sgd_momentum", "cpu", "prange", rung=2)
def sgd_momentum_prange(p_new, b_new, p, g, b, lr, momentum, wd, nesterov):
    """Rung 1 split over cores with prange: bound by DRAM bandwidth, so predict ~the CPU copy rate."""
    _sgd_prange(p_new, b_new, p, g, b, lr, momentum, wd, bool(nesterov))


@njit(cache=True, inline="always")
def _adam_elem(p, g, m, v, decay, l2, b1, omb1, b2, omb2, step_size, inv_sqrt_bc2, eps):
    if l2 != 0:  # Adam's L2 term only: AdamW passes l2 = 0, and g + 0 * inf is NaN for an infinite weight
        g = g + l2 * p
    p = p * decay
    m = b1 * m + omb1 * g
    v = b2 * v + omb2 * g * g
    p = p - step_size * m / (math.sqrt(v) * inv_sqrt_bc2 + eps)
    return p, m, v


@njit(cache=True)
def _adam_loop(p_new, m_new, v_new, p, g, m, v, decay, l2, b1, omb1, b2, omb2, step_size, isb, eps):
    for i in range(p.size):
        p_new[i], m_new[i], v_new[i] = _adam_elem(p[i], g[i], m[i], v[i], decay, l2, b1, omb1, b2, omb2,
                                                  step_size, isb, eps)


@njit(cache=True, parallel=True)
def _adam_prange(p_new, m_new, v_new, p, g, m, v, decay, l2, b1, omb1, b2, omb2, step_size, isb, eps):
    for i in prange(p.size):
        p_new[i], m_new[i], v_new[i] = _adam_elem(p[i], g[i], m[i], v[i], decay, l2, b1, omb1, b2, omb2,
                                                  step_size, isb, eps)


@register("adam", "cpu", "loop", rung=1)
def adam_loop(p_new, m_new, v_new, p, g, m, v, step, lr, beta1, beta2, eps, wd):
    """One @njit loop; L2 decay adds wd*p to the gradient, so it is rescaled by 1/sqrt(v) like g."""
    _adam_loop(p_new, m_new, v_new, p, g, m, v, *_adam_coeffs(step, lr, beta1, beta2, eps, wd, False))


@register("adamw", "cpu", "loop", rung=1)
def adamw_loop(p_new, m_new, v_new, p, g, m, v, step, lr, beta1, beta2, eps, wd):
    """One @njit loop over the parameters, bias corrections hoisted to the host: 28 B/param."""
    _adam_loop(p_new, m_new, v_new, p, g, m, v, *_adam_coeffs(step, lr, beta1, beta2, eps, wd))


@register("adamw", "cpu", "prange", rung=2)
def adamw_prange(p_new, m_new, v_new, p, g, m, v, step, lr, beta1, beta2, eps, wd):
    """Rung 1 over all cores: the sqrt and divide are cheap next to 28 bytes, so predict ~copy rate."""
    _adam_prange(p_new, m_new, v_new, p, g, m, v, *_adam_coeffs(step, lr, beta1, beta2, eps, wd))


@njit(cache=True)
def _sumsq(g):
    s = 0.0  # float64 accumulator on the CPU: n squares, no cancellation
    for i in range(g.size):
        s += g[i] * g[i]
    return s


def _clip_from_sumsq(sumsq, max_norm):
    """clip_scale's rule from the sum of squares: NaN stays NaN; inf gives max_norm / inf = 0 (finite
    gradients become 0, an infinite one 0 * inf = NaN), never inf (which turned every parameter into NaN)."""
    if sumsq != sumsq:
        return float("nan")
    return min(1.0, max_norm / (math.sqrt(sumsq) + CLIP_EPS))


@njit(cache=True)
def _adam_clip_loop(p_new, m_new, v_new, p, g, m, v, scale, decay, b1, omb1, b2, omb2, step_size, isb, eps):
    for i in range(p.size):
        p_new[i], m_new[i], v_new[i] = _adam_elem(p[i], scale * g[i], m[i], v[i], decay, 0.0, b1, omb1, b2,
                                                  omb2, step_size, isb, eps)


@register("adamw_clip", "cpu", "loop", rung=1)
def adamw_clip_loop(p_new, m_new, v_new, p, g, m, v, step, lr, beta1, beta2, eps, wd, max_norm):
    """Pass 1 sums g^2 (a reduction), pass 2 is the AdamW loop with g scaled on the fly: 32 B/param."""
    scale = _clip_from_sumsq(_sumsq(g), max_norm)
    decay, _, *rest = _adam_coeffs(step, lr, beta1, beta2, eps, wd)
    _adam_clip_loop(p_new, m_new, v_new, p, g, m, v, scale, decay, *rest)


@register("adam", "cpu", "prange", rung=2)
def adam_prange(p_new, m_new, v_new, p, g, m, v, step, lr, beta1, beta2, eps, wd):
    """Rung 1 split over the cores with prange (issue 36): 28 B/param and ~13 FLOPs, a sqrt and a divide per
    param, which SIMD hides behind DRAM. Predict >= 70 % of the parallel copy rate (rung 1 was ~23 %)."""
    _adam_prange(p_new, m_new, v_new, p, g, m, v, *_adam_coeffs(step, lr, beta1, beta2, eps, wd, False))


CLIP_CHUNKS = 64  # fixed number of partial sums: the same additions in the same order on 1 core or 64


@njit(cache=True, parallel=True, fastmath={"reassoc", "contract"})
def _sumsq_chunks(partials, g):
    n = g.size
    per = (n + CLIP_CHUNKS - 1) // CLIP_CHUNKS
    for c in prange(CLIP_CHUNKS):
        s = 0.0  # float64 accumulator, as in _sumsq
        for i in range(c * per, min(n, (c + 1) * per)):
            x = np.float64(g[i])
            s += x * x
        partials[c] = s


@njit(cache=True, parallel=True)
def _adam_clip_prange(p_new, m_new, v_new, p, g, m, v, scale, decay, b1, omb1, b2, omb2, step_size, isb, eps):
    for i in prange(p.size):
        p_new[i], m_new[i], v_new[i] = _adam_elem(p[i], scale * g[i], m[i], v[i], decay, np.float32(0.0), b1, omb1, b2,
                                                  omb2, step_size, isb, eps)


@register("adamw_clip", "cpu", "prange", rung=2)
def adamw_clip_prange(p_new, m_new, v_new, p, g, m, v, step, lr, beta1, beta2, eps, wd, max_norm):
    """Both passes over the cores. Pass 1: CLIP_CHUNKS = 64 fixed chunks, each a float64 sum of squares,
    added in chunk order on the host, so the norm (and every output) is the same bit for bit whatever the
    thread count; pass 2 the AdamW loop under prange. 32 B/param over two passes: predict >= 70 % of copy."""
    partials = np.empty(CLIP_CHUNKS, dtype=np.float64)
    _sumsq_chunks(partials, g)
    scale = _clip_from_sumsq(_ordered_sum(partials), max_norm)
    decay, _, *rest = _adam_coeffs(step, lr, beta1, beta2, eps, wd)
    _adam_clip_prange(p_new, m_new, v_new, p, g, m, v, np.float32(scale), decay, *rest)


def _ordered_sum(partials):
    s = 0.0
    for x in partials:
        s += float(x)
    return s


# ----------------------------------------------------------------------- rung 3: 16-float vectors, streaming stores
# Why rung 2 sat at about half the copy rate (measured, `kernels asm adamw` and one-core A/B runs; chapter 12):
# every ordinary store to a line that is not cached first reads that line (write-allocate), so AdamW's 28
# counted bytes per parameter move 40 through the memory bus, and the loop's vdivps + vsqrtps per 8 or 16 lanes
# sit on the same core as the loads. Rung 3 writes p', m', v' with streaming stores (vmovntps: whole 64-byte
# lines, no read first), from 16-float vectors of the compiler door. The element math is rung 2's, lane for lane
# (same operations, same order: bit-identical results); the first elements up to where the outputs' lines start,
# and the last n % 16, take the scalar path with ordinary stores. Outputs that do not share one alignment (a view
# at an odd offset) get ordinary vector stores throughout.
@njit(cache=True, inline="always")
def _adam16(p, g, m, v, scale, decay, l2, b1, omb1, b2, omb2, step_size, isb, eps, use_l2):
    # f32x16 lanes, the same operations as _adam_elem in the same order
    g = vmul16(scale, g)
    if use_l2:
        g = vadd16(g, vmul16(l2, p))
    p = vmul16(p, decay)
    m = vadd16(vmul16(b1, m), vmul16(omb1, g))
    v = vadd16(vmul16(b2, v), vmul16(vmul16(omb2, g), g))
    p = vsub16(p, vdiv16(vmul16(step_size, m), vadd16(vmul16(vsqrt16(v), isb), eps)))
    return p, m, v


def _chunks(nb):
    """How many contiguous chunks of 16-float blocks prange deals out: one per thread (each ends with a fence)."""
    return max(1, min(get_num_threads(), nb))


@njit(cache=True, parallel=True)
def _adam_stream(p_new, m_new, v_new, p, g, m, v, scale, decay, l2, b1, omb1, b2, omb2, step_size, isb, eps, head,
                 nch):
    # p, g, m, v (N,) -> p_new, m_new, v_new (N,); head: first index where all three outputs start a 64-byte line
    # (-1: they do not share one, use ordinary stores); nch: chunks (one per thread)
    n = p.size
    nt = head >= 0
    h = min(max(head, 0), n)
    nb = (n - h) // 16
    e = h + nb * 16
    for i in range(h):  # the head and the tail: scalar, ordinary stores
        p_new[i], m_new[i], v_new[i] = _adam_elem(p[i], scale * g[i], m[i], v[i], decay, l2, b1, omb1, b2, omb2,
                                                  step_size, isb, eps)
    for i in range(e, n):
        p_new[i], m_new[i], v_new[i] = _adam_elem(p[i], scale * g[i], m[i], v[i], decay, l2, b1, omb1, b2, omb2,
                                                  step_size, isb, eps)
    use_l2 = l2 != 0
    for c in prange(nch):  # one contiguous run of blocks per thread, closed by its own store fence
        k = (vsplat16(scale), vsplat16(decay), vsplat16(l2), vsplat16(b1), vsplat16(omb1), vsplat16(b2),
             vsplat16(omb2), vsplat16(step_size), vsplat16(isb), vsplat16(eps))
        for b in range(c * nb // nch, (c + 1) * nb // nch):
            i = h + 16 * b
            pv, mv, vv = _adam16(vload16(p, i), vload16(g, i), vload16(m, i), vload16(v, i), k[0], k[1], k[2], k[3],
                                 k[4], k[5], k[6], k[7], k[8], k[9], use_l2)
            if nt:
                vstream16(p_new, i, pv)
                vstream16(m_new, i, mv)
                vstream16(v_new, i, vv)
            else:
                vstore16(p_new, i, pv)
                vstore16(m_new, i, mv)
                vstore16(v_new, i, vv)
        if nt:
            sfence()


def _adam_stream_run(p_new, m_new, v_new, p, g, m, v, scale, coeffs):
    head = stream_head(p_new, m_new, v_new)
    n = p.shape[0]
    _adam_stream(p_new, m_new, v_new, p, g, m, v, np.float32(scale), *coeffs, head, _chunks(n // 16))


_STREAM_DOC = ("Rung 2's loop on 16-float vectors of the compiler door, p', m', v' written with streaming stores "
               "(vmovntps, 64-byte aligned; the head and tail scalar, a store fence per thread)")


@register("adamw", "cpu", "stream", rung=3)
def adamw_stream(p_new, m_new, v_new, p, g, m, v, step, lr, beta1, beta2, eps, wd):
    """Rung 2 on 16-float vectors with streaming stores of p', m', v' (vmovntps: a whole 64-byte line written
    without reading it first). Rung 2's ordinary stores read each output line before writing it
    (write-allocate): 40 bytes through the bus per 28 counted. Streaming: 28, and the core no longer waits on
    those reads, so the vdivps/vsqrtps hide behind the loads. A/B in one process on a busy 2-core AVX2 EPYC, 2^24:
    1.31x rung 2 on two threads, 1.47x on one; with two threads as fast as the same seven streams with no
    arithmetic. Predict rung 2's ~55 % of copy -> >= 70 %."""
    _adam_stream_run(p_new, m_new, v_new, p, g, m, v, 1.0, _adam_coeffs(step, lr, beta1, beta2, eps, wd))


@register("adam", "cpu", "stream", rung=3)
def adam_stream(p_new, m_new, v_new, p, g, m, v, step, lr, beta1, beta2, eps, wd):
    """adamw's rung 3 (the same kernel) with Adam's L2 term: streaming stores of p', m', v', 28 B/param through
    the bus instead of 40. A/B on the busy 2-core AVX2 EPYC, 2^24: 1.22x rung 2 on two threads, 1.13x on one.
    Predict rung 2's ~52 % of copy -> >= 70 %."""
    _adam_stream_run(p_new, m_new, v_new, p, g, m, v, 1.0, _adam_coeffs(step, lr, beta1, beta2, eps, wd, False))


@register("adamw_clip", "cpu", "stream", rung=3)
def adamw_clip_stream(p_new, m_new, v_new, p, g, m, v, step, lr, beta1, beta2, eps, wd, max_norm):
    """Rung 2's norm pass (64 fixed float64 chunks, the same bits on any thread count), then adamw's rung 3 with
    g scaled on the fly: streaming stores of p', m', v', 32 B/param through the bus instead of 44. A/B on the busy
    2-core AVX2 EPYC, 2^24: 1.17x rung 2 on two threads, 1.24x on one. Predict rung 2's ~36 % of copy -> >= 70 %
    if the norm pass (a read of g at the copy rate) is not what holds it back."""
    partials = np.empty(CLIP_CHUNKS, dtype=np.float64)
    _sumsq_chunks(partials, g)
    scale = _clip_from_sumsq(_ordered_sum(partials), max_norm)
    _adam_stream_run(p_new, m_new, v_new, p, g, m, v, scale, _adam_coeffs(step, lr, beta1, beta2, eps, wd))


@njit(cache=True, inline="always")
def _sgd_elem(p, g, b, lr, mu, wd, nesterov):
    gt = g + wd * p if wd != 0 else g
    bi = mu * b + gt
    return p - lr * (gt + mu * bi if nesterov else bi), bi


@njit(cache=True, parallel=True)
def _sgd_stream(p_new, b_new, p, g, b, lr, mu, wd, nesterov, head, nch):
    # p, g, b (N,) -> p_new, b_new (N,); head and nch as in _adam_stream
    n = p.size
    nt = head >= 0
    h = min(max(head, 0), n)
    nb = (n - h) // 16
    e = h + nb * 16
    for i in range(h):  # the head and the tail: scalar, ordinary stores
        p_new[i], b_new[i] = _sgd_elem(p[i], g[i], b[i], lr, mu, wd, nesterov)
    for i in range(e, n):
        p_new[i], b_new[i] = _sgd_elem(p[i], g[i], b[i], lr, mu, wd, nesterov)
    use_wd = wd != 0
    for c in prange(nch):
        lr_v, mu_v, wd_v = vsplat16(lr), vsplat16(mu), vsplat16(wd)
        for blk in range(c * nb // nch, (c + 1) * nb // nch):
            i = h + 16 * blk
            pv = vload16(p, i)
            gt = vload16(g, i)
            if use_wd:
                gt = vadd16(gt, vmul16(wd_v, pv))
            bv = vadd16(vmul16(mu_v, vload16(b, i)), gt)
            step = vadd16(gt, vmul16(mu_v, bv)) if nesterov else bv
            pv = vsub16(pv, vmul16(lr_v, step))
            if nt:
                vstream16(b_new, i, bv)
                vstream16(p_new, i, pv)
            else:
                vstore16(b_new, i, bv)
                vstore16(p_new, i, pv)
        if nt:
            sfence()


@register("sgd_momentum", "cpu", "stream", rung=3)
def sgd_momentum_stream(p_new, b_new, p, g, b, lr, momentum, wd, nesterov):
    """Rung 2 on 16-float vectors with streaming stores of p' and b': 20 B/param through the bus instead of 28
    (write-allocate reads each output line first). A/B on the busy 2-core AVX2 EPYC, 2^24: 1.46x rung 2 on two
    threads, 1.32x on one. Predict rung 2's ~49 % of copy -> >= 70 %."""
    f = np.float32
    _sgd_stream(p_new, b_new, p, g, b, f(lr), f(momentum), f(wd), bool(nesterov), stream_head(p_new, b_new),
                _chunks(p.shape[0] // 16))


# ========================================================================================== GPU
V1 = "float32[::1]"
SIG_ADAM = f"void({', '.join([V1] * 7)}, {', '.join(['float32'] * 9)})"


@cuda.jit(device=True, inline=True)
def adam_elem(p, g, m, v, decay, l2, b1, omb1, b2, omb2, step_size, inv_sqrt_bc2, eps):
    """One parameter's Adam/AdamW update in float32 (l2 = 0, decay = 1 - lr wd: AdamW). The L2 term only
    when l2 != 0 (a branch every thread takes the same way): 0 * inf would turn an infinite weight into NaN."""
    if l2 != 0:
        g = g + l2 * p
    p = p * decay
    m = b1 * m + omb1 * g
    v = b2 * v + omb2 * g * g
    p = p - step_size * m / (math.sqrt(v) * inv_sqrt_bc2 + eps)
    return p, m, v


@cuda.jit
def adam_fused_kernel(p_new, m_new, v_new, p, g, m, v, decay, l2, b1, omb1, b2, omb2, step_size, inv_sqrt_bc2, eps):
    # p, g, m, v (N,) -> p_new, m_new, v_new (N,); one thread per parameter
    i = cuda.grid(1)
    if i < p.size:
        p_new[i], m_new[i], v_new[i] = adam_elem(p[i], g[i], m[i], v[i], decay, l2, b1, omb1, b2, omb2, step_size,
                                                 inv_sqrt_bc2, eps)


@cuda.jit
def adam_ilp_kernel(p_new, m_new, v_new, p, g, m, v, decay, l2, b1, omb1, b2, omb2, step_size, inv_sqrt_bc2, eps):
    # each thread: ILP parameters, THREADS apart inside its block's tile of THREADS*ILP (coalesced loads)
    base = cuda.blockIdx.x * (THREADS * ILP) + cuda.threadIdx.x
    n = p.size
    for k in range(ILP):
        i = base + k * THREADS
        if i < n:
            p_new[i], m_new[i], v_new[i] = adam_elem(p[i], g[i], m[i], v[i], decay, l2, b1, omb1, b2, omb2, step_size,
                                                     inv_sqrt_bc2, eps)


def launch_adam(kernel, p_new, m_new, v_new, p, g, m, v, coeffs, per_thread=1):
    n = p.shape[0]
    if n == 0:
        return
    kernel[ceil_div(n, THREADS * per_thread), THREADS](p_new, m_new, v_new, p, g, m, v, *coeffs)


@register("adam", "gpu", "fused", rung=1, ptx=[(adam_fused_kernel, SIG_ADAM)])
def adam_fused(p_new, m_new, v_new, p, g, m, v, step, lr, beta1, beta2, eps, wd):
    """One fused kernel, one thread per parameter, L2 decay in the gradient: 28 B/param, ~copy speed."""
    launch_adam(adam_fused_kernel, p_new, m_new, v_new, p, g, m, v,
                _adam_coeffs(step, lr, beta1, beta2, eps, wd, False))


# --- rung 1: unfused, the way a framework without a fused optimizer runs it: one elementwise op at a time
@cuda.jit
def scale_kernel(out, x, a):
    i = cuda.grid(1)
    if i < x.size:
        out[i] = a * x[i]


@cuda.jit
def ema_kernel(out, x, g, beta, one_minus_beta, square):
    # out = beta x + (1 - beta) g  (or g^2 when square): the m or v update alone
    i = cuda.grid(1)
    if i < x.size:
        gi = g[i]
        if square:
            gi = gi * gi
        out[i] = beta * x[i] + one_minus_beta * gi


@cuda.jit
def adam_apply_kernel(p_new, m, v, step_size, inv_sqrt_bc2, eps):
    # p_new -= step_size m / (sqrt(v) inv_sqrt_bc2 + eps), with m, v already updated
    i = cuda.grid(1)
    if i < p_new.size:
        p_new[i] = p_new[i] - step_size * m[i] / (math.sqrt(v[i]) * inv_sqrt_bc2 + eps)


SIG_SCALE = f"void({V1}, {V1}, float32)"
SIG_EMA = f"void({V1}, {V1}, {V1}, float32, float32, boolean)"
SIG_APPLY = f"void({V1}, {V1}, {V1}, float32, float32, float32)"


@register("adamw", "gpu", "unfused", rung=1, bytes=lambda s, b: 12 * s[0] * b,
          ptx=[(scale_kernel, SIG_SCALE), (ema_kernel, SIG_EMA), (adam_apply_kernel, SIG_APPLY)])
def adamw_unfused(p_new, m_new, v_new, p, g, m, v, step, lr, beta1, beta2, eps, wd):
    """Four elementwise kernels (decay p, update m, update v, apply): 8+12+12+16 = 48 B/param (counted
    here, so GB/s is honest). Predict ~28/48 = 58 % of the fused rung's time-per-step speed."""
    decay, _, b1, omb1, b2, omb2, ss, isb, e = _adam_coeffs(step, lr, beta1, beta2, eps, wd)
    n = p.shape[0]
    if n == 0:
        return
    grid = ceil_div(n, THREADS)
    scale_kernel[grid, THREADS](p_new, p, decay)
    ema_kernel[grid, THREADS](m_new, m, g, b1, omb1, False)
    ema_kernel[grid, THREADS](v_new, v, g, b2, omb2, True)
    adam_apply_kernel[grid, THREADS](p_new, m_new, v_new, ss, isb, e)


@register("adamw", "gpu", "fused", rung=2, ptx=[(adam_fused_kernel, SIG_ADAM)])
def adamw_fused(p_new, m_new, v_new, p, g, m, v, step, lr, beta1, beta2, eps, wd):
    """One kernel, one thread per parameter: each byte moves once, 28 B/param. Predict ~90 % of copy
    bandwidth (7 streams instead of copy's 2; enough loads in flight at full occupancy)."""
    launch_adam(adam_fused_kernel, p_new, m_new, v_new, p, g, m, v, _adam_coeffs(step, lr, beta1, beta2, eps, wd))


@register("adamw", "gpu", "fused_ilp4", rung=3, ptx=[(adam_ilp_kernel, SIG_ADAM)])
def adamw_fused_ilp4(p_new, m_new, v_new, p, g, m, v, step, lr, beta1, beta2, eps, wd):
    """Rung 2 with 4 parameters per thread (a block's tile is 4x256, each load still coalesced): the
    same 28 B/param, 4x fewer blocks to schedule and up to 16 loads in flight per thread. Predict
    0-5 % faster than rung 2: both should already be near the copy roof."""
    launch_adam(adam_ilp_kernel, p_new, m_new, v_new, p, g, m, v,
                _adam_coeffs(step, lr, beta1, beta2, eps, wd), per_thread=ILP)


# --- SGD with momentum
SIG_SGD = f"void({', '.join([V1] * 5)}, float32, float32, float32, boolean)"


@cuda.jit
def sgd_momentum_kernel(p_new, b_new, p, g, b, lr, mu, wd, nesterov):
    # p, g, b (N,) -> p_new, b_new (N,); one thread per parameter
    i = cuda.grid(1)
    if i < p.size:
        gt = g[i] + wd * p[i] if wd != 0 else g[i]
        bi = mu * b[i] + gt
        b_new[i] = bi
        if nesterov:
            p_new[i] = p[i] - lr * (gt + mu * bi)
        else:
            p_new[i] = p[i] - lr * bi


@register("sgd_momentum", "gpu", "fused", rung=1, ptx=[(sgd_momentum_kernel, SIG_SGD)])
def sgd_momentum_fused(p_new, b_new, p, g, b, lr, momentum, wd, nesterov):
    """One thread per parameter: 20 B/param. Predict ~90 % of copy bandwidth, like AdamW."""
    n = p.shape[0]
    if n == 0:
        return
    f = np.float32
    sgd_momentum_kernel[ceil_div(n, THREADS), THREADS](p_new, b_new, p, g, b, f(lr), f(momentum), f(wd),
                                                         bool(nesterov))


# --- many tensors: per-tensor launches, one flat launch, multi-tensor apply
@register("adamw_multi", "gpu", "per_tensor", rung=1, ptx=[(adam_fused_kernel, SIG_ADAM)])
def adamw_per_tensor(p_new, m_new, v_new, p, g, m, v, lengths, step, lr, beta1, beta2, eps, wd):
    """One launch of the fused kernel per tensor (what a loop over model.parameters() does). Each launch
    costs a few microseconds of host time however small the tensor: predict time ~ T x launch cost once
    T x launch cost exceeds the 28 N bytes / bandwidth. (The slices are made once per layout and reused.)"""
    c = _adam_coeffs(step, lr, beta1, beta2, eps, wd)
    for views in _tensor_views((p_new, m_new, v_new, p, g, m, v), lengths):
        launch_adam(adam_fused_kernel, *views, c)


_views_cache: list = []


def _tensor_views(arrays, lengths):
    """Per tensor, the 7 views into the buffers, made once per (buffers, layout): an optimizer holds its
    parameter tensors, it does not re-slice them every step. (Cached with the arrays themselves, so an
    id is never confused with a freed array's.)"""
    key = (tuple(lengths), tuple(id(a) for a in arrays))
    for k, arrs, views in _views_cache:
        if k == key and all(x is y for x, y in zip(arrs, arrays)):
            return views
    views, o = [], 0
    for n in lengths:
        views.append(tuple(a[o:o + n] for a in arrays))
        o += n
    _views_cache.insert(0, (key, arrays, views))
    del _views_cache[4:]
    return views


@register("adamw_multi", "gpu", "flat", rung=2, ptx=[(adam_fused_kernel, SIG_ADAM)])
def adamw_flat(p_new, m_new, v_new, p, g, m, v, lengths, step, lr, beta1, beta2, eps, wd):
    """The tensors live back to back in one buffer, so ONE launch updates them all (the layout is
    irrelevant to an elementwise step). Predict the flat rung's time whatever T is."""
    launch_adam(adam_fused_kernel, p_new, m_new, v_new, p, g, m, v, _adam_coeffs(step, lr, beta1, beta2, eps, wd))


@functools.lru_cache(maxsize=64)
def _chunk_table_host(lengths, chunk):
    rows = []
    o = 0
    for n in lengths:
        for c in range(0, n, chunk):
            rows.append((o + c, min(chunk, n - c)))
        o += n
    return np.array(rows, dtype=np.int64).reshape(-1, 2)


def chunk_table(lengths, chunk=CHUNK):
    """(offset, length) rows: every tensor cut into chunks of at most ``chunk`` parameters."""
    return _chunk_table_host(tuple(lengths), chunk)


_tables: dict = {}


def _device_table(lengths, chunk):
    """The chunk table on the device, built once per parameter layout (an optimizer's layout does not
    change between steps), so a step is one launch and no copy."""
    key = (tuple(lengths), chunk)
    hit = _tables.get(key)
    if hit is None:
        if len(_tables) > 32:
            _tables.clear()
        hit = _tables[key] = cuda.to_device(chunk_table(lengths, chunk))
    return hit


@cuda.jit
def adam_multi_tensor_kernel(p_new, m_new, v_new, p, g, m, v, table, decay, l2, b1, omb1, b2, omb2,
                             step_size, inv_sqrt_bc2, eps):
    # block b updates chunk b: parameters table[b, 0] .. table[b, 0] + table[b, 1] - 1
    b = cuda.blockIdx.x
    start = table[b, 0]
    stop = start + table[b, 1]
    i = start + cuda.threadIdx.x
    while i < stop:
        p_new[i], m_new[i], v_new[i] = adam_elem(p[i], g[i], m[i], v[i], decay, l2, b1, omb1, b2, omb2, step_size,
                                                 inv_sqrt_bc2, eps)
        i += cuda.blockDim.x


SIG_MULTI = f"void({', '.join([V1] * 7)}, int64[:, ::1], {', '.join(['float32'] * 9)})"


@register("adamw_multi", "gpu", "multi_tensor", rung=3, ptx=[(adam_multi_tensor_kernel, SIG_MULTI)])
def adamw_multi_tensor(p_new, m_new, v_new, p, g, m, v, lengths, step, lr, beta1, beta2, eps, wd):
    """ONE launch over a table of (offset, length) chunks of at most 2048 parameters, one block per
    chunk: the launch count no longer grows with T and a tensor of 10 parameters costs one short block.
    Predict the flat rung's speed for large tensors, somewhat less when most chunks are tiny. (Chunks
    of 16384 were measured at 52-82 % of copy at 16.7 M parameters: 1024 blocks of 64 serial
    iterations are about one and a third waves on an H100, so the last wave ran mostly empty.)"""
    if p.shape[0] == 0:
        return
    table = _device_table(lengths, CHUNK)
    adam_multi_tensor_kernel[table.shape[0], THREADS](p_new, m_new, v_new, p, g, m, v, table,
                                                       *_adam_coeffs(step, lr, beta1, beta2, eps, wd))


# --- global-norm clipping: a reduction pass, then the scaled update
@cuda.jit(device=True, inline=True)
def tree_sum(buf, acc):
    """The block's sum of every thread's ``acc`` (valid in thread 0), by a shared-memory tree over ``buf``
    (THREADS floats): the order of the additions is fixed."""
    t = cuda.threadIdx.x
    buf[t] = acc
    cuda.syncthreads()
    s = THREADS // 2
    while s > 0:
        if t < s:
            buf[t] += buf[t + s]
        cuda.syncthreads()
        s //= 2
    return buf[0]


@cuda.jit(device=True, inline=True)
def block_sumsq(g, buf):
    """This block's sum of g^2 (valid in thread 0): a grid-stride float32 partial per thread, then a
    shared-memory tree over the block (buf: THREADS floats). The order of the sums is fixed."""
    acc = float32(0.0)
    i = cuda.grid(1)
    stride = cuda.gridsize(1)
    while i < g.size:
        acc += g[i] * g[i]
        i += stride
    return tree_sum(buf, acc)


@cuda.jit
def sumsq_kernel(out, g):
    # out[0] += sum of g^2: one atomic add per block (the order of the atomics is not fixed)
    buf = cuda.shared.array(THREADS, float32)
    total = block_sumsq(g, buf)
    if cuda.threadIdx.x == 0:
        cuda.atomic.add(out, 0, total)


@cuda.jit(device=True, inline=True)
def clip_factor(sumsq, max_norm):
    c = max_norm / (math.sqrt(sumsq) + float32(CLIP_EPS))
    if c > float32(1.0):  # not min(): fminf(1, NaN) is 1, and a NaN norm must give a NaN step
        c = float32(1.0)
    return c


@cuda.jit
def scale_by_norm_kernel(out, g, sumsq, max_norm):
    i = cuda.grid(1)
    if i < g.size:
        out[i] = g[i] * clip_factor(sumsq[0], max_norm)


@cuda.jit
def adam_clip_kernel(p_new, m_new, v_new, p, g, m, v, sumsq, max_norm, decay, b1, omb1, b2, omb2,
                     step_size, inv_sqrt_bc2, eps):
    # the fused update with g scaled by the clip factor, computed per thread from the reduced sum
    i = cuda.grid(1)
    if i < p.size:
        s = clip_factor(sumsq[0], max_norm)
        p_new[i], m_new[i], v_new[i] = adam_elem(p[i], s * g[i], m[i], v[i], decay, float32(0.0), b1, omb1, b2,
                                                 omb2, step_size, inv_sqrt_bc2, eps)


@cuda.jit
def sumsq_partials_kernel(partials, g):
    # partials[b] = block b's sum of g^2 over its fixed grid-stride share: the same tree as sumsq_kernel, but
    # the block's total is STORED in its own slot, not added atomically (the order of atomics is not fixed)
    buf = cuda.shared.array(THREADS, float32)
    total = block_sumsq(g, buf)
    if cuda.threadIdx.x == 0:
        partials[cuda.blockIdx.x] = total


@cuda.jit
def sum_partials_kernel(out, partials):
    # one block: thread t adds partials[t], partials[t + THREADS], ... in index order, then the same tree:
    # a fixed order of additions, so the same bits on every run
    buf = cuda.shared.array(THREADS, float32)
    t = cuda.threadIdx.x
    acc = float32(0.0)
    i = t
    while i < partials.size:
        acc += partials[i]
        i += THREADS
    total = tree_sum(buf, acc)
    if t == 0:
        out[0] = total


REDUCE_BLOCKS = 1024  # blocks of the norm pass: enough to fill an H100 (132 SMs x 8), few atomics
SIG_SUMSQ = f"void({V1}, {V1})"
SIG_SCALE_NORM = f"void({V1}, {V1}, {V1}, float32)"
SIG_CLIP = f"void({', '.join([V1] * 8)}, {', '.join(['float32'] * 9)})"


@cuda.jit
def zero_kernel(out):
    if cuda.grid(1) < out.size:
        out[cuda.grid(1)] = float32(0.0)


_buffers: dict = {}


def _buffer(name, n):
    """A device scratch buffer kept between steps (cudaMalloc on every step costs more than the step at
    16.7 M parameters; the first measurement of the clipping rungs paid it)."""
    buf = _buffers.get(name)
    if buf is None or buf.shape[0] != n:
        buf = _buffers[name] = cuda.device_array(n, dtype=np.float32)
    return buf


def _sumsq_gpu(g):
    out = _buffer("sumsq", 1)
    zero_kernel[1, 32](out)
    sumsq_kernel[min(REDUCE_BLOCKS, max(1, ceil_div(g.shape[0], THREADS))), THREADS](out, g)
    return out


@register("adamw_clip", "gpu", "unfused", rung=1, bytes=lambda s, b: 10 * s[0] * b,
          ptx=[(zero_kernel, f"void({V1})"), (sumsq_kernel, SIG_SUMSQ), (scale_by_norm_kernel, SIG_SCALE_NORM),
               (adam_fused_kernel, SIG_ADAM)])
def adamw_clip_unfused(p_new, m_new, v_new, p, g, m, v, step, lr, beta1, beta2, eps, wd, max_norm):
    """Norm pass, then g * scale written to a scratch buffer (as clip_grad_norm_ does in place), then the
    fused AdamW reading it: 4 + 8 + 28 = 40 B/param. Predict ~80 % of rung 2's speed (32/40)."""
    n = p.shape[0]
    if n == 0:
        return
    sumsq = _sumsq_gpu(g)
    gs = _buffer("scaled_g", n)
    scale_by_norm_kernel[ceil_div(n, THREADS), THREADS](gs, g, sumsq, np.float32(max_norm))
    launch_adam(adam_fused_kernel, p_new, m_new, v_new, p, gs, m, v, _adam_coeffs(step, lr, beta1, beta2, eps, wd))


@register("adamw_clip", "gpu", "fused", rung=2,
          ptx=[(zero_kernel, f"void({V1})"), (sumsq_kernel, SIG_SUMSQ), (adam_clip_kernel, SIG_CLIP)])
def adamw_clip_fused(p_new, m_new, v_new, p, g, m, v, step, lr, beta1, beta2, eps, wd, max_norm):
    """Reduction pass (reads g: 4 B/param), then the update reads the sum and scales g on the fly
    (28 B/param): 32 B/param, no scaled copy of g. The norm is global, so two launches are the minimum.
    Predict ~90 % of copy bandwidth at 32 B/param."""
    n = p.shape[0]
    if n == 0:
        return
    sumsq = _sumsq_gpu(g)
    decay, _, *rest = _adam_coeffs(step, lr, beta1, beta2, eps, wd)
    adam_clip_kernel[ceil_div(n, THREADS), THREADS](p_new, m_new, v_new, p, g, m, v, sumsq, np.float32(max_norm),
                                                    decay, *rest)


def _sumsq_two_pass_gpu(g):
    """sum g^2 in a fixed order: per-block partials to an array, then one block adds them up."""
    blocks = min(REDUCE_BLOCKS, max(1, ceil_div(g.shape[0], THREADS)))
    partials = _buffer("partials", blocks)
    out = _buffer("sumsq", 1)
    sumsq_partials_kernel[blocks, THREADS](partials, g)
    sum_partials_kernel[1, THREADS](out, partials)
    return out


@register("adamw_clip", "gpu", "two_pass", rung=3,
          ptx=[(sumsq_partials_kernel, SIG_SUMSQ), (sum_partials_kernel, SIG_SUMSQ), (adam_clip_kernel, SIG_CLIP)])
def adamw_clip_two_pass(p_new, m_new, v_new, p, g, m, v, step, lr, beta1, beta2, eps, wd, max_norm):
    """Rung 2 made deterministic: each block of the norm pass stores its partial sum in its own slot
    (instead of an atomic add, whose order changes from run to run and with it the last bits of the
    norm), and a one-block pass adds the partials in index order. Same bytes (+8 KB), one more launch of a
    single block: predict rung 2's time within a few microseconds, and the same bits on every run."""
    n = p.shape[0]
    if n == 0:
        return
    sumsq = _sumsq_two_pass_gpu(g)
    decay, _, *rest = _adam_coeffs(step, lr, beta1, beta2, eps, wd)
    adam_clip_kernel[ceil_div(n, THREADS), THREADS](p_new, m_new, v_new, p, g, m, v, sumsq, np.float32(max_norm),
                                                    decay, *rest)


def clip_sumsq_bits(g, deterministic, runs):
    """The float32 bit patterns of the norm pass's sum of g^2 over ``runs`` runs on the same device array
    ``g``: the atomic pass of rungs 1-2 (``deterministic=False``) or the two-pass one. For the determinism
    measurement (kernels_src.figures.optim.measure_clip_determinism)."""
    out = []
    for _ in range(runs):
        s = (_sumsq_two_pass_gpu(g) if deterministic else _sumsq_gpu(g)).copy_to_host()
        out.append(int(s.view(np.uint32)[0]))
    return out


# ================================================================================ torch baselines
def torch_gpu():
    from .reductions import torch_gpu as _t

    return _t()


def _views(*arrays):
    from .reductions import torch_view

    return [torch_view(a) for a in arrays]


_torch_opts: dict = {}


def torch_adamw_step(params, grads, ms, vs, step, lr, beta1, beta2, eps, wd, fused=True):
    """One torch.optim.AdamW(fused=...) step, IN PLACE on lists of torch tensors (params updated, ms/vs
    used as its exp_avg/exp_avg_sq state, ``step`` = t after the step). The optimizer object is cached per
    list of tensors, as in training. ``step=None`` continues from torch's own step count."""
    import torch

    key = ("adamw", fused, tuple(x.data_ptr() for x in params), tuple(x.data_ptr() for x in ms))
    opt = _torch_opts.get(key)
    if opt is None:
        if len(_torch_opts) > 16:
            _torch_opts.clear()
        kw = {"fused": True} if fused else {"foreach": True}
        opt = torch.optim.AdamW(params, lr=lr, betas=(beta1, beta2), eps=eps, weight_decay=wd, **kw)
        _torch_opts[key] = opt
    g = opt.param_groups[0]
    g.update(lr=lr, betas=(beta1, beta2), eps=eps, weight_decay=wd)
    for x, gr, m, v in zip(params, grads, ms, vs):
        if x.grad is not gr:
            x.grad = gr
        st = opt.state[x]
        if st.get("exp_avg") is not m or st.get("exp_avg_sq") is not v:
            st["exp_avg"], st["exp_avg_sq"] = m, v
        if "step" not in st:  # torch keeps a float32 step tensor (on the device for fused)
            st["step"] = torch.zeros((), dtype=torch.float32, device=x.device if fused else "cpu")
        if step is not None:  # None: carry on from torch's own count (timing loops: no extra fill kernel)
            st["step"].fill_(step - 1)  # torch adds 1 before using it
    opt.step()


def torch_sgd_step(params, grads, bufs, lr, momentum, wd, nesterov):
    """One torch.optim.SGD(momentum, nesterov, weight_decay) step in place (foreach implementation)."""
    import torch

    key = ("sgd", tuple(x.data_ptr() for x in params), tuple(b.data_ptr() for b in bufs))
    opt = _torch_opts.get(key)
    if opt is None:
        if len(_torch_opts) > 16:
            _torch_opts.clear()
        opt = torch.optim.SGD(params, lr=lr, momentum=momentum, nesterov=bool(nesterov), weight_decay=wd,
                              foreach=True)
        _torch_opts[key] = opt
    opt.param_groups[0].update(lr=lr, momentum=momentum, nesterov=bool(nesterov), weight_decay=wd)
    for x, gr, b in zip(params, grads, bufs):
        x.grad = gr
        opt.state[x]["momentum_buffer"] = b
    opt.step()


# On the H100 (helper-44g's run, 2026-11-27) the edge check of adamw/gpu/torch failed once the edge inputs held +-inf
# weights; the failing element was not isolated there (the run that would print it did not get device time): the
# cause below is read from ATen's source (a run printing torch's single-tensor, foreach and fused results side by side
# is still owed).
TORCH_FUSED_INF = ("torch's fused AdamW kernel (ATen fused_adam_utils.cuh) decays as param -= lr * wd * param, so an "
                   "infinite weight becomes inf - inf = NaN, where torch's single-tensor and foreach steps multiply by "
                   "1 - lr * wd and keep it infinite (the rule of every course rung)")


@register("adamw", "gpu", "torch", baseline=True, requires=torch_gpu, bytes=lambda s, b: 13 * s[0] * b,
          edge_exempt=TORCH_FUSED_INF)
def adamw_torch(p_new, m_new, v_new, p, g, m, v, step, lr, beta1, beta2, eps, wd):
    """torch.optim.AdamW(fused=True), preceded by 3 copies (p, m, v into the outputs) because torch only
    steps in place: 28 + 24 = 52 B/param counted. For the parity check on the GPU; the fair in-place
    speed comparison is kernels_src.figures.optim.measure_inplace."""
    tp_new, tm_new, tv_new, tp, tg, tm, tv = _views(p_new, m_new, v_new, p, g, m, v)
    tp_new.copy_(tp)
    tm_new.copy_(tm)
    tv_new.copy_(tv)
    torch_adamw_step([tp_new], [tg], [tm_new], [tv_new], step, lr, beta1, beta2, eps, wd)


@register("adamw_multi", "gpu", "torch", baseline=True, requires=torch_gpu, bytes=lambda s, b: 13 * s[1] * b,
          edge_exempt=TORCH_FUSED_INF)
def adamw_multi_torch(p_new, m_new, v_new, p, g, m, v, lengths, step, lr, beta1, beta2, eps, wd):
    """torch.optim.AdamW(fused=True) over the T tensors (views of the buffers), after 3 copies: 52 B/param."""
    tp_new, tm_new, tv_new, tp, tg, tm, tv = _views(p_new, m_new, v_new, p, g, m, v)
    tp_new.copy_(tp)
    tm_new.copy_(tm)
    tv_new.copy_(tv)
    split = lambda x: list(x.split(list(lengths)))  # noqa: E731
    torch_adamw_step(split(tp_new), split(tg), split(tm_new), split(tv_new), step, lr, beta1, beta2, eps, wd)


@register("sgd_momentum", "gpu", "torch", baseline=True, requires=torch_gpu, bytes=lambda s, b: 9 * s[0] * b)
def sgd_momentum_torch(p_new, b_new, p, g, b, lr, momentum, wd, nesterov):
    """torch.optim.SGD(momentum, nesterov, weight_decay) after 2 copies (p, b into the outputs): 36 B/param."""
    tp_new, tb_new, tp, tg, tb = _views(p_new, b_new, p, g, b)
    tp_new.copy_(tp)
    tb_new.copy_(tb)
    torch_sgd_step([tp_new], [tg], [tb_new], lr, momentum, wd, nesterov)


# ============================================================================ mixed precision (NumPy)
def round_bf16(x, mode="nearest"):
    """float32 -> the nearest bfloat16 (8 exponent bits, 7 mantissa bits), returned as float32.
    bfloat16 is float32 with the low 16 bits dropped: ``mode="truncate"`` drops them (round toward 0),
    ``"nearest"`` rounds to nearest even first, as hardware conversions do."""
    x = np.asarray(x, dtype=np.float32)
    u = x.view(np.uint32).astype(np.uint64)
    if mode == "nearest":
        u = u + 0x7FFF + ((u >> 16) & 1)
    out = ((u >> 16) << 16).astype(np.uint32).view(np.float32)
    return np.where(np.isnan(x), x, out)


def cast(x, dtype):
    """Round float values to 'float16', 'bfloat16' (emulated) or 'float32'; returned as float32 arrays
    (float16 ones are exactly representable in float32)."""
    if dtype == "bfloat16":
        return round_bf16(x)
    # straight from float64: going through float32 first rounds twice, and a sum just under half an ulp
    # can round up to the tie and then away (the seed sweep of the exercise found such cases)
    return np.asarray(x, dtype=np.float64).astype(dtype).astype(np.float32)


def update_vanishes(p, u, dtype="float16"):
    """1.0 where p + u rounds back to p in ``dtype`` (the update is lost), else 0.0. float64 oracle of
    the mixed-precision exercise: compare with half an ulp of p."""
    p = cast(p, dtype)
    return (cast(p.astype(np.float64) + u, dtype) == p).astype(np.float64)


def ulp(x, dtype="float16"):
    """Spacing of ``dtype`` numbers at |x| (float16: 10 mantissa bits; bfloat16: 7)."""
    x = np.abs(np.asarray(x, dtype=np.float64))
    bits = {"float16": 10, "bfloat16": 7, "float32": 23}[dtype]
    tiny_exp = {"float16": -14, "bfloat16": -126, "float32": -126}[dtype]
    e = np.floor(np.log2(np.where(x > 0, x, 1.0)))
    return 2.0 ** (np.maximum(e, tiny_exp) - bits)


# ============================================================== small ops behind the exercises
def first_update_reference(g, lr, beta1, beta2, eps):
    """float64: the first Adam update (m = v = 0 before it), with and without bias correction.
    Returns (du_bc, du_nobc), where p_new = p + du."""
    m = (1.0 - beta1) * g
    v = (1.0 - beta2) * g * g
    with_bc = -lr * (m / (1.0 - beta1)) / (np.sqrt(v / (1.0 - beta2)) + eps)
    without = -lr * m / (np.sqrt(v) + eps)
    return with_bc, without


def make_inputs_first_update(size, dtype, rng):
    """Gradients spanning 1e-12 .. 1e2 in magnitude (some well below eps = 1e-8), both signs, some zeros."""
    (n,) = size
    g = np.sign(rng.standard_normal(n)) * 10.0 ** rng.uniform(-12, 2, n)
    g[::7] = 0.0
    return g.astype(dtype), 1e-3, 0.9, 0.999, 1e-8


@njit(cache=True)
def _first_update_loop(du_bc, du_nobc, g, lr, beta1, beta2, eps):
    for i in range(g.size):
        m = (1.0 - beta1) * g[i]
        v = (1.0 - beta2) * g[i] * g[i]
        du_bc[i] = -lr * (m / (1.0 - beta1)) / (math.sqrt(v / (1.0 - beta2)) + eps)
        du_nobc[i] = -lr * m / (math.sqrt(v) + eps)


define_op("adam_first_update", reference=first_update_reference, make_inputs=make_inputs_first_update,
          chapter=12, title="Adam's first update, with and without bias correction", size_names=("n",),
          kind="memory", tol=(1e-5, 1e-12),  # updates are ~1e-3 or far smaller; float32 relative error
          output_names=("du_bc", "du_nobc"),
          sizes={"check": [(1,), (7,), (1000,)], "check_sim": [(1,), (7,)], "bench": [(1 << 20,)]},
          flops=lambda s: 12 * s[0], bytes=lambda s, b: 3 * s[0] * b)


@register("adam_first_update", "cpu", "loop", rung=1)
def adam_first_update_loop(du_bc, du_nobc, g, lr, beta1, beta2, eps):
    """The two first-step updates side by side, in float64 arithmetic per element."""
    _first_update_loop(du_bc, du_nobc, g, lr, beta1, beta2, eps)


@njit(cache=True, parallel=True, error_model="numpy")
def _first_update_prange(du_bc, du_nobc, g, a_bc, s_bc, a_nobc, s_nobc, eps):
    for i in prange(g.size):
        x = np.float64(g[i])
        ax = abs(x)
        du_bc[i] = a_bc * x / (s_bc * ax + eps)
        du_nobc[i] = a_nobc * x / (s_nobc * ax + eps)


@register("adam_first_update", "cpu", "prange", rung=2)
def adam_first_update_prange(du_bc, du_nobc, g, lr, beta1, beta2, eps):
    """The constants hoisted to the host (m/(1-b1) = g, sqrt(v) = sqrt(1-b2)|g|: no sqrt per element), NumPy's
    error model (no zero-division check in the loop, so LLVM vectorizes the divide) and prange: 12 B/param,
    predict >= 70 % of copy (rung 1, a scalar libm sqrt and two checked divides per element, ran at ~3 %)."""
    a_bc = -lr
    s_bc = 1.0  # sqrt(v / (1 - b2)) = |g|
    a_nobc = -lr * (1.0 - beta1)
    s_nobc = math.sqrt(1.0 - beta2)
    _first_update_prange(du_bc, du_nobc, g, a_bc, s_bc, a_nobc, s_nobc, eps)


@njit(cache=True, parallel=True, error_model="numpy")
def _first_update_stream(du_bc, du_nobc, g, a_bc, s_bc, a_nobc, s_nobc, eps, head, nch):
    # g (N,) -> du_bc, du_nobc (N,): rung 2's formula in float32 on 16-float vectors, streaming stores
    n = g.size
    nt = head >= 0
    h = min(max(head, 0), n)
    nb = (n - h) // 16
    e = h + nb * 16
    for i in range(h):  # the head and the tail: scalar, ordinary stores
        du_bc[i] = a_bc * g[i] / (s_bc * abs(g[i]) + eps)
        du_nobc[i] = a_nobc * g[i] / (s_nobc * abs(g[i]) + eps)
    for i in range(e, n):
        du_bc[i] = a_bc * g[i] / (s_bc * abs(g[i]) + eps)
        du_nobc[i] = a_nobc * g[i] / (s_nobc * abs(g[i]) + eps)
    for c in prange(nch):
        ab, sb, an, sn, ev = vsplat16(a_bc), vsplat16(s_bc), vsplat16(a_nobc), vsplat16(s_nobc), vsplat16(eps)
        for blk in range(c * nb // nch, (c + 1) * nb // nch):
            i = h + 16 * blk
            x = vload16(g, i)
            ax = vabs16(x)
            bc = vdiv16(vmul16(ab, x), vadd16(vmul16(sb, ax), ev))
            nobc = vdiv16(vmul16(an, x), vadd16(vmul16(sn, ax), ev))
            if nt:
                vstream16(du_bc, i, bc)
                vstream16(du_nobc, i, nobc)
            else:
                vstore16(du_bc, i, bc)
                vstore16(du_nobc, i, nobc)
        if nt:
            sfence()


@register("adam_first_update", "cpu", "stream", rung=3)
def adam_first_update_stream(du_bc, du_nobc, g, lr, beta1, beta2, eps):
    """Rung 2's hoisted formula on 16-float vectors in float32 (rung 2 computed in float64: half the lanes per
    instruction and two conversions per element), both outputs written with streaming stores: 12 B/param
    through the bus instead of 20 (write-allocate). A/B on the busy 2-core AVX2 EPYC, 2^20 (12 MiB, about the
    size of the caches: the gain is smaller than on DRAM-sized arrays): 1.07x rung 2 on two threads, 1.51x on
    one. Predict rung 2's ~41 % of copy -> >= 70 %."""
    f = np.float32
    _first_update_stream(du_bc, du_nobc, g, f(-lr), f(1.0), f(-lr * (1.0 - beta1)), f(math.sqrt(1.0 - beta2)),
                         f(eps), stream_head(du_bc, du_nobc), _chunks(g.shape[0] // 16))


def make_inputs_vanish(size, dtype, rng):
    """p: float16 numbers that are not powers of two, 2^-10 <= |p| < 2^11 (normal, away from the
    spacing change at a power of two); u: updates with |u| / |p| log-uniform in 1e-5 .. 1e-1 (no exact
    ties). Returned as float32 arrays (every float16 value is exactly a float32)."""
    (n,) = size
    k = rng.integers(-10, 11, n)
    j = rng.integers(1, 1024, n)
    p = np.sign(rng.standard_normal(n)) * (1.0 + j / 1024.0) * 2.0 ** k
    u = np.sign(rng.standard_normal(n)) * np.abs(p) * 10.0 ** rng.uniform(-5, -1, n)
    return p.astype(np.float32), u.astype(dtype)


def fp16_vanishes_reference(p, u):
    """float64 oracle: 1.0 where float16(p + u) == p, i.e. the update is lost in float16."""
    return update_vanishes(p, u, "float16")


@njit(cache=True)
def _vanish_loop(out, p, u):
    for i in range(p.size):
        m, e = math.frexp(p[i])  # p = m 2^e, 0.5 <= |m| < 1: float16's spacing there is 2^(e - 11)
        out[i] = 1.0 if abs(u[i]) < math.ldexp(1.0, e - 12) else 0.0


define_op("fp16_update_vanishes", reference=fp16_vanishes_reference, make_inputs=make_inputs_vanish,
          chapter=12, title="does p + u round back to p in float16?", size_names=("n",), kind="memory",
          tol=(0.0, 0.0), output_names=("lost",),
          sizes={"check": [(1,), (7,), (1000,), (4099,)], "check_sim": [(1,), (7,)], "bench": [(1 << 20,)]},
          flops=lambda s: 3 * s[0], bytes=lambda s, b: 3 * s[0] * b)


@register("fp16_update_vanishes", "cpu", "ulp_rule", rung=1)
def fp16_update_vanishes_rule(lost, p, u):
    """The half-ulp rule: the update is lost when |u| < spacing(p) / 2 (no ties in these inputs)."""
    _vanish_loop(lost, p, u)


# ======================================================== "predict, then measure" (committed H100 data)
MEASURED_MULTI = "h100/adamw_multi_gpu.json"  # under book/data/bench: the tensor-count sweep


def measured_per_tensor_us():
    """{T: median microseconds per step} of adamw_multi/gpu/per_tensor in the committed H100 sweep (16.7 M
    parameters in T tensors). The data live in book/data/bench/, next to the package in a checkout."""
    import json
    from pathlib import Path

    path = BENCH_DATA / MEASURED_MULTI
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: the predict-then-measure op grades against committed data")
    res = json.loads(path.read_text())
    return {r["size"][0]: r["median_s"] * 1e6 for r in res["rows"]
            if r.get("variant") == "per_tensor" and "median_s" in r}


def per_tensor_time_reference(T):
    """The oracle is the measurement: the median time per step at each tensor count T (microseconds)."""
    data = measured_per_tensor_us()
    return np.array([data[int(t)] for t in np.asarray(T)], dtype=np.float64)


def make_inputs_per_tensor_time(size, dtype, rng):
    """``n`` tensor counts, cycling through the measured ones (1 ... 4096) in a random order."""
    (n,) = size
    ts = sorted(measured_per_tensor_us())
    return (np.array([ts[i % len(ts)] for i in rng.permutation(max(n, len(ts)))[:n]], dtype=dtype),)


define_op("adamw_per_tensor_time", reference=per_tensor_time_reference, make_inputs=make_inputs_per_tensor_time,
          chapter=12, title="predicted vs measured time of T per-tensor AdamW launches", size_names=("n",),
          kind="memory",
          tol=(0.5, 0.0),  # a prediction within +-50 % of the measurement passes: the point is the model's shape
          output_names=("us",), sizes={"check": [(1,), (7,)], "check_sim": [(1,), (7,)], "bench": [(6,)]},
          flops=lambda s: s[0], bytes=lambda s, b: 2 * s[0] * b)
