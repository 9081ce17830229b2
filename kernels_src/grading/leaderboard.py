"""Example results of the speed questions, and the book's leaderboard page built from them.

    python -m kernels_src.grading.leaderboard run --kind cpu --out book/data/grading/perf_cpu_<machine>.json
    python -m kernels_src.grading.leaderboard run --kind gpu --out $OUT/perfgrade/perf_h100.json
    python -m kernels_src.grading.leaderboard page            # book/leaderboard.md from book/data/grading/perf_*.json

``run`` grades each speed question (:mod:`.perf`) on the submissions of :data:`ENTRIES`: the master's
solution and, for some questions, a plausible slower answer (a student's first try), so that the table shows
what separates them. Every number in the page is a fraction of the ideal measured in the same run (the
copy bandwidth or NumPy), never a raw time alone.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "book" / "data" / "grading"
PAGE = ROOT / "book" / "leaderboard.md"

# Other answers, as replacements of a question's code cell: {(exercise, question): {entry name: source}}.
SLOWER = {
    ("ch04_gemv", "q1"): {"column order, one core (a first try)": '''
@njit
def gemv_rows(y, x, W):
    K, N = W.shape
    for j in range(N):
        acc = np.float32(0.0)
        for k in range(K):
            acc += x[k] * W[k, j]
        y[j] = acc
'''},
    ("ch04_gemv", "q2"): {"one thread per column, no split of K (a first try)": '''
@cuda.jit
def gemv_splitk_kernel(y, x, W):
    n = cuda.grid(1)
    if n < y.size:
        acc = float32(0.0)
        for k in range(x.size):
            acc += x[k] * W[k, n]
        y[n] = acc


def gemv_splitk_gpu(y, x, W):
    K, N = W.shape
    gemv_splitk_kernel[ceil_div(N, 128), 128](y, x, W)
'''},
    ("ch01_axpy", "q2"): {"a grid-stride loop on 32 blocks (a first try)": '''
@cuda.jit
def axpy_kernel(out, a, x, y):
    for i in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        out[i] = a * x[i] + y[i]


def axpy_gpu(out, a, x, y):
    axpy_kernel[32, 128](out, a, x, y)
'''},
    ("ch05_gemm", "q3"): {"question 2's 8 x 8 shared-memory tiles, one element per thread (the rung below)": '''
@cuda.jit
def gemm_reg_kernel(C, A, B):
    M, N = C.shape
    K = A.shape[1]
    tx = cuda.threadIdx.x
    ty = cuda.threadIdx.y
    i = cuda.blockIdx.y * 8 + ty
    j = cuda.blockIdx.x * 8 + tx
    As = cuda.shared.array((8, 8), float32)
    Bs = cuda.shared.array((8, 8), float32)
    acc = float32(0.0)
    for k0 in range(0, K, 8):
        As[ty, tx] = A[i, k0 + tx] if i < M and k0 + tx < K else float32(0.0)
        Bs[ty, tx] = B[k0 + ty, j] if k0 + ty < K and j < N else float32(0.0)
        cuda.syncthreads()
        for kk in range(8):
            acc += As[ty, kk] * Bs[kk, tx]
        cuda.syncthreads()
    if i < M and j < N:
        C[i, j] = acc


def gemm_reg_gpu(C, A, B):
    M, N = C.shape
    gemm_reg_kernel[(ceil_div(N, 8), ceil_div(M, 8)), (8, 8)](C, A, B)
'''},
    ("ch08_softmax", "q2"): {"one thread per row (a first try)": '''
@cuda.jit
def softmax_online_kernel(y, x):
    i = cuda.grid(1)
    if i < x.shape[0]:
        n = x.shape[1]
        m = float32(-math.inf)
        s = float32(0.0)
        for j in range(n):
            v = x[i, j]
            if v > m:
                s = s * math.exp(m - v) + float32(1.0)
                m = v
            elif v > -math.inf:
                s += math.exp(v - m)
        for j in range(n):
            y[i, j] = float32(0.0) if m == -math.inf else math.exp(x[i, j] - m) / s


def softmax_online_gpu(y, x):
    softmax_online_kernel[(x.shape[0] + 127) // 128, 128](y, x)
'''},
    ("ch05_gemm", "q4"): {"naive i, j, k loops, one core (a first try)": '''
@njit
def gemm_blocked_cpu(C, A, B):
    M, K = A.shape
    N = B.shape[1]
    for i in range(M):
        for j in range(N):
            acc = np.float32(0.0)
            for k in range(K):
                acc += A[i, k] * B[k, j]
            C[i, j] = acc
'''},
}


def master_cells(slug: str) -> list[tuple[int, str]]:
    """The code cells of ``solutions/<slug>.md`` (the master, solutions in place), read without jupytext or
    nbformat (the GPU machine has neither): ```` ```{code-cell} ```` blocks, in order."""
    cells, cur, n = [], None, 0
    for line in (ROOT / "solutions" / f"{slug}.md").read_text(encoding="utf-8").splitlines():
        if cur is None and line.startswith("```{"):
            n += 1
            if line.startswith("```{code-cell}"):
                cur = []
            continue
        if cur is not None:
            if line.startswith("```"):
                cells.append((n, "\n".join(ln for ln in cur if not ln.startswith(":"))))
                cur = None
            else:
                cur.append(line)
    return [(i, c) for i, c in cells if "kernels_src.grading" not in c]  # the test cells are not the answer


def _bundles(slug: str, question: str):
    """[(entry name, bundle)]: the master's solution, then the slower answers (appended as a last cell, which
    redefines the function)."""
    from . import bundle as bundle_mod

    cells = master_cells(slug)
    out = [("master solution", bundle_mod.from_cells(cells))]
    for name, src in SLOWER.get((slug, question), {}).items():
        out.append((name, bundle_mod.from_cells(cells + [(cells[-1][0] + 1, src)])))
    return out


def run(kind: str, slugs=None, runs: int | None = None, out: Path | None = None) -> dict:
    from .. import bench, device
    from .perf import all_specs, grade_perf

    rows, todo = [], []
    for slug, specs in sorted(all_specs().items()):
        if slugs and slug not in slugs:
            continue
        for s in specs:
            if kind != "all" and s.kind != kind:
                continue
            if runs:
                s = dataclasses.replace(s, runs=runs)
            for i, (entry, b) in enumerate(_bundles(slug, s.question)):
                todo.append((i, slug, s, entry, b))
    for _, slug, s, entry, b in sorted(todo, key=lambda t: t[0]):  # every master first, then the slower tries
        t0 = time.perf_counter()
        print(f"grading {slug} {s.question} `{s.function}` ({entry}) ...", flush=True)
        v = grade_perf(s, b)
        rows.append({"exercise": slug, "question": s.question, "function": s.function, "kind": s.kind,
                     "entry": entry, "status": v.status, "fraction": v.fraction, "roofline": v.roofline,
                     "score": v.score, "points": s.points, "full": s.full, "zero": s.zero,
                     "size": list(v.size), "device": v.device, "yardstick": v.yardstick,
                     "ideal": ("cuBLAS (torch), same shape, same run" if s.ideal == "cublas" else
                               "copy bandwidth measured in the same run") if s.kind == "gpu"
                     else "NumPy, same inputs, same run", "baseline_s": v.baseline_seconds,
                     "seconds": v.seconds, "details": {k: v.details.get(k) for k in ("floor_s", "overhead_s", "clock",
                                                                                        "times_s", "wall_s", "bytes",
                                                                                        "flops")}, "copy_gbps": v.details.get("copy_gbps"),
                     "runs": v.runs, "grading_s": round(time.perf_counter() - t0, 1),
                     "feedback": v.feedback})
        print(v.feedback, flush=True)
        if out is not None:  # after every row: a run cut short still leaves what it measured
            Path(out).write_text(json.dumps(_wrap(kind, rows), indent=1, default=str))
    return _wrap(kind, rows)


def _wrap(kind: str, rows: list) -> dict:
    from .. import bench, device

    env = bench.environment()
    env.pop("host", None)
    machine = (env.get("device") or {}).get("name") if device.MODE == "gpu" and kind != "cpu" else None
    machine = machine or f"{env.get('cpu_model')}, {env.get('cpu_threads') or env.get('cpu_count')} threads"
    return {"kind": kind, "device": device.MODE, "machine": machine, "environment": env, "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "results": rows}


def _pct(x) -> str:
    return "—" if x is None else f"{100 * x:.0f}%"


def render(files) -> str:
    lines = [
        "# Leaderboard: speed questions",
        "",
        "Some exercises have a **speed question** on top of their correctness checks, graded with",
        "`kernels grade --perf` (see \"How speed is graded\" in [how grading works](how_grading_works.md)). The score",
        "is the fraction of the *ideal* a kernel reaches, measured in the same run on the same machine: for a",
        "memory-bound GPU question, the op's bytes over the copy bandwidth just measured (the roofline of a",
        "memory-bound kernel); for a compute-bound one (a GEMM), cuBLAS's time for the same shape (the same",
        "FLOPs); for a CPU question, NumPy doing the same op on the same inputs. Full credit at the question's",
        "`full` fraction, none at or below `zero`, linear in between. Each question's thresholds were set from",
        "these runs: the master solution above `full`, with a margin, and a documented slower answer between",
        "`zero` and `full` where there is one.",
        "",
        "The tables below are example results from this repository's runs: the master solution of each question",
        "and, for some, a plausible first try. Raw times are not shown on purpose: a time means little without",
        "the machine's own yardstick beside it. Your own run prints your fraction and its yardstick.",
        "",
    ]
    from .perf import all_specs
    from .perf import credit as perf_credit

    now = {(slug, sp.question): sp for slug, specs in all_specs().items() for sp in specs}
    for f in files:
        d = json.loads(Path(f).read_text())
        rows = [r for r in d["results"]]
        if not rows:
            continue
        lines += [f"## {d.get('machine') or d['kind']} ({d['kind'].upper()} questions, {d.get('when', '')})", ""]
        lines += ["| exercise | question | submission | size | ideal | fraction of ideal | "
                  "of copy bandwidth | credit |",
                  "|---|---|---|---|---|---|---|---|"]
        for r in rows:
            size = "x".join(str(n) for n in r["size"])
            frac = _pct(r["fraction"]) if r["status"] == "scored" else r["status"]
            credit = f"{r['score']:g} / {r['points']:g} (full at {_pct(r['full'])}, none at {_pct(r['zero'])})"
            cur = now.get((r["exercise"], r["question"]))
            if cur is not None and (cur.full, cur.zero) != (r["full"], r["zero"]) and r["status"] == "scored":
                # the thresholds were set from this run (or changed since): the credit under today's thresholds,
                # and what the run itself gave under the thresholds of its day
                c = round(perf_credit(r["fraction"], cur.zero, cur.full) * r["points"], 4)
                credit = (f"{c:g} / {r['points']:g} (full at {_pct(cur.full)}, none at {_pct(cur.zero)}; "
                          f"graded {r['score']:g} at the run, under full {_pct(r['full'])} / none {_pct(r['zero'])})")
            lines.append(f"| {r['exercise']} | {r['question']} `{r['function']}` | {r['entry']} | {size} | "
                         f"{r['ideal']} | {frac} | {_pct(r['roofline'])} | {credit} |")
        lines += ["", f"Data: `book/data/grading/{Path(f).name}`.", ""]
    return "\n".join(lines).rstrip() + "\n"


def page(out=PAGE) -> Path:
    files = sorted(DATA.glob("perf_*.json"))
    Path(out).write_text(render(files), encoding="utf-8")
    return Path(out)


def main(argv=None) -> int:
    from ..usage import Parser, output_file

    ap = Parser(prog="python -m kernels_src.grading.leaderboard")
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--kind", choices=("cpu", "gpu", "all"), default="cpu")
    r.add_argument("--out", required=True)
    r.add_argument("--exercise", action="append")
    r.add_argument("--runs", type=int)
    sub.add_parser("page")
    a = ap.parse_args(argv)
    if a.cmd == "run":
        out = output_file(a.out, "--out")
        data = run(a.kind, a.exercise, a.runs, out)
        out.write_text(json.dumps(data, indent=1, default=str))
        print(f"wrote {out}")
    else:
        print(f"wrote {page()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
