"""torch's scaled_dot_product_attention as the yardstick for attention and attention_bwd on the GPU (chapter 9).

The torch baselines produce O through F.scaled_dot_product_attention, exactly as a user calls it.
SDPA does not return L, so for ``kernels check`` they also compute L (and zero fully masked rows)
with extra torch work. With the environment variable KERNELS_SDPA_O_ONLY=1 (set for benchmarks) they
skip that extra work, so the timings are those of SDPA itself (their L is then not written).
"""
from __future__ import annotations
import math
import os
import numpy as np

from ..registry import register
from .reductions import torch_gpu, torch_view
from .attention_ref import visible


# ------------------------------------------------------------------------------- torch baselines
O_ONLY = os.environ.get("KERNELS_SDPA_O_ONLY", "") == "1"
_masks: dict = {}


def _torch_mask(kv_len, S, T, causal):
    """None when SDPA's own flags express the mask (no padding; causal only with S = T), else a bool
    (B,1,S,T) mask (True = attend) for bottom-right causal and padding; cached per kv_len array."""
    import torch

    key = (id(kv_len), S, T, causal)
    hit = _masks.get(key)
    if hit is not None and hit[0] is kv_len:
        return hit[1]
    kl = np.asarray(kv_len.copy_to_host() if hasattr(kv_len, "copy_to_host") else kv_len)
    if (kl >= T).all() and (not causal or S == T):
        m = None
    else:
        m = torch.as_tensor(visible(S, T, kl, causal), device="cuda")
    if len(_masks) > 32:
        _masks.clear()
    _masks[key] = (kv_len, m)
    return m


def _sdpa(q, k, v, kv_len, causal, math_backend):
    import contextlib

    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    S, T = q.shape[2], k.shape[2]
    mask = _torch_mask(kv_len, S, T, causal)
    ctx = sdpa_kernel(SDPBackend.MATH) if math_backend else contextlib.nullcontext()
    with ctx:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=bool(causal) and mask is None,
                                              enable_gqa=q.shape[1] != k.shape[1])


def _torch_lse(q, k, kv_len, causal):
    import torch

    g = q.shape[1] // k.shape[1]
    kk = k.repeat_interleave(g, dim=1) if g > 1 else k
    s = torch.matmul(q, kk.transpose(-1, -2)) / math.sqrt(q.shape[3])
    vis = torch.as_tensor(visible(q.shape[2], k.shape[2], np.asarray(kv_len.copy_to_host()), causal), device="cuda")
    return torch.logsumexp(s.masked_fill(~vis, -math.inf), dim=-1)


def _sdpa_fwd(o, lse, q, k, v, kv_len, causal, math_backend):
    import torch

    Q, K, V = torch_view(q), torch_view(k), torch_view(v)
    out = _sdpa(Q, K, V, kv_len, causal, math_backend)
    if O_ONLY:
        torch_view(o).copy_(out)
        return
    L = _torch_lse(Q, K, kv_len, causal)
    torch_view(lse).copy_(L)
    torch_view(o).copy_(torch.where(torch.isinf(L)[..., None], 0.0, out))  # our fully-masked-row rule


@register("attention", "gpu", "sdpa_math", baseline=True, requires=torch_gpu)
def attention_sdpa_math(o, lse, q, k, v, kv_len, causal):
    """torch SDPA, math backend, TF32 off: Q K^T (cuBLAS), softmax, P V -- the score matrix in DRAM."""
    _sdpa_fwd(o, lse, q, k, v, kv_len, causal, True)


@register("attention", "gpu", "sdpa_default", baseline=True, requires=torch_gpu)
def attention_sdpa_default(o, lse, q, k, v, kv_len, causal):
    """torch SDPA as a user calls it: for fp32 the memory-efficient backend (tensor cores, 3xTF32)."""
    _sdpa_fwd(o, lse, q, k, v, kv_len, causal, False)


_graphs: dict = {}


def _sdpa_bwd(dq, dk, dv, do, q, k, v, kv_len, causal, math_backend):
    import torch

    key = (id(q), id(k), id(v), math_backend)
    hit = _graphs.get(key)
    if hit is None or hit[0] is not q:
        Q, K, V = (torch_view(a).detach().clone().requires_grad_(True) for a in (q, k, v))
        out = _sdpa(Q, K, V, kv_len, causal, math_backend)
        if len(_graphs) > 8:
            _graphs.clear()
        hit = _graphs[key] = (q, (Q, K, V), out)
    _, leaves, out = hit
    grads = torch.autograd.grad(out, leaves, torch_view(do), retain_graph=True)
    for dst, gr in zip((dq, dk, dv), grads):
        torch_view(dst).copy_(gr)


@register("attention_bwd", "gpu", "sdpa_math", baseline=True, requires=torch_gpu)
def attention_bwd_sdpa_math(dq, dk, dv, do, q, k, v, o, lse, kv_len, causal):
    """torch autograd through SDPA's math backend (TF32 off): the saved S x T probabilities are reused."""
    _sdpa_bwd(dq, dk, dv, do, q, k, v, kv_len, causal, True)


@register("attention_bwd", "gpu", "sdpa_default", baseline=True, requires=torch_gpu)
def attention_bwd_sdpa_default(dq, dk, dv, do, q, k, v, o, lse, kv_len, causal):
    """torch autograd through SDPA's default fp32 backend (memory-efficient)."""
    _sdpa_bwd(dq, dk, dv, do, q, k, v, kv_len, causal, False)
