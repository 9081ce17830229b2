"""Exercise-only ops of chapter 13: one transformer block's forward, and a whole-model gradient.

block_forward   x (T,C), g1 (C,), wqkv (C,3C), wo (C,C), g2 (C,), wfc (C,F), wproj (F,C), cos, sin (T,D/2)
                -> y (T,C): one pre-norm block of the capstone GPT for one sequence, H = BLOCK_HEADS heads
                of D = C/H, F = 4C (see kernels_src/model/reference.py for the math)
gpt_fd_gradient theta (V*C + C,) float64, ids (T,) int32, targets (T,) int32, V, C
                -> g (V*C + C,): the gradient of the mean cross-entropy of the smallest whole GPT, L = 0
                blocks (embedding -> final RMSNorm -> tied head -> loss), parameters packed as
                theta = [wte (V,C) row-major | gf (C,)]. The exercise computes it by central finite
                differences; the oracle is the reference model's hand-written backward.
These ops have no ladder: they exist only as exercises (registry.exercise_op), so no benchmark shows them.
"""
import numpy as np

from ..registry import exercise_op

BLOCK_HEADS = 2


def block_reference(x, g1, wqkv, wo, g2, wfc, wproj, cos, sin):
    """float64 oracle: the reference model's block, applied to one sequence."""
    from ..model.reference import attention_fwd, rms_fwd, rope
    from .activations import gelu_ref

    x = np.asarray(x, np.float64)
    T, C = x.shape
    H, D = BLOCK_HEADS, C // BLOCK_HEADS
    c64, s64 = np.asarray(cos, np.float64), np.asarray(sin, np.float64)
    h, _ = rms_fwd(x, np.asarray(g1, np.float64))
    qkv = (h @ np.asarray(wqkv, np.float64)).reshape(1, T, 3, H, D).transpose(2, 0, 3, 1, 4)
    q, k, v = rope(qkv[0], c64, s64), rope(qkv[1], c64, s64), qkv[2]
    o, _ = attention_fwd(q, k, v)
    x = x + o.transpose(0, 2, 1, 3).reshape(T, C) @ np.asarray(wo, np.float64)
    h, _ = rms_fwd(x, np.asarray(g2, np.float64))
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
    """float64 oracle: the analytic gradient of the L = 0 GPT (reference model's backward)."""
    from ..model.reference import Config, ReferenceGPT

    cfg = Config(vocab=int(V), ctx=max(1, len(ids)), width=int(C), heads=1, layers=0)
    _, g = ReferenceGPT(cfg, unpack(theta, V, C)).loss_and_grads(np.asarray(ids)[None], np.asarray(targets)[None])
    return np.concatenate([g["wte"].ravel(), g["gf"]])


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
