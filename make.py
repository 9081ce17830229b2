#!/usr/bin/env python3
"""The README's commands without `make`, for a machine that has Python but no make.

    python make.py book    build the course site into _build/html (creates .venv and installs the pins first)
    python make.py test    build the book, then run the whole test suite
    python make.py lab     open the chapters and exercises in JupyterLab
    python make.py venv    only create .venv and install the pinned environment

The Makefile's ``book``, ``test`` and ``venv`` targets call this file, so both spellings do the same thing,
and CI's ``make test`` runs it. On Windows the tested path is WSL2 with the Linux commands (README, "Windows:
WSL2"); ``py make.py book`` natively is untested, and the exercises' checks cannot run there.

It uses only the standard library: it runs before anything is installed. The environment is the ``all`` extra
of pyproject.toml constrained by requirements.lock, whose platform markers pip applies for the machine it
runs on (macOS gets no numba-cuda). These serve CI and maintainers:

    python make.py platforms [--download] [PLATFORM ...]
                           print each platform's pinned set (from the lock's markers); with --download,
                           ask PyPI for a wheel of every pin (``pip download --platform``) and fail on a miss
    python make.py venv --platform macos --venv DIR
                           a venv with exactly the macOS set, on this (Linux) machine: what CI tests Macs with
    python make.py book --venv DIR --out OUT
                           the same strict book build, its chapters executed by that venv, into OUT/_build/html
"""
from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent
LOCK = ROOT / "requirements.lock"
VENV = ROOT / ".venv"
MIN_PYTHON = (3, 11)

# Platform name -> (the marker environment pip sees there, the wheel tags `pip download --platform` asks for).
PLATFORMS = {
    "linux": ({"sys_platform": "linux", "platform_system": "Linux", "os_name": "posix",
               "platform_machine": "x86_64"}, ["manylinux_2_28_x86_64", "manylinux2014_x86_64"]),
    "macos-arm64": ({"sys_platform": "darwin", "platform_system": "Darwin", "os_name": "posix",
                     "platform_machine": "arm64"}, ["macosx_14_0_arm64"]),
    "macos-x86_64": ({"sys_platform": "darwin", "platform_system": "Darwin", "os_name": "posix",
                      "platform_machine": "x86_64"}, ["macosx_14_0_x86_64"]),
    "windows": ({"sys_platform": "win32", "platform_system": "Windows", "os_name": "nt",
                 "platform_machine": "AMD64"}, ["win_amd64"]),
}
ALIASES = {"macos": "macos-arm64", "mac": "macos-arm64", "win": "windows", "win32": "windows", "darwin": "macos-arm64"}


def fail(msg: str) -> None:
    print(f"make.py: {msg}", file=sys.stderr)
    raise SystemExit(1)


def run(cmd, **kw) -> None:
    print("+ " + " ".join(str(c) for c in cmd), flush=True)
    r = subprocess.run([str(c) for c in cmd], **kw)
    if r.returncode != 0:
        raise SystemExit(r.returncode)


def venv_python(venv: Path = VENV) -> Path:
    return venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


# ----------------------------------------------------------------------------------------- the lock's sets
def _marker_class():
    """packaging's Marker: from the installed package, else pip's vendored copy (this file needs no install)."""
    try:
        from packaging.markers import Marker
    except ImportError:
        from pip._vendor.packaging.markers import Marker  # type: ignore[no-redef]
    return Marker


def lock_pins(platform: str, python_version: str | None = None, lock: Path = LOCK) -> list[str]:
    """The pins (``name==version``) of requirements.lock whose marker holds on ``platform``."""
    platform = ALIASES.get(platform, platform)
    if platform not in PLATFORMS:
        fail(f"unknown platform {platform!r}: one of {', '.join(PLATFORMS)}")
    Marker = _marker_class()
    env = dict(PLATFORMS[platform][0])
    pv = python_version or "{}.{}".format(*sys.version_info[:2])
    env.update(python_version=pv, python_full_version=pv + ".0", implementation_name="cpython",
               platform_python_implementation="CPython")
    pins = []
    for line in lock.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        pin, _, marker = (part.strip() for part in line.partition(";"))
        if not re.fullmatch(r"[A-Za-z0-9_.\-]+==[^=\s;]+", pin):
            fail(f"requirements.lock: {line!r} is not `name==version [; marker]`")
        if not marker or Marker(marker).evaluate(env):
            pins.append(pin)
    return pins


