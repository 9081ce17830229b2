"""Measurement and code-generation tools (sweeps, profiling drivers, codegen evidence): kept beside bench.py, apart from the kernels in ops/."""
