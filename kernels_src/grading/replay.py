"""The launches a launcher made on decoy inputs (recorded by :mod:`.planrun`), replayed by the grader on its own
arrays: each recorded host write applied, each kernel launched with the recorded grid, block, dynamic shared
memory and arguments (the grader's arrays, views of them, arrays the launcher made, scalars).

Used by the exec run (:mod:`.worker`, in the simulator) and by the speed worker (:mod:`.perfworker`, on a GPU),
through one loop (:func:`replay_launches`) and one argument builder (:func:`kernel_args`). The two differ only in
what they pass: how a made array goes to the device, where a scalar input's value comes from (the speed runs
vary them), whether a view may be rebuilt, and how a host write reaches an array."""
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


def kernel_args(la, real, plan_arrays, cache, to_device, *, scalars=None, views=True) -> list:
    """The arguments of the recorded launch ``la``, rebuilt on the grader's arrays: the one builder of both replays.

    - ``out``/``in``: the grader's array ``real[(kind, k)]``;
    - ``view``: a view of one of them with the recorded offset, shape, strides and dtype (``views=True``, the
      simulator, whose arrays are host memory; the speed path passes ``False``: its device arrays are fresh
      allocations each run, and a view is an error there);
    - ``made``: an array the launcher made (scratch, given constants), made once per recorded id with
      ``to_device(host copy)`` and kept in ``cache``; when the host changed it between launches, the recorded
      contents are copied into the same array again;
    - ``scalar``: the recorded value, or, for a scalar that was one of the inputs and a ``scalars`` mapping
      (``("scalar", k)`` -> this run's value; the speed path, whose runs vary the scalars), this run's value.
    """
    import numpy as np

    args = []
    for a in la["args"]:
        kind = a["kind"]
        if kind in ("out", "in"):
            args.append(real[(kind, a["k"])])
        elif kind == "view" and views:
            base = real[(a["role"], a["k"])]._ary
            v = np.ndarray(tuple(a["shape"]), np.dtype(a["dtype"]), buffer=base, offset=a["offset"],
                           strides=tuple(a["strides"]))
            args.append(_fake(v))
        elif kind == "view":
            raise TypeError("a kernel argument of kind 'view' (a view of an array) is not supported by speed "
                            "questions: pass whole arrays")
        elif kind == "made":
            arr = cache.get(a["id"])
            src = plan_arrays[a["key"]]
            if arr is None:
                arr = cache[a["id"]] = to_device(np.array(src, copy=True))
            elif not np.array_equal(_bits(src), _bits(cache.setdefault(("snap", a["id"]), src))):
                arr.copy_to_device(np.ascontiguousarray(src))  # the host changed it between launches
            cache[("snap", a["id"])] = src
            args.append(arr)
        elif kind == "scalar" and scalars is not None and a.get("input") is not None:
            args.append(scalar_arg(dict(a, value=scalars[("scalar", a["input"])].item())))
        elif kind == "scalar":
            args.append(scalar_arg(a))
        else:
            raise TypeError(f"a kernel argument of type {a.get('type')} cannot be passed to a kernel")
    return args


def replay_launches(made, plan, real, plan_arrays, cache, to_device, apply_writes, *, scalars=None,
                    views=True) -> None:
    """Launch the plan's kernels, in order, on the grader's arrays, each recorded host write applied first
    (``apply_writes(writes)``) and those after the last launch at the end. The arguments come from
    :func:`kernel_args` (``to_device``, ``scalars`` and ``views`` are passed through)."""
    for la in plan["launches"]:
        apply_writes(la.get("host_writes"))
        kernel = made.get(la["kernel"])
        if kernel is None or la["module"] != "submission":
            continue
        launch_recorded(kernel, la, kernel_args(la, real, plan_arrays, cache, to_device, scalars=scalars,
                                                views=views))
    apply_writes(plan.get("end_writes"))


def _fake(v):
    from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

    return FakeCUDAArray(v)


def _replay(made, plan, real, plan_arrays, cache) -> list:
    """The exec run's replay, in the simulator: its arrays are host memory (a view is a view of that memory), and
    recorded host writes go straight into it."""
    def apply_writes(writes):
        for d, idx, val in host_writes(writes, real, plan_arrays):
            write_flat(d._ary.reshape(-1), idx, val)

    replay_launches(made, plan, real, plan_arrays, cache, _fake, apply_writes)
    return []
