"""Confine a grading process before any student code runs: what Linux offers, used where it is available.

Called first thing by the sandboxed process (``python -I <runtime>/boot.py job.json``, :mod:`.child`) and by the
otter child, while the process still runs the grader's own code only. In order:

1. **No network**: a new, empty network namespace (needs root; skipped otherwise).
2. **Another user**: when the grader runs as root and the Python installation is readable by other users
   (Gradescope's image), the process becomes an unprivileged uid of its own (one per process, so two
   submissions cannot signal each other either); else (an interpreter under a private ``/root``) it stays
   uid 0 and gives up every capability.
3. **no_new_privs**, then **Landlock** (Linux >= 5.13): the process may read only the directories it needs
   (the Python installation, its site-packages *without* the course's own package, the grader's read-only
   runtime copy, system libraries) and write only its scratch directory; with Landlock ABI >= 4 it can make
   no TCP connection, and with ABI >= 6 it cannot signal a process outside its own sandbox (the grader, or
   another submission's worker), whatever its uid.

:func:`describe` says which of these this machine gives. Seccomp is not used: the filesystem, signal and
network rules above are what protects the grader and other students, and a syscall filter for NumPy,
Numba and LLVM would be long and fragile.
"""
from __future__ import annotations

import ctypes
import os
import sys

# Landlock (linux/landlock.h)
_SYS_CREATE, _SYS_ADD, _SYS_RESTRICT = 444, 445, 446  # x86_64 and aarch64 share these numbers
_ACCESS = {"execute": 1, "write_file": 2, "read_file": 4, "read_dir": 8, "remove_dir": 16, "remove_file": 32,
           "make_char": 64, "make_dir": 128, "make_reg": 256, "make_sock": 512, "make_fifo": 1024,
           "make_block": 2048, "make_sym": 4096, "refer": 8192, "truncate": 16384, "ioctl_dev": 32768}
READ = _ACCESS["execute"] | _ACCESS["read_file"] | _ACCESS["read_dir"]
_PR_SET_NO_NEW_PRIVS, _PR_CAPBSET_DROP = 38, 24
_CLONE_NEWNET = 0x40000000


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def landlock_abi() -> int:
    """The Landlock ABI version of the running kernel (0: not available)."""
    if not sys.platform.startswith("linux"):
        return 0
    try:
        r = _libc().syscall(_SYS_CREATE, None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    except Exception:  # noqa: BLE001
        return 0
    return max(0, int(r))


def _fs_mask(abi: int) -> int:
    mask = (1 << 13) - 1
    if abi >= 2:
        mask |= _ACCESS["refer"]
    if abi >= 3:
        mask |= _ACCESS["truncate"]
    if abi >= 5:
        mask |= _ACCESS["ioctl_dev"]
    return mask


def _landlock(read: list[str], write: list[str], tcp: bool = False, list_only=(), devices=()) -> str:
    abi = landlock_abi()
    if abi <= 0:
        return "no Landlock"
    libc = _libc()
    handled = _fs_mask(abi)
    no_tcp = abi >= 4 and not tcp
    attr = _RulesetAttr(handled, 3 if no_tcp else 0, 3 if abi >= 6 else 0)  # TCP bind+connect; abstract sockets+signals
    size = ctypes.sizeof(_RulesetAttr) if abi >= 6 else (16 if abi >= 4 else 8)
    fd = libc.syscall(_SYS_CREATE, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if fd < 0:
        return f"no Landlock (create: errno {ctypes.get_errno()})"
    rw = handled & ~(_ACCESS["make_char"] | _ACCESS["make_block"] | _ACCESS.get("ioctl_dev", 0))
    try:
        dev = rw | (handled & _ACCESS["ioctl_dev"])  # a GPU's device files: opened read-write, driven by ioctl
        for paths, access in ((read, READ), (write, rw), (list(list_only), _ACCESS["read_dir"]), (list(devices), dev)):
            for p in paths:
                try:
                    pfd = os.open(p, os.O_PATH | os.O_CLOEXEC)
                except OSError:
                    continue
                try:
                    file_rights = (_ACCESS["execute"] | _ACCESS["read_file"] | _ACCESS["write_file"] | _ACCESS["truncate"]
                                   | _ACCESS["ioctl_dev"])
                    acc = access if os.path.isdir(p) else access & file_rights  # read_dir etc.: directories only
                    acc &= handled
                    rule = _PathBeneath(acc, pfd)
                    if libc.syscall(_SYS_ADD, ctypes.c_int(fd), ctypes.c_int(1), ctypes.byref(rule),
                                    ctypes.c_uint32(0)) != 0:
                        pass  # a path we cannot add is simply not allowed
                finally:
                    os.close(pfd)
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            return "no Landlock (no_new_privs failed)"
        if libc.syscall(_SYS_RESTRICT, ctypes.c_int(fd), ctypes.c_uint32(0)) != 0:
            return f"no Landlock (restrict: errno {ctypes.get_errno()})"
    finally:
        os.close(fd)
    what = "Landlock ABI %d: read-only system and Python, writes only to its own directory" % abi
    if no_tcp:
        what += ", no TCP"
    if abi >= 6:
        what += ", no signals outside its sandbox"
    return what


def _drop_capabilities() -> None:
    libc = _libc()
    for cap in range(64):
        libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0)

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]

    hdr = Header(0x20080522, 0)
    data = (Data * 2)()
    libc.syscall(126 if os.uname().machine == "x86_64" else 91, ctypes.byref(hdr), data)  # capset


