"""The capstone GPT, float32, every operation a registered course kernel (chapter 13).

Same architecture and parameter names as :mod:`kernels_src.model.reference` (read that file for the
math). Nothing here computes: each line hands arrays to a kernel looked up in the registry, through
a *backend*, which asks the dispatcher (kernels_src.runtime.dispatch, chapter 14) which registered variant
plays the role ("gemm", "attention", ...) for this call's shape, dtype and device:

    backend("cpu")   Numba CPU rungs
    backend("gpu")   numba.cuda rungs: on a real GPU the fast ones (by the GPU's autotune table), in the
                     simulator the simple ones

The model keeps no table of its own; ``kernels dispatch --explain train|decode`` prints what each call gets.

With ``Config(experts=E)`` each block's MLP is chapter 18's MoE layer. Training calls the layer's rungs
directly (``moe_layer/{cpu,gpu}/course`` and ``moe_layer_bwd``: the load-balancing losses need its buffers);
decoding with the KV cache goes through the dispatcher's ``moe`` role, which gives a few tokens the GEMV rung
(``moe_layer/gpu/gemv``, T*k <= moe_gemv_max_slots) and more the grouped rung. Quantized MoE decoding raises.

N = B*T token rows, C width, H heads of D, F = 4C, V vocabulary. Shapes are written where they are used.
"""
from __future__ import annotations

import time
from contextlib import contextmanager

import numpy as np

from .. import device, registry
from ..ops.rope import cos_sin_cache
from .reference import Config, param_shapes


class RoleTable(dict):
    """role -> the variant key it ran last (or, before any call, the one it gets for a large call): the
    role -> kernel table chapter 13 prints. The dispatcher decides per call; this is a summary of it."""

    def __init__(self, be):
        super().__init__()
        self._be = be

    def __missing__(self, role):
        return self._be.dispatch.default_variant(role)


class Backend:
    """Where arrays live and which kernel plays each role. The kernel is not fixed per role: every call goes
    to the dispatcher (kernels_src.runtime.dispatch), which picks the variant for its shape, dtype and device
    and caches that per (role, shapes). ``profile`` collects seconds per role; ``log`` (a list, when set)
    records each call's Decision; ``dry=True`` records without running anything (``model.explain``).

    ``table``: the dispatcher's autotune table (a dict or path; None: the device's committed one, or the
    defaults); ``overrides``: {role: "op/backend/variant"} forced whatever the shape."""

    def __init__(self, kind: str, table=None, *, overrides=None, dispatcher=None, dry=False):
        from ..runtime.dispatch import Dispatcher, device_of

        self.kind = kind
        self.gpu = kind == "gpu" and not dry
        self.dry = dry
        self.dispatch = dispatcher or Dispatcher(device_of(kind), table=table, overrides=overrides,
                                                 empty=self.empty)
        self.table = RoleTable(self)
        self.times: dict | None = None
        self.log: list | None = None
        self._ws: dict = {}

    def variant(self, role):
        return registry.get_variant(self.table[role])

    def __call__(self, role, *args):
        d = self.dispatch.pick(role, *args)
        self.table[role] = d.variant
        if self.log is not None:
            self.log.append(d)
        if self.dry:
            return
        if self.times is None:
            d.fn(*args)
            return
        self.sync()
        t0 = time.perf_counter()
        d.fn(*args)
        self.sync()
        self.times[role] = self.times.get(role, 0.0) + time.perf_counter() - t0

    @contextmanager
    def profile(self):
        """with backend.profile() as times: ... -> {role: seconds} (synchronising around every kernel)."""
        self.times = {}
        try:
            yield self.times
        finally:
            self.times = None

    def sync(self):
        if self.gpu:
            device.synchronize()

    # arrays
    def asarray(self, a, dtype=None):
        a = np.ascontiguousarray(a, dtype=dtype)
        return device.cuda.to_device(a) if self.gpu else a

    def host(self, a):
        return a.copy_to_host() if self.gpu else np.array(a)

    def empty(self, shape, dtype=np.float32):
        return device.cuda.device_array(shape, dtype=dtype) if self.gpu else np.empty(shape, dtype)

    def ws(self, key, shape, dtype=np.float32):
        """A buffer kept between calls (like a caching allocator), per key and shape."""
        shape = tuple(int(s) for s in shape)
        a = self._ws.get(key)
        if a is None or a.shape != shape or a.dtype != np.dtype(dtype):
            a = self._ws[key] = self.empty(shape, dtype)
        return a


def backend(kind="cpu", table=None, overrides=None) -> Backend:
    return Backend(kind, table, overrides=overrides)


