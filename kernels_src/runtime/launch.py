"""Launch plans: the launches of one step, recorded once and replayed cheaply.

A numba.cuda launch from Python costs tens of microseconds of host time (``kernels launchcost`` measures
it), most of it spent re-deriving what does not change between two decode steps: which overload the
argument types select, and how each array flattens into kernel parameters. A decode step launches the same
kernels on the same static buffers every time, with the position kept in a device buffer. So the runtime
records the step once (every launch the registered launchers make, in order), packs each launch's
parameters into a ctypes array, and replays the list with one ``cuLaunchKernel`` per kernel:

    plan, out = Plan.record(step)     # runs step() once, normally, and records its launches
    plan.run()                        # the same launches again, on the same buffers
    plan.summary()                    # launches per kernel, parameters per launch

What a plan cannot see, it cannot replay: host work inside the step (a copy to or from the device, an
allocation, a value read back to choose a grid). Such work has to move out of the step (static buffers,
device-side position) before a plan, or a CUDA graph (:mod:`kernels_src.runtime.graphs`), is correct.
"""
from __future__ import annotations

from collections import Counter

from ..compiler import launch as _launch

AVAILABLE, WHY = _launch.AVAILABLE, _launch.WHY


class Plan:
    """The packed launches of one step, in order. ``run(stream)`` replays them."""

    def __init__(self, records):
        self.records = list(records)
        self.packed = [_launch.pack(r) for r in self.records]

    @classmethod
    def record(cls, fn, *args, **kw):
        """Run ``fn(*args, **kw)`` once with every kernel launch recorded; returns (plan, fn's result)."""
        rec: list = []
        with _launch.recording(rec):
            out = fn(*args, **kw)
        return cls(rec), out

    def __len__(self):
        return len(self.packed)

    def run(self, stream=0):
        for p in self.packed:
            p.launch(stream)

    def kernels(self) -> list[str]:
        return [p.name for p in self.packed]

    def summary(self) -> dict:
        """{"launches": n, "by_kernel": {name: count}, "params": total kernel parameters}."""
        return {"launches": len(self.packed), "by_kernel": dict(Counter(self.kernels())),
                "params": sum(p.n_params for p in self.packed)}
