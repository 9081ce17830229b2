"""Tile decisions from the device's autotune table: which tile shape a kernel launches with at a given shape.

The dispatcher (:mod:`kernels_src.runtime.dispatch`) chooses *which kernel* runs a role; some kernels also have a
*tile shape* to choose, and the right one depends on the head size, the mask and the GPU. ``kernels autotune
--attention`` times every tile a kernel can build on this GPU and writes the winners into the same table file
the dispatcher reads (``tables/<device>.json``), under the key ``"tiles"``:

    {"kind": "attention", "variant": "attention/gpu/flash_shfl", "D": 64, "causal": 0,
     "best": {"BR": 64, "BC": 64, "TM": 8, "TN": 8, "minblocks": 3}, "us": {"64x64x8x8/3": 2215.0, ...}, ...}

A kernel asks :func:`choose_tile` with its key (variant, D, causal), its documented default and the list of
tiles it can build. The answer is the table's ``best`` for that exact key, or the default when the table has no
such entry or there is no table (CPU, simulator, an unknown GPU, ``KERNELS_DISPATCH_TABLE=none``). A table whose
``best`` is not a tile the kernel can build is refused with :class:`TileTableError` naming the entry and the tiles
that exist: never launched as some other tile, never silently replaced by the default.
"""
from __future__ import annotations

import json
from pathlib import Path

from .dispatch import DispatchTableError, default_table_path

TILE_KEYS = ("BR", "BC", "TM", "TN", "minblocks")


class TileTableError(DispatchTableError):
    """A table's tile entry names a tile the kernel cannot build (or is malformed)."""


def tile_text(t: dict) -> str:
    """{'BR': 64, 'BC': 64, 'TM': 8, 'TN': 8, 'minblocks': 3} -> '64x64x8x8/3' (the key of an entry's timings)."""
    return "x".join(str(t[k]) for k in ("BR", "BC", "TM", "TN")) + f"/{t.get('minblocks') or 0}"


def _norm(t) -> dict:
    if not isinstance(t, dict) or any(k not in TILE_KEYS for k in t) or any(k not in t for k in TILE_KEYS[:4]):
        raise TileTableError(f"a tile is a JSON object with {', '.join(TILE_KEYS[:4])} (and optional minblocks), "
                             f"not {t!r}")
    return {k: int(t.get(k) or 0) for k in TILE_KEYS}


_loaded: dict = {}


def load_tiles(table=None, dev: str = "gpu") -> tuple[list, str]:
    """The tile entries of a table (a dict, a path, or None: this device's committed table, if any) and where
    they came from."""
    if table is None:
        path = default_table_path(dev)
        if path is None:
            return [], "defaults (no table for this device)"
        table = path
    if isinstance(table, (str, Path)):
        path = Path(table)
        key = (str(path), path.stat().st_mtime if path.exists() else None)
        if key not in _loaded:
            try:
                _loaded[key] = json.loads(path.read_text())
            except FileNotFoundError:
                raise TileTableError(f"dispatch table {path} does not exist") from None
            except json.JSONDecodeError as e:
                raise TileTableError(f"dispatch table {path} is not valid JSON: {e}") from None
        return list(_loaded[key].get("tiles") or []), str(path)
    if not isinstance(table, dict):
        raise TileTableError(f"a dispatch table is a JSON object, not {type(table).__name__}")
    return list(table.get("tiles") or []), "given"


def choose_tile(kind: str, key: dict, default: dict, candidates: list[dict], table=None, dev: str = "gpu"):
    """(tile, source): the table's winner for ``key`` (e.g. {"variant": ..., "D": 64, "causal": 0}) if it has an
    entry for exactly that key, else ``default``. Raises TileTableError if that entry's tile is not among
    ``candidates`` (the tiles the kernel can build at this key; a list, or a function returning one)."""
    entries, where = load_tiles(table, dev)
    for i, e in enumerate(entries):
        if e.get("kind") != kind or any(e.get(k) != v for k, v in key.items()):
            continue
        best = _norm(e.get("best"))
        ok = [_norm(c) for c in (candidates() if callable(candidates) else candidates)]
        if best not in ok:
            raise TileTableError(
                f"{where}: tile entry {i} ({kind} " + " ".join(f"{k}={v}" for k, v in key.items())
                + f") names tile {tile_text(best)}, which this kernel cannot build; tiles that exist: "
                + ", ".join(tile_text(c) for c in ok))
        return best, f"table ({where}, entry {i})"
    return _norm(default), "default" if where == "given" or not entries else f"default (no entry in {where})"
