"""Numba's compile flags, compared faster: the same answers, a fraction of the time.

Every compile in Numba (CPU ``@njit``, numba-cuda, numba-cuda-mlir) looks up typing templates in caches keyed by
the current flags, a ``TargetConfig``. Its ``values()`` builds a dict of about 50 options by calling one Python
property per option, and both ``__hash__`` and ``__eq__`` call it: a profile of the PTX check
(``tests/test_bench_cli.py``, one registry chunk under cProfile) spent 18 of its 107 s there, 270 000 calls;
a fresh CPU compile of five ops' rungs spent 5.6 of 55 s.

:func:`install` replaces ``values`` and ``__hash__`` of each ``TargetConfig`` class that is loaded (Numba's, and
the copies inside numba-cuda and numba-cuda-mlir) with versions that give the same results without the
properties:

- ``values()``: the options' defaults (taken once per class) overlaid with the values set on this instance:
  exactly what the property getter returns for each option (``self._values.get(name, option.default)``);
- ``__hash__``: Numba hashes ``tuple(sorted(self.values()))``, which is the sorted option *names* only (sorting
  a dict sorts its keys), the same for every instance of a class; it is computed once per class.

``KERNELS_FAST_FLAGS=0`` leaves Numba as it is. ``tests/test_compiler.py`` checks the patched methods against the
originals on flags with options set, unset and copied.
"""
from __future__ import annotations

import os
import sys

ORIGINAL: dict = {}  # class -> (values, __hash__) as Numba defined them


def _defaults(cls) -> dict:
    d = cls.__dict__.get("_kernels_defaults")
    if d is None:
        d = {name: opt.default for name, opt in cls.options.items()}
        type.__setattr__(cls, "_kernels_defaults", d)
    return d


def _values(self) -> dict:
    d = dict(_defaults(type(self)))
    mine = self._values
    if mine.keys() <= d.keys():
        d.update(mine)
    else:  # values copied from a config of another class: only this class's options count
        for k in d.keys() & mine.keys():
            d[k] = mine[k]
    return d


def _hash(self) -> int:
    cls = type(self)
    h = cls.__dict__.get("_kernels_hash")
    if h is None:
        h = hash(tuple(sorted(cls.options)))
        type.__setattr__(cls, "_kernels_hash", h)
    return h


def _patch(base) -> None:
    if base in ORIGINAL or not hasattr(base, "options") or not hasattr(base, "values"):
        return
    ORIGINAL[base] = (base.values, base.__hash__)
    base.values = _values
    base.__hash__ = _hash


def install() -> list[str]:
    """Patch every loaded ``TargetConfig`` (a module named ``*targetconfig``); returns the modules patched."""
    if os.environ.get("KERNELS_FAST_FLAGS", "1").strip() == "0":
        return []
    done = []
    for name, mod in list(sys.modules.items()):
        if name.endswith("targetconfig") and isinstance(getattr(mod, "TargetConfig", None), type):
            _patch(mod.TargetConfig)
            done.append(name)
    return done