def download_check(platform: str, python_version: str, dest: Path) -> list[str]:
    """``pip download --platform`` of every pin of ``platform``'s set; returns the pins with no wheel there."""
    platform = ALIASES.get(platform, platform)
    pins = lock_pins(platform, python_version)
    tags = [a for t in PLATFORMS[platform][1] for a in ("--platform", t)]
    base = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", *tags,
            "--python-version", python_version, "--implementation", "cp", "-d", str(dest)]
    reqs = dest / "pins.txt"
    dest.mkdir(parents=True, exist_ok=True)
    reqs.write_text("\n".join(pins) + "\n")
    if subprocess.run([*base, "-r", str(reqs)], capture_output=True, text=True).returncode == 0:
        return []
    # Something is missing: ask pin by pin, to name every one.
    return [p for p in pins if subprocess.run([*base, p], capture_output=True, text=True).returncode != 0]


def cmd_platforms(args) -> int:
    names = [ALIASES.get(p, p) for p in (args.platform or ["macos-arm64", "macos-x86_64"])]
    bad = 0
    for name in names:
        for pv in args.python_version:
            pins = lock_pins(name, pv)
            print(f"{name} (CPython {pv}): {len(pins)} pins")
            if args.list:
                print("".join(f"  {p}\n" for p in pins), end="")
            if args.download:
                with tempfile.TemporaryDirectory() as d:
                    missing = download_check(name, pv, Path(d))
                if missing:
                    bad += 1
                    print(f"  MISSING on {name}: no wheel of " + ", ".join(missing))
                else:
                    print(f"  every pin has a wheel for {name}")
    return 1 if bad else 0


# --------------------------------------------------------------------------------------------- the venv
def _stamp(venv: Path) -> Path:
    return venv / ".installed"


def _stale(venv: Path) -> bool:
    stamp = _stamp(venv)
    if not stamp.exists() or not venv_python(venv).exists():
        return True
    t = stamp.stat().st_mtime
    return any(p.stat().st_mtime > t for p in (ROOT / "pyproject.toml", LOCK))


def ensure_venv(venv: Path = VENV, platform: str | None = None) -> Path:
    """Create ``venv`` and install the pinned environment, unless that was done since the pins last changed.

    ``platform=None``: this machine's set (pip applies the lock's markers). ``platform="macos"`` (or another
    name of PLATFORMS): exactly that platform's set of the lock, installed without resolving, then the course
    itself without its dependencies: the way CI installs what a Mac gets, on Linux."""
    if sys.version_info < MIN_PYTHON:
        fail("Python >= {}.{} is required (run this file with a newer python)".format(*MIN_PYTHON))
    if not _stale(venv):
        return venv_python(venv)
    py = venv_python(venv)
    if not py.exists():
        run([sys.executable, "-m", "venv", venv])
    run([py, "-m", "pip", "install", "-q", "--upgrade", "pip"])
    if platform is None:
        run([py, "-m", "pip", "install", "-q", "-c", LOCK, "-e", f"{ROOT}[all]"])
    else:
        with tempfile.TemporaryDirectory() as d:
            reqs = Path(d) / "pins.txt"
            reqs.write_text("\n".join(lock_pins(platform)) + "\n")
            run([py, "-m", "pip", "install", "-q", "--no-deps", "-r", reqs])
        # (no `pip check`: it would judge the course's own markers by this machine, not by `platform`)
        run([py, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "-e", ROOT])
    _stamp(venv).touch()
    return py


# --------------------------------------------------------------------------------------------- the book
def _key(paths) -> str:
    h = hashlib.sha256()
    for p in sorted(paths, key=lambda p: p.as_posix()):
        h.update(p.read_bytes())
    return h.hexdigest()[:16]


def _files(dirs, pred) -> list[Path]:
    return [p for d in dirs if (ROOT / d).is_dir() for p in (ROOT / d).rglob("*") if p.is_file() and pred(p)]


