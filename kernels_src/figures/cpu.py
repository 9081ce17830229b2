"""The CPU scoreboard in the book: every op's best CPU rung against torch on the CPU and the NumPy formula.

Drawn from book/data/bench/cpu/<machine>/cpuboard.json, written by ``kernels cpuboard --again`` (one run, every
op, then a second pass over the best rungs and baselines). Nothing here times anything.
"""
from __future__ import annotations

import math

import numpy as np

from ..bench import fmt_time, load_json
from ..paths import BENCH_DATA, CPU_BENCH_DATA


def _folder(machine: str | None):
    return CPU_BENCH_DATA if machine is None else BENCH_DATA / "cpu" / machine


def load_board(path=None, machine: str | None = None) -> dict | None:
    """The committed scoreboard of the book's CPU machine (or of ``machine``, a folder name under
    book/data/bench/cpu), or None where it has not been measured."""
    p = path or _folder(machine) / "cpuboard.json"
    return load_json(p) if p.exists() else None


def machine(board: dict) -> str:
    m = board["meta"]
    return (f"{m.get('cpu_model', '?')}, {m.get('cpu_count', '?')} cores ({m.get('cpu_threads', '?')} Numba threads; "
            f"SIMD {', '.join(m.get('simd', [])) or '?'})")


def _chapter(op: str):
    from ..registry import get_op

    try:
        return get_op(op).chapter
    except KeyError:
        return None


def goals(board: dict) -> dict:
    """Counts behind the issue's goals: ops at least as fast as torch / NumPy, memory-bound ops at >= 70 % of
    the copy bandwidth, and the largest spread between the two runs."""
    rows = board["rows"]
    vs_t = [r for r in rows if r.get("vs_torch")]
    vs_n = [r for r in rows if r.get("vs_numpy")]
    mem = [r for r in rows if r["kind"] == "memory" and r.get("frac_copy") is not None]
    spreads = [r["run_spread"] for r in rows if "run_spread" in r]
    return {"ops": len(rows), "with_torch": len(vs_t), "beat_torch": sum(r["vs_torch"] >= 1.0 for r in vs_t),
            "with_numpy": len(vs_n), "beat_numpy": sum(r["vs_numpy"] >= 1.0 for r in vs_n),
            "memory_ops": len(mem), "copy70": sum(r["frac_copy"] >= 0.70 for r in mem),
            "max_spread": max(spreads) if spreads else None,
            "median_spread": float(np.median(spreads)) if spreads else None,
            "behind_torch": [r["op"] for r in vs_t if r["vs_torch"] < 1.0],
            "behind_numpy": [r["op"] for r in vs_n if r["vs_numpy"] < 1.0]}


def board_table(board: dict, ops=None) -> str:
    """A Markdown table: one row per op (sorted by chapter), the best rung, its time, the ratios (> 1: the
    course is faster) and, for memory-bound ops, the fraction of the copy bandwidth."""
    rows = [r for r in board["rows"] if not ops or r["op"] in ops]
    rows.sort(key=lambda r: (_chapter(r["op"]) or 99, r["op"]))
    out = ["| ch | op | size | best course rung | median | vs NumPy | vs torch | % of copy | 2nd run |",
           "|---|---|---|---|---|---|---|---|---|"]

    def ratio(x):
        return "–" if not x else (f"**{x:.2f}×**" if x >= 1.0 else f"{x:.2f}×")

    for r in rows:
        frac = f"{100 * r['frac_copy']:.0f} %" if r.get("frac_copy") is not None and r["kind"] == "memory" else "–"
        spread = f"±{100 * r['run_spread']:.0f} %" if "run_spread" in r else "–"
        out.append(f"| {_chapter(r['op']) or ''} | {r['op']} | {r['size_label']} | {r['best']} | "
                   f"{fmt_time(r['best_s'], 'µs')} | {ratio(r.get('vs_numpy'))} | {ratio(r.get('vs_torch'))} | "
                   f"{frac} | {spread} |")
    return "\n".join(out)