class GPT:
    """float32 GPT on a backend. Parameters, gradients and the AdamW moments are four flat buffers
    (matrices first, then the norm gains), so one AdamW launch per group updates everything."""

    def __init__(self, cfg: Config, params: dict, be: Backend | str = "cpu"):
        self.cfg = cfg
        self.be = be = backend(be) if isinstance(be, str) else be
        shapes = param_shapes(cfg)
        names = [n for n in shapes if len(shapes[n]) >= 2] + [n for n in shapes if len(shapes[n]) == 1]
        self.names, self.shapes, self.offsets = names, shapes, {}
        o = 0
        for n in names:
            self.offsets[n] = (o, o + int(np.prod(shapes[n])))
            o = self.offsets[n][1]
        self.n_params = o
        self.n_matrix = max(self.offsets[n][1] for n in names if len(shapes[n]) >= 2)
        flat = np.concatenate([np.asarray(params[n], np.float32).ravel() for n in names])
        self.flat = be.asarray(flat)
        self.gflat = be.empty(o)
        self.m, self.v = be.asarray(np.zeros(o, np.float32)), be.asarray(np.zeros(o, np.float32))
        self.p = self._views(self.flat)
        self.g = self._views(self.gflat)
        cos, sin = cos_sin_cache(cfg.ctx, cfg.head_dim)
        self.cos, self.sin = be.asarray(cos), be.asarray(sin)
        self.step = 0
        self.expert_load = None  # MoE: set to a list to record each forward's tokens per expert, per layer
        # Data parallelism (kernels_src.model.dp): backward() calls on_grads_ready(layer, ranges) as soon as block
        # `layer`'s gradients are final (layer None at the end: wte and gf), ranges = the (lo, hi) runs of gflat
        # they fill; grad_scale multiplies the loss's gradient (1/n ranks: the all-reduced sum is the mean).
        self.on_grads_ready = None
        self.grad_scale = 1.0
        self.grad_ranges = {i: _runs([self.offsets[n] for n in names if n.startswith(f"h{i}.")])
                            for i in range(cfg.layers)}
        self.grad_ranges[None] = _runs([self.offsets[n] for n in names if not n.startswith("h")])

    def _views(self, flat):
        return {n: flat[a:b].reshape(self.shapes[n]) for n, (a, b) in self.offsets.items()}

    def params(self) -> dict:
        """name -> float32 NumPy copy."""
        host = self.be.host(self.flat)
        return {n: host[a:b].reshape(self.shapes[n]) for n, (a, b) in self.offsets.items()}

    def grads(self) -> dict:
        host = self.be.host(self.gflat)
        return {n: host[a:b].reshape(self.shapes[n]) for n, (a, b) in self.offsets.items()}

    # --------------------------------------------------------------------------------- forward
    def forward(self, ids, targets=None):
        """ids, targets (B,T) int -> logits (B*T, V) on the backend, and the mean loss (a float) if
        targets are given. Keeps the activations for backward()."""
        be = self.be
        B, T = ids.shape
        self._write_inputs(ids, targets)
        self._forward_launches(B, T, targets is not None)
        logits = self.act["logits"]
        if targets is None:
            return logits, None
        return logits, float(be.host(be.ws("total", (1,)))[0]) / (B * T) + self._aux

    def _write_inputs(self, ids, targets=None):
        """ids (and targets) into static device buffers (in.ids, in.tg), with the constant start and length
        vectors of a (B,T) batch: a step then launches on the same buffers every time (a CUDA graph's
        condition, see Trainer)."""
        be = self.be
        B, T = ids.shape
        for key, a in (("in.ids", ids), ("in.tg", targets)):
            if a is not None:
                _put(be, be.ws(key, (B * T,), np.int32), np.asarray(a).reshape(-1))
        key = ("in.pos", B, T)
        if key not in be._ws:
            be._ws[key] = (be.asarray(np.zeros(B, np.int32)), be.asarray(np.full(B, T, np.int32)))
        return be._ws[key]

    def _forward_launches(self, B, T, with_targets):
        """The kernels of forward() on the static buffers _write_inputs filled; with_targets: also the loss
        (cross entropy, summed into the device buffer "total": nothing is read back here)."""
        cfg, be, p = self.cfg, self.be, self.p
        N, C, H, D, F, V = B * T, cfg.width, cfg.heads, cfg.head_dim, cfg.mlp * cfg.width, cfg.vocab
        ids_d = be.ws("in.ids", (N,), np.int32)
        start, kv_len = be._ws[("in.pos", B, T)]
        self.act = act = {"B": B, "T": T, "ids": ids_d, "kv_len": kv_len}
        self._aux = 0.0  # MoE: the weighted load-balancing and z-losses of this forward
        x = be.ws("x0", (N, C))
        be("embedding", x, ids_d, p["wte"])                              # x (N,C) = wte[ids]
        be("rmsnorm", be.ws("0.h1", (N, C)), be.ws("0.r1", (N,)), x, p["h0.g1"])  # h1 (N,C), rstd (N,)
        for i in range(cfg.layers):
            a = act[i] = {"x": x}
            a["r1"], a["h1"] = be.ws(f"{i}.r1", (N,)), be.ws(f"{i}.h1", (N, C))  # written by the add before
            qkv = be.ws(f"{i}.qkv", (N, 3 * C))
            be("gemm", qkv, a["h1"], p[f"h{i}.wqkv"])                    # (N,3C) = (B,T,3H,D)
            q, k, v = (be.ws(f"{i}.{n}", (B, H, T, D)) for n in "qkv")
            be("rope_qkv", q, k, v, qkv.reshape(B, T, 3 * H, D), start, self.cos, self.sin, H, T)
            o, lse = be.ws(f"{i}.o", (B, H, T, D)), be.ws(f"{i}.lse", (B, H, T))
            be("attention", o, lse, q, k, v, kv_len, 1)                  # causal, o (B,H,T,D)
            om = be.ws(f"{i}.om", (B, T, C))
            be("heads_merge", om, o)                                     # (B,T,C)
            att = be.ws(f"{i}.att", (N, C))
            be("gemm", att, om.reshape(N, C), p[f"h{i}.wo"])
            xm = be.ws(f"{i}.xm", (N, C))
            a.update(q=q, k=k, v=v, o=o, lse=lse, om=om, xm=xm)
            a["r2"], a["h2"] = be.ws(f"{i}.r2", (N,)), be.ws(f"{i}.h2", (N, C))
            be("add_rmsnorm", xm, a["h2"], a["r2"], att, x, p[f"h{i}.g2"])  # xm = att + x (residual), h2
            mlp = be.ws(f"{i}.mlp", (N, C))
            if cfg.experts:  # chapter 18: router, align, grouped SwiGLU experts, combine
                self._moe_forward(i, mlp, a["h2"])
            else:
                u, gl = be.ws(f"{i}.u", (N, F)), be.ws(f"{i}.gl", (N, F))
                be("gemm", u, a["h2"], p[f"h{i}.wfc"])                   # (N,F)
                be("gelu", gl.reshape(-1), u.reshape(-1))
                be("gemm", mlp, gl, p[f"h{i}.wproj"])                    # (N,C)
                a.update(u=u, gl=gl)
            x = be.ws(f"{i}.xout", (N, C))
            last = i + 1 == cfg.layers  # x = mlp + xm (residual), then the next norm: layer i+1's or the final
            hn, rn = (be.ws("xf", (N, C)), be.ws("rf", (N,))) if last else (be.ws(f"{i + 1}.h1", (N, C)),
                                                                          be.ws(f"{i + 1}.r1", (N,)))
            be("add_rmsnorm", x, hn, rn, mlp, xm, p["gf"] if last else p[f"h{i + 1}.g1"])
        act["xL"] = x
        act["rf"], act["xf"] = be.ws("rf", (N,)), be.ws("xf", (N, C))
        logits = be.ws("logits", (N, V))
        mm_dx(be, logits, act["xf"], p["wte"])                     # tied head: xf wte^T (N,V)
        act["logits"] = logits
        if not with_targets:
            return logits
        tg = be.ws("in.tg", (N,), np.int32)
        losses, lse = be.ws("losses", (N,)), be.ws("lse_v", (N,))
        be("cross_entropy", losses, lse, logits, tg)
        total = be.ws("total", (1,))
        be("sum", total, losses)
        act.update(targets=tg, lse_v=lse)
        return logits

    # --------------------------------------------------------------------------------- backward
    def backward(self):
        """Gradients of the mean loss of the last forward() into self.g (the flat self.gflat)."""
        cfg, be, p, g, act = self.cfg, self.be, self.p, self.g, self.act
        B, T = act["B"], act["T"]
        N, C, H, D, F, V = B * T, cfg.width, cfg.heads, cfg.head_dim, cfg.mlp * cfg.width, cfg.vocab
        dloss = self._dloss(N)
        dlogits = be.ws("dlogits", (N, V))
        be("cross_entropy_bwd", dlogits, act["logits"], act["targets"], act["lse_v"], dloss)
        mm_dw(be, g["wte"], dlogits, act["xf"])                    # head part of dwte (V,C)
        dxf = be.ws("dxf", (N, C))
        be("gemm", dxf, dlogits, p["wte"])                               # (N,C)
        dx, dn = be.ws("dx", (N, C)), be.ws("dn", (N, C))
        be("rmsnorm_bwd", dx, g["gf"], dxf, act["xL"], act["rf"], p["gf"])
        for i in reversed(range(cfg.layers)):
            a = act[i]
            dh = be.ws("dh", (N, C))
            if cfg.experts:  # MoE branch: x = xm + moe(h2); moe_layer_bwd recomputes the layer's forward
                self._moe_backward(i, dh, dx, a["h2"])
            else:  # MLP branch: x = xm + gelu(h2 Wfc) Wproj
                mm_dw(be, g[f"h{i}.wproj"], a["gl"], dx)
                dgl, du = be.ws("dgl", (N, F)), be.ws("du", (N, F))
                mm_dx(be, dgl, dx, p[f"h{i}.wproj"])
                be("gelu_bwd", du.reshape(-1), dgl.reshape(-1), a["u"].reshape(-1))
                mm_dw(be, g[f"h{i}.wfc"], a["h2"], du)
                mm_dx(be, dh, du, p[f"h{i}.wfc"])
            be("rmsnorm_bwd", dn, g[f"h{i}.g2"], dh, a["xm"], a["r2"], p[f"h{i}.g2"])
            add(be, dx, dn, dx)
            # attention branch: xm = x + merge(o) Wo
            mm_dw(be, g[f"h{i}.wo"], a["om"].reshape(N, C), dx)
            dom, do = be.ws("dom", (N, C)), be.ws("do", (B, H, T, D))
            mm_dx(be, dom, dx, p[f"h{i}.wo"])
            be("heads_split", do, dom.reshape(B, T, C), H)
            dq, dk, dv = (be.ws(f"d{n}", (B, H, T, D)) for n in "qkv")
            be("attention_bwd", dq, dk, dv, do, a["q"], a["k"], a["v"], a["o"], a["lse"], act["kv_len"], 1)
            dqkv = be.ws("dqkv", (B, T, 3 * H, D))
            be("rope_qkv_bwd", dqkv, dq, dk, dv, self.cos, self.sin)
            mm_dw(be, g[f"h{i}.wqkv"], a["h1"], dqkv.reshape(N, 3 * C))
            mm_dx(be, dh, dqkv.reshape(N, 3 * C), p[f"h{i}.wqkv"])
            be("rmsnorm_bwd", dn, g[f"h{i}.g1"], dh, a["x"], a["r1"], p[f"h{i}.g1"])
            add(be, dx, dn, dx)
            if self.on_grads_ready is not None:
                self.on_grads_ready(i, self.grad_ranges[i])
        demb = be.ws("demb", (V, C))
        be("embedding_bwd", demb, act["ids"], dx, V)
        add(be, g["wte"], demb, g["wte"])
        if self.on_grads_ready is not None:
            self.on_grads_ready(None, self.grad_ranges[None])

    # ------------------------------------------------------------------------------------ MoE blocks
    def _moe_weights(self, i, src):
        return src[f"h{i}.wr"], src[f"h{i}.wg"], src[f"h{i}.wu"], src[f"h{i}.w2"]

    def _moe_forward(self, i, out, h):
        """out (N,C) = moe(h): chapter 18's layer rung for this backend (no dispatcher role yet)."""
        from ..ops import moe_layer

        from ..ops import moe_route

        cfg = self.cfg
        fn = moe_layer.layer_gpu if self.be.gpu else moe_layer.layer_cpu
        bufs = fn(out, h, *self._moe_weights(i, self.p), cfg.topk, 1)
        if cfg.aux_lb or cfg.aux_z:  # the router's load-balancing loss and z-loss, added to the model's loss
            losses = self.be.ws("moe_aux", (2,))
            (moe_route.aux_gpu if self.be.gpu else moe_route.aux_cpu)(losses, bufs["logits"], bufs["ids"])
            lb, z = self.be.host(losses)
            self._aux += cfg.aux_lb * float(lb) + cfg.aux_z * float(z)
        if self.expert_load is not None:
            ids = self.be.host(bufs["ids"]).reshape(-1)
            while len(self.expert_load) <= i:
                self.expert_load.append([])
            self.expert_load[i].append(np.bincount(ids, minlength=self.cfg.experts))

    def _moe_backward(self, i, dh, dout, h):
        """dh (N,C) and the layer's weight gradients (into self.g) from dout (N,C)."""
        from ..ops import moe_layer

        cfg = self.cfg
        fn = moe_layer.layer_bwd_gpu if self.be.gpu else moe_layer.layer_bwd_cpu
        fn(dh, *self._moe_weights(i, self.g), dout, h, *self._moe_weights(i, self.p), cfg.topk, 1,
           aux=(cfg.aux_lb, cfg.aux_z))

    def _dloss(self, N):
        key = ("dloss", N, self.grad_scale)
        if key not in self.be._ws:
            self.be._ws[key] = self.be.asarray(np.full(N, self.grad_scale / N, np.float32))
        return self.be._ws[key]

    def adamw(self, lr, beta1=0.9, beta2=0.95, eps=1e-8, wd=0.1):
        """One AdamW step in place: decay on the matrices (the first n_matrix entries), none on gains."""
        self.step += 1
        k = self.n_matrix
        for lo, hi, w in ((0, k, wd), (k, self.n_params, 0.0)):
            p, g, m, v = (a[lo:hi] for a in (self.flat, self.gflat, self.m, self.v))
            self.be("adamw", p, m, v, p, g, m, v, self.step, lr, beta1, beta2, eps, w)

    def train_step(self, ids, targets, lr, **hyper):
        _, loss = self.forward(ids, targets)
        self.backward()
        self.adamw(lr, **hyper)
        return loss

    def trainer(self, batch, seq, mode="auto", quiet=False, **hyper):
        """A :class:`Trainer`: training steps of shape (batch, seq) replayed as one CUDA graph (mode "graph"),
        a launch plan ("plan") or run eagerly ("eager"); "auto" captures where possible and says in one line
        why not elsewhere. hyper: AdamW's beta1, beta2, eps, wd."""
        return Trainer(self, batch, seq, mode, quiet, **hyper)

    # --------------------------------------------------------------------------------- decoding
    def new_cache(self, batch=1):
        cfg, be = self.cfg, self.be
        shape = (batch, cfg.heads, cfg.ctx, cfg.head_dim)
        return [(be.asarray(np.zeros(shape, np.float32)), be.asarray(np.zeros(shape, np.float32)))
                for _ in range(cfg.layers)]

    def decode_step(self, tok, pos, cache, qweights=None):
        """One token per sequence: tok (B,) int at position pos (an int), KV cache from new_cache().
        Returns logits (B,V) on the host. With qweights (from quantize()), every matrix-vector product
        runs on packed Q8_0/Q4_0 weights (batch 1).

        The step reads the token, the position and the cache length from one static device buffer
        (``dec.state``, written here with one copy), and every kernel writes static buffers: the launches
        of _decode_launches are the same from step to step, which is what lets decoder() replay them as a
        launch plan or a CUDA graph."""
        B = len(tok)
        self._write_state(tok, pos, B)
        self._decode_launches(B, cache, qweights)
        return self.be.host(self.be.ws("dec.logits", (B, self.cfg.vocab)))

    def _write_state(self, tok, pos, B):
        """dec.state (3,B) int32 on the device: row 0 the tokens, row 1 the position, row 2 the cache length."""
        st = np.empty((3, B), np.int32)
        st[0], st[1], st[2] = np.asarray(tok, np.int32), pos, pos + 1
        state = self.be.ws("dec.state", (3, B), np.int32)
        if self.be.gpu:
            state.copy_to_device(st)
        else:
            state[...] = st
        return state

    def _qtable(self, qweights):
        """The token table of packed weights, dequantized once on the device (V,C): the embedding of a
        token is then the same row the packed table dequantizes to (llama.cpp's get_rows), read without
        any host-side indexing."""
        fmt, packed = qweights
        key = ("dec.qtable", fmt, id(packed["wte"]))
        t = self.be._ws.get(key)
        if t is None:
            t = self.be._ws[key] = self.be.empty((self.cfg.vocab, self.cfg.width))
            self.be(f"{fmt}_dequantize", t, packed["wte"])
        return t

    def _decode_launches(self, B, cache, qweights=None):
        """The kernels of one decode step, on static buffers only (no copies, no allocations after the
        first call): tokens, position and cache length come from dec.state, logits go to dec.logits."""
        cfg, be, p = self.cfg, self.be, self.p
        C, H, D, F, V = cfg.width, cfg.heads, cfg.head_dim, cfg.mlp * cfg.width, cfg.vocab
        state = be.ws("dec.state", (3, B), np.int32)
        ids, start, lengths = state[0], state[1], state[2]

        def matmul(y, x, name):
            if qweights is None:
                be("gemm", y, x, p[name])
            else:
                fmt, packed = qweights
                be(f"qgemv_{fmt}", y.reshape(-1), x.reshape(-1), packed[name])

        x = be.ws("dec.x", (B, C))
        be("embedding", x, ids, p["wte"] if qweights is None else self._qtable(qweights))
        h, r = be.ws("dec.h", (B, C)), be.ws("dec.r", (B,))
        qkv, q, o = be.ws("dec.qkv", (B, 3 * C)), be.ws("dec.q", (B, H, 1, D)), be.ws("dec.o", (B, H, D))
        att, xm = be.ws("dec.att", (B, C)), be.ws("dec.xm", (B, C))
        u, gl, mlp = be.ws("dec.u", (B, F)), be.ws("dec.gl", (B, F)), be.ws("dec.mlp", (B, C))
        be("rmsnorm", h, r, x, p["h0.g1"])
        for i in range(cfg.layers):
            K, Vc = cache[i]
            matmul(qkv, h, f"h{i}.wqkv")
            be("rope_qkv", q, K, Vc, qkv.reshape(B, 1, 3 * H, D), start, self.cos, self.sin, H, cfg.ctx)
            be("decode_attention", o, q.reshape(B, H, D), K, Vc, lengths)
            matmul(att, o.reshape(B, C), f"h{i}.wo")                     # (B,H,D) is already (B,C)
            be("add_rmsnorm", xm, h, r, att, x, p[f"h{i}.g2"])          # xm = att + x; h = norm2(xm)
            if cfg.experts:  # chapter 18's layer through the dispatcher's "moe" role: few tokens get rung 2 (GEMV)
                if qweights is not None:
                    raise NotImplementedError("quantized decoding is not built for the MoE model (chapter 18)")
                be("moe", mlp, h, *self._moe_weights(i, p), cfg.topk, 1)
            elif qweights is not None:  # the up projection and its GELU in one launch (chapter 14)
                be(f"qgemv_gelu_{qweights[0]}", gl.reshape(-1), h.reshape(-1), qweights[1][f"h{i}.wfc"])
                matmul(mlp, gl, f"h{i}.wproj")
            else:
                matmul(u, h, f"h{i}.wfc")
                be("gelu", gl.reshape(-1), u.reshape(-1))
                matmul(mlp, gl, f"h{i}.wproj")
            g_next = p[f"h{i + 1}.g1"] if i + 1 < cfg.layers else p["gf"]
            be("add_rmsnorm", x, h, r, mlp, xm, g_next)                 # x = mlp + xm; h = the next norm of x
        logits = be.ws("dec.logits", (B, V))
        if qweights is None:
            mm_dx(be, logits, h, p["wte"])
        else:
            be(f"qgemv_{qweights[0]}", logits.reshape(-1), h.reshape(-1), qweights[1]["wte"])
        return logits

    def decoder(self, cache, qweights=None, batch=1, mode="auto", quiet=False):
        """A :class:`Decoder` over this model and cache: decode steps replayed as a launch plan or a CUDA
        graph (mode "plan" / "graph"), or run eagerly ("eager"); "auto" picks the graph where capture is
        possible and says in one line why not elsewhere."""
        return Decoder(self, cache, qweights, batch, mode, quiet)

    def quantize(self, fmt):
        """Pack every matrix for the dequantizing GEMV (chapter 11): W (K,N) is stored GGML's way, one
        packed row per output column (W^T quantized along K). The tied head packs wte (V,C) as it is.
        Returns (fmt, {name: packed}) for decode_step and the dequantized fp32 weights (a dict)."""
        if self.cfg.experts:
            raise NotImplementedError("quantized decoding is not built for the MoE model yet (chapter 18)")
        be = self.be
        bb = {"q8_0": 34, "q4_0": 18}[fmt]
        packed, deq = {}, {}
        host = self.params()
        for n in self.names:
            if len(self.shapes[n]) != 2:
                continue
            w = host[n] if n == "wte" else np.ascontiguousarray(host[n].T)   # (N_out, K)
            wd = be.asarray(w)
            out = be.empty((w.shape[0], w.shape[1] // 32 * bb), np.uint8)
            be(f"{fmt}_quantize", out, wd)
            back = be.empty(w.shape)
            be(f"{fmt}_dequantize", back, out)
            packed[n] = out
            b = be.host(back)
            deq[n] = b if n == "wte" else np.ascontiguousarray(b.T)
        return (fmt, packed), deq

    def generate(self, prompt, n_new, temperature=0.0, seed=0, cache=True, qweights=None, mode="auto",
                 top_k=0, top_p=1.0):
        """Token ids continuing prompt (a list of ints). temperature 0: greedy (argmax; the first index
        wins a tie); above 0, a draw with top_k (0: off) and top_p (1: off) by chapter 16's ``sample`` op,
        reproducible from the seed on every backend (see :func:`pick`). With cache=False every step re-runs
        the whole sequence through forward(). mode: how the cached decode steps launch (see decoder();
        "auto" replays a CUDA graph on a real GPU)."""
        from ..ops.sampling import check_params

        check_params(temperature, top_k, top_p)  # bad knobs fail before any step runs, not after the prompt
        toks = list(prompt)
        n_new = min(n_new, self.cfg.ctx - len(toks))  # the context (and the cache) holds ctx tokens
        dec = self.decoder(self.new_cache(), qweights, mode=mode, quiet=True) if cache else None
        logits = None
        if cache:
            for pos, t in enumerate(toks):
                logits = dec.step([t], pos)[0]
        for _ in range(n_new):
            if not cache:
                ctx = np.array([toks], np.int32)
                logits = self.be.host(self.forward(ctx)[0])[-1]
            nxt = pick(logits, temperature, top_k, top_p, seed, len(toks))
            toks.append(nxt)
            if cache and len(toks) < self.cfg.ctx:
                logits = dec.step([nxt], len(toks) - 1)[0]
        return toks


class Decoder:
    """Decode steps of one model on one KV cache, launched through the runtime (chapter 14).

    The first step runs the registered launchers and records their launches (kernels_src.runtime); later
    steps write the token and position into the static device buffer and replay: one cuLaunchKernel per
    kernel ("plan"), or one cuGraphLaunch for the whole step ("graph"). On the CPU and in the simulator a
    plan or graph cannot exist, and "auto" runs eagerly (``self.runner.why`` says why)."""

    def __init__(self, model, cache, qweights=None, batch=1, mode="auto", quiet=False):
        from ..runtime.graphs import StepRunner

        self.model, self.cache, self.qweights, self.batch = model, cache, qweights, batch
        if not model.be.gpu and mode == "auto":
            mode, why = "eager", "the CPU backend launches no GPU kernels"
        else:
            why = ""
        self.runner = StepRunner(lambda: model._decode_launches(batch, cache, qweights), mode, quiet=quiet)
        self.runner.why = self.runner.why or why
        self.mode = self.runner.mode
        self._state = None
        self._hstate = self._hlogits = None

    def step(self, tok, pos):
        """tok (B,) ints at position pos -> logits (B,V) on the host."""
        m = self.model
        if len(tok) != self.batch:
            raise ValueError(f"this decoder was built for batch {self.batch}, got {len(tok)} tokens")
        if not 0 <= pos < m.cfg.ctx:
            raise ValueError(f"position {pos} is outside the context (0..{m.cfg.ctx - 1})")
        r = self.runner
        state = m.be._ws.get("dec.state")
        if r.plan is not None and state is self._state and self._hstate is not None:
            # replay: the token and position go in, the logits come out, through pinned host buffers whose
            # copies are part of the replay (inside the graph)
            h = self._hstate.array
            h[0], h[1], h[2] = tok, pos, pos + 1
            r()
            return self._hlogits.array.copy()
        m._write_state(tok, pos, self.batch)
        state = m.be._ws.get("dec.state")
        if r.plan is not None and state is not self._state:  # the model's buffers were replaced (another
            r.plan = r.graph = None                            # batch size): record again
        self._state = state
        logits = m.be.ws("dec.logits", (self.batch, m.cfg.vocab))
        if r.plan is None and self.mode != "eager":
            from ..runtime.graphs import Pinned

            self._hstate, self._hlogits = Pinned((3, self.batch), np.int32), Pinned(logits.shape, np.float32)
            r.inputs, r.outputs = [(state, self._hstate.array)], [(self._hlogits.array, logits)]
        r()
        return m.be.host(logits)

    def describe(self) -> str:
        return self.runner.describe()


class Trainer:
    """Training steps (forward, backward, AdamW) of one model at one batch shape, launched through the
    runtime (chapter 14): the shapes are static, so every step launches the same kernels on the same buffers.

    The first step writes the batch into static device buffers (in.ids, in.tg), runs the registered launchers
    and records their launches; from the second on, a step is: wait for the previous one, write the batch
    into pinned host buffers, give the two AdamW launches their new arguments, replay. Only AdamW's scalars
    change from step to step (its bias corrections follow the step count, and the learning rate may follow a
    schedule); they are computed on the host as in an eager step (so a replay is bit-for-bit the same work)
    and set into the graph's two AdamW nodes (``Graph.set_launch``) instead of baked in at capture. The
    batch is copied in by the graph itself; the loss stays on the device (``loss()`` reads it).

    mode "graph": one cuGraphLaunch a step; "plan": one cuLaunchKernel per kernel; "eager": the registered
    launchers every step. Where no graph can exist ("auto" on the CPU or in the simulator; the MoE model, whose
    router reads its token counts on the host) the steps run eagerly and ``why`` says why in one line."""

    def __init__(self, model, batch, seq, mode="auto", quiet=False, **hyper):
        from ..runtime.graphs import MODES, available

        if mode not in MODES:
            raise ValueError(f"mode {mode!r} is not one of {', '.join(MODES)}")
        self.model, self.B, self.T, self.hyper = model, int(batch), int(seq), hyper
        self.why = ""
        if model.cfg.experts:
            self.why = "the MoE layer reads its routing on the host inside the step"
        elif not model.be.gpu:
            self.why = "the CPU backend launches no GPU kernels"
        else:
            ok, why = available()
            self.why = "" if ok else why
        if self.why:
            if mode not in ("auto", "eager"):
                raise RuntimeError(f"mode={mode!r}: {self.why}")
            if mode == "auto" and not quiet:
                import warnings

                warnings.warn(f"{self.why}; training eagerly", RuntimeWarning, stacklevel=3)
            mode = "eager"
        self.mode = "graph" if mode == "auto" else mode
        self.plan = self.graph = None
        self.n_adamw = 0
        self.split = ""  # set (with the reason) if AdamW's graph nodes cannot take new arguments
        self.steps = 0

    def _launch_fwd_bwd(self):
        self.model._forward_launches(self.B, self.T, True)
        self.model.backward()

    def step(self, ids, targets, lr):
        """One training step on ids, targets (B,T) ints with learning rate lr. Returns nothing: the loss
        stays on the device until loss() is asked for."""
        m = self.model
        ids, targets = np.asarray(ids), np.asarray(targets)
        if ids.shape != (self.B, self.T) or targets.shape != (self.B, self.T):
            raise ValueError(f"this trainer was built for batch shape {(self.B, self.T)}, got {ids.shape}")
        self.steps += 1
        if self.mode == "eager":
            m._write_inputs(ids, targets)
            self._launch_fwd_bwd()
            m.adamw(lr, **self.hyper)
            return
        if self.plan is None:
            self._record(ids, targets, lr)
            return
        from ..compiler.launch import pack, recording
        from ..runtime import graphs
        from ..runtime.graphs import _check
        from ..runtime.launch import Plan

        rec: list = []
        with recording(rec, execute=False):  # AdamW's launches with this step's scalars, not run
            m.adamw(lr, **self.hyper)
        if len(rec) != self.n_adamw:
            raise RuntimeError(f"AdamW made {len(rec)} launches, the captured step has {self.n_adamw}")
        packed = [pack(r) for r in rec]
        first = len(self.plan) - self.n_adamw
        from cuda.bindings import driver

        if self.graph is not None:
            self.graph.synchronize()  # the previous replay has read the pinned batch: overwrite it
            self._hids.array[...] = ids.reshape(-1)
            self._htg.array[...] = targets.reshape(-1)
            if not self.split:
                try:
                    for j, p in enumerate(packed):
                        self.graph.set_launch(first + j, p)
                except RuntimeError as e:  # this driver takes no new node arguments: AdamW outside the graph
                    self.split = f"AdamW launched after the graph ({e})"
                    self.graph = graphs.capture(Plan(self.plan.records[:first]), before=self._copy_in)
            self.graph.launch()
            if self.split:
                for p in packed:
                    p.launch(self.graph.stream)
        else:
            s = driver.CUstream(0)
            _check(driver.cuStreamSynchronize(s), "cuStreamSynchronize")
            self._hids.array[...] = ids.reshape(-1)
            self._htg.array[...] = targets.reshape(-1)
            for j, p in enumerate(packed):
                self.plan.packed[first + j] = p
            self._copy_in(s)
            self.plan.run(s)

    def _record(self, ids, targets, lr):
        from ..runtime import graphs
        from ..runtime.launch import Plan

        m = self.model
        m._write_inputs(ids, targets)
        fb, _ = Plan.record(self._launch_fwd_bwd)
        opt, _ = Plan.record(lambda: m.adamw(lr, **self.hyper))
        self.n_adamw = len(opt)
        self.plan = Plan(fb.records + opt.records)
        N = self.B * self.T
        self._ids_d, self._tg_d = m.be.ws("in.ids", (N,), np.int32), m.be.ws("in.tg", (N,), np.int32)
        self._total = m.be.ws("total", (1,))
        self._hids, self._htg = graphs.Pinned((N,), np.int32), graphs.Pinned((N,), np.int32)
        if self.mode == "graph":
            n = len(self.plan)
            try:
                self.graph = graphs.capture(self.plan, before=self._copy_in,
                                            updatable=range(n - self.n_adamw, n))
            except RuntimeError as e:  # the nodes could not be found: AdamW outside the graph
                self.split = f"AdamW launched after the graph ({e})"
                self.graph = graphs.capture(Plan(fb.records), before=self._copy_in)

    def _copy_in(self, stream):
        from ..runtime import graphs

        graphs.copy_in(self._ids_d, self._hids.array, stream)
        graphs.copy_in(self._tg_d, self._htg.array, stream)

    def synchronize(self):
        if self.graph is not None:
            self.graph.synchronize()
        self.model.be.sync()

    def loss(self) -> float:
        """The mean loss of the last step's forward (read from the device: this waits for the step)."""
        self.synchronize()
        be = self.model.be
        total = self._total if self.plan is not None else be.ws("total", (1,))
        return float(be.host(total)[0]) / (self.B * self.T) + self.model._aux

    def describe(self) -> str:
        if self.mode == "eager":
            return "eager" + (f" ({self.why})" if self.why else "")
        n = len(self.plan) if self.plan is not None else "?"
        if self.split:
            return f"{self.mode} of {n} launches; {self.split}"
        return f"{self.mode} of {n} launches ({self.n_adamw} AdamW launches updated per step)"


def _put(be, dev, host):
    """host values into the existing buffer dev (a copy on the GPU, an assignment on the CPU)."""
    host = np.ascontiguousarray(host, dtype=dev.dtype)
    if be.gpu:
        dev.copy_to_device(host)
    else:
        dev[...] = host


def _runs(ranges):
    """(lo, hi) ranges -> the sorted contiguous runs they make: [(0, 4), (4, 9), (12, 13)] -> [(0, 9), (12, 13)]."""
    out = []
    for lo, hi in sorted(ranges):
        if out and out[-1][1] == lo:
            out[-1] = (out[-1][0], hi)
        else:
            out.append((lo, hi))
    return out


def mm_dx(be, out, G, W):
    """out (M,K) = G (M,N) W^T, W (K,N): role gemm_nt. The dispatcher runs chapter 5's GEMM on a transposed
    copy of W, or for one row chapter 4's y = W x GEMV on W as it is."""
    be("gemm_nt", out, G, W)


def mm_dw(be, out, X, G):
    """out (K,N) = X^T G, X (M,K), G (M,N): role gemm_tn, a GEMM on a transposed copy of X (split-K when
    the M = B*T token rows are many and the output small)."""
    be("gemm_tn", out, X, G)


def add(be, out, a, b):
    """out = a + b elementwise (a residual connection): chapter 1's axpy with a = 1, on flat views."""
    be("add", out.reshape(-1), np.float32(1.0), a.reshape(-1), b.reshape(-1))


def pick(logits, temperature, top_k, top_p, seed, step):
    """The next token from one row of logits (V floats on the host), by chapter 16's ``sample`` op: greedy at
    temperature 0 (the largest logit, the smallest index on a tie), else a draw from softmax(logits / T)
    cut to the top k tokens and to the smallest set whose probability reaches top_p. The draw's uniform is
    Philox's at (seed, step), so a seed gives the same tokens on the CPU, in the simulator and on a GPU,
    whatever ran the model, and however the steps were launched."""
    from ..ops.sampling import sample

    return int(sample(np.asarray(logits, np.float32).reshape(1, -1), temperature, top_k, top_p, seed, step)[0])
