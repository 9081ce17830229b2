"""Every subcommand of `kernels` answers bad input with one line on stderr and exit status 2: no traceback, no
work started (the checks come before any compilation or benchmark), and no file or directory written where none
was asked for. The checks live in kernels_src/usage.py."""
import subprocess
import sys
from pathlib import Path

import pytest

from kernels_src.cli import main
from kernels_src.usage import UsageError, check_sizes, op_named, parse_sizes

ROOT = Path(__file__).resolve().parents[1]


def _refused(capsys, argv, *fragments):
    """main(argv) exits 2 (argparse's own errors raise SystemExit(2)) with one stderr line holding fragments."""
    try:
        rc = main(argv)
    except SystemExit as e:
        rc = e.code
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert rc == 2, (argv, rc, out, err)
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("kernels"), lines[0]
    for f in fragments:
        assert f in lines[0], (f, lines[0])
    return lines[0]


# (argv, what the one line must say: the bad value, and something allowed)
BAD = {
    "list: unknown op": (["list", "nosuchop"], "'nosuchop'", "gemv"),
    "check: unknown op": (["check", "nosuchop"], "'nosuchop'", "axpy"),
    "check: unknown variant": (["check", "gemv", "--variant", "nope"], "'nope'", "colorder"),
    "check: variant of another backend": (["check", "gemv", "--backend", "gpu", "--variant", "colorder"],
                                          "'colorder'", "splitk"),
    "check: variant of no op": (["check", "--variant", "nope"], "'nope'", "kernels list"),
    "check: size of the wrong rank": (["check", "gemv", "--sizes", "1024"], "1024", "KxN"),
    "check: size below 1": (["check", "axpy", "--sizes", "-3"], "-3", "1 or more"),
    "check: sizes without an op": (["check", "--sizes", "7"], "--sizes", "OP"),
    "check: bad dtype": (["check", "gemv", "--dtype", "banana"], "'banana'", "float32"),
    "check: bad backend": (["check", "gemv", "--backend", "tpu"], "'tpu'", "cpu"),
    "bench: unknown op": (["bench", "gemvv"], "'gemvv'", "did you mean gemv"),
    "bench: size of the wrong rank": (["bench", "gemv", "--sizes", "1024"], "1024", "KxN"),
    "bench: empty problem": (["bench", "gemv", "--sizes", "0x0"], "0x0", "1 or more"),
    "bench: negative size": (["bench", "axpy", "--sizes", "-5"], "-5", "1 or more"),
    "bench: unreadable size": (["bench", "axpy", "--sizes", "lots"], "'lots'", "512x512x512"),
    "bench: no size at all": (["bench", "axpy", "--sizes", ","], "','", "1024"),
    "bench: negative power": (["bench", "axpy", "--sizes", "2**-1"], "'2**-1'", "2**20"),
    "bench: bad dtype": (["bench", "gemv", "--dtype", "banana"], "'banana'", "float32"),
    "bench: dtype no variant takes": (["bench", "gemv", "--dtype", "float64"], "'float64'", "float32"),
    "bench: unknown variant": (["bench", "axpy", "--variants", "loop,nope"], "'nope'", "prange"),
    "bench: bad backend": (["bench", "axpy", "--backend", "tpu"], "'tpu'", "gpu"),
    "bench: repeat 0": (["bench", "axpy", "--repeat", "0"], "--repeat", "1 or more"),
    "bench: repeat not a number": (["bench", "axpy", "--repeat", "many"], "'many'", "whole number"),
    "ptx: unknown op": (["ptx", "nosuchop"], "'nosuchop'", "axpy"),
    "ptx: op without GPU kernels": (["ptx", "decode_time_prediction"], "decode_time_prediction", "axpy"),
    "profile: unknown op": (["profile", "nosuchop"], "'nosuchop'", "axpy"),
    "profile: unknown variant": (["profile", "softmax", "--variants", "nope"], "'nope'", "softmax/gpu"),
    "profile: two sizes": (["profile", "axpy", "--size", "8,9"], "--size", "one size"),
    "profile: bad size": (["profile", "gemv", "--size", "1024"], "1024", "KxN"),
    "profile: bad dtype": (["profile", "axpy", "--dtype", "banana"], "'banana'", "float32"),
    "profile: bad metric set": (["profile", "axpy", "--set", "nope"], "'nope'", "memory"),
    "asm: unknown op": (["asm", "nosuchop"], "'nosuchop'", "axpy"),
    "asm: unknown variant": (["asm", "gemv", "--variants", "numpy"], "'numpy'", "colorder"),
    "asm: bad size": (["asm", "gemv", "--size", "1024"], "1024", "KxN"),
    "cpuboard: unknown op": (["cpuboard", "--ops", "nosuchop"], "'nosuchop'", "axpy"),
    "cpuboard: op without CPU rungs": (["cpuboard", "--ops", "decode_time_prediction"], "decode_time_prediction",
                                       "axpy"),
    "launchcost: launches 0": (["launchcost", "--launches", "0"], "--launches", "1 or more"),
    "launchcost: repeat -1": (["launchcost", "--repeat", "-1"], "--repeat", "1 or more"),
    "stepprofile: unknown step": (["stepprofile", "infer"], "'infer'", "train"),
    "stepprofile: unknown config": (["stepprofile", "train", "--config", "huge"], "'huge'", "bench"),
    "dispatch: unknown step": (["dispatch", "--explain", "infer"], "'infer'", "decode"),
    "dispatch: bad config key": (["dispatch", "--explain", "train", "--config", "depth=3"], "depth=3", "width"),
    "dispatch: bad config value": (["dispatch", "--explain", "train", "--config", "width=oops"], "'oops'",
                                   "whole number"),
    "dispatch: zero width": (["dispatch", "--explain", "train", "--config", "width=0"], "width=0", "1 or more"),
    "dispatch: width not a multiple of heads": (["dispatch", "--explain", "train", "--config", "width=30,heads=4"],
                                                "width=30", "heads=4"),
    "dispatch: batch 0": (["dispatch", "--explain", "train", "--batch", "0"], "--batch", "1 or more"),
    "dispatch: bad device": (["dispatch", "--explain", "train", "--device", "tpu"], "'tpu'", "gpu"),
    "dispatch: missing table": (["dispatch", "--explain", "train", "--table", "/nonexistent/table.json"],
                                "/nonexistent/table.json", "no such file"),
    "exercises: unknown name": (["exercises", "ch99_nothing", "--check"], "'ch99_nothing'", "ch01_axpy"),
    "grade: nothing to grade": (["grade"], "submissions", "--solution"),
    "grade: missing folder": (["grade", "/nonexistent"], "/nonexistent", "no such file or directory"),
    "grade: unknown solution": (["grade", "--solution", "ch99_nothing"], "'ch99_nothing'", "ch01_axpy"),
    "grade: unknown exercise": (["grade", str(ROOT / "tests"), "--exercise", "ch99_nothing"], "'ch99_nothing'",
                                "ch01_axpy"),
    "grade: missing autograder": (["grade", str(ROOT / "tests"), "--autograder", "/nonexistent/ag.zip"],
                                  "/nonexistent/ag.zip", "no such"),
    "grade: jobs 0": (["grade", str(ROOT / "tests"), "--jobs", "0"], "--jobs", "1 or more"),
    "racecheck: missing file": (["racecheck", "/nonexistent/k.py", "k"], "/nonexistent/k.py", "no such file"),
    "no command": ([], "COMMAND", "-h"),
    "unknown command": (["benchh"], "'benchh'", "bench"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_is_one_line_and_exit_2(capsys, case):
    argv, *fragments = BAD[case]
    _refused(capsys, argv, *fragments)


# (argv with {out} for a path in a directory that does not exist)
WRITERS = {
    "bench --json": ["bench", "axpy", "--sizes", "64", "--json", "{out}"],
    "profile --json": ["profile", "axpy", "--json", "{out}"],
    "asm --json": ["asm", "axpy", "--json", "{out}"],
    "launchcost --json": ["launchcost", "--json", "{out}"],
    "stepprofile --json": ["stepprofile", "decode", "--json", "{out}"],
    "autotune --out": ["autotune", "--out", "{out}"],
    "dispatch --json": ["dispatch", "--explain", "decode", "--json", "{out}"],
    "cpuboard --out": ["cpuboard", "--ops", "axpy", "--out", "{out}"],
    "grade --out": ["grade", "{here}", "--out", "{out}"],
    "grade --results-dir": ["grade", "{here}", "--results-dir", "{out}"],
    "grade --solution --json": ["grade", "--solution", "ch01_axpy", "--json", "{out}"],
}


@pytest.mark.parametrize("case", list(WRITERS))
def test_an_output_in_a_missing_directory_is_refused_and_not_created(capsys, tmp_path, case):
    missing = tmp_path / "no" / "such" / "dir"
    out = missing / "out.json"
    argv = [a.format(out=out, here=tmp_path) for a in WRITERS[case]]
    _refused(capsys, argv, str(out), "does not exist" if "--out" not in case and "-dir" not in case else "exist")
    assert not (tmp_path / "no").exists(), f"{case} created directories it was not asked for"


@pytest.mark.parametrize("flag", ["--json", "--out"])
def test_an_output_file_that_is_a_directory_is_refused(capsys, tmp_path, flag):
    argv = (["bench", "axpy", "--sizes", "64", "--json", str(tmp_path)] if flag == "--json"
            else ["grade", str(tmp_path), "--out", str(tmp_path)])
    _refused(capsys, argv, str(tmp_path), "is a directory")


def test_racecheck_names_what_the_file_defines(capsys, tmp_path):
    f = tmp_path / "kern.py"
    f.write_text("def my_kernel(out):\n    pass\n\n\ndef make_args():\n    return 1, 1\n")
    _refused(capsys, ["racecheck", str(f), "my_kernal"], "'my_kernal'", "did you mean my_kernel")
    _refused(capsys, ["racecheck", str(f), "my_kernel", "--args", "build"], "'build'", "make_args")
    txt = tmp_path / "kern.txt"
    txt.write_text("")
    _refused(capsys, ["racecheck", str(txt), "k"], str(txt), ".py")


def test_grade_exercise_not_built_says_how_to_build_it(capsys, tmp_path, monkeypatch):
    from kernels_src.grading import exercises

    monkeypatch.setattr(exercises, "BUILD", tmp_path / "autograder")
    _refused(capsys, ["grade", str(tmp_path), "--exercise", "ch01_axpy"], "ch01_axpy", "kernels exercises ch01_axpy")


def test_the_gradebook_goes_to_an_ignored_folder_by_default(tmp_path, monkeypatch, capsys):
    from kernels_src.grading import batch
    from kernels_src.grading.cli import DEFAULT_GRADEBOOK

    seen = {}

    def fake(folder, out, **kw):
        seen["out"] = Path(out)
        return {"graded": 0, "skipped": 0, "total": 0, "gradebook": str(out), "results_dir": "r"}

    monkeypatch.setattr(batch, "grade_folder", fake)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "subs").mkdir()
    assert main(["grade", "subs", "-q"]) == 0
    assert seen["out"] == DEFAULT_GRADEBOOK and (tmp_path / DEFAULT_GRADEBOOK.parent).is_dir()
    assert main(["grade", "subs", "-q", "--out", "mine.csv"]) == 0
    assert seen["out"] == Path("mine.csv")
    ignored = subprocess.run(["git", "check-ignore", "-q", str(DEFAULT_GRADEBOOK)], cwd=ROOT)
    assert ignored.returncode == 0, f"{DEFAULT_GRADEBOOK} is not ignored by git"


def test_parse_sizes_and_check_sizes():
    assert parse_sizes("1,7,2**4") == [(1,), (7,), (16,)]
    assert parse_sizes("3x5x7") == [(3, 5, 7)] and parse_sizes(None) is None
    for bad in ("abc", "", ",", "2**-1", "3xx4"):
        with pytest.raises(UsageError):
            parse_sizes(bad)
    # 0 where the op's own sizes use it: a flag (attention's mask) or a checked empty input (scan of n = 0)
    attention = op_named("attention")
    assert check_sizes(attention, [(1, 4, 4, 64, 64, 64, 0)], "bench")
    assert check_sizes(op_named("scan"), [(0,)], "check")
    with pytest.raises(UsageError, match="n = 0"):
        check_sizes(op_named("scan"), [(0,)], "bench")
    with pytest.raises(UsageError, match="B = 0"):
        check_sizes(attention, [(0, 4, 4, 64, 64, 64, 0)], "bench")


ISSUE_CASES = [["bench", "gemv", "--sizes", "1024"], ["bench", "gemv", "--sizes", "0x0"],
               ["bench", "gemv", "--dtype", "banana"], ["ptx", "nosuchop"], ["grade", "/nonexistent"],
               ["bench", "gemv", "--json", "/nonexistent/dir/out.json"]]


def test_python_dash_m_refuses_the_cases_of_the_issue():
    """`python -m kernels_src ...` itself: exit 2 and one line, for the commands that ended in a traceback."""
    procs = [subprocess.Popen([sys.executable, "-m", "kernels_src", *argv], cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for argv in ISSUE_CASES]
    for argv, p in zip(ISSUE_CASES, procs):
        out, err = p.communicate(timeout=120)
        assert p.returncode == 2, (argv, p.returncode, err)
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, (argv, err)
        assert not out.strip(), (argv, out)
    assert not Path("/nonexistent").exists()