def ops_table(ops, machine: str | None = None) -> str:
    """The scoreboard rows of ``ops`` (a chapter's CPU table), from the committed cpuboard.json of ``machine``
    (default: the book's CPU machine); a one-line note where the board or an op's row has not been measured yet."""
    board = load_board(machine=machine)
    if board is None:
        return "*The CPU scoreboard has not been measured yet: `python -m kernels_src cpuboard --again`.*"
    have = {r["op"] for r in board["rows"]}
    missing = [o for o in ops if o not in have]
    note = f"\n\n*Not on the committed board yet: {', '.join(missing)}.*" if missing else ""
    present = [o for o in ops if o in have]
    if not present:  # board_table reads an empty list as "every op": say only what is missing
        return note.strip()
    return board_table(board, ops=present) + note


def board_plot(board: dict, ax=None, ops=None):
    """Speed of each op's best CPU rung relative to torch and to NumPy (log scale; right of 1 = faster)."""
    import matplotlib.pyplot as plt

    rows = [r for r in board["rows"] if (r.get("vs_torch") or r.get("vs_numpy")) and (not ops or r["op"] in ops)]
    rows.sort(key=lambda r: (_chapter(r["op"]) or 99, r["op"]), reverse=True)
    if ax is None:
        _, ax = plt.subplots(figsize=(7.5, 0.26 * len(rows) + 1.2))
    y = np.arange(len(rows))
    h = 0.38
    for off, key, label, color in ((h / 2, "vs_torch", "against torch (CPU)", "tab:red"),
                                   (-h / 2, "vs_numpy", "against the NumPy formula", "tab:blue")):
        vals = [r.get(key) or math.nan for r in rows]
        ax.barh(y + off, [v - 1 if v == v else 0 for v in vals], left=1, height=h, color=color, label=label)
    ax.axvline(1.0, color="black", lw=1)
    ax.set_xscale("log")
    ax.set_yticks(y, [r["op"] for r in rows], fontsize=8)
    ax.set_xlabel("speed of the course's best CPU rung (× the yardstick; right of 1 = faster)")
    ax.set_title(f"Every op on the CPU: {board['meta'].get('cpu_model', '?')}, {board['meta'].get('cpu_count')} cores",
                 fontsize=10)
    ax.legend(loc="lower right", fontsize=8)
    ax.grid(axis="x", which="both", alpha=0.3)
    return ax


# ------------------------------------------------------------------------ where the CPU path still loses, and why
def load_asm(path=None, machine: str | None = None) -> dict | None:
    """The instruction counts and byte models of the board's best rungs (``kernels cpuboard --asm``), or None."""
    p = path or _folder(machine) / "cpuboard_asm.json"
    return load_json(p) if p.exists() else None


# Ops whose misses other work of issue 36 is reworking: their "why" is the chapter's (filled in by the lead).
SEE_CHAPTER = ("adam", "adamw", "adam_first_update", "adamw_clip", "sgd_momentum", "transpose", "scan",
               "segmented_scan", "histogram", "radix_sort", "regression_grad", "linear_bwd_db", "qkv_rope_bwd",
               "q8_0_quantize", "q4_0_quantize", "qgemv_q4_0", "qgemv_q8_0", "kv_append_decode", "attention_scores")

