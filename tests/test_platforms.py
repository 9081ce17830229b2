"""Per-platform installs: the lock's markers, make.py (the README's commands without make), doctor's advice.

The macOS set itself is installed and exercised by `.ci/run` (a second venv with exactly the macOS pins, on
Linux); these tests check the pieces that decide it, and run in both venvs.
"""
import importlib.util
import io
import re
import subprocess
import sys
import tomllib
from contextlib import redirect_stdout
from importlib import metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CUDA_ONLY = re.compile(r"^(numba-cuda|cuda-[a-z-]+|nvidia-[a-z0-9-]+)$")


def _make():
    spec = importlib.util.spec_from_file_location("make_py", ROOT / "make.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _names(pins):
    return {re.sub(r"[-_.]+", "-", p.split("==")[0]).lower(): p.split("==")[1] for p in pins}


@pytest.mark.parametrize("platform", ["macos-arm64", "macos-x86_64"])
def test_macos_set_has_no_cuda_package(platform):
    mk = _make()
    for pv in ("3.11", "3.12", "3.13"):
        names = _names(mk.lock_pins(platform, pv))
        assert not [n for n in names if CUDA_ONLY.match(n)], "macOS has no build of these"
        assert names["numba"] == "0.68.1" and names["numpy"] == "2.3.5" and "appnope" in names
        assert "colorama" not in names and "pywinpty" not in names


def test_linux_and_windows_keep_every_cuda_pin():
    mk = _make()
    lock = [ln for ln in (ROOT / "requirements.lock").read_text().splitlines() if "==" in ln]
    cuda_pins = {ln.split(";")[0].strip() for ln in lock if CUDA_ONLY.match(_canon(ln.split("==")[0]))}
    assert "numba-cuda==0.30.4" in cuda_pins and len(cuda_pins) >= 8
    for platform in ("linux", "windows"):
        pins = set(mk.lock_pins(platform, "3.12"))
        assert cuda_pins <= pins, platform
    assert {"colorama==0.4.6", "pywinpty==3.1.2"} <= set(mk.lock_pins("windows", "3.12"))
    linux = _names(mk.lock_pins("linux", "3.12"))
    assert not {"appnope", "colorama", "pywinpty"} & set(linux)


def _canon(name):
    return re.sub(r"[-_.]+", "-", name).lower()


@pytest.mark.skipif(sys.platform != "linux", reason="compares the Linux set with this Linux install")
def test_this_linux_install_is_the_linux_set():
    """What is installed here is exactly the lock's Linux set, pin for pin (the macOS CI venv: its own set)."""
    mk = _make()
    platform = "linux" if _has("numba-cuda") else "macos-arm64"
    want = _names(mk.lock_pins(platform))
    got = {_canon(d.metadata["Name"]): d.version for d in metadata.distributions()}
    # (a pin that this Python does not need, such as `overrides` from 3.12 on, is simply not installed)
    wrong = {n: (v, got[n]) for n, v in want.items() if n in got and got[n] != v}
    assert not wrong, f"installed versions differ from requirements.lock's {platform} set: {wrong}"
    core = ["numpy", "numba", "llvmlite"] + (["numba-cuda", "nvidia-nvvm"] if platform == "linux" else [])
    assert all(n in got for n in core), [n for n in core if n not in got]
    extra = [n for n in got if CUDA_ONLY.match(n) and n not in want]
    assert not extra, f"installed but not in the {platform} set: {extra}"


def _has(dist):
    try:
        metadata.version(dist)
        return True
    except metadata.PackageNotFoundError:
        return False


def test_pyproject_gives_macos_no_numba_cuda():
    from packaging.requirements import Requirement

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    darwin = {"sys_platform": "darwin", "platform_system": "Darwin", "platform_machine": "arm64", "extra": ""}
    linux = {"sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64", "extra": ""}
    for reqs in (project["dependencies"], project["optional-dependencies"]["all"]):
        cuda = [Requirement(r) for r in reqs if Requirement(r).name == "numba-cuda"]
        assert len(cuda) == 1 and cuda[0].marker is not None
        assert not cuda[0].marker.evaluate(darwin) and cuda[0].marker.evaluate(linux)
        assert not [r for r in reqs if CUDA_ONLY.match(Requirement(r).name) and Requirement(r).name != "numba-cuda"]


def test_make_lock_keeps_the_markers():
    """`make lock` (pip freeze on Linux) must not drop macOS's and Windows's markers and pins."""
    mk = _make()
    lock = (ROOT / "requirements.lock").read_text()
    freeze = "\n".join(mk.lock_pins("linux") + ["pip==26.3", "-e file:///x#egg=kernels-from-scratch"]) + "\n"
    assert mk.merge_lock(freeze, lock) == lock
    bumped = freeze.replace("numba-cuda==0.30.4", "numba-cuda==0.30.5")
    assert 'numba-cuda==0.30.5 ; sys_platform != "darwin"' in mk.merge_lock(bumped, lock)


def test_unknown_platform_is_a_clear_error(capsys):
    mk = _make()
    with pytest.raises(SystemExit):
        mk.lock_pins("amiga")
    assert "unknown platform 'amiga'" in capsys.readouterr().err


def test_make_py_needs_no_install():
    """make.py runs before anything is installed: the standard library only (packaging via pip's copy)."""
    src = (ROOT / "make.py").read_text()
    imports = set(re.findall(r"^\s*(?:from|import) ([a-zA-Z_]+)", src, re.M))
    assert imports <= set(sys.stdlib_module_names) | {"packaging", "pip"}, imports
    r = subprocess.run([sys.executable, "-I", str(ROOT / "make.py"), "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "book" in r.stdout and "test" in r.stdout, r.stderr
    r = subprocess.run([sys.executable, "-I", str(ROOT / "make.py"), "platforms", "macos", "windows", "--list"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "macos-arm64 (CPython 3.12):" in r.stdout and "pywinpty==3.1.2" in r.stdout


def test_makefile_calls_make_py():
    """One implementation of the two commands: make's book/test/venv targets are make.py's."""
    text = (ROOT / "Makefile").read_text()
    for target in ("book", "test", "venv"):
        assert re.search(rf"\$\(PYTHON\) make\.py {target}\b", text), target
    assert "make test" in (ROOT / ".ci" / "run").read_text()


def _doctor_output(monkeypatch, builtin: bool, darwin: bool) -> tuple[int, str]:
    from kernels_src import compiler, doctor, ptx

    if builtin:
        monkeypatch.setattr(compiler, "NAME", "numba-builtin")
        real = doctor._version
        monkeypatch.setattr(doctor, "_version", lambda m: None if m == "numba-cuda" else real(m))
    if darwin:
        monkeypatch.setattr(sys, "platform", "darwin")
        monkeypatch.setattr(doctor, "NUMBA_CUDA_INSTALLABLE", False)
    monkeypatch.setattr(ptx, "compile_registry_subprocess", lambda *a, **k: pytest.fail("must not try PTX"))
    buf = io.StringIO()
    with redirect_stdout(buf):
        rc = doctor.doctor()
    return rc, buf.getvalue()


def test_doctor_on_a_mac_says_what_runs_and_asks_for_nothing(monkeypatch):
    rc, out = _doctor_output(monkeypatch, builtin=True, darwin=True)
    assert rc == 0, out
    runs = [ln for ln in out.splitlines() if ln.startswith("runs here")]
    assert len(runs) == 1 and "CPU kernels" in runs[0] and "no PTX check" in runs[0], out
    assert "GPU kernels in the CUDA simulator" in runs[0] or "skipped" in runs[0], out
    assert "PTX (sm_90)   skipped: numba-cuda is not installed (it has no macOS build)" in out
    assert "pip install" not in out and "No problems found." in out


def test_doctor_without_numba_cuda_on_linux_says_reinstall(monkeypatch):
    rc, out = _doctor_output(monkeypatch, builtin=True, darwin=False)
    assert rc == 1 and "numba-cuda is missing" in out and "reinstall the pinned environment" in out, out
    assert "no PTX check" in out


def test_kernels_ptx_skips_in_one_line_without_numba_cuda(monkeypatch, capsys):
    from kernels_src import cli, compiler

    monkeypatch.setattr(compiler, "NAME", "numba-builtin")
    assert cli.main(["ptx", "axpy"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith("PTX check skipped: numba-cuda is not installed"), out


@pytest.mark.skipif(_has("numba-cuda"), reason="runs in the macOS set (numba-cuda absent): .ci/run's second venv")
def test_macos_set_simulates_with_numbas_builtin_cuda():
    import kernels_src
    from kernels_src import compiler, ptx

    assert compiler.NAME == "numba-builtin" and ptx.unavailable()
    assert kernels_src.device.SIMULATED


def test_simulated_device_function_of_another_module_keeps_the_fake_cuda(tmp_path, monkeypatch):
    """A block's threads inside a device function of another module: numba's built-in simulator (the macOS
    set) swapped that module's ``cuda`` back to the real one when the first thread returned, so the others
    failed with "module 'numba.cuda' has no attribute 'threadIdx'". kernels_src.simulator counts entries."""
    import numpy as np

    import kernels_src
    from kernels_src.device import simulator_speedup

    if not kernels_src.device.SIMULATED:
        pytest.skip("simulator only")
    (tmp_path / "p37_dev.py").write_text(
        "from kernels_src.compiler import cuda\n\n@cuda.jit(device=True)\ndef tid(x):\n    s = 0\n"
        "    for _ in range(200):\n        s += cuda.threadIdx.x\n    return x + s // 200\n")
    (tmp_path / "p37_kern.py").write_text(
        "from kernels_src.compiler import cuda\nfrom p37_dev import tid\n\n@cuda.jit\ndef k(out):\n"
        "    out[cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x] = tid(0)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import p37_kern

    for _ in range(3):
        out = np.full(128, -1, np.int64)
        with simulator_speedup():
            p37_kern.k[2, 64](out)
        np.testing.assert_array_equal(out, np.tile(np.arange(64), 2))


# ------------------------------------------------------------------------------------------ Windows: WSL2
def _readme_section(start: str, end: str) -> str:
    text = (ROOT / "README.md").read_text()
    assert start in text and end in text, (start, end)
    return text[text.index(start):text.index(end, text.index(start))]


def _makefile_targets() -> set[str]:
    return set(re.findall(r"^([a-z][a-z0-9_-]*):", (ROOT / "Makefile").read_text(), re.M))


# Ubuntu releases that `wsl --install -d NAME` installs, and the Python 3 they ship (apt's python3).
UBUNTU_PYTHON = {"Ubuntu-20.04": (3, 8), "Ubuntu-22.04": (3, 10), "Ubuntu-24.04": (3, 12), "Ubuntu": (3, 12)}


def test_readme_windows_steps_name_commands_that_exist():
    """The README's WSL2 steps: every command they give exists (a Makefile target, a make.py command that
    make.py's own parser accepts, an importable module of the pinned set), the Ubuntu they install ships a
    Python the course accepts, and apt installs exactly what the two commands need. So the steps cannot rot
    when a target or a command is renamed."""
    mk = _make()
    steps = _readme_section("#### Windows: WSL2", "**Why WSL2.**")
    distro = re.findall(r"`wsl --install -d ([\w.-]+)`", steps)
    assert len(distro) == 1 and distro[0] in UBUNTU_PYTHON, distro
    assert UBUNTU_PYTHON[distro[0]] >= mk.MIN_PYTHON, f"{distro[0]}'s python3 is older than make.py accepts"
    # apt: python3-venv (make.py runs `python3 -m venv`, and Ubuntu ships venv's ensurepip separately), make, git
    apt = re.findall(r"apt-get install -y ([a-z0-9. -]+?)\n", steps)
    assert len(apt) == 1 and set(apt[0].split()) == {"python3-venv", "make", "git"}, apt
    assert re.search(r"^PYTHON \?= python3$", (ROOT / "Makefile").read_text(), re.M)
    makes = re.findall(r"(?:^[ \t]*|`)make ([a-z][a-z0-9_-]*)", steps, re.M)  # a command: a line or a `span`
    assert {"book", "test", "lab"} <= set(makes), makes
    assert set(makes) <= _makefile_targets(), set(makes) - _makefile_targets()
    mods = re.findall(r"\.venv/bin/python -m ([\w.]+)((?: [\w./-]+)*)", steps)
    assert {m for m, _ in mods} == {"http.server", "playwright"}, mods
    lock = _names(mk.lock_pins("linux"))
    for mod, rest in mods:
        if mod == "playwright":
            assert "playwright" in lock
            assert rest.split()[:1] == ["install-deps"] and rest.split()[1:] == ["chromium"], rest
        else:
            assert rest.split() == ["-d", "_build/html"], rest  # where `make book` puts the site
    assert "/mnt/c" in steps and "localhost" in steps


def test_readme_make_py_commands_parse():
    """Every `make.py ...` command in the README (native Windows, CI, maintainers) parses with make.py's parser."""
    mk = _make()
    text = (ROOT / "README.md").read_text() + (ROOT / ".ci" / "run").read_text()
    found = re.findall(r"(?:py|python3?|\$\(PYTHON\)|\S*/bin/python) make\.py ([^`\n)]*)", text)
    assert len(found) >= 5, found
    for cmd in found:
        for alt in cmd.split(" | ") if "|" in cmd else [cmd]:
            mk.parser().parse_args([a.strip('"') for a in alt.split()])


def test_readme_platform_table_quotes_doctor():
    """The README's "what runs there" column is doctor's `runs here` line, word for word, on each platform."""
    from kernels_src.doctor import runs_here

    table = _readme_section("### Platforms", "#### Windows: WSL2")
    rows = {ln.split("|")[1].strip(): ln for ln in table.splitlines() if ln.startswith("| ")}
    want = {"Linux (x86-64) with an NVIDIA GPU": runs_here(True, False, "linux", "gpu"),
            "Linux (x86-64), no GPU": runs_here(False, False, "linux", "sim"),
            "macOS, Apple silicon (arm64)": runs_here(False, True, "macos", "sim"),
            "Windows 10 or 11 (x86-64)": runs_here(False, False, "wsl2", "sim")}
    for platform, line in want.items():
        assert platform in rows, (platform, list(rows))
        assert f"`{line}`" in rows[platform], (platform, line)


def test_doctor_names_the_platform(monkeypatch):
    from kernels_src import doctor

    for plat, release, want in (("linux", "6.8.0-45-generic", "linux"), ("darwin", "24.1.0", "macos"),
                                ("linux", "5.15.167.4-microsoft-standard-WSL2", "wsl2"), ("win32", "11", "windows")):
        monkeypatch.setattr(sys, "platform", plat)
        monkeypatch.setattr(doctor.platform, "release", lambda r=release: r)
        assert doctor.host() == want


def test_doctor_on_native_windows_points_to_wsl2(monkeypatch):
    """Native Windows is reported as a problem whose fix is WSL2, and the reason doctor gives is true: the
    grader's sandbox sets POSIX resource limits and passes a pipe by descriptor, which Windows lacks."""
    from kernels_src import doctor
    from kernels_src.grading import sandbox

    monkeypatch.setattr(doctor, "host", lambda: "windows")
    rc, out = _doctor_output(monkeypatch, builtin=True, darwin=False)
    assert rc == 1 and "native Windows: the exercises' checks cannot run here" in out, out
    assert "use WSL2 with Ubuntu" in out and "not the exercises' checks" in out, out
    src = Path(sandbox.__file__).read_text()
    assert "import resource" in src and "pass_fds=" in src, "the sandbox became portable: update doctor and README"


def test_book_into_another_folder_gets_its_own_cache(tmp_path):
    """`make.py book --out DIR` (CI's book build in the macOS set): the config differs from _config.yml only
    in the execution cache, which is DIR's own (a shared one would hand it the other build's outputs), and in
    the local extension's path, made absolute because Jupyter Book reads it from the config file's folder."""
    mk = _make()
    cfg = mk.book_config(tmp_path / "out")
    old, new = (ROOT / "_config.yml").read_text().splitlines(), cfg.read_text().splitlines()
    changed = [(a.strip(), b.strip()) for a, b in zip(old, new) if a != b]
    assert len(old) == len(new) and len(changed) == 2, changed
    assert changed[0] == ("cache: _build/.jupyter_cache", f"cache: {(tmp_path / 'out' / '.jupyter_cache').as_posix()}")
    ext = changed[1][1].split(":", 1)[1].split("#")[0].strip()
    assert Path(ext).is_absolute() and (Path(ext) / "kfs_site.py").exists(), changed[1]


def test_ci_builds_the_book_in_the_macos_set():
    """.ci/run builds the book (strict, chapters executed) with the macOS venv's Python, into its own folder."""
    mk = _make()
    ci = (ROOT / ".ci" / "run").read_text()
    books = [ln.split("make.py", 1)[1].split() for ln in ci.splitlines() if re.search(r"make\.py book\b", ln)]
    assert len(books) == 1, books
    args = mk.parser().parse_args([a.strip('"') for a in books[0]])
    assert args.venv == "$MACVENV" and args.out and args.out.startswith("_build/") and args.out != "_build"
    assert 'MACVENV=_build/macos-venv' in ci
