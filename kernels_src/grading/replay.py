"""The launches a launcher made on decoy inputs (recorded by :mod:`.planrun`), replayed by the grader on its own
arrays: each recorded host write applied, each kernel launched with the recorded grid, block, dynamic shared
memory and arguments (the grader's arrays, views of them, arrays the launcher made, scalars).

Used by the exec run (:mod:`.worker`, in the simulator) and by the speed worker (:mod:`.perfworker`, on a GPU)."""
from __future__ import annotations

def _bits(a):
    import numpy as np

    a = np.ascontiguousarray(a)
    return a.view(np.dtype(f"u{a.dtype.itemsize}")) if a.dtype.itemsize in (1, 2, 4, 8) else a.view(np.uint8)


def host_writes(writes, real, plan_arrays):
    """``(array, idx, val)`` for each host write recorded between launches that lands in one of the grader's
    arrays (``real``): the plan run's flat indices and the values written there."""
    for w in writes or []:
        d = real.get((w["role"], w["k"]))
        idx = plan_arrays.get(w["key"] + "_idx")
        val = plan_arrays.get(w["key"] + "_val")
        if d is not None and idx is not None and val is not None:
            yield d, idx, val


def write_flat(flat, idx, val) -> None:
    """Apply one recorded host write to a flat host view, ignoring indices outside it."""
    ok = (idx >= 0) & (idx < flat.size)
    flat[idx[ok]] = val[ok].astype(flat.dtype, copy=False)


def scalar_arg(a):
    """A recorded scalar kernel argument, rebuilt with its type (Python int/float/bool or a NumPy scalar)."""
    import numpy as np

    t = a["dtype"]
    return {"int": int, "float": float, "bool": bool}[t](a["value"]) if t in ("int", "float", "bool") \
        else np.dtype(t).type(a["value"])


def launch_recorded(kernel, la, args) -> None:
    """Launch ``kernel`` with the recorded launch ``la``'s grid, block and dynamic shared memory."""
    grid, block = tuple(la["grid"]), tuple(la["block"])
    if la.get("dynshared"):
        kernel[grid, block, 0, la["dynshared"]](*args)
    else:
        kernel[grid, block](*args)


def _apply_host_writes(writes, real, plan_arrays) -> None:
    for d, idx, val in host_writes(writes, real, plan_arrays):  # simulator arrays: write their host buffer
        write_flat(d._ary.reshape(-1), idx, val)


def _replay(made, plan, real, plan_arrays, cache) -> list:
    """Launch the plan's kernels, in order, on the grader's arrays."""
    import numpy as np

    from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

    for la in plan["launches"]:
        _apply_host_writes(la.get("host_writes"), real, plan_arrays)
        kernel = made.get(la["kernel"])
        if kernel is None or la["module"] != "submission":
            continue
        args = []
        for a in la["args"]:
            kind = a["kind"]
            if kind in ("out", "in"):
                args.append(real[(kind, a["k"])])
            elif kind == "view":
                base = real[(a["role"], a["k"])]._ary
                v = np.ndarray(tuple(a["shape"]), np.dtype(a["dtype"]), buffer=base, offset=a["offset"],
                               strides=tuple(a["strides"]))
                args.append(FakeCUDAArray(v))
            elif kind == "made":
                arr = cache.get(a["id"])
                src = plan_arrays[a["key"]]
                if arr is None:
                    arr = cache[a["id"]] = FakeCUDAArray(np.array(src, copy=True))
                elif not np.array_equal(_bits(src), _bits(cache.setdefault(("snap", a["id"]), src))):
                    arr._ary[...] = src  # the host changed it between launches
                cache[("snap", a["id"])] = src
                args.append(arr)
            elif kind == "scalar":
                args.append(scalar_arg(a))
            else:
                raise TypeError(f"a kernel argument of type {a.get('type')} cannot be passed to a kernel")
        launch_recorded(kernel, la, args)
    _apply_host_writes(plan.get("end_writes"), real, plan_arrays)
    return []