# One sentence of evidence per op: what was checked (which count in the rung's machine code, which measurement)
# and what it shows. Fields in braces come from the committed counts (cpuboard_asm.json) and the board, so the
# numbers are always those of the machine the table describes: {alu} vector-unit instructions, {elems} elements
# per iteration, {div} divisions or square roots, {cvt} conversions, {fma} FMAs, {bcast} broadcasts and {loads}
# vector loads in the hot loop;
# {vs_torch}, {spread}, {torch_frac} from the board. None: the op's chapter gives the why.
EVIDENCE = {op: None for op in SEE_CHAPTER}
EVIDENCE.update({
    # exp-bound activations: the hot loop's vector work against the vector units' rate
    "gelu": "The hot loop is {alu} vector-unit instructions per {elems} elements, {div} of them a division (A&S's "
            "1/(1 + p|z|) in the erfc), for one load and one store.",
    "gelu_bwd": "{alu} vector-unit instructions per {elems} elements ({div} division): the forward's polynomial "
                "and the density, for two loads and one store.",
    "gelu_tanh": "{alu} vector-unit instructions per {elems} elements, {div} of them a division (the sigmoid "
                 "pair's 1/(1 + u)), for one load and one store.",
    "gelu_tanh_bwd": "{alu} vector-unit instructions per {elems} elements ({div} division), for two loads and "
                     "one store.",
    "silu": "{alu} vector-unit instructions per {elems} elements, {div} of them a division (1/(1 + u)), for one "
            "load and one store.",
    "silu_bwd": "{alu} vector-unit instructions per {elems} elements ({div} division), for two loads and one "
                "store.",
    "bias_gelu": "The fused bias and tanh GELU: {alu} vector-unit instructions per {elems} elements ({div} "
                 "division) in one pass over each row.",
    # row-wise ops: a reduction, then another walk over the row
    "softmax": "Three walks per row (max, exp and sum, scale: the code of softmax_row_exp2); the hot loop (the "
               "exp walk) is {alu} vector-unit instructions per {elems} elements; the later walks re-read a "
               "16 KiB row from cache, which the byte model does not count.",
    "cross_entropy": "Two walks per 128 KiB row (max, then the sum of exps: _ce_simd_exp2); the hot loop is {alu} "
                     "vector-unit instructions per {elems} logits and stores nothing, and the op writes two "
                     "numbers per row: its time is the two walks, not a read-and-write stream like the copy's.",
    "cross_entropy_bwd": "One walk per row writing e^(x - lse) scaled (_ce_bwd_exp2): {alu} vector-unit "
                         "instructions per {elems} logits.",
    "layernorm": "Three walks per row (mean, variance, the write: _ln_row), the sums and the write in float64: "
                 "the hot loop has {cvt} float32/float64 conversions among its {alu} vector-unit instructions "
                 "per {elems} elements.",
    "rmsnorm": "Two walks per row (sum of squares, the write: _rms_row), the write in float64: the hot loop has "
               "{cvt} float32/float64 conversions among its {alu} vector-unit instructions per {elems} elements.",
    "layernorm_bwd": "One fused walk per row (this row's dx, the next row's sums): the hot loop is {alu} "
                     "vector-unit instructions and {loads} vector loads per {elems} elements.",
    "rmsnorm_bwd": "One fused walk per row (this row's dx, the next row's sum): the hot loop is {alu} vector-unit "
                   "instructions and {loads} vector loads per {elems} elements.",
    "softmax_bwd": "One fused walk per row (this row's dx, the next row's dot): the hot loop is {alu} vector-unit "
                   "instructions and {loads} vector loads per {elems} elements.",
    # streams: little arithmetic per element
    "axpy": "{alu} vector-unit instructions per {elems} elements, two loads and one store each: the copy's "
            "shape with one more read.",
    "relu_bwd": "{alu} vector-unit instructions per {elems} elements, two loads and one store each.",
    "decode_attention": "K and V are read once per group of 4 query heads (1 x 32 x 8 x 4096 x 128: 32 query "
                        "heads, 8 KV heads); the hot loop is {alu} vector-unit instructions per {elems} "
                        "elements.",
    "gemv_wx": "The hot loop is {alu} vector-unit instructions and {loads} vector loads per {elems} weights: a "
               "read-only stream of W; torch reaches {torch_frac} of the copy's counted GB/s on the same bytes.",
    "reduce_sum": "A read-only stream (no write-allocate) at {our_frac} of the copy's counted GB/s; torch at "
                  "{torch_frac}.",
    # compute-bound: the FMA units
    "gemm": "The micro-kernel's loop is {fma} FMAs, {bcast} broadcasts and {loads} vector loads per iteration "
            "on {bits}-bit registers, the accumulators in registers.",
    "linear_fwd": "Chapter 5's GEMM (its loop: {fma} FMAs, {bcast} broadcasts per iteration), then a pass of b "
                  "over Y.",
    "linear_bwd_dx": "Chapter 5's GEMM (its loop: {fma} FMAs, {bcast} broadcasts per iteration) on W "
                     "transposed, a view (no copy).",
    "linear_bwd_dw": "Chapter 5's GEMM (its loop: {fma} FMAs, {bcast} broadcasts per iteration) on X "
                     "transposed, with only 256 rows of dW to share out between the cores.",
    "conv2d": "An im2row matrix of 6272 x 576 floats (14.5 MB) written by vector copies and read back by one "
              "GEMM (its loop: {fma} FMAs, {bcast} broadcasts per iteration).",
    "conv2d_bwd_dw": "An im2col matrix of 576 x 6272 floats (14.5 MB) built and read back, and one GEMM of "
                     "depth 6272 (its loop: {fma} FMAs, {bcast} broadcasts per iteration).",
    "attention": "Both tile products are register-blocked micro-GEMMs ({fma} FMAs per iteration of the hot "
                 "loop on {bits}-bit registers) and the online softmax's exp is the course's polynomial.",
})


