"""Where the committed benchmark data lives: ``book/data/bench`` of the checkout, or the folder named by
``KERNELS_BENCH_DATA`` (the Gradescope autograder installs the library as a package and ships the data
beside it). Predict-then-measure exercises and the book's figures read it through :data:`BENCH_DATA`."""
from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH_DATA = Path(os.environ.get("KERNELS_BENCH_DATA") or ROOT / "book" / "data" / "bench")

# CPU results are kept per machine, in a folder named by the CPU's model and core count (``bench.cpu_slug()``):
# book/data/bench/cpu/<machine>/<op>_cpu.json. The book's CPU tables and figures come from this machine's.
CPU_MACHINE = os.environ.get("KERNELS_CPU_MACHINE") or "intel-xeon-processor-2c"
CPU_BENCH_DATA = BENCH_DATA / "cpu" / CPU_MACHINE
# The machine issue 36 set the CPU goals on: 2 cores with AVX2 only (no AVX-512), where the zmm rungs are skipped.
# Chapter 1 sets its scoreboard beside the book's machine's, and explains its misses from its own machine code.
CPU_MACHINE_AVX2 = "amd-epyc-2c"
