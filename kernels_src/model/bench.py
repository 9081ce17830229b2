"""The capstone's GPU run: parity, speed against torch, a per-kernel breakdown, a short training run.

    python -m kernels_src.model.bench OUT.json [--quick]

Writes OUT.json after every stage, so a run cut short still leaves what it measured. Stages:
  parity_ref    the GPU model vs the float64 reference (tiny config): logits, loss, every gradient
  train_step    our training step (forward, backward, AdamW): median seconds, tokens/s, and a
                per-role breakdown (each kernel call synchronised and timed)
  decode_step   our decode step with the KV cache at position POS (batch 1), fp32 and Q8_0/Q4_0 weights
  torch         the same model in torch eager (fp32, TF32 off, SDPA, AdamW fused): step and decode
                times, and its logits and gradients from our weights against ours
  training      a short run on the course's prose: losses, held-out loss, samples
"""
from __future__ import annotations

import json
import math
import sys
import time

import numpy as np

from .. import device
from . import data
from .gpt import GPT, backend
from .reference import Config, ReferenceGPT, init_params

from .configs import BATCH, BENCH, LARGE, POS, TRAIN_CONFIGS  # noqa: F401  (the measured sizes)


def median_time(fn, reps=10, warm=2) -> float:
    """Median wall seconds of ``fn()`` after ``warm`` untimed calls, the device drained around every call."""
    for _ in range(warm):
        fn()
    device.synchronize()
    ts = []
    for _ in range(reps):
        device.synchronize()
        t0 = time.perf_counter()
        fn()
        device.synchronize()
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts))


def parity_ref(cfg=Config(vocab=29, ctx=16, width=128, heads=2, layers=2), B=2, T=11, seed=1):
    p = init_params(cfg, seed)
    rng = np.random.default_rng(seed + 100)
    p = {k: v + 0.1 * rng.standard_normal(v.shape) for k, v in p.items()}
    ids, tg = rng.integers(0, cfg.vocab, (B, T)), rng.integers(0, cfg.vocab, (B, T))
    ref = ReferenceGPT(cfg, p)
    lr, loss_r = ref.forward(ids, tg)
    gr = ref.backward()
    m = GPT(cfg, p, "gpu")
    logits, loss = m.forward(ids, tg)
    m.backward()
    g = m.grads()
    out = {"config": cfg.__dict__, "B": B, "T": T,
           "logits": _err(m.be.host(logits), lr.reshape(B * T, -1)), "loss": _err(np.array([loss]), np.array([loss_r]))}
    out["grads"] = {k: _err(g[k], gr[k]) for k in gr}
    return out


def _err(got, want):
    got = np.asarray(got, np.float64)
    want = np.asarray(want, np.float64).reshape(got.shape)
    e, s = float(np.abs(got - want).max()), float(np.abs(want).max())
    return {"max_abs": e, "max_ref": s, "rel_to_max": e / s if s else e}


def train_step(model, ids, tg):
    def step():
        model.forward(ids, tg)
        model.backward()
        model.adamw(1e-4)

    t = median_time(step)
    with model.be.profile() as times:
        step()
    return {"median_s": t, "tokens_per_s": ids.size / t, "breakdown_s": times,
            "roles": {r: model.be.table[r] for r in times}}


def decode_step(model, pos=POS, qweights=None):
    cache = model.new_cache()
    tok = [3]
    t = median_time(lambda: model.decode_step(tok, pos, cache, qweights), reps=30, warm=3)
    with model.be.profile() as times:
        model.decode_step(tok, pos, cache, qweights)
    return {"median_s": t, "tokens_per_s": 1.0 / t, "breakdown_s": times}