def _width(bits: int) -> str:
    return {512: "zmm", 256: "ymm", 128: "xmm"}.get(bits, "no vector")


def asm_summary(a: dict | None) -> str:
    """What the machine code of a rung shows, in a few words, from its counts in cpuboard_asm.json."""
    if a is None:
        return "no counts yet (`kernels cpuboard --asm`)"
    if "error" in a:
        return f"not counted: {a['error'][:80]}"
    if "skipped" in a:
        return f"not compiled where counted ({a['skipped'][:60]})"
    t = a["total"]
    calls = t.get("calls") or {}
    libm = ("math calls: " + ", ".join(f"{k} ×{n}" for k, n in calls.items())) if calls else "no math call"
    h = t.get("hot_loop")
    if not h:
        return f"{t['packed_fp_total']} packed fp, {t['scalar_fp']} scalar fp, no loop; {libm}"
    spills = f", {h['spill_loads']} stack reloads" if h.get("spill_loads") else ""
    nt = f", {h['nt_stores']} streaming stores" if h.get("nt_stores") else ""
    return (f"{_width(h['bits'])}: {h['fma']} FMA, {h['broadcasts']} broadcast, {h['scalar_fp']} scalar, "
            f"{h['div_sqrt']} div/sqrt{spills}{nt}; {h['per_element']:.1f} instr./element; {libm}")


def _ms(s: float) -> str:
    return fmt_time(s, "µs")


def _copy_gbps(r: dict) -> float | None:
    return r["gbps"] / r["frac_copy"] if r.get("frac_copy") else None


def memory_model(r: dict, io: dict, nt: bool = False, copy_nt: bool = False) -> dict:
    """The write-allocate model of a memory-bound row: an ordinary store reads its cache line before writing it,
    so an op that reads r bytes and writes w (the bench's byte model, counted once each) moves r + 2w; the copy
    yardstick reads 1 and writes 1 (counted 2) but moves 3. At the copy's real rate the op can reach
    1.5 (r + w) / (r + 2w) of the copy's counted GB/s; ``t_mem`` is the time that model allows. Non-temporal
    stores (``nt``: the op's hot loop has ``vmovntps``; ``copy_nt``: the copy's has) write a line without
    reading it: w moved once."""
    rd, wr = io["read"], io["written"]
    moved = rd + (1 if nt else 2) * wr
    per_counted = 1.0 if copy_nt else 1.5  # bytes the copy moves per byte it counts
    out = {"read": rd, "written": wr, "moved": moved, "nt": nt, "copy_nt": copy_nt,
           "allowed": per_counted * (rd + wr) / moved if moved else None}
    copy = _copy_gbps(r)
    out["t_mem"] = moved / (per_counted * copy * 1e9) if copy and moved else None
    return out


def _nt(a: dict | None) -> bool:
    h = (a or {}).get("total", {}).get("hot_loop") or {}
    return bool(h.get("nt_stores"))


def _copy_nt(asm: dict | None) -> bool:
    return bool(((asm or {}).get("copy_yardstick") or {}).get("nt_stores"))


def port_model(r: dict, a: dict | None, peak: dict | None, io: dict | None) -> dict | None:
    """The vector units' share of a row's time: the hot loop's vector-unit instructions per element, times the
    elements (the bytes it stores, or loads where it stores nothing, in float32), at the rate the register-only
    FMA loop issues them on every thread at once (tools/fmapeak.py; one per FMA slot, division counted as
    one although it occupies its unit longer). None without the counts or the FMA rate."""
    if not a or "total" not in a or not io or not peak or "fma_per_s" not in peak:
        return None
    h = a["total"].get("hot_loop")
    if not h or not h["elements"]:
        return None
    n = (io["written"] if h["stores"] else io["read"]) / 4
    t = h["vector_alu"] / h["elements"] * n / peak["fma_per_s"]
    return {"t_port": t, "elements": n, "per_element": h["vector_alu"] / h["elements"]}


