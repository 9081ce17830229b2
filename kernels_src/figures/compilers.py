"""Tables of the compiler comparison (numba-cuda against numba-cuda-mlir on the H100), read from the committed
``book/data/bench/h100/compilers_h100.json`` (written by ``python -m kernels_src.tools.compilers compare``).

    read()            the committed comparison (None if missing)
    check_rows(d)     per op: GPU checks passed under each compiler (a Markdown table)
    rung_rows(d)      each chapter's best rung: time under each, and the successor's time over numba-cuda's
    launch_rows(d)    host cost of one launch from Python by number of array arguments
"""
from __future__ import annotations

import json

from ..paths import BENCH_DATA

PATH = BENCH_DATA / "h100" / "compilers_h100.json"


def read():
    try:
        return json.loads(PATH.read_text())
    except (OSError, ValueError):
        return None


def _md(head, rows) -> str:
    return "\n".join(["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
                     + ["| " + " | ".join(map(str, r)) + " |" for r in rows])


def _counts(e) -> str:
    if not e:
        return "–"
    ran = e["passed"] + e["failed"]
    return f"{e['passed']} of {ran}" + (f" ({e['skipped']} skipped)" if e["skipped"] else "")


def check_rows(d) -> str:
    rows = [(f"`{op}`", _counts(v["numba_cuda"]), _counts(v["mlir"])) for op, v in d["checks_per_op"].items()]
    a, b = d["numba_cuda"]["totals"], d["mlir"]["totals"]
    rows.append(("**all**", _counts(a), _counts(b)))
    return _md(("op", f"numba-cuda {d['numba_cuda']['version']}", f"numba-cuda-mlir {d['mlir']['version']}"), rows)


def failing_variants(d) -> dict:
    """{variant label: first line of its error} of the checks that fail under the successor."""
    out = {}
    for v in d["checks_per_op"].values():
        out.update((v.get("mlir") or {}).get("failures", {}))
    return out


def _error(text) -> str:
    if not text:
        return "–"
    if "ILLEGAL_ADDRESS" in text:
        return "fails: illegal address"
    return "fails: " + text.split(":")[0][:40]


def rung_rows(d) -> str:
    rows = []
    for r in d["rungs"]:
        a, b = r["numba_cuda_s"], r["mlir_s"]
        ratio = r["ratio_mlir_over_numba_cuda"]
        rows.append((r["chapter"], f"`{r['op']}/{r['variant']}`",
                     f"{a * 1e6:,.0f} µs" if a else "–", f"{b * 1e6:,.0f} µs" if b else _error(r.get("mlir_error")),
                     f"{ratio:.2f}×" if ratio else "–"))
    return _md(("ch", "best rung (largest benchmarked size)", "numba-cuda", "numba-cuda-mlir", "ratio"), rows)


def launch_rows(d) -> str:
    a, b = d["numba_cuda"]["launch_us"], d["mlir"]["launch_us"]
    fmt = lambda x: f"{x:.0f} µs" if isinstance(x, (int, float)) else str(x)[:40]  # noqa: E731
    return _md(("array arguments", "numba-cuda", "numba-cuda-mlir"), [(n, fmt(a.get(n)), fmt(b.get(n))) for n in a])
