"""Chapter 21's exercise references against the course's own definitions (two independent writings of each)."""
import numpy as np
import pytest

from kernels_src.dist import schedule
from kernels_src.ops import coll_exercises as ce


def test_busbw_reference_matches_schedule():
    rng = np.random.default_rng(0)
    n, nbytes, seconds = ce.make_inputs_busbw((40,), np.float32, rng)
    ref = ce.reference_busbw(n, nbytes, seconds)
    for i in range(len(n)):
        for j, coll in enumerate(("all_reduce", "reduce_scatter", "all_gather")):
            assert ref[i, j] == pytest.approx(schedule.busbw(nbytes[i], seconds[i], int(n[i]), coll), rel=1e-12)


def test_alpha_beta_reference_recovers_the_model_and_the_fit():
    rng = np.random.default_rng(1)
    b, t = ce.make_inputs_alpha_beta((20,), np.float64, rng)
    ref = ce.reference_alpha_beta(b, t)
    for i in range(len(b)):
        alpha_s, beta_bps = schedule.fit_alpha_beta(b[i, :2], t[i] * 1e-6, relative=False)
        assert ref[i, 0] == pytest.approx(alpha_s * 1e6, rel=1e-6, abs=1e-6)
        assert ref[i, 1] == pytest.approx(beta_bps / 1e9, rel=1e-6)
        assert ref[i, 2] == pytest.approx(alpha_s * 1e6 + b[i, 2] / beta_bps * 1e6, rel=1e-6)


@pytest.mark.parametrize("L,n", [(1, 1), (10, 3), (3, 7), (23, 5), (1000, 8)])
def test_rs_step_reference_uses_the_course_split(L, n):
    rng = np.random.default_rng(L + n)
    for r in range(n):
        for s in range(max(n - 1, 1)):
            buf, msg, *_ = ce.make_inputs_rs_step((L, n, r, s), np.float64, rng)
            lo, hi = schedule.chunk_bounds(L, n, (r - s - 1) % n)
            want = buf.copy()
            want[lo:hi] += msg
            np.testing.assert_array_equal(ce.reference_rs_step(buf, msg, n, r, s), want)


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8])
def test_ring_schedule_of_the_course_runs_a_correct_all_reduce(n):
    """The exercise's reference is the sum on every rank; the course's schedule, replayed chunk by chunk, gives it
    (so a student who copies the chapter's schedule passes, and the check does not depend on it)."""
    rng = np.random.default_rng(n)
    (x,) = ce.make_inputs_ring((n, 13), np.float64, rng)
    buf = x.copy()
    for phase in ("reduce_scatter", "all_gather"):
        for s in range(n - 1):
            now = [t for t in schedule.ring_steps(n) if t[0] == phase and t[1] == s]
            msgs = {r: buf[r].copy() for (_, _, r, _, _) in now}
            for (_, _, r, _, c) in now:
                lo, hi = schedule.chunk_bounds(13, n, c)
                src = msgs[(r - 1) % n][lo:hi]
                buf[r, lo:hi] = buf[r, lo:hi] + src if phase == "reduce_scatter" else src
    rtol, atol = ce.ring_tol((n, 13), np.float64)
    np.testing.assert_allclose(buf, ce.reference_ring(x), rtol=rtol, atol=atol)
