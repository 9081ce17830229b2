"""What the command line accepts, checked before any work starts: ops, variants, sizes, dtypes and paths.

Each check raises :class:`UsageError` with one line that names the bad value and what is allowed; ``kernels``
(:func:`kernels_src.cli.main`) prints it as ``kernels CMD: error: ...`` on stderr and exits 2, as argparse does
for its own usage errors. Checking first means a typo costs no compilation, no benchmark and no file.

The subcommands that live beside the benchmark (``kernels_src/tools/``) and the grader's take their argument
helpers from here, below the CLI, so nothing imports ``kernels_src.cli`` but its entry points.

    parse_sizes("1,7,2**4")       -> [(1,), (7,), (16,)]      "64x64x64" -> [(64, 64, 64)]
    op_named("gemv")              -> the registry's Op (unknown: the known ops, and the closest names)
    variant_names(op, "cpu", ...) -> the names, each one a variant of op on that backend
    check_sizes(op, sizes)        -> one number per size name of op, each >= 1 (0 where the op's own sizes use 0)
    check_dtype("float32", ...)   -> a dtype the chosen variants are registered for
    output_file(path)             -> a file to write, in a directory that exists (none is ever created)
"""
from __future__ import annotations

import argparse
import difflib
import os
from pathlib import Path


class UsageError(ValueError):
    """A command-line value the command cannot use; its message is one line."""


class Parser(argparse.ArgumentParser):
    """argparse, with its usage errors on one line (the usage text is one ``-h`` away)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} -h`)\n")


# ------------------------------------------------------------------------------------------- numbers
def eval_int(p: str) -> int:
    """``"1024"`` -> 1024, ``"2**20"`` -> 1048576."""
    if "**" in p:
        base, exp = p.split("**")
        if int(exp) < 0:
            raise ValueError(p)
        return int(base) ** int(exp)
    return int(p)


def parse_sizes(text: str | None):
    """``"1,7,127"`` -> [(1,), (7,), (127,)];  ``"64x64x64,3x5x7"`` -> [(64, 64, 64), (3, 5, 7)]."""
    if text is None:
        return None
    out = []
    for part in text.split(","):
        part = part.strip().lower()
        if not part:
            continue
        try:
            out.append(tuple(int(eval_int(p)) for p in part.split("x")))
        except ValueError:
            raise UsageError(f"cannot read size {part!r}; write e.g. 1024 or 512x512x512 or 2**20") from None
    if not out:
        raise UsageError(f"no size in {text!r}; write e.g. 1024 or 512x512x512 or 1,7,1000")
    return out


def positive_int(text: str) -> int:
    """An argparse ``type``: a whole number >= 1."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"{n} is too small: give 1 or more")
    return n


def names(text: str | None) -> list[str] | None:
    """``"a,b"`` -> ["a", "b"]; None or blanks -> None."""
    out = [n.strip() for n in (text or "").split(",") if n.strip()]
    return out or None


# --------------------------------------------------------------------------------- ops and variants
def _unknown(what: str, name: str, known, flag: str = "") -> UsageError:
    known = list(known)
    close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
    hint = f" (did you mean {' or '.join(close)}?)" if close else ""
    return UsageError(f"{flag + ': ' if flag else ''}unknown {what} {name!r}{hint}; known: {', '.join(known) or 'none'}")


def one_of(what: str, name: str, known, flag: str = ""):
    """``name`` if it is among ``known``, else a UsageError listing them (``flag``: the option that gave it)."""
    known = list(known)
    if name not in known:
        raise _unknown(what, name, known, flag)
    return name


def op_named(name: str):
    """The registered op called ``name``."""
    from .registry import _OPS, get_op

    try:
        return get_op(name)
    except KeyError:
        raise _unknown("op", name, sorted(_OPS)) from None


def variant_names(op, backend: str | None, wanted, *, known=None) -> list[str]:
    """``wanted`` (a list, or comma-separated text), each a variant of ``op`` on ``backend`` (None: any), or
    among ``known`` where the command takes only some of them (``kernels asm``: the CPU course rungs)."""
    wanted = names(wanted) if isinstance(wanted, str) else list(wanted)
    if known is None:
        known = list(dict.fromkeys(v.name for v in op.variants if backend is None or v.backend == backend))
    where = f"{op.name}/{backend}" if backend else op.name
    if not known:
        raise UsageError(f"{where} has no variants{' on ' + backend if backend else ''}; "
                         f"`kernels list {op.name}` shows what it has")
    for n in wanted:
        if n not in known:
            raise _unknown(f"{where} variant", n, known)
    return wanted


