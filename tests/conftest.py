"""Shared test configuration.

The suite runs with no GPU: GPU variants run in the CUDA simulator at each op's small ``check_sim``
sizes. Tests marked ``gpu`` need a real GPU (run them on the H100 with ``KERNELS_DEVICE=gpu``).
"""
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
# Each test chooses how simulated blocks run (OS threads, or the sim_greenlets fixtures below); a
# KERNELS_SIM_THREADS left in the shell (the site's build sets it for the pages) must not choose for all of them.
os.environ.pop("KERNELS_SIM_THREADS", None)

# A full run that collects almost nothing means something is broken (an import error in a plugin, a
# renamed folder): fail instead of passing, whatever pytest's own exit code would be.
MIN_TESTS_FULL_RUN = 50


def pytest_configure(config):
    # One folder for the whole session, shared by pytest-xdist's workers (they inherit the environment): what a
    # test helper builds once for every worker (tests/_grading_support.py's generated exercises) goes there.
    if not hasattr(config, "workerinput") and not os.environ.get("KERNELS_TEST_SHARED"):
        import tempfile

        config._kernels_shared = os.environ["KERNELS_TEST_SHARED"] = tempfile.mkdtemp(prefix="kernels-tests-")


def pytest_unconfigure(config):
    shared = getattr(config, "_kernels_shared", None)
    if shared:
        import shutil

        shutil.rmtree(shared, ignore_errors=True)
        os.environ.pop("KERNELS_TEST_SHARED", None)


def pytest_sessionfinish(session, exitstatus):
    if hasattr(session.config, "workerinput"):  # xdist worker: the controller decides
        return
    if _is_full_run(session.config) and session.testscollected < MIN_TESTS_FULL_RUN:
        print(f"\nERROR: only {session.testscollected} tests were collected (expected at least "
              f"{MIN_TESTS_FULL_RUN}); refusing to pass.", file=sys.stderr)
        session.exitstatus = 1


def _is_full_run(config) -> bool:
    args = [Path(a).resolve() for a in config.args]
    return (not args or args == [ROOT / "tests"]) and not config.option.keyword and not config.option.markexpr


def pytest_collection_modifyitems(config, items):
    import kernels_src

    if _is_full_run(config):  # a test file that silently collects nothing is a broken test file
        files = {p.name for p in (ROOT / "tests").glob("test_*.py")}
        seen = {Path(str(item.fspath)).name for item in items}
        if files - seen:
            raise pytest.UsageError(f"these test files collected no tests: {sorted(files - seen)}")

    if kernels_src.device.MODE != "gpu":
        skip = pytest.mark.skip(reason=f"needs a real GPU ({kernels_src.device.REASON})")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)

    from kernels_src.ptx import unavailable

    if unavailable():  # numba's built-in numba.cuda (the macOS set): it simulates but cannot compile
        skip = pytest.mark.skip(reason=f"needs NVVM: {unavailable()}")
        for item in items:
            if "ptx" in item.keywords:
                item.add_marker(skip)

    # The longest tests first (the PTX compiles of the whole registry, the browser tests, those marked slow), the
    # rest in file order: with pytest-xdist's work stealing (make.py runs `-n auto --dist worksteal`), the workers'
    # last tests are then short ones, so that they end together instead of one waiting on the other's long test.
    # The order changes nothing else: no test depends on another having run. (--ff / --nf keep their own order.)
    if not (config.getoption("failedfirst", False) or config.getoption("newfirst", False)):
        items.sort(key=_start_order)


def _start_order(item) -> int:
    for rank, mark in enumerate(("ptx", "browser", "slow")):
        if item.get_closest_marker(mark) is not None:
            return rank
    return 3


@pytest.fixture
def run_python():
    """Run a snippet in a fresh interpreter (device selection happens once per process)."""
    import subprocess

    def run(code: str, env: dict | None = None, timeout: int = 300):
        e = dict(os.environ)
        e.pop("NUMBA_ENABLE_CUDASIM", None)
        e.update(env or {})
        e["PYTHONPATH"] = str(ROOT) + os.pathsep + e.get("PYTHONPATH", "")
        return subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True,
                              timeout=timeout, cwd=ROOT)

    return run


@pytest.fixture
def sim_greenlets():
    """Simulated blocks run their threads as greenlets during the test (kernels_src.simulator.threads_as_greenlets):
    several times faster, one schedule a GPU may run. For tests of race-free kernels' results (a model against
    its reference); whether each kernel is race-free is tested with OS threads (tests/test_registry.py's race
    test). No effect on a real GPU or without greenlet."""
    import contextlib
    import importlib.util

    import kernels_src

    if not kernels_src.device.SIMULATED or importlib.util.find_spec("greenlet") is None:
        ctx = contextlib.nullcontext()
    else:
        from kernels_src.simulator import threads_as_greenlets

        ctx = threads_as_greenlets()
    with ctx:
        yield


@pytest.fixture
def sim_race_checked():
    """In the simulator, the test's launches run through the race detector with blocks' threads as greenlets
    (:func:`kernels_src.grading.racecheck.instrumented`, engine "greenlets"): as fast as ``sim_greenlets``, and the
    test also fails on a shared-memory race or a barrier some threads skip (the detector's verdict does not depend
    on the schedule). For tests of kernels at sizes beyond the registry's race test (several tiles, odd K tiles).
    No effect on a real GPU or without greenlet."""
    import importlib.util

    import kernels_src

    if not kernels_src.device.SIMULATED or importlib.util.find_spec("greenlet") is None:
        yield
        return
    from kernels_src.grading.racecheck import instrumented

    with instrumented(engine="greenlets") as session:
        yield
    races = session.report()
    assert races.ok, str(races)


@pytest.fixture(scope="session")
def browser():
    """A headless Chromium (Playwright); skips the test without one, fails under REQUIRE_BROWSER=1.
    See tests/_browser.py."""
    import _browser

    with _browser.launch() as b:
        yield b