def book_config(out: Path, config: Path = ROOT / "_config.yml") -> Path:
    """A copy of _config.yml for a book built into ``out``: its execution cache in ``out`` (a cache shared with
    the default build would hand this build the other's outputs instead of executing the chapters), and its
    local extension's path absolute (Jupyter Book resolves it from the config file's folder)."""
    text = config.read_text()
    subs = [(r"(?m)^(\s+cache:\s*)_build/\.jupyter_cache\s*$", (out / ".jupyter_cache").as_posix()),
            (r"(?m)^(\s+kfs_site:\s*)book/_ext(\s*(?:#.*)?)$", (ROOT / "book" / "_ext").as_posix())]
    for pattern, value in subs:
        text, n = re.subn(pattern, lambda m: m.group(1) + value + (m.group(2) if m.lastindex > 1 else ""), text)
        if n != 1:
            fail(f"book --out: _config.yml has no line matching {pattern!r}")
    out.mkdir(parents=True, exist_ok=True)
    path = out / "_config.yml"
    path.write_text(text)
    return path


def cmd_book(args) -> int:
    venv = Path(args.venv).resolve() if getattr(args, "venv", None) else None
    out = Path(args.out).resolve() if getattr(args, "out", None) else None
    if venv is None:
        py = ensure_venv()
    else:
        # Another environment executes the chapters (CI: the macOS set, from `make.py venv --platform macos`).
        py = venv_python(venv)
        if not py.exists():
            fail(f"book --venv: {venv} has no Python; create it with `python make.py venv --venv {args.venv}`")
    build = out or ROOT / "_build"
    build.mkdir(parents=True, exist_ok=True)
    # The execution cache (_build/.jupyter_cache) re-executes a page only when its code cells change. It cannot
    # see changes to the library or to the benchmark data the pages read, so those clear it. Sphinx does not
    # recopy static files (CSS, vendored JS) when no page changed, so those make it re-read the pages.
    doctrees = (out / "_build" if out else build) / ".doctrees"
    exec_key = _key(_files(["kernels_src", "book/data"], lambda p: p.suffix in (".py", ".json")))
    site_key = _key(_files(["book/_static", "book/_vendor", "book/_ext"], lambda p: p.suffix != ".pyc"))
    exec_file, site_file = build / ".book_exec_key", build / ".book_site_key"
    if not exec_file.exists() or exec_file.read_text().strip() != exec_key:
        if (build / ".jupyter_cache").is_dir():
            print("kernels_src/ or book/data/ changed: every page is re-executed")
        shutil.rmtree(build / ".jupyter_cache", ignore_errors=True)
        shutil.rmtree(doctrees, ignore_errors=True)
        exec_file.write_text(exec_key + "\n")
    if not site_file.exists() or site_file.read_text().strip() != site_key:
        shutil.rmtree(doctrees, ignore_errors=True)
        site_file.write_text(site_key + "\n")
    env = dict(os.environ, JUPYTER_PREFER_ENV_PATH="1", PYTHONUNBUFFERED="1")
    where = ["--path-output", "."]
    if out is not None:
        where = ["--path-output", str(out), "--config", str(book_config(out))]
    cmd = [py, "-c", "import sys; from jupyter_book.cli.main import main; sys.exit(main())",
           "build", ".", *where, "-W", "-n", "--keep-going"]
    print("+ jupyter-book build . " + " ".join(where) + " -W -n --keep-going", flush=True)
    if subprocess.run([str(c) for c in cmd], cwd=ROOT, env=env).returncode != 0:
        # On failure, forget the parsed pages: Sphinx would otherwise not re-read (and re-report) them.
        shutil.rmtree(doctrees, ignore_errors=True)
        fail("book: the build failed (warnings are errors)")
    html = Path(os.path.relpath((out or ROOT) / "_build" / "html", ROOT))
    rel = Path(os.path.relpath(py, ROOT))
    print(f"\nThe course site is in {html.as_posix()}. To read it:")
    print(f"    {rel} -m http.server -d {html.as_posix()}   # then open http://localhost:8000")
    return 0


def cmd_test(args) -> int:
    cmd_book(args)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    # --durations: the 25 slowest tests are listed at the end, so a slow new test shows up in every run.
    # --dist worksteal: a worker that runs out of tests takes half of the other's queue, so that the two end together
    # (tests/conftest.py starts the longest tests first).
    return subprocess.run([str(venv_python()), "-m", "pytest", "-n", "auto", "--dist", "worksteal", "--durations=25",
                           *args.pytest_args],
                          cwd=ROOT, env=env).returncode