def interpreter_readable_by_others() -> bool:
    """Can an unprivileged user run this interpreter? (Every directory on the way must be o+x.)"""
    import stat

    for base in {sys.base_prefix, sys.prefix, os.path.dirname(os.path.realpath(sys.executable))}:
        p = os.path.realpath(base)
        while True:
            try:
                if not os.stat(p).st_mode & stat.S_IXOTH:
                    return False
            except OSError:
                return False
            parent = os.path.dirname(p)
            if parent == p:
                break
            p = parent
    return True


_LIST_ONLY: set = set()


def read_paths(extra=()) -> list[str]:
    """What a grading process needs to read: system libraries, the Python installation, and its
    site-packages without the course's own package (installed there on Gradescope)."""
    import sysconfig

    paths = ["/usr", "/lib", "/lib64", "/bin", "/etc/ld.so.cache", "/etc/localtime", "/etc/hosts", "/etc/nsswitch.conf",
             "/etc/host.conf", "/etc/gai.conf", "/etc/passwd", "/etc/group", "/dev/urandom",
             "/dev/zero", "/proc", "/sys/devices/system/cpu", "/sys/fs/cgroup"]
    prefixes = {os.path.realpath(sys.base_prefix), os.path.dirname(os.path.realpath(sys.executable))}
    site = set()
    for k in ("purelib", "platlib"):
        site.add(os.path.realpath(sysconfig.get_paths()[k]))
    for p in sys.path:
        if p and ("site-packages" in p or "dist-packages" in p) and os.path.isdir(p):
            site.add(os.path.realpath(p))
    paths += sorted(prefixes)
    venv = os.path.realpath(sys.prefix)
    if venv not in prefixes:  # a virtual environment: its bin/ and pyvenv.cfg, its site-packages below
        paths += [os.path.join(venv, d) for d in ("bin", "pyvenv.cfg", "include", "share", "etc")]
    for s in sorted(site):
        _LIST_ONLY.add(s)  # its names may be listed (the import system needs that); files only as allowed below
        if any(s.startswith(p + os.sep) for p in prefixes):
            # the interpreter's own site-packages is inside an allowed prefix: the course package cannot be
            # cut out of it; a course installed there is only the runtime copy's twin (see README of runtime)
            continue
        try:
            names = os.listdir(s)
        except OSError:
            continue
        for n in names:
            low = n.lower()
            if low.startswith(("kernels_src", "kernels_from_scratch", "__editable__")) or low.endswith(".pth"):
                continue  # the course package, and .pth files that put the course's source tree on sys.path
            paths.append(os.path.join(s, n))
    for k in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(k):
            paths.append(os.environ[k])
    return paths + [p for p in extra if p]


SKIPPABLE = ("netns", "uid", "landlock")  # KERNELS_GRADING_CONFINE_SKIP: pretend this machine lacks them (tests)


def skipped_from_env() -> list[str]:
    """The protections that ``KERNELS_GRADING_CONFINE_SKIP`` (comma-separated: netns, uid, landlock) turns off:
    how a test, or an instructor checking the report, sees what grading on a machine without them says."""
    raw = os.environ.get("KERNELS_GRADING_CONFINE_SKIP", "")
    return [s for s in (x.strip().lower() for x in raw.split(",")) if s in SKIPPABLE]


