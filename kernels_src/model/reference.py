"""The float64 NumPy GPT: the oracle for the course-kernel model (same architecture, written plainly).

Shapes (fixed letters): B sequences of T tokens, C = H*D model width, H heads of size D, F = 4C MLP
width, V vocabulary, N = B*T token rows.

    x = wte[ids]                                  (B,T,C)    token embedding
    for each of the L blocks:
        h   = rmsnorm(x) * g1                     (B,T,C)
        q,k,v = split(h @ Wqkv)                   (B,H,T,D)  each; q and k rotated by RoPE
        o   = softmax(q k^T / sqrt(D) + causal) v (B,H,T,D)
        x   = x + merge(o) @ Wo                   (B,T,C)    residual
        h   = rmsnorm(x) * g2
        x   = x + gelu(h @ Wfc) @ Wproj           (B,T,F) -> (B,T,C)
    logits = (rmsnorm(x) * gf) @ wte^T            (B,T,V)    tied LM head

With ``Config(experts=E, topk=k)`` every block's MLP is a Mixture-of-Experts layer instead (chapter 18): a
router Wr (C,E) sends each token to its top-k experts (softmax weights renormalised over the k), expert e is
a SwiGLU MLP (Wg, Wu (C,F), W2 (F,C)), and the token gets the weighted sum of its k experts' outputs:
        x   = x + moe(h)                          (kernels_src.ops.moe_layer.reference_layer)
    loss   = mean over tokens of -log softmax(logits)[target]

Parameters live in a dict name -> float64 array; ``backward`` returns a dict of the same names.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..ops.activations import gelu_bwd_ref, gelu_ref
from ..ops.moe_layer import reference_layer as moe_ref
from ..ops.moe_layer import reference_layer_bwd as moe_bwd_ref
from ..ops.moe_route import reference_aux, reference_router
from ..ops.norms import EPS
from ..ops.rope import cos_sin_cache


@dataclass(frozen=True)
class Config:
    vocab: int = 64
    ctx: int = 64          # the longest sequence (RoPE table rows, KV-cache capacity)
    width: int = 64        # C
    heads: int = 4         # H (D = C / H)
    layers: int = 2        # L
    mlp: int = 4           # F = mlp * C
    experts: int = 0       # E > 0: every block's MLP is a Mixture of Experts of E SwiGLU experts of width F
    topk: int = 2          # k experts per token (the router's weights renormalised over the k)
    aux_lb: float = 0.0    # MoE: the loss adds aux_lb * (load-balancing loss) + aux_z * (z-loss) of every layer
    aux_z: float = 0.0

    @property
    def head_dim(self):
        return self.width // self.heads


def param_shapes(cfg: Config) -> dict:
    """name -> shape, in a fixed order (the order of the flat parameter buffer)."""
    C, F = cfg.width, cfg.mlp * cfg.width
    shapes = {"wte": (cfg.vocab, C)}
    for i in range(cfg.layers):
        shapes.update({f"h{i}.g1": (C,), f"h{i}.wqkv": (C, 3 * C), f"h{i}.wo": (C, C), f"h{i}.g2": (C,)})
        if cfg.experts:
            E = cfg.experts
            shapes.update({f"h{i}.wr": (C, E), f"h{i}.wg": (E, C, F), f"h{i}.wu": (E, C, F), f"h{i}.w2": (E, F, C)})
        else:
            shapes.update({f"h{i}.wfc": (C, F), f"h{i}.wproj": (F, C)})
    shapes["gf"] = (C,)
    return shapes


def init_params(cfg: Config, seed: int = 0) -> dict:
    """GPT-2's initialisation: N(0, 0.02) matrices, the residual projections scaled by 1/sqrt(2L);
    norm gains 1. float64."""
    rng = np.random.default_rng(seed)
    p = {}
    for name, shape in param_shapes(cfg).items():
        if len(shape) == 1:
            p[name] = np.ones(shape)
        else:
            std = 0.02 / math.sqrt(2 * cfg.layers) if name.endswith(("wo", "wproj", "w2")) else 0.02
            p[name] = rng.normal(0.0, std, shape)
    return p


# ------------------------------------------------------------------------------------------- pieces
def rms_fwd(x, g):
    rstd = 1.0 / np.sqrt((x * x).mean(axis=-1, keepdims=True) + EPS)
    return x * rstd * g, rstd


def rms_bwd(dy, x, rstd, g):
    gy = dy * g
    dx = rstd * (gy - x * rstd ** 2 * (gy * x).mean(axis=-1, keepdims=True))
    dg = (dy * x * rstd).reshape(-1, x.shape[-1]).sum(axis=0)
    return dx, dg


def rope(x, cos, sin, inverse=False):
    """x (B,H,T,D), half-split pairs (i, i + D/2) rotated by theta(t) (or -theta(t))."""
    T, r2 = x.shape[2], cos.shape[1]
    c, s = cos[:T][None, None], sin[:T][None, None] * (-1.0 if inverse else 1.0)
    a, b = x[..., :r2], x[..., r2:2 * r2]
    return np.concatenate([a * c - b * s, b * c + a * s, x[..., 2 * r2:]], axis=-1)


def attention_fwd(q, k, v):
    D, T = q.shape[-1], q.shape[2]
    s = q @ k.transpose(0, 1, 3, 2) / math.sqrt(D)
    s = np.where(np.tril(np.ones((T, T), bool)), s, -np.inf)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    return p @ v, p


def attention_bwd(do, q, k, v, p):
    D = q.shape[-1]
    dv = p.transpose(0, 1, 3, 2) @ do
    dp = do @ v.transpose(0, 1, 3, 2)
    ds = p * (dp - (dp * p).sum(axis=-1, keepdims=True)) / math.sqrt(D)
    return ds @ k, ds.transpose(0, 1, 3, 2) @ q, dv


def cross_entropy(logits, targets):
    """mean loss over all N rows, and dlogits of that mean."""
    m = logits.max(axis=-1, keepdims=True)
    lse = m[:, 0] + np.log(np.exp(logits - m).sum(axis=-1))
    n = logits.shape[0]
    loss = np.mean(lse - logits[np.arange(n), targets])
    d = np.exp(logits - lse[:, None])
    d[np.arange(n), targets] -= 1.0
    return loss, d / n


# ------------------------------------------------------------------------------------------- model
class ReferenceGPT:
    """float64, NumPy only. ``forward(ids, targets)`` keeps what ``backward()`` needs."""

    def __init__(self, cfg: Config, params: dict):
        self.cfg = cfg
        self.p = {k: np.asarray(v, np.float64) for k, v in params.items()}
        self.cos, self.sin = cos_sin_cache(cfg.ctx, cfg.head_dim, dtype=np.float64)

    def forward(self, ids, targets=None):
        cfg, p = self.cfg, self.p
        B, T = ids.shape
        H, D, C = cfg.heads, cfg.head_dim, cfg.width
        x = p["wte"][ids]  # (B,T,C)
        self.cache = cache = {"ids": ids, "layers": []}
        for i in range(cfg.layers):
            c = {"x": x}
            h, c["r1"] = rms_fwd(x, p[f"h{i}.g1"])
            c["h1"] = h
            qkv = (h @ p[f"h{i}.wqkv"]).reshape(B, T, 3, H, D).transpose(2, 0, 3, 1, 4)  # (3,B,H,T,D)
            q, k, v = rope(qkv[0], self.cos, self.sin), rope(qkv[1], self.cos, self.sin), qkv[2]
            o, c["p"] = attention_fwd(q, k, v)
            c.update(q=q, k=k, v=v)
            c["om"] = om = o.transpose(0, 2, 1, 3).reshape(B, T, C)
            x = x + om @ p[f"h{i}.wo"]
            c["xm"] = x
            h2, c["r2"] = rms_fwd(x, p[f"h{i}.g2"])
            c["h2"] = h2
            if cfg.experts:
                x = x + moe_ref(h2.reshape(B * T, C), *self._moe(i), cfg.topk, 1).reshape(B, T, C)
                if cfg.aux_lb or cfg.aux_z:
                    lg, _, ids_r = reference_router(h2.reshape(B * T, C), p[f"h{i}.wr"], cfg.topk, 1)
                    lb, z = reference_aux(lg, ids_r)
                    cache["aux"] = cache.get("aux", 0.0) + cfg.aux_lb * lb + cfg.aux_z * z
            else:
                c["u"] = u = h2 @ p[f"h{i}.wfc"]
                c["a"] = a = gelu_ref(u)
                x = x + a @ p[f"h{i}.wproj"]
            cache["layers"].append(c)
        cache["xL"] = x
        xf, cache["rf"] = rms_fwd(x, p["gf"])
        cache["xf"] = xf
        logits = xf @ p["wte"].T  # (B,T,V)
        self.logits = logits
        if targets is None:
            return logits, None
        loss, self.dlogits = cross_entropy(logits.reshape(B * T, -1), targets.reshape(-1))
        return logits, loss + cache.get("aux", 0.0)

    def _moe(self, i):
        p = self.p
        return p[f"h{i}.wr"], p[f"h{i}.wg"], p[f"h{i}.wu"], p[f"h{i}.w2"]

    def backward(self):
        cfg, p, cache = self.cfg, self.p, self.cache
        ids = cache["ids"]
        B, T = ids.shape
        H, D, C = cfg.heads, cfg.head_dim, cfg.width
        g = {}
        dl = self.dlogits.reshape(B, T, -1)
        xf = cache["xf"]
        g["wte"] = dl.reshape(B * T, -1).T @ xf.reshape(B * T, C)
        dxf = dl @ p["wte"]
        dx, g["gf"] = rms_bwd(dxf, cache["xL"], cache["rf"], p["gf"])
        for i in reversed(range(cfg.layers)):
            c = cache["layers"][i]
            if cfg.experts:  # MoE branch: x = xm + moe(h2)
                dh2, g[f"h{i}.wr"], g[f"h{i}.wg"], g[f"h{i}.wu"], g[f"h{i}.w2"] = moe_bwd_ref(
                    dx.reshape(B * T, C), c["h2"].reshape(B * T, C), *self._moe(i), cfg.topk, 1,
                    aux=(cfg.aux_lb, cfg.aux_z))
                dh2 = dh2.reshape(B, T, C)
            else:  # MLP branch: x = xm + gelu(h2 Wfc) Wproj
                g[f"h{i}.wproj"] = c["a"].reshape(-1, c["a"].shape[-1]).T @ dx.reshape(-1, C)
                da = dx @ p[f"h{i}.wproj"].T
                du = gelu_bwd_ref(da, c["u"])
                g[f"h{i}.wfc"] = c["h2"].reshape(-1, C).T @ du.reshape(-1, du.shape[-1])
                dh2 = du @ p[f"h{i}.wfc"].T
            dxn, g[f"h{i}.g2"] = rms_bwd(dh2, c["xm"], c["r2"], p[f"h{i}.g2"])
            dx = dx + dxn
            # attention branch: xm = x + merge(o) Wo
            g[f"h{i}.wo"] = c["om"].reshape(-1, C).T @ dx.reshape(-1, C)
            dom = dx @ p[f"h{i}.wo"].T
            do = dom.reshape(B, T, H, D).transpose(0, 2, 1, 3)
            dq, dk, dv = attention_bwd(do, c["q"], c["k"], c["v"], c["p"])
            dq, dk = rope(dq, self.cos, self.sin, inverse=True), rope(dk, self.cos, self.sin, inverse=True)
            dqkv = np.stack([dq, dk, dv]).transpose(1, 3, 0, 2, 4).reshape(B, T, 3 * C)
            g[f"h{i}.wqkv"] = c["h1"].reshape(-1, C).T @ dqkv.reshape(-1, 3 * C)
            dh = dqkv @ p[f"h{i}.wqkv"].T
            dxn, g[f"h{i}.g1"] = rms_bwd(dh, c["x"], c["r1"], p[f"h{i}.g1"])
            dx = dx + dxn
        np.add.at(g["wte"], ids.reshape(-1), dx.reshape(-1, C))
        return g

    def loss_and_grads(self, ids, targets):
        _, loss = self.forward(ids, targets)
        return loss, self.backward()


def adamw_step(params, grads, m, v, step, lr, beta1=0.9, beta2=0.95, eps=1e-8, wd=0.1):
    """float64 AdamW (decoupled decay on matrices only, as GPT-2 trainers do; the MoE experts' stacked
    matrices count as matrices), in place."""
    for k in params:
        wd_k = wd if params[k].ndim >= 2 else 0.0
        m[k] = beta1 * m[k] + (1 - beta1) * grads[k]
        v[k] = beta2 * v[k] + (1 - beta2) * grads[k] ** 2
        mh, vh = m[k] / (1 - beta1 ** step), v[k] / (1 - beta2 ** step)
        params[k] = params[k] * (1 - lr * wd_k) - lr * mh / (np.sqrt(vh) + eps)