def cmd_lab(args) -> int:
    py = ensure_venv()
    env = dict(os.environ, JUPYTER_CONFIG_PATH=str(ROOT / ".jupyter"), JUPYTER_PREFER_ENV_PATH="1")
    extra = ["--allow-root"] if hasattr(os, "getuid") and os.getuid() == 0 else []
    return subprocess.run([str(py), "-m", "jupyterlab", "--notebook-dir=.", *extra], cwd=ROOT, env=env).returncode


def cmd_venv(args) -> int:
    venv = Path(args.venv).resolve() if args.venv else VENV
    py = ensure_venv(venv, args.platform)
    print(f"{venv}: ready ({py})")
    return 0


def _canon(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def merge_lock(freeze: str, old_lock: str) -> str:
    """A new lock from ``pip freeze`` output (this machine's set) and the old lock: each pin keeps the old
    line's marker, and pins with a marker that this machine never installs (appnope on macOS, colorama on
    Windows) are carried over as they were."""
    header, old = [], {}
    for line in old_lock.splitlines():
        if line.startswith("#") and not old:
            header.append(line)
        elif "==" in line:
            pin, _, marker = (x.strip() for x in line.partition(";"))
            old[_canon(pin.split("==")[0])] = (pin, marker)
    new = {}
    for line in freeze.splitlines():
        line = line.strip()
        if "==" not in line or line.startswith("#"):
            continue
        name = _canon(line.split("==")[0])
        if name in ("pip",) or name.startswith("kernels"):
            continue
        new[name] = (line, old.get(name, ("", ""))[1])
    for name, (pin, marker) in old.items():
        if name not in new and marker:
            new[name] = (pin, marker)
    rows = sorted(new.values(), key=lambda row: row[0].split("==")[0].lower())  # pip freeze's order
    lines = [f"{pin} ; {marker}" if marker else pin for pin, marker in rows]
    return "\n".join(header + lines) + "\n"


def cmd_lock(args) -> int:
    py = ensure_venv()
    freeze = subprocess.run([str(py), "-m", "pip", "freeze", "--all", "--exclude-editable"], capture_output=True,
                            text=True, check=True).stdout
    out = ROOT / "requirements.lock.new"
    out.write_text(merge_lock(freeze, LOCK.read_text()))
    print(f"wrote {out.name}; review it (markers kept from requirements.lock), move it over requirements.lock, "
          "then run `python make.py platforms --download`")
    return 0


def parser() -> argparse.ArgumentParser:
    """The command line (tests/test_platforms.py parses the README's commands with it)."""
    ap = argparse.ArgumentParser(prog="make.py", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("book", help="build the course site into _build/html")
    b.add_argument("--venv", help="execute the chapters with this existing venv's Python (default: .venv, "
                                  "created when needed); CI: the macOS set's venv")
    b.add_argument("--out", help="build into OUT/_build/html, with an execution cache of its own in OUT "
                                 "(default: _build/html)")
    t = sub.add_parser("test", help="build the book, then run the whole test suite")
    t.add_argument("pytest_args", nargs="*", help="passed on to pytest (after --)")
    sub.add_parser("lab", help="open the chapters and exercises in JupyterLab")
    sub.add_parser("lock", help="write requirements.lock.new from .venv, keeping the old lock's platform markers")
    v = sub.add_parser("venv", help="create .venv and install the pinned environment")
    v.add_argument("--venv", help="where (default: .venv)")
    v.add_argument("--platform", help="install exactly this platform's pins of the lock, without resolving "
                                      f"({', '.join(PLATFORMS)}); default: this machine's, resolved by pip")
    p = sub.add_parser("platforms", help="each platform's pinned set; --download checks PyPI has every wheel")
    p.add_argument("platform", nargs="*", help=f"default: macos-arm64 macos-x86_64; any of {', '.join(PLATFORMS)}")
    p.add_argument("--python-version", action="append", help="default: 3.12 (repeatable)")
    p.add_argument("--download", action="store_true", help="pip download --platform every pin (network)")
    p.add_argument("--list", action="store_true", help="print the pins")
    return ap


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    if args.cmd == "platforms" and not args.python_version:
        args.python_version = ["3.12"]
    return {"book": cmd_book, "test": cmd_test, "lab": cmd_lab, "venv": cmd_venv, "platforms": cmd_platforms,
            "lock": cmd_lock}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