def control(r: dict, board: dict, asm: dict | None, alu_max: float = 0.5) -> dict | None:
    """The measured yardstick for a memory-bound row: of the other memory-bound ops on the same board whose bytes
    are split between reads and writes alike (written share within 5 points), whose arrays are at least half as
    large (not held in a cache), whose hot loop has at most ``alu_max`` vector-unit instructions per element (a
    stream with next to no arithmetic) and which do not exceed 110 % of copy (a byte model that counts cache
    hits), the one nearest the copy's bandwidth. Not the copy op itself: it is the yardstick (its loop may be
    the C library's memcpy, with stores of its own choosing). Where a control reaches 70 % of copy and the row does not, the bytes are not the bound."""
    counted = {x["op"]: x for x in (asm or {}).get("rows", [])}
    a = counted.get(r["op"])
    if not a or "io" not in a:
        return None

    def share(io):
        tot = io["read"] + io["written"]
        return io["written"] / tot if tot else None

    mine = share(a["io"])
    best = None
    for o in board["rows"]:
        c = counted.get(o["op"])
        if o["op"] in (r["op"], "copy") or o["kind"] != "memory" or o.get("frac_copy") is None or not c or "io" not in c:
            continue
        h = c.get("total", {}).get("hot_loop")
        if not h or h["vector_alu"] / h["elements"] > alu_max or mine is None or share(c["io"]) is None:
            continue
        big = c["io"]["read"] + c["io"]["written"] >= 0.5 * (a["io"]["read"] + a["io"]["written"])
        if o["frac_copy"] > 1.1 or not big:  # a byte model that counts cache hits, or arrays that fit a cache
            continue
        if abs(share(c["io"]) - mine) <= 0.05 and (best is None or o["frac_copy"] > best["frac_copy"]):
            best = {"op": o["op"], "best": o["best"], "frac_copy": o["frac_copy"],
                    "per_element": h["vector_alu"] / h["elements"], "written_share": share(c["io"])}
    return best


def misses(board: dict, asm: dict | None = None) -> list:
    """One row per (op, goal missed) on the board: the measured figure, what the machine code shows (from
    ``asm``, cpuboard_asm.json, where given) and why, as far as the models and EVIDENCE say."""
    counted = {x["op"]: x for x in (asm or {}).get("rows", [])}
    peak = (asm or {}).get("fma_peak_all")
    out = []
    for r in board["rows"]:
        goals_missed = []
        if r.get("vs_torch") is not None and r["vs_torch"] < 1.0:
            goals_missed.append(("≥ 1.0× torch", f"{r['vs_torch']:.2f}× torch"))
        if r.get("vs_numpy") is not None and r["vs_numpy"] < 1.0:
            blas = " (BLAS)" if r["kind"] == "compute" else ""
            goals_missed.append((f"≥ 1.0× NumPy{blas}", f"{r['vs_numpy']:.2f}× NumPy"))
        if r["kind"] == "memory" and r.get("frac_copy") is not None and r["frac_copy"] < 0.70:
            goals_missed.append(("≥ 70 % of copy", f"{100 * r['frac_copy']:.0f} % ({r['gbps']:.1f} GB/s)"))
        if not goals_missed:
            continue
        a = counted.get(r["op"])
        if a is not None and a.get("variant") != r["best"]:
            a = {"skipped": f"counted {a.get('variant')}, the board's best is now {r['best']}"}
        for goal, measured in goals_missed:
            out.append({"op": r["op"], "chapter": _chapter(r["op"]), "goal": goal, "measured": measured,
                        "best": r["best"], "asm": asm_summary(a) if asm is not None else None,
                        "why": why(r, a, peak, goal, _copy_nt(asm), control(r, board, asm), board["meta"])})
    out.sort(key=lambda m: (m["chapter"] or 99, m["op"], m["goal"]))
    return out


class _Fields(dict):
    missing = False

    def __missing__(self, key):
        self.missing = True
        return "?"


