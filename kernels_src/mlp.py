"""A 2-layer MLP trained end to end, once in float64 NumPy and once with the course's kernels (chapter 3).

Shapes (M samples, D = 2 input features, H hidden units, C classes)
  X  (M,D)  --linear W1 (D,H), b1 (H,)-->  Z1 (M,H)  --ReLU-->  A1 (M,H)
            --linear W2 (H,C), b2 (C,)-->  Z2 (M,C)  --softmax + cross-entropy with labels (M,)--> loss
Backward, with G = dL/d(output) for each layer:
  G2  = (softmax(Z2) - onehot(labels)) / M        (M,C)
  dW2 = A1^T G2 (H,C)    db2 = sum_rows(G2) (C,)    dA1 = G2 W2^T (M,H)
  G1  = dA1 * [Z1 > 0]                            (M,H)
  dW1 = X^T G1  (D,H)    db1 = sum_rows(G1) (H,)    (dX = G1 W1^T is not needed: X is data)

``train(backend="numpy")`` is the float64 reference. ``train(backend="cpu")`` runs every linear-layer
and ReLU step through registered Numba CPU kernels (``linear_fwd``, ``linear_bwd_dw``, ``linear_bwd_dx``,
``linear_bwd_db``, ``relu_mlp_fwd``, ``relu_mlp_bwd``) in float32, and the SGD update through chapter
1's ``axpy``; ``backend="gpu"`` does the same with the numba.cuda kernels, keeping every array on the
device. The softmax/cross-entropy head runs in NumPy in both (softmax kernels are chapter 8): on the GPU
path that means copying the (M,C) logits to the host and G2 back, M*C floats each way per step.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from . import registry

PARAMS = ("W1", "b1", "W2", "b2")


# ------------------------------------------------------------------------------------ data
def make_spirals(n_per_class: int = 100, classes: int = 3, noise: float = 0.3, turns: float = 1.0,
                 seed: int = 0):
    """``classes`` interleaved spiral arms in the plane. Returns X (M,2) float64 and labels (M,) int64,
    M = n_per_class * classes. Point i of arm c sits at radius r = i/n and angle
    2*pi*(turns*r + c/classes) + noise*N(0,1)."""
    rng = np.random.default_rng(seed)
    X = np.empty((n_per_class * classes, 2))
    labels = np.empty(n_per_class * classes, dtype=np.int64)
    r = np.linspace(0.05, 1.0, n_per_class)
    for c in range(classes):
        t = 2 * np.pi * (turns * r + c / classes) + noise * rng.standard_normal(n_per_class)
        sl = slice(c * n_per_class, (c + 1) * n_per_class)
        X[sl, 0] = r * np.cos(t)
        X[sl, 1] = r * np.sin(t)
        labels[sl] = c
    return X, labels


def init_params(n_in: int = 2, hidden: int = 64, n_out: int = 3, seed: int = 0) -> dict:
    """He-scaled normal weights (variance 2/fan_in, which keeps ReLU activations from shrinking or
    growing layer to layer), zero biases. float64."""
    rng = np.random.default_rng(seed)
    return {"W1": rng.standard_normal((n_in, hidden)) * np.sqrt(2.0 / n_in), "b1": np.zeros(hidden),
            "W2": rng.standard_normal((hidden, n_out)) * np.sqrt(2.0 / hidden), "b2": np.zeros(n_out)}


# ---------------------------------------------------------------------- the head (NumPy)
def softmax_xent(Z2, labels):
    """Mean cross-entropy of softmax(Z2) against integer labels, and G2 = dL/dZ2 (M,C), in Z2's dtype."""
    M = Z2.shape[0]
    Zs = Z2 - Z2.max(axis=1, keepdims=True)  # subtracting the row max changes nothing but avoids overflow
    E = np.exp(Zs)
    P = E / E.sum(axis=1, keepdims=True)
    loss = float(-np.mean(np.log(P[np.arange(M), labels])))
    G2 = P.copy()
    G2[np.arange(M), labels] -= 1.0
    G2 /= M
    return loss, G2.astype(Z2.dtype, copy=False)


