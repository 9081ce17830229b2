"""Exercise-only ops of chapter 13: one transformer block's forward, and a whole-model gradient.

block_forward   x (T,C), g1 (C,), wqkv (C,3C), wo (C,C), g2 (C,), wfc (C,F), wproj (F,C), cos, sin (T,D/2)
                -> y (T,C): one pre-norm block of the capstone GPT for one sequence, H = BLOCK_HEADS heads
                of D = C/H, F = 4C (the math of kernels_src/model/reference.py, from the oracles of the ops
                it is made of: RMSNorm, RoPE, causal attention, GELU)
gpt_fd_gradient theta (V*C + C,) float64, ids (T,) int32, targets (T,) int32, V, C
                -> g (V*C + C,): the gradient of the mean cross-entropy of the smallest whole GPT, L = 0
                blocks (embedding -> final RMSNorm -> tied head -> loss), parameters packed as
                theta = [wte (V,C) row-major | gf (C,)]. The exercise computes it by central finite
                differences; the oracle is that model's backward written out (cross-entropy and RMSNorm
                backward oracles), equal to the reference model's (tests/test_ch13_capstone.py holds them
                to each other).
These ops have no ladder: they exist only as exercises (registry.exercise_op), so no benchmark shows them.
"""
import numpy as np

from ..registry import exercise_op

BLOCK_HEADS = 2


def block_reference(x, g1, wqkv, wo, g2, wfc, wproj, cos, sin):
    """float64 oracle: the reference model's block, applied to one sequence, from the ops' own oracles."""
    from .activations import gelu_ref
    from .attention import reference as attention
    from .norms import rms_reference
    from .rope import rotate

    x = np.asarray(x, np.float64)
    T, C = x.shape
    H, D = BLOCK_HEADS, C // BLOCK_HEADS
    c64, s64, pos = np.asarray(cos, np.float64), np.asarray(sin, np.float64), np.arange(T)
    h, _ = rms_reference(x, np.asarray(g1, np.float64))
    qkv = (h @ np.asarray(wqkv, np.float64)).reshape(T, 3, H, D)  # (T,3,H,D)
    q, k, v = (a[None].transpose(0, 2, 1, 3) for a in  # (1,H,T,D) each; q and k rotated
               (rotate(qkv[:, 0], pos, c64, s64), rotate(qkv[:, 1], pos, c64, s64), qkv[:, 2]))
    o, _ = attention(q, k, v, np.array([T]), True)  # (1,H,T,D), causal
    x = x + o[0].transpose(1, 0, 2).reshape(T, C) @ np.asarray(wo, np.float64)
    h, _ = rms_reference(x, np.asarray(g2, np.float64))
    return x + gelu_ref(h @ np.asarray(wfc, np.float64)) @ np.asarray(wproj, np.float64)


def block_inputs(size, dtype, rng):
    from .rope import cos_sin_cache

    T, C = size
    F = 4 * C
    x = rng.standard_normal((T, C)).astype(dtype)
    g1 = (1 + 0.1 * rng.standard_normal(C)).astype(dtype)
    g2 = (1 + 0.1 * rng.standard_normal(C)).astype(dtype)
    w = lambda k, n: (rng.standard_normal((k, n)) / np.sqrt(k)).astype(dtype)  # noqa: E731
    cos, sin = cos_sin_cache(T, C // BLOCK_HEADS, dtype=dtype)
    return x, g1, w(C, 3 * C), w(C, C), g2, w(C, F), w(F, C), cos, sin


def block_edge_inputs(size, dtype, rng):
    """Rows a block must survive: an all-zero token (RMSNorm divides by sqrt(eps)), a token of 1e3
    (attention logits in the thousands: a softmax that does not subtract its max overflows), and
    the first token (it attends only to itself)."""
    args = list(block_inputs(size, dtype, rng))
    x = args[0]
    x[0] = 0.0
    if x.shape[0] > 1:
        x[1] *= 1e3
    return tuple(args)


exercise_op("block_forward", reference=block_reference, make_inputs=block_inputs, chapter=13,
            title="one pre-norm transformer block (forward)", size_names=("T", "C"), kind="compute",
            tol=(2e-4, 2e-5), output_names=("y",), edge_inputs=block_edge_inputs,
            sizes={"check": [(1, 4), (5, 8), (13, 16)], "check_sim": [(1, 4), (5, 8)], "bench": [(13, 16)]},
            flops=lambda s: 24 * s[0] * s[1] ** 2, bytes=lambda s, b: 12 * s[1] ** 2 * b)


# ------------------------------------------------------------------------------ whole-model gradient
def unpack(theta, V, C):
    return {"wte": np.asarray(theta[:V * C], np.float64).reshape(V, C), "gf": np.asarray(theta[V * C:], np.float64)}


def fd_reference(theta, ids, targets, V, C):
    """float64 oracle: the analytic gradient of the L = 0 GPT (the reference model's backward with no block).

    x = wte[ids] (T,C);  xf, rstd = rmsnorm(x) * gf;  logits = xf @ wte^T (T,V);  loss = mean cross-entropy."""
    from .cross_entropy import reference as ce, reference_bwd as ce_bwd
    from .norms import rms_bwd_reference, rms_reference

    p = unpack(theta, V, C)
    ids, targets = np.asarray(ids), np.asarray(targets)
    T = len(ids)
    x = p["wte"][ids]
    xf, rstd = rms_reference(x, p["gf"])
    logits = xf @ p["wte"].T
    dlogits = ce_bwd(logits, targets, ce(logits, targets)[1], np.full(T, 1.0 / T))  # of the mean loss
    g_wte = dlogits.T @ xf  # the tied head
    dx, g_gf = rms_bwd_reference(dlogits @ p["wte"], x, rstd, p["gf"])
    np.add.at(g_wte, ids, dx)  # the embedding
    return np.concatenate([g_wte.ravel(), g_gf])


def fd_inputs(size, dtype, rng):
    """theta float64 always (finite differences need the precision), V = 2C - 1 characters."""
    T, C = size
    V = 2 * C - 1
    theta = np.concatenate([rng.standard_normal(V * C), 1 + 0.3 * rng.standard_normal(C)])
    return theta, rng.integers(0, V, T).astype(np.int32), rng.integers(0, V, T).astype(np.int32), V, C


exercise_op("gpt_fd_gradient", reference=fd_reference, make_inputs=fd_inputs, chapter=13,
            title="whole-model gradient by finite differences (L = 0 GPT)", size_names=("T", "C"),
            kind="compute", output_names=("g",), sizes={"check": [(1, 4), (6, 8), (9, 12)], "bench": [(6, 8)]},
            # central differences with h ~ 1e-5 in float64: truncation ~h^2 * |f'''| ~ 1e-10, rounding
            # ~ eps * |loss| / h ~ 1e-11; allow 1e-6 relative and 1e-8 absolute
            tol=(1e-6, 1e-8), flops=lambda s: 0, bytes=lambda s, b: 0)