def ops_with(backend: str) -> list[str]:
    from .registry import ops

    return [o.name for o in ops() if any(v.backend == backend for v in o.variants)]


# ------------------------------------------------------------------------------------- sizes, dtypes
def _label(size) -> str:
    return "x".join(str(s) for s in size)


def check_sizes(op, sizes, purpose: str = "bench"):
    """``sizes`` (or None), each with one number per name of ``op.size_names``, each number >= 1. A number may
    be 0 only where the op's own ``purpose`` sizes ("check" or "bench") use 0 at that place: a flag (attention's
    mask, the optimizer's nesterov) or the empty input a check includes (scan of n = 0)."""
    if sizes is None:
        return None
    declared = [tuple(s) for key, lst in op.sizes.items() if key.startswith(purpose) for s in lst]
    zero_ok = {i for s in declared for i, x in enumerate(s) if x == 0}
    rank = len(op.size_names)
    example = _label(declared[-1]) if declared else "x".join(["64"] * rank)
    for size in sizes:
        if len(size) != rank:
            raise UsageError(f"size {_label(size)} has {len(size)} number{'s' if len(size) != 1 else ''}; "
                             f"{op.name} takes {rank}: {'x'.join(op.size_names)} (e.g. {example})")
        for i, (n, x) in enumerate(zip(op.size_names, size)):
            low = 0 if i in zero_ok else 1
            if x < low:
                raise UsageError(f"size {_label(size)}: {n} = {x}, but {op.name}'s {n} must be {low} or more "
                                 f"(sizes are {'x'.join(op.size_names)}, e.g. {example})")
    return sizes


def check_dtype(dtype: str | None, allowed, what: str = "the chosen variants") -> str | None:
    """``dtype`` (None: each variant's own) as numpy names it, if ``allowed`` holds it."""
    if dtype is None:
        return None
    import numpy as np

    allowed = sorted(set(allowed))
    try:
        name = np.dtype(dtype).name
    except TypeError:
        name = None
    if name not in allowed:
        raise UsageError(f"dtype {dtype!r} is not one {what} take; give {' or '.join(allowed) or 'none'}")
    return name


# -------------------------------------------------------------------------------------------- paths
def output_file(path: str | None, flag: str = "--json") -> Path | None:
    """A file to write: not a directory, in a directory that exists and can be written. Nothing is created."""
    if path is None:
        return None
    p = Path(path)
    if p.is_dir():
        raise UsageError(f"{flag} {path}: is a directory; name a file in it")
    parent = p.parent
    if not parent.is_dir():
        raise UsageError(f"{flag} {path}: directory {parent} does not exist (create it first, or name a file in "
                         "an existing directory)")
    if not os.access(parent, os.W_OK | os.X_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise UsageError(f"{flag} {path}: cannot write there (permission denied)")
    return p


def output_dir(path: str | None, flag: str = "--out") -> Path | None:
    """A directory to write into: one that exists, or a new one in a directory that exists."""
    if path is None:
        return None
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise UsageError(f"{flag} {path}: is a file; name a directory")
    if not p.exists() and not p.parent.is_dir():
        raise UsageError(f"{flag} {path}: neither it nor its parent directory {p.parent} exists (create the "
                         "parent first)")
    there = p if p.exists() else p.parent
    if not os.access(there, os.W_OK | os.X_OK):
        raise UsageError(f"{flag} {path}: cannot write there (permission denied)")
    return p


def input_path(path: str | None, flag: str, kind: str = "file or directory") -> Path | None:
    """A path to read that exists (``kind``: "file", "directory", or either)."""
    if path is None:
        return None
    p = Path(path)
    if not p.exists():
        raise UsageError(f"{flag} {path}: no such {kind}")
    if kind == "file" and not p.is_file():
        raise UsageError(f"{flag} {path}: is not a file")
    if kind == "directory" and not p.is_dir():
        raise UsageError(f"{flag} {path}: is not a directory")
    if not os.access(p, os.R_OK):
        raise UsageError(f"{flag} {path}: cannot read it (permission denied)")
    return p