# ------------------------------------------------------------------ float64 reference
def relu(Z):
    return np.maximum(Z, 0.0)


def relu_bwd(G, Z):
    return G * (Z > 0)


def forward(params, X):
    """Returns the logits Z2 and a cache of what the backward pass needs."""
    Z1 = X @ params["W1"] + params["b1"]
    A1 = relu(Z1)
    Z2 = A1 @ params["W2"] + params["b2"]
    return Z2, (X, Z1, A1)


def backward(params, cache, G2) -> dict:
    """The chain rule, layer by layer: the same four formulas as the kernels compute."""
    X, Z1, A1 = cache
    dW2 = A1.T @ G2
    db2 = G2.sum(axis=0)
    dA1 = G2 @ params["W2"].T
    G1 = relu_bwd(dA1, Z1)
    dW1 = X.T @ G1
    db1 = G1.sum(axis=0)
    return {"W1": dW1, "b1": db1, "W2": dW2, "b2": db2}


def loss_and_grads(params, X, labels):
    Z2, cache = forward(params, X)
    loss, G2 = softmax_xent(Z2, labels)
    return loss, backward(params, cache, G2)


def loss_only(params, X, labels) -> float:
    return softmax_xent(forward(params, X)[0], labels)[0]


def numerical_grad(f, a: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """Central differences (f(a + eps e_i) - f(a - eps e_i)) / (2 eps), one element at a time.
    Error O(eps^2) from truncation plus O(1e-16/eps) from rounding in float64: eps = 1e-6 balances them."""
    g = np.zeros_like(a)
    for i in np.ndindex(a.shape):
        old = a[i]
        a[i] = old + eps
        up = f()
        a[i] = old - eps
        down = f()
        a[i] = old
        g[i] = (up - down) / (2 * eps)
    return g


def rel_error(a, b) -> float:
    """max |a - b| over the largest |entry| of a or b: the error relative to the gradient's scale.
    (Elementwise relative error would flag entries that are tiny only by accident, where the finite
    difference's own rounding noise, ~1e-16 |L| / eps, dominates.)"""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    scale = max(float(np.max(np.abs(a))), float(np.max(np.abs(b))), 1e-12)
    return float(np.max(np.abs(a - b)) / scale)


def grad_check(params, X, labels, eps: float = 1e-6) -> dict:
    """Relative error between the hand-derived gradient and central differences, per parameter."""
    params = {k: v.astype(np.float64).copy() for k, v in params.items()}
    _, grads = loss_and_grads(params, X, labels)
    out = {}
    for name in PARAMS:
        num = numerical_grad(lambda: loss_only(params, X, labels), params[name], eps)
        out[name] = rel_error(grads[name], num)
    return out


def predict(params, X) -> np.ndarray:
    return np.argmax(forward({k: np.asarray(v, dtype=np.float64) for k, v in params.items()}, X)[0], axis=1)


def accuracy(params, X, labels) -> float:
    return float(np.mean(predict(params, X) == labels))


# ------------------------------------------------------------- kernel-backed training
CPU_VARIANTS = {"linear_fwd": "loop", "linear_bwd_dw": "loop", "linear_bwd_dx": "loop", "linear_bwd_db": "loop",
                "relu_mlp_fwd": "loop", "relu_mlp_bwd": "loop", "axpy": "loop"}
GPU_VARIANTS = {"linear_fwd": "naive", "linear_bwd_dw": "naive", "linear_bwd_dx": "naive",
                "linear_bwd_db": "tree", "relu_mlp_fwd": "thread", "relu_mlp_bwd": "thread", "axpy": "thread"}


class KernelSteps:
    """One training step of the MLP as a sequence of registered kernels, on "cpu" or "gpu".

    The arrays live where the kernels run (NumPy float32 on the CPU, device arrays on the GPU) and are
    allocated once; a step launches 13 kernels (2 linear forward, 1 ReLU forward, 5 linear backward,
    1 ReLU backward, plus 4 axpy updates) and runs the head on the host.
    """

    def __init__(self, backend, params, X, variants=None):
        if backend not in ("cpu", "gpu"):
            raise ValueError("backend must be 'cpu' or 'gpu'")
        self.backend = backend
        chosen = dict(CPU_VARIANTS if backend == "cpu" else GPU_VARIANTS)
        chosen.update(variants or {})
        self.k = {op: registry.get_variant(f"{op}/{backend}/{name}").fn for op, name in chosen.items()}
        M, D = X.shape
        H = params["W1"].shape[1]
        C = params["W2"].shape[1]
        f32 = np.float32
        host = {"X": X.astype(f32), **{k: np.ascontiguousarray(v, dtype=f32) for k, v in params.items()}}
        shapes = {"Z1": (M, H), "A1": (M, H), "Z2": (M, C), "G2": (M, C), "dA1": (M, H), "G1": (M, H),
                  "W1g": (D, H), "b1g": (H,), "W2g": (H, C), "b2g": (C,)}
        if backend == "gpu":
            from .device import cuda

            self.a = {k: cuda.to_device(v) for k, v in host.items()}
            self.a.update({k: cuda.device_array(s, dtype=f32) for k, s in shapes.items()})
        else:
            self.a = dict(host)
            self.a.update({k: np.empty(s, dtype=f32) for k, s in shapes.items()})

    def logits(self) -> np.ndarray:
        a, k = self.a, self.k
        k["linear_fwd"](a["Z1"], a["X"], a["W1"], a["b1"])  # Z1 = X W1 + b1      (M,H)
        k["relu_mlp_fwd"](a["A1"], a["Z1"])  # A1 = relu(Z1)                        (M,H)
        k["linear_fwd"](a["Z2"], a["A1"], a["W2"], a["b2"])  # Z2 = A1 W2 + b2     (M,C)
        return a["Z2"].copy_to_host() if self.backend == "gpu" else a["Z2"]

    def step(self, labels, lr: float) -> float:
        """Forward, head, backward and an SGD update; returns the loss before the update."""
        a, k = self.a, self.k
        loss, G2 = softmax_xent(self.logits(), labels)  # on the host, float32
        if self.backend == "gpu":
            a["G2"].copy_to_device(G2)
        else:
            a["G2"][...] = G2
        k["linear_bwd_dw"](a["W2g"], a["A1"], a["G2"])  # dW2 = A1^T G2    (H,C)
        k["linear_bwd_db"](a["b2g"], a["G2"])  # db2 = sum_rows(G2)          (C,)
        k["linear_bwd_dx"](a["dA1"], a["G2"], a["W2"])  # dA1 = G2 W2^T    (M,H)
        k["relu_mlp_bwd"](a["G1"], a["dA1"], a["Z1"])  # G1 = dA1 * [Z1 > 0]  (M,H)
        k["linear_bwd_dw"](a["W1g"], a["X"], a["G1"])  # dW1 = X^T G1      (D,H)
        k["linear_bwd_db"](a["b1g"], a["G1"])  # db1 = sum_rows(G1)          (H,)
        step = np.float32(-lr)
        for p in PARAMS:  # p <- (-lr) * grad + p, as flat vectors, with chapter 1's axpy
            flat, gflat = _flat(a[p]), _flat(a[p + "g"])
            k["axpy"](flat, step, gflat, flat)
        return loss

    def params(self) -> dict:
        if self.backend == "gpu":
            return {p: self.a[p].copy_to_host() for p in PARAMS}
        return {p: self.a[p].copy() for p in PARAMS}


def _flat(arr):
    return arr.reshape(arr.size)


@dataclass
class History:
    backend: str
    losses: list = field(default_factory=list)  # the loss before each update
    params: dict = field(default_factory=dict)  # the final parameters (float64 copies)
    accuracy: float = float("nan")


def train(X, labels, *, backend: str = "numpy", steps: int = 2000, lr: float = 0.5, hidden: int = 64,
          seed: int = 0, params: dict | None = None, variants: dict | None = None) -> History:
    """Full-batch gradient descent from the same initial parameters for every backend."""
    C = int(labels.max()) + 1
    p0 = params if params is not None else init_params(X.shape[1], hidden, C, seed)
    hist = History(backend)
    if backend == "numpy":
        p = {k: np.array(v, dtype=np.float64) for k, v in p0.items()}
        Xd = np.asarray(X, dtype=np.float64)
        for _ in range(steps):
            loss, g = loss_and_grads(p, Xd, labels)
            hist.losses.append(loss)
            for name in PARAMS:
                p[name] -= lr * g[name]
    else:
        ks = KernelSteps(backend, p0, X, variants)
        for _ in range(steps):
            hist.losses.append(ks.step(labels, lr))
        p = ks.params()
    hist.params = {k: np.asarray(v, dtype=np.float64) for k, v in p.items()}
    hist.accuracy = accuracy(hist.params, np.asarray(X, dtype=np.float64), labels)
    return hist


def decision_grid(params, lim: float = 1.2, res: int = 200):
    """Predicted class over a res x res grid of the square [-lim, lim]^2: (xs, ys, classes (res,res))."""
    xs = np.linspace(-lim, lim, res)
    gx, gy = np.meshgrid(xs, xs)
    pts = np.column_stack([gx.ravel(), gy.ravel()])
    return xs, xs, predict(params, pts).reshape(res, res)


# ------------------------------------------------------------------------------ command line
LOSS_TOL = 1e-3  # the stated tolerance: |loss_kernels - loss_reference| at every step (see chapter 3)


def compare_training(backend: str, steps: int = 2000, n_per_class: int = 100, hidden: int = 64,
                     lr: float = 0.5) -> dict:
    """Train the float64 reference and the kernel-backed MLP from the same start; return both loss
    curves, wall times and the largest gap between them."""
    import time

    X, labels = make_spirals(n_per_class)
    t0 = time.perf_counter()
    ref = train(X, labels, backend="numpy", steps=steps, hidden=hidden, lr=lr)
    t_ref = time.perf_counter() - t0
    train(X, labels, backend=backend, steps=2, hidden=hidden, lr=lr)  # warm-up: JIT compilation
    t0 = time.perf_counter()
    ker = train(X, labels, backend=backend, steps=steps, hidden=hidden, lr=lr)
    t_ker = time.perf_counter() - t0
    gap = np.abs(np.array(ref.losses) - np.array(ker.losses))
    return {"backend": backend, "steps": steps, "M": int(X.shape[0]), "hidden": hidden, "lr": lr,
            "losses_reference": ref.losses, "losses_kernels": [float(v) for v in ker.losses],
            "max_abs_gap": float(gap.max()), "tolerance": LOSS_TOL,
            "accuracy_reference": ref.accuracy, "accuracy_kernels": ker.accuracy,
            "seconds_reference": t_ref, "seconds_kernels": t_ker}


def main(argv=None) -> int:
    import argparse
    import sys

    from .bench import environment, save_json

    p = argparse.ArgumentParser(prog="python -m kernels_src.mlp",
                                description="train the chapter-3 MLP with the reference and with kernels")
    p.add_argument("--backend", choices=["cpu", "gpu"], default="cpu")
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--json")
    args = p.parse_args(argv)
    res = compare_training(args.backend, args.steps)
    from . import device

    res.update(simulated=args.backend == "gpu" and device.SIMULATED, meta=environment())
    print(f"{args.backend}: max |loss gap| {res['max_abs_gap']:.2e} over {args.steps} steps "
          f"(tolerance {LOSS_TOL:g}); reference {res['seconds_reference']:.2f} s, kernels "
          f"{res['seconds_kernels']:.2f} s; accuracy {res['accuracy_reference']:.3f} / {res['accuracy_kernels']:.3f}")
    if args.json:
        print(f"wrote {save_json(res, args.json)}")
    return 0 if res["max_abs_gap"] <= LOSS_TOL else 1


if __name__ == "__main__":
    raise SystemExit(main())
