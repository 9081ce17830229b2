"""Compile GPU kernels to PTX for sm_90 without a GPU.

The CUDA simulator runs kernels as Python, so it never checks nopython typing: a kernel that indexes
with a float or returns a string "works" simulated and fails on a real GPU. NVVM (shipped by
``numba-cuda[cu13]``) can compile to PTX with no GPU present, which catches those errors.

numba.cuda cannot be the simulator and the real compiler in one process, so the check runs in a
child process started with ``KERNELS_DEVICE=ptx``. Each GPU variant lists its kernels and their
signatures at registration: ``register(..., ptx=[(kernel, "void(float32[::1], float32[::1])")])``.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass

from . import device

CC = (9, 0)  # H100


@dataclass
class PtxResult:
    variant: str
    kernel: str
    signature: str
    ok: bool
    message: str = ""
    ptx_lines: int = 0

    def __str__(self) -> str:
        head = f"{'ok  ' if self.ok else 'FAIL'} {self.variant}: {self.kernel}{self.signature}"
        return head + (f" ({self.ptx_lines} lines of PTX)" if self.ok else f"\n    {self.message}")


def unavailable() -> str | None:
    """Why kernels cannot be compiled to PTX in this install (one line), or None when they can.

    NVVM comes with the numba-cuda package (``numba-cuda[cu13]``). Where it is absent, as on macOS, for which it
    has no build, ``numba.cuda`` is numba's built-in target: its simulator runs the course's kernels, but it
    cannot compile them, so the PTX check is skipped there (tests, ``kernels ptx``, ``kernels doctor``)."""
    from . import compiler

    if compiler.NAME != "numba-builtin":
        return None
    where = "it has no macOS build" if sys.platform == "darwin" else "reinstall the pinned environment to get it"
    return (f"numba-cuda is not installed ({where}); numba's built-in numba.cuda cannot compile to PTX, "
            "only simulate")


def py_func(kernel):
    """The plain Python function behind a real or simulated @cuda.jit kernel."""
    for attr in ("py_func", "fn"):
        f = getattr(kernel, attr, None)
        if f is not None:
            return f
    return kernel


def compile_one(kernel, signature, cc=CC) -> str:
    if device.MODE != "ptx" and device.SIMULATED:
        raise RuntimeError("PTX compilation needs the real numba.cuda: run it with KERNELS_DEVICE=ptx "
                           "(`python -m kernels_src ptx` does this for you)")
    opts = getattr(kernel, "targetoptions", {}) or {}
    # Compile what really runs: the kernel's own fastmath flags and launch bounds, not the defaults.
    kwargs = {k: opts[k] for k in ("fastmath", "launch_bounds", "lineinfo") if opts.get(k)}
    ptx, _ = device.cuda.compile_ptx(py_func(kernel), signature, cc=cc, **kwargs)
    return ptx


def _ops(op) -> list:
    """``None`` (every op), one op's name, or a list of names, as the list ``variants()`` takes one at a time."""
    return [None] if op is None else [op] if isinstance(op, str) else list(op)


def _kernel_key(kernel, sig):
    opts = getattr(kernel, "targetoptions", {}) or {}
    return (id(py_func(kernel)), str(sig), repr(sorted((k, opts[k]) for k in ("fastmath", "launch_bounds", "lineinfo")
                                                        if opts.get(k))))


def compile_registry(op=None, cc=CC) -> list[PtxResult]:
    """Compile every (kernel, signature) listed by GPU variants, in this process.

    ``op``: None (all), an op's name, or a list of names. A kernel that several variants list with the same
    signature and options (a shared rung, an op built on another op's kernels) compiles once; each variant still
    gets its own result line, so the report (and a test's failure message) names every variant that lists it."""
    from .registry import variants

    results = []
    done: dict = {}
    for name_of_op in _ops(op):
        for v in variants(name_of_op, "gpu"):
            if v.baseline:
                continue
            if not v.ptx:
                results.append(PtxResult(v.key, "-", "", False,
                                         "no kernels listed: register(..., ptx=[(kernel, sig)])"))
                continue
            for kernel, sig in v.ptx:
                name = getattr(py_func(kernel), "__qualname__", repr(kernel))
                key = _kernel_key(kernel, sig)
                if key not in done:
                    try:
                        ptx = compile_one(kernel, sig, cc)
                        done[key] = (True, "", ptx.count("\n"))
                    except Exception as e:  # noqa: BLE001  (a typing error is the finding, not a crash)
                        msg = " ".join(str(e).split())[:600]
                        done[key] = (False, f"{type(e).__name__}: {msg}", 0)
                ok, msg, lines = done[key]
                results.append(PtxResult(v.key, name, f"{sig}", ok, msg, lines))
    return results


def registry_chunks(n: int) -> list[tuple[str, ...]]:
    """The GPU ops of the registry in ``n`` groups of about equal work, for tests that compile the whole registry
    in parallel (one child process per group). Ops that share a kernel stay in one group, so that it compiles once;
    the groups together hold every op with a GPU variant. Computed from the registry in this process (the
    simulator lists the same variants and kernels as the real numba.cuda)."""
    from .registry import variants

    kernels_of: dict[str, set] = {}
    for v in variants(None, "gpu"):
        if not v.baseline:
            kernels_of.setdefault(v.op, set()).update(_kernel_key(k, s) for k, s in (v.ptx or []))
    # connected components of "shares a kernel"
    parent = {o: o for o in kernels_of}

    def root(o):
        while parent[o] != o:
            parent[o] = parent[parent[o]]
            o = parent[o]
        return o

    owner: dict = {}
    for o, ks in kernels_of.items():
        for k in ks:
            if k in owner:
                parent[root(o)] = root(owner[k])
            else:
                owner[k] = o
    comps: dict[str, list[str]] = {}
    for o in sorted(kernels_of):
        comps.setdefault(root(o), []).append(o)
    weight = {r: 1 + len(set().union(*(kernels_of[o] for o in ops))) for r, ops in comps.items()}
    groups: list[list[str]] = [[] for _ in range(max(1, n))]
    load = [0] * len(groups)
    for r in sorted(comps, key=lambda r: (-weight[r], r)):  # largest first, into the lightest group
        i = load.index(min(load))
        groups[i] += comps[r]
        load[i] += weight[r]
    return [tuple(sorted(g)) for g in groups if g]


def compile_registry_subprocess(op=None, cc=CC, timeout=900) -> list[PtxResult]:
    """Run :func:`compile_registry` in a child with the real numba.cuda, and collect its results.

    ``op``: None (all), an op's name, or a list of names (one child compiles them all)."""
    why = unavailable()
    if why:
        raise RuntimeError(f"cannot compile to PTX: {why}")
    env = dict(os.environ, KERNELS_DEVICE="ptx", NUMBA_ENABLE_CUDASIM="0")
    code = ("import json,sys; from kernels_src import ptx; "
            f"r = ptx.compile_registry({op if op is None or isinstance(op, str) else list(op)!r}, {tuple(cc)!r}); "
            "sys.stdout.write('@@PTX@@' + json.dumps([x.__dict__ for x in r]))")
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0 or "@@PTX@@" not in p.stdout:
        raise RuntimeError(f"the PTX compiler process failed (exit {p.returncode}):\n{p.stderr[-3000:]}")
    return [PtxResult(**d) for d in json.loads(p.stdout.split("@@PTX@@", 1)[1])]