# ------------------------------------------------------------------------------------------ torch
def torch_model(cfg, params, host_logits=True):
    import torch
    import torch.nn.functional as F

    from ..ops.rope import cos_sin_cache

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    P = {k: torch.tensor(np.asarray(v, np.float32), device="cuda", requires_grad=True) for k, v in params.items()}
    cos, sin = (torch.tensor(a, device="cuda") for a in cos_sin_cache(cfg.ctx, cfg.head_dim))
    H, D, C = cfg.heads, cfg.head_dim, cfg.width

    def rope(x, c, s):  # x (B,H,T,D) half-split pairs; c, s (T, D/2)
        a, b = x[..., :D // 2], x[..., D // 2:]
        return torch.cat([a * c - b * s, b * c + a * s], dim=-1)

    def moe(h, i):  # chapter 18's layer as the torch loop over experts a user writes (moe_layer's torch_loop)
        logits = h @ P[f"h{i}.wr"]
        w, ids = torch.sort(torch.softmax(logits, dim=-1), dim=-1, descending=True, stable=True)
        w, ids = w[:, :cfg.topk], ids[:, :cfg.topk]
        w = w / w.sum(dim=-1, keepdim=True)
        res = torch.zeros_like(h)
        for e in range(cfg.experts):
            tok, j = torch.where(ids == e)
            if tok.numel() == 0:  # a host synchronisation per expert, as in the usual loop
                continue
            xe = h[tok]
            u = F.silu(xe @ P[f"h{i}.wg"][e]) * (xe @ P[f"h{i}.wu"][e])
            res = res.index_add(0, tok, (u @ P[f"h{i}.w2"][e]) * w[tok, j].unsqueeze(1))
        return res

    def mlp(h, i):
        if cfg.experts:
            return moe(h.reshape(-1, C), i).view(h.shape)
        return F.gelu(h @ P[f"h{i}.wfc"]) @ P[f"h{i}.wproj"]

    def forward(ids, targets=None):
        B, T = ids.shape
        x = P["wte"][ids]
        c, s = cos[:T], sin[:T]
        for i in range(cfg.layers):
            h = F.rms_norm(x, (C,), P[f"h{i}.g1"], eps=1e-5)
            qkv = (h @ P[f"h{i}.wqkv"]).view(B, T, 3, H, D).permute(2, 0, 3, 1, 4)
            q, k, v = rope(qkv[0], c, s), rope(qkv[1], c, s), qkv[2]
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + o.transpose(1, 2).reshape(B, T, C) @ P[f"h{i}.wo"]
            h = F.rms_norm(x, (C,), P[f"h{i}.g2"], eps=1e-5)
            x = x + mlp(h, i)
        logits = F.rms_norm(x, (C,), P["gf"], eps=1e-5) @ P["wte"].T
        if targets is None:
            return logits, None
        return logits, F.cross_entropy(logits.view(B * T, -1), targets.view(-1))

    def decode(tok, pos, cache):
        with torch.no_grad():
            x = P["wte"][tok]  # (1,C)
            c, s = cos[pos:pos + 1], sin[pos:pos + 1]
            for i in range(cfg.layers):
                K, V = cache[i]
                h = F.rms_norm(x, (C,), P[f"h{i}.g1"], eps=1e-5)
                qkv = (h @ P[f"h{i}.wqkv"]).view(1, 3, H, 1, D)
                q, k = rope(qkv[:, 0], c, s), rope(qkv[:, 1], c, s)
                K[:, :, pos:pos + 1] = k
                V[:, :, pos:pos + 1] = qkv[:, 2]
                o = F.scaled_dot_product_attention(q, K[:, :, :pos + 1], V[:, :, :pos + 1])
                x = x + o.reshape(1, C) @ P[f"h{i}.wo"]
                h = F.rms_norm(x, (C,), P[f"h{i}.g2"], eps=1e-5)
                x = x + mlp(h, i)
            logits = F.rms_norm(x, (C,), P["gf"], eps=1e-5) @ P["wte"].T
            return logits.cpu() if host_logits else logits   # on the device: capturable in a CUDA graph

    return P, forward, decode


def torch_graph_decode(cfg, params, pos):
    """torch's decode step at position pos captured in a CUDA graph (static token, cache and logits);
    returns (graph, run) where run() replays it and copies the logits to the host."""
    import torch

    _P, _fwd, decode = torch_model(cfg, params, host_logits=False)
    H, D = cfg.heads, cfg.head_dim
    cache = [(torch.zeros(1, H, cfg.ctx, D, device="cuda"), torch.zeros(1, H, cfg.ctx, D, device="cuda"))
             for _ in range(cfg.layers)]
    tok = torch.tensor([3], device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            decode(tok, pos, cache)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        logits = decode(tok, pos, cache)

    def run():
        g.replay()
        return logits.cpu()

    return g, run


def torch_stage(cfg, params, model, ids, tg):
    import torch

    P, forward, decode = torch_model(cfg, params)
    ids_t = torch.tensor(ids, device="cuda", dtype=torch.long)
    tg_t = torch.tensor(tg, device="cuda", dtype=torch.long)
    out = {"torch": torch.__version__}
    # parity: torch's logits and gradients against ours (same float32 weights)
    logits, loss = forward(ids_t, tg_t)
    loss.backward()
    ours_logits, ours_loss = model.forward(ids, tg)
    model.backward()
    g = model.grads()
    out["parity"] = {"logits": _err(model.be.host(ours_logits), logits.detach().cpu().numpy()),
                     "loss": _err(np.array([ours_loss]), np.array([loss.item()])),
                     "grads": {k: _err(g[k], P[k].grad.cpu().numpy()) for k in P}}
    opt = torch.optim.AdamW(list(P.values()), lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0, fused=True)

    def step():
        opt.zero_grad(set_to_none=False)
        _, l_ = forward(ids_t, tg_t)
        l_.backward()
        opt.step()

    t = median_time(step)
    out["train_step"] = {"median_s": t, "tokens_per_s": ids.size / t}
    H, D = cfg.heads, cfg.head_dim
    cache = [(torch.zeros(1, H, cfg.ctx, D, device="cuda"), torch.zeros(1, H, cfg.ctx, D, device="cuda"))
             for _ in range(cfg.layers)]

    def dstep():
        decode(torch.tensor([3], device="cuda"), POS, cache)

    t = median_time(dstep, reps=30, warm=3)
    out["decode_step"] = {"median_s": t, "tokens_per_s": 1.0 / t}
    return out


def training(cfg, steps=300, seconds=30.0):
    tokens = data.encode(data.corpus())
    tr, va = data.split(tokens)
    m = GPT(cfg, init_params(cfg, 0), "gpu")
    it = data.batches(tr, BATCH, 128, seed=0)
    hist = {"step": [], "loss": [], "val_step": [], "val": []}
    t0 = time.perf_counter()
    for s in range(steps):
        lr = 1e-3 * min(1.0, (s + 1) / 20) * (0.1 + 0.45 * (1 + math.cos(math.pi * s / steps)))
        ids, tg = next(it)
        hist["step"].append(s + 1)
        hist["loss"].append(m.train_step(ids, tg, lr))
        if (s + 1) % 50 == 0:
            hist["val_step"].append(s + 1)
            hist["val"].append(data.evaluate(m, va, BATCH, 128))
        if time.perf_counter() - t0 > seconds:
            break
    hist["seconds"] = time.perf_counter() - t0
    prompt = list(data.encode("The kernel "))
    hist["samples"] = {"greedy": data.decode(m.generate(prompt, 100)),
                       "temperature_0.8": data.decode(m.generate(prompt, 100, temperature=0.8, seed=1))}
    hist["batch"], hist["ctx"] = BATCH, 128
    return hist


# ------------------------------------------------------------------------------ decode through the runtime
def decode_compare(cfg, pos, reps=50, compile_torch=True) -> dict:
    """Batch-1 decode tokens/s at position pos: the course model (fp32, Q8_0, Q4_0) launched eagerly, as a
    launch plan and as a CUDA graph (kernels_src.runtime), against torch eager, torch.compile and torch
    replayed in a CUDA graph. Every step ends with the logits on the host. Medians of reps steps."""
    import torch

    params = init_params(cfg, 0)
    model = GPT(cfg, params, "gpu")
    out = {"config": cfg.__dict__, "pos": pos, "reps": reps, "course": {}, "torch": {"version": torch.__version__}}
    ref_logits = None
    for fmt in ("fp32", "q8_0", "q4_0"):
        qw = None if fmt == "fp32" else model.quantize(fmt)[0]
        for mode in ("eager", "plan", "graph"):
            cache = model.new_cache()
            dec = model.decoder(cache, qw, mode=mode)
            first = dec.step([3], pos)
            t = median_time(lambda: dec.step([3], pos), reps=reps, warm=3)
            again = dec.step([3], pos)
            e = {"median_s": t, "tokens_per_s": 1.0 / t, "mode": dec.describe(),
                 "replay_equals_first": bool(np.array_equal(first, again))}
            if mode == "eager":
                ref_logits = again
            else:
                e["max_abs_vs_eager"] = float(np.abs(again - ref_logits).max())
            out["course"][f"{fmt}_{mode}"] = e
            print(f"decode {fmt:5s} {mode:6s} {1e6 * t:9.1f} us  {1 / t:9.0f} tok/s", flush=True)
    _P, _fwd, decode = torch_model(cfg, params)
    H, D = cfg.heads, cfg.head_dim
    cache = [(torch.zeros(1, H, cfg.ctx, D, device="cuda"), torch.zeros(1, H, cfg.ctx, D, device="cuda"))
             for _ in range(cfg.layers)]
    tok = torch.tensor([3], device="cuda")
    t = median_time(lambda: decode(tok, pos, cache), reps=reps, warm=3)
    out["torch"]["eager"] = {"median_s": t, "tokens_per_s": 1.0 / t}
    print(f"torch eager {1e6 * t:9.1f} us", flush=True)
    _g, run = torch_graph_decode(cfg, params, pos)
    t = median_time(run, reps=reps, warm=3)
    out["torch"]["graph"] = {"median_s": t, "tokens_per_s": 1.0 / t}
    print(f"torch graph {1e6 * t:9.1f} us", flush=True)
    if compile_torch:
        try:
            t0 = time.perf_counter()
            cdec = torch.compile(decode, dynamic=False)
            for _ in range(3):
                cdec(tok, pos, cache)
            comp_s = time.perf_counter() - t0
            t = median_time(lambda: cdec(tok, pos, cache), reps=reps, warm=3)
            out["torch"]["compile"] = {"median_s": t, "tokens_per_s": 1.0 / t, "compile_s": comp_s}
            print(f"torch compile {1e6 * t:9.1f} us", flush=True)
        except Exception as e:  # report, keep the rest
            out["torch"]["compile"] = {"error": f"{type(e).__name__}: {e}"[:500]}
    return out


def decode_main(path, configs=("bench", "large"), reps=50, compile_torch=True):
    """python -m kernels_src.model.bench --decode OUT.json [--config bench|large] [--no-compile]"""
    res = {"device": device.describe(), "configs": {}}
    for name in configs:
        cfg = Config(**(BENCH if name == "bench" else LARGE))
        res["configs"][name] = decode_compare(cfg, POS if name == "bench" else cfg.ctx // 2, reps, compile_torch)
        with open(path, "w") as f:
            json.dump(res, f, indent=1, default=float)
    return res


# ------------------------------------------------------------------------------ training through the dispatcher
def train_compare(cfg, B, T, reps=10, compile_torch=True, out=None, save=lambda: None) -> dict:
    """Training tokens/s (forward, backward, AdamW; fp32, TF32 off) of the course model, every call dispatched
    by shape (kernels_src.runtime.dispatch, with this GPU's table), against the same model in torch eager and
    torch.compile. Also: the losses of both on the same batch, the per-role breakdown (every call synchronised)
    and the dispatcher's decision for every call of the step."""
    import torch

    from .explain import explain

    params = init_params(cfg, 0)
    rng = np.random.default_rng(0)
    ids, tg = rng.integers(0, cfg.vocab, (B, T)), rng.integers(0, cfg.vocab, (B, T))
    model = GPT(cfg, params, "gpu")
    out = {} if out is None else out  # filled stage by stage; save() after each (a run cut short keeps them)
    out.update({"config": cfg.__dict__, "batch": B, "T": T, "tokens": B * T, "n_params": model.n_params,
                "table": model.be.dispatch.table_source, "thresholds": model.be.dispatch.thresholds})
    _, loss = model.forward(ids, tg)
    out["course_loss"] = loss

    def step():
        model.forward(ids, tg)
        model.backward()
        model.adamw(1e-4)

    ts = []
    for _ in range(3):  # three medians of reps steps: how repeatable one run is
        ts.append(median_time(step, reps=reps, warm=2))
    t = float(np.median(ts))
    with model.be.profile() as times:
        step()
    out["course"] = {"median_s": t, "tokens_per_s": B * T / t, "medians_s": ts, "breakdown_s": times,
                     "roles": {r: model.be.table[r] for r in times}}
    print(f"train course {1e3 * t:8.2f} ms  {B * T / t:10.0f} tok/s  {ts}", flush=True)
    out["decisions"] = explain("train", cfg, dev="gpu", table=model.be.dispatch.table or {}, batch=B, seq=T)
    save()
    # the same step through the runtime: captured once as a CUDA graph, one cuGraphLaunch a step (AdamW's
    # scalars set per step); the batch is copied in by the graph, the loss stays on the device
    try:
        tr = model.trainer(B, T, mode="graph")
        gstep = lambda: tr.step(ids, tg, 1e-4)  # noqa: E731
        ts = [median_time(gstep, reps=reps, warm=2) for _ in range(3)]
        t = float(np.median(ts))
        out["course_graph"] = {"median_s": t, "tokens_per_s": B * T / t, "medians_s": ts, "mode": tr.describe()}
        print(f"train course graph {1e3 * t:8.2f} ms  {ts}", flush=True)
        out["graph_check"] = graph_check(cfg, params, ids, tg)
    except Exception as e:  # report, keep the rest
        import traceback

        out["course_graph"] = {"error": f"{type(e).__name__}: {e}"[:500], "trace": traceback.format_exc()[-1500:]}
    save()
    del model
    P, forward, _dec = torch_model(cfg, params)
    ids_t = torch.tensor(ids, device="cuda", dtype=torch.long)
    tg_t = torch.tensor(tg, device="cuda", dtype=torch.long)
    out["torch_loss"] = float(forward(ids_t, tg_t)[1].item())
    opt = torch.optim.AdamW(list(P.values()), lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0, fused=True)

    def tstep(fwd):
        opt.zero_grad(set_to_none=False)
        _, l_ = fwd(ids_t, tg_t)
        l_.backward()
        opt.step()

    ts = [median_time(lambda: tstep(forward), reps=reps, warm=2) for _ in range(3)]
    t = float(np.median(ts))
    out["torch_eager"] = {"median_s": t, "tokens_per_s": B * T / t, "medians_s": ts}
    print(f"train torch eager {1e3 * t:8.2f} ms", flush=True)
    out["vs_torch_eager"] = out["course"]["tokens_per_s"] / out["torch_eager"]["tokens_per_s"]
    save()
    if compile_torch:
        try:
            t0 = time.perf_counter()
            cf = torch.compile(forward)
            for _ in range(2):
                tstep(cf)
            comp = time.perf_counter() - t0
            ts = [median_time(lambda: tstep(cf), reps=reps, warm=2) for _ in range(3)]
            t = float(np.median(ts))
            out["torch_compile"] = {"median_s": t, "tokens_per_s": B * T / t, "medians_s": ts, "compile_s": comp}
            print(f"train torch compile {1e3 * t:8.2f} ms", flush=True)
        except Exception as e:  # report, keep the rest
            out["torch_compile"] = {"error": f"{type(e).__name__}: {e}"[:500]}
    try:  # torch's whole step captured in a CUDA graph (static batch, capturable fused AdamW)
        ts = torch_graph_train(cfg, params, ids_t, tg_t, reps)
        t = float(np.median(ts))
        out["torch_graph"] = {"median_s": t, "tokens_per_s": B * T / t, "medians_s": ts}
        print(f"train torch graph {1e3 * t:8.2f} ms", flush=True)
    except Exception as e:  # report, keep the rest
        out["torch_graph"] = {"error": f"{type(e).__name__}: {e}"[:500]}
    for k in ("torch_eager", "torch_compile", "torch_graph"):
        if "tokens_per_s" in out.get(k, {}):
            out[f"vs_{k}"] = out["course"]["tokens_per_s"] / out[k]["tokens_per_s"]
            if "tokens_per_s" in out.get("course_graph", {}):
                out[f"graph_vs_{k}"] = out["course_graph"]["tokens_per_s"] / out[k]["tokens_per_s"]
    for k in ("course", "course_graph", "torch_eager", "torch_compile", "torch_graph"):
        ms = out.get(k, {}).get("medians_s")
        if ms:  # how far apart the three medians of this run are, relative to their median
            out[k]["spread"] = (max(ms) - min(ms)) / float(np.median(ms))
    return out


def graph_check(cfg, params, ids, tg, steps=3, lrs=(1e-3, 3e-4, 2e-3)):
    """Two fresh models, the same steps (a changing learning rate): eager against the replayed graph. The
    largest loss and parameter differences (0: bit-identical)."""
    res = {}
    for mode in ("eager", "graph"):
        m = GPT(cfg, params, "gpu")
        tr = m.trainer(*ids.shape, mode=mode)
        losses = []
        for s in range(steps):
            tr.step(ids, tg, lrs[s % len(lrs)])
            losses.append(tr.loss())
        res[mode] = (np.array(losses), m.params())
        del m, tr
    (le, pe), (lg, pg) = res["eager"], res["graph"]
    dp = max(float(np.abs(pg[k] - pe[k]).max()) for k in pe)
    return {"steps": steps, "losses_eager": le.tolist(), "losses_graph": lg.tolist(),
            "max_abs_loss": float(np.abs(lg - le).max()), "max_abs_param": dp,
            "bit_identical": bool(np.array_equal(lg, le) and dp == 0.0)}


def torch_graph_train(cfg, params, ids_t, tg_t, reps=10):
    """torch's training step (forward, backward, fused AdamW with capturable=True) captured in one CUDA graph,
    the recipe of torch.cuda.graph's documentation (warm-up on a side stream, grads set to None before
    capture). Returns three medians of reps replays."""
    import torch

    P, forward, _dec = torch_model(cfg, params)
    opt = torch.optim.AdamW(list(P.values()), lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0, fused=True,
                            capturable=True)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            forward(ids_t, tg_t)[1].backward()
            opt.step()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(g):
        forward(ids_t, tg_t)[1].backward()
        opt.step()
    return [median_time(g.replay, reps=reps, warm=2) for _ in range(3)]


def train_main(path, configs=("bench", "large"), compile_torch=True):
    """python -m kernels_src.model.bench --train OUT.json [--config bench|large] [--no-compile]"""
    res = {"device": device.describe(), "configs": {}}
    for name in configs:
        cfg, B, T = TRAIN_CONFIGS[name]

        def save():
            with open(path, "w") as f:
                json.dump(res, f, indent=1, default=float)

        res["configs"][name] = out = {}
        try:
            train_compare(Config(**cfg), B, T, compile_torch=compile_torch, out=out, save=save)
        except Exception as e:  # keep what the other config measured
            import traceback

            out.update(error=f"{type(e).__name__}: {e}", trace=traceback.format_exc()[-2000:])
        save()
    return res


def main(path, quick=False):
    res = {"device": device.describe(), "bench_config": BENCH, "batch": BATCH, "decode_pos": POS, "stages": {}}

    def save():
        with open(path, "w") as f:
            json.dump(res, f, indent=1, default=float)

    def stage(name, fn):
        t0 = time.perf_counter()
        try:
            res["stages"][name] = fn()
        except Exception as e:  # keep going: a later stage may still work
            import traceback

            res["stages"][name] = {"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-2000:]}
        res["stages"][name + "_wall_s"] = time.perf_counter() - t0
        print(name, "done in", round(time.perf_counter() - t0, 1), "s", flush=True)
        save()

    cfg = Config(**BENCH) if not quick else Config(vocab=data.VOCAB, ctx=16, width=64, heads=1, layers=1)
    B = BATCH if not quick else 1
    T = 256 if not quick else 8
    params = init_params(cfg, 0)
    rng = np.random.default_rng(0)
    ids, tg = rng.integers(0, cfg.vocab, (B, T)), rng.integers(0, cfg.vocab, (B, T))
    stage("parity_ref", parity_ref if not quick else
          lambda: parity_ref(Config(vocab=7, ctx=8, width=64, heads=1, layers=1), B=1, T=3))
    model = GPT(cfg, params, "gpu")
    res["n_params"] = model.n_params
    stage("train_step", lambda: train_step(model, ids, tg))
    pos = POS if not quick else 4
    stage("decode_fp32", lambda: decode_step(model, pos))
    if not quick:
        stage("torch", lambda: torch_stage(cfg, params, GPT(cfg, params, "gpu"), ids, tg))
    for fmt in ("q8_0", "q4_0"):
        stage(f"decode_{fmt}", lambda fmt=fmt: decode_step(model, pos, model.quantize(fmt)[0]))
    if not quick:
        stage("training", lambda: training(Config(vocab=data.VOCAB, ctx=128, width=256, heads=4, layers=4)))
    save()
    return res


# ------------------------------------------------------------------------------ the MoE model (chapter 18)
def moe_compare(path, cfg=None, B=16, T=256, pos=POS, reps=5):
    """python -m kernels_src.model.bench --moe OUT.json: the MoE GPT (MOE_BENCH: the bench model with 8 SwiGLU
    experts, top 2) against the same model in torch eager (its MoE as the loop over experts a user writes, fp32,
    TF32 off): logits and loss parity on one batch, training step (forward, backward, AdamW), forward alone,
    and a batch-1 decode step at position pos (the course's through the dispatcher's "moe" role, eager and,
    where capture works, as a CUDA graph; torch's loop synchronises with the host once per expert, so it
    cannot be captured). Written after every stage."""
    import torch

    from .configs import MOE_BENCH

    cfg = cfg or Config(**MOE_BENCH)
    res = {"device": device.describe(), "config": cfg.__dict__, "batch": B, "T": T, "tokens": B * T, "pos": pos,
           "reps": reps, "torch": torch.__version__}

    def save():
        with open(path, "w") as f:
            json.dump(res, f, indent=1, default=float)

    def stage(name, fn):
        t0 = time.perf_counter()
        try:
            res[name] = fn()
        except Exception as e:  # keep what the other stages measure
            import traceback

            res[name] = {"error": f"{type(e).__name__}: {e}"[:500], "trace": traceback.format_exc()[-1500:]}
        print(name, round(time.perf_counter() - t0, 1), "s", json.dumps(res[name], default=float)[:300], flush=True)
        save()

    params = init_params(cfg, 0)
    rng = np.random.default_rng(0)
    ids, tg = rng.integers(0, cfg.vocab, (B, T)), rng.integers(0, cfg.vocab, (B, T))
    model = GPT(cfg, params, "gpu")
    res["n_params"] = model.n_params

    def course_train():
        def step():
            model.forward(ids, tg)
            model.backward()
            model.adamw(1e-4)
        t = median_time(step, reps=reps)
        return {"median_s": t, "tokens_per_s": B * T / t}

    def course_forward():
        t = median_time(lambda: model.forward(ids, tg), reps=reps)
        return {"median_s": t, "tokens_per_s": B * T / t}

    def course_decode():
        out = {}
        for mode in ("eager", "graph"):
            try:
                dec = model.decoder(model.new_cache(), mode=mode, quiet=True)
                first = dec.step([3], pos)
                t = median_time(lambda: dec.step([3], pos), reps=30, warm=3)
                out[mode] = {"median_s": t, "tokens_per_s": 1.0 / t, "mode": dec.describe(),
                             "replay_equals_first": bool(np.array_equal(first, dec.step([3], pos)))}
            except Exception as e:
                out[mode] = {"error": f"{type(e).__name__}: {e}"[:300]}
        out["moe_kernel"] = model.be.table.get("moe")
        return out

    stage("course_forward", course_forward)
    stage("course_train_step", course_train)
    stage("course_decode", course_decode)
    fresh = GPT(cfg, params, "gpu")
    c_logits, c_loss = fresh.forward(ids, tg)
    c_logits = fresh.be.host(c_logits)
    del fresh, model
    P, forward, decode = torch_model(cfg, params)
    ids_t = torch.tensor(ids, device="cuda", dtype=torch.long)
    tg_t = torch.tensor(tg, device="cuda", dtype=torch.long)

    def parity():
        with torch.no_grad():
            lg, loss = forward(ids_t, tg_t)
        return {"logits": _err(c_logits, lg.cpu().numpy()), "loss": _err(np.array([c_loss]), np.array([loss.item()]))}

    def torch_forward():
        def f():
            with torch.no_grad():
                forward(ids_t, tg_t)
        t = median_time(f, reps=reps)
        return {"median_s": t, "tokens_per_s": B * T / t, "what": "torch eager, no_grad"}

    def torch_train():
        opt = torch.optim.AdamW(list(P.values()), lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0, fused=True)

        def step():
            opt.zero_grad(set_to_none=False)
            forward(ids_t, tg_t)[1].backward()
            opt.step()
        t = median_time(step, reps=reps)
        return {"median_s": t, "tokens_per_s": B * T / t}

    def torch_decode():
        H, D = cfg.heads, cfg.head_dim
        cache = [(torch.zeros(1, H, cfg.ctx, D, device="cuda"), torch.zeros(1, H, cfg.ctx, D, device="cuda"))
                 for _ in range(cfg.layers)]
        tok = torch.tensor([3], device="cuda")
        t = median_time(lambda: decode(tok, pos, cache), reps=30, warm=3)
        return {"eager": {"median_s": t, "tokens_per_s": 1.0 / t}}

    stage("parity_vs_torch", parity)
    stage("torch_forward", torch_forward)
    stage("torch_train_step", torch_train)
    stage("torch_decode", torch_decode)
    for a, b, key in (("course_forward", "torch_forward", "forward"), ("course_train_step", "torch_train_step", "train")):
        if "median_s" in res.get(a, {}) and "median_s" in res.get(b, {}):
            res[f"vs_torch_{key}"] = res[b]["median_s"] / res[a]["median_s"]
    for mode in ("eager", "graph"):
        c, t = res.get("course_decode", {}).get(mode, {}), res.get("torch_decode", {}).get("eager", {})
        if "median_s" in c and "median_s" in t:
            res[f"vs_torch_decode_{mode}"] = t["median_s"] / c["median_s"]
    save()
    return res


if __name__ == "__main__":
    if "--moe" in sys.argv:
        moe_compare([a for a in sys.argv[1:] if not a.startswith("--")][0])
    elif "--decode" in sys.argv:
        argv = [a for a in sys.argv[1:] if not a.startswith("--")]
        cfgs = [sys.argv[sys.argv.index("--config") + 1]] if "--config" in sys.argv else ["bench", "large"]
        argv = [a for a in argv if a not in cfgs]
        decode_main(argv[0], cfgs, compile_torch="--no-compile" not in sys.argv)
    elif "--train" in sys.argv:
        argv = [a for a in sys.argv[1:] if not a.startswith("--")]
        cfgs = [sys.argv[sys.argv.index("--config") + 1]] if "--config" in sys.argv else ["bench", "large"]
        argv = [a for a in argv if a not in cfgs]
        train_main(argv[0], cfgs, compile_torch="--no-compile" not in sys.argv)
    else:
        main(sys.argv[1], quick="--quick" in sys.argv)