def _evidence(op: str, r: dict, a: dict | None) -> str:
    text = EVIDENCE.get(op, "")
    if text is None:
        return f"See chapter {_chapter(op)}."
    h = (a or {}).get("total", {}).get("hot_loop") or {}
    f = _Fields()
    if h:
        f.update(alu=h["vector_alu"], elems=h["elements"], div=h["div_sqrt"], bcast=h["broadcasts"],
                 loads=h["loads"], fma=h["fma"], bits=h["bits"], cvt=h.get("convert", "?"))
    if r.get("run_spread") is not None:
        f["spread"] = f"±{100 * r['run_spread']:.0f} %"
    if r.get("frac_copy"):
        f["our_frac"] = f"{100 * r['frac_copy']:.0f} %"
        if r.get("vs_torch"):
            f["torch_frac"] = f"{100 * r['frac_copy'] / r['vs_torch']:.0f} %"
    out = text.format_map(f)
    return "" if f.missing else out  # a sentence about counts not made yet says nothing


def why(r: dict, a: dict | None, peak: dict | None, goal: str, copy_nt: bool = False,
        ctl: dict | None = None, board_meta: dict | None = None) -> str:
    """The models' figures for one miss, then the op's sentence of evidence."""
    parts = []
    if EVIDENCE.get(r["op"], "") is None:
        return f"See chapter {_chapter(r['op'])}."
    io = (a or {}).get("io")
    if r["kind"] == "memory" and io:
        m = memory_model(r, io, _nt(a), copy_nt)
        if m["written"] < 0.01 * m["read"]:
            how = "it only reads: it moves r"
        else:
            how = ("its stores are non-temporal: it moves r + w" if m["nt"] else "write-allocate: it moves r + 2w")
        how += ", the copy 2 per 2 counted" if m["copy_nt"] else ", the copy 3 per 2 counted"
        text = (f"Memory: reads {m['read'] / 1e6:.0f} MB, writes {m['written'] / 1e6:.0f} MB; {how}, so the "
                f"model allows {100 * m['allowed']:.0f} % of copy")
        if m["t_mem"]:
            text += (f": ≥ {_ms(m['t_mem'])}, {100 * m['t_mem'] / r['best_s']:.0f} % of the measured "
                     f"{_ms(r['best_s'])}")
        parts.append(text + ".")
        if ctl:
            parts.append(f"Control: {ctl['op']} ({ctl['best']}), the same mix of reads and writes with "
                         f"{ctl['per_element']:.2f} vector instructions per element, reached "
                         f"{100 * ctl['frac_copy']:.0f} % of copy on this board.")
        h = (a or {}).get("total", {}).get("hot_loop")
        threads = (board_meta or {}).get("cpu_threads") or 1
        if h and h["elements"] and h["vector_alu"] / h["elements"] >= 1:  # arithmetic enough to count issue
            n = (io["written"] if h["stores"] else io["read"]) / 4
            rate = h["per_element"] * n / r["best_s"] / threads
            parts.append(f"Issue: the hot loop is {h['per_element']:.1f} instructions per element, "
                         f"{rate / 1e9:.1f} G instructions/s on each of {threads} threads at the measured time.")
        p = port_model(r, a, peak, io)
        if p:
            parts.append(f"Vector units: {p['per_element']:.2f} instructions per element at the FMA loop's "
                         f"{peak['fma_per_s'] / 1e9:.1f} G/s: ≥ {_ms(p['t_port'])}, "
                         f"{100 * p['t_port'] / r['best_s']:.0f} %.")
    elif r["kind"] == "compute":
        if peak and "gflops" in peak:
            s = (f"{r['gflops']:.0f} GFLOP/s = {100 * r['gflops'] / peak['gflops']:.0f} % of the FMA peak of "
                 f"{peak['threads']} threads ({peak['gflops']:.0f} GFLOP/s, tools/fmapeak)")
            if r.get("vs_numpy"):
                s += f"; BLAS {100 * r['gflops'] / r['vs_numpy'] / peak['gflops']:.0f} %"
            if r.get("vs_torch"):
                s += f"; torch {100 * r['gflops'] / r['vs_torch'] / peak['gflops']:.0f} %"
            parts.append(s + ".")
        else:
            why_not = (peak or {}).get("skipped", "not counted yet")
            parts.append(f"{r['gflops']:.0f} GFLOP/s (FMA peak not measured: {why_not}).")
    vs = r.get("vs_torch") if "torch" in goal else r.get("vs_numpy") if "NumPy" in goal else None
    if vs is not None and r.get("run_spread") is not None and 1 - vs < r["run_spread"]:
        parts.append(f"The gap ({100 * (1 - vs):.0f} %) is within the two runs' spread "
                     f"(±{100 * r['run_spread']:.0f} %).")
    sentence = _evidence(r["op"], r, a)
    if sentence:
        parts.append(sentence)
    return " ".join(parts) or "–"


