"""The description of a check (:class:`CheckSpec`) and its outcome (:class:`Verdict`): plain data, importable
without the course's registry (the otter run of a notebook and the sandboxed worker use them)."""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class CheckSpec:
    kind: str  # "cpu" (an @njit function) or "gpu" (a launcher and its @cuda.jit kernels)
    function: str  # the name the student's notebook must define
    op: str  # a registered op or an exercise op: gives the reference, inputs, sizes and tolerance
    kernels: tuple = ()  # GPU: names of the @cuda.jit kernels the launcher must launch
    sizes: tuple | None = None  # default: the op's "check" sizes (CPU) or "check_sim" sizes (GPU)
    edge: bool = False  # also run the op's edge-value inputs (zeros, inf, NaN, ...)
    hidden: bool = False
    dtype: str = "float32"
    racecheck: bool = True
    ptx: bool = True
    forbid: tuple = ()  # extra forbidden names, e.g. ("np.add",)
    allow: tuple = ()  # default-forbidden NumPy names this exercise allows, e.g. ("sum",)
    args: tuple = ()  # argument names for messages, e.g. ("out", "a", "x", "y")
    timeout: float | None = None

    @property
    def key(self) -> str:
        blob = json.dumps(asdict(self), sort_keys=True, default=list)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    @property
    def title(self) -> str:
        hidden = ", hidden test" if self.hidden else ""
        if self.kind == "gpu":
            ks = ", ".join(f"`{k}`" for k in self.kernels)
            return f"`{self.function}` (GPU launcher of {ks}{hidden})" if ks else f"`{self.function}` (GPU{hidden})"
        return f"`{self.function}` (CPU, Numba{hidden})"


@dataclass
class Verdict:
    key: str
    title: str
    passed: bool
    feedback: str
    seed: int = 0
    seconds: float = 0.0
    status: str = "ok"  # ok | fail | error (the grader itself failed: never the student's fault)
    flags: list = field(default_factory=list)  # instructor notes: suspicious constructs in the code
    timed_out: bool = False  # the student's code did not finish within the check's time limit
    sandbox: list = field(default_factory=list)  # protections the sandbox lacked on this machine (confine.weaknesses)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> "Verdict":
        return cls(**d)


class GraderError(RuntimeError):
    """The exercise itself is broken (e.g. every reference output is zero): an author's bug."""