def confine(scratch: str, read=(), uid: int | None = None, net: bool = True, devices=(), skip=()) -> list[str]:
    """Confine this process (see the module docstring). Returns what was applied, one line each.

    ``net=False`` keeps TCP (the otter run talks to its Jupyter kernel over localhost). ``devices``: device
    files it may open read-write and drive (a speed question's worker on a GPU: ``/dev/nvidia*``). ``skip``:
    protections not to apply (see :func:`skipped_from_env`); each is reported as missing."""
    done = []
    skip = set(skip)
    if not sys.platform.startswith("linux"):
        return ["no confinement (not Linux)"]
    is_root = os.geteuid() == 0
    if net and is_root and "netns" not in skip:
        if _libc().unshare(_CLONE_NEWNET) == 0:
            done.append("no network (empty network namespace)")
    paths = read_paths(read)
    if is_root and "uid" not in skip:
        if uid is not None and interpreter_readable_by_others():
            try:
                os.chown(scratch, uid, uid)
                for root, dirs, files in os.walk(scratch):
                    for n in dirs + files:
                        os.lchown(os.path.join(root, n), uid, uid)
                os.setgroups([])
                os.setgid(uid)
                os.setuid(uid)
                done.append(f"unprivileged uid {uid}")
            except OSError as e:
                done.append(f"uid change failed ({e}); stays uid 0 without capabilities")
                _drop_capabilities()
        else:
            _drop_capabilities()
            done.append("uid 0 without capabilities (the interpreter is not readable by other users)")
    if "landlock" in skip:
        done.append("no Landlock (skipped: KERNELS_GRADING_CONFINE_SKIP)")
    else:
        done.append(_landlock(paths, [scratch, "/dev/null"], tcp=not net, list_only=sorted(_LIST_ONLY),
                              devices=devices))
    return done


NOT_CONFINED = "not confined (KERNELS_GRADING_CONFINE=0)"


def weaknesses(done, net: bool = True) -> list[str]:
    """What a process confined as ``done`` (the lines :func:`confine` returned; None: not confined at all) is
    not protected from, one plain line per missing protection, naming it and what it means. Empty when the
    process got everything this design asks for (see the module docstring)."""
    if done is None or NOT_CONFINED in done:
        return ["no confinement at all (KERNELS_GRADING_CONFINE=0): the code ran with the grader's own rights "
                "(files, network, signals)"]
    if any(d.startswith("no confinement") for d in done):
        return [f"{done[0]}: the code ran with the grader's own rights (files, network, signals)"]
    text = "\n".join(done)
    abi = 0
    for d in done:
        if d.startswith("Landlock ABI"):
            try:
                abi = int(d.split()[2].rstrip(":"))
            except (IndexError, ValueError):
                abi = 1
    out = []
    if not abi:
        out.append("no Landlock: the code could read every file the grading user can read (the course's "
                   "solutions, hidden tests, other submissions) and write outside its own directory")
    netns = "empty network namespace" in text
    if net and not netns:
        if abi >= 4:
            out.append("no network namespace (it needs root): Landlock blocks TCP, other protocols "
                       "(UDP) stay open")
        else:
            out.append("no network namespace and no Landlock network rule: the code could use the network")
    own_uid = "unprivileged uid" in text
    if not own_uid:
        if abi >= 6:
            if "uid 0 without capabilities" not in text:
                out.append("no separate user: the code runs as the grader's user; "
                           "Landlock still keeps it from signalling or tracing the grader")
        else:
            out.append("no separate user and no Landlock signal scope (ABI < 6): the code could signal (kill) "
                       "the grader and other submissions' processes")
    return out


def weakness_line(lines) -> str:
    """The one line a report carries when the sandbox was weaker than designed ('' when it was not)."""
    lines = sorted(set(lines))
    return ("Sandbox weaker than designed on this machine: " + "; ".join(lines) + ".") if lines else ""


def describe() -> str:
    abi = landlock_abi()
    parts = [f"Landlock ABI {abi}" if abi else "no Landlock"]
    if os.geteuid() == 0:
        parts.append("per-process unprivileged uid" if interpreter_readable_by_others()
                     else "uid 0 without capabilities (interpreter not readable by others)")
        parts.append("empty network namespace")
    return ", ".join(parts)