def miss_kinds(board: dict, asm: dict | None) -> dict:
    """For the prose: of the memory-bound misses (below 70 % of copy) with counts, how many the write-allocate
    model allows to reach 70 %, how many have a control stream (:func:`control`) that did, and how many spend
    at least half of their measured time in the vector units
    (the port model's lower bound); and the compute-bound misses' range of FMA-peak fractions."""
    counted = {x["op"]: x for x in (asm or {}).get("rows", [])}
    peak = (asm or {}).get("fma_peak_all")
    mem, allows, ctl70, ports, fracs = 0, 0, 0, 0, []
    for r in board["rows"]:
        a = counted.get(r["op"])
        if r["op"] in SEE_CHAPTER or not a or "io" not in a:
            continue
        if r["kind"] == "memory" and r.get("frac_copy") is not None and r["frac_copy"] < 0.70:
            mem += 1
            allows += memory_model(r, a["io"], _nt(a), _copy_nt(asm))["allowed"] >= 0.70
            c = control(r, board, asm)
            ctl70 += bool(c and c["frac_copy"] >= 0.70)
            p = port_model(r, a, peak, a["io"])
            ports += bool(p and p["t_port"] >= 0.5 * r["best_s"])
        elif r["kind"] == "compute" and peak and "gflops" in peak and (
                (r.get("vs_torch") or 1) < 1 or (r.get("vs_numpy") or 1) < 1):
            fracs.append(r["gflops"] / peak["gflops"])
    return {"memory": mem, "model_allows": allows, "control_70": ctl70, "port_half": ports,
            "compute_frac": (min(fracs), max(fracs)) if fracs else None}


def misses_table(board: dict | None = None, asm=...) -> str:
    """The misses as a Markdown table (op, goal, measured, what the assembly shows, why), from the committed
    cpuboard.json and cpuboard_asm.json (``asm``: the counts, None for none; left out, the committed file);
    where the counts have not been made, the table says how."""
    board = board if board is not None else load_board()
    if board is None:
        return "*The CPU scoreboard has not been measured yet: `python -m kernels_src cpuboard --again`.*"
    asm = load_asm() if asm is ... else asm
    rows = misses(board, asm)
    out = ["| ch | op | goal | measured | what the assembly shows | why |", "|---|---|---|---|---|---|"]
    for m in rows:
        out.append(f"| {m['chapter'] or ''} | {m['op']} ({m['best']}) | {m['goal']} | {m['measured']} | "
                   f"{m['asm'] or '–'} | {m['why']} |")
    notes = []
    if asm is None:
        notes.append("*No instruction counts committed yet: `python -m kernels_src cpuboard --asm` writes "
                     "cpuboard_asm.json beside the board (it compiles the best rungs, it times nothing).*")
    else:
        where, made = asm["meta"].get("cpu_model"), board["meta"].get("cpu_model")
        if (asm.get("copy_yardstick") or {}).get("memcpy"):
            notes.append("*The copy yardstick's loop (bench._parallel_copy) compiles to a call of the C library's "
                         "memcpy per thread, which picks its own stores (glibc streams large copies past a "
                         "threshold set from the cache size): the copy's 3 bytes moved per 2 counted is the "
                         "model's assumption, and the control rows are what the same board measured.*")
        if where != made:
            notes.append(f"*The counts were compiled on {where}, the times measured on {made}: the code differs "
                         "where the two CPUs' vector widths differ.*")
    return "\n".join(out) + ("\n\n" + "\n".join(notes) if notes else "")
