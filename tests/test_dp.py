"""Data-parallel capstone (kernels_src/model/dp.py) on CPU ranks: n = 2 and n = 3 processes, the course's
all-reduce (kernels_src.dist.comm), a tiny GPT, four AdamW steps.

What is checked, against the float64 reference model on the concatenation of the ranks' batches (the oracle):
  - replicas: every rank's parameters are bitwise identical after every step;
  - gradients: the all-reduced gradient of step 1 on every rank, per tensor, within GRAD_RTOL of the tensor's
    largest reference entry (chapter 13's stated gradient tolerance for the float32 model);
  - losses: every step's global loss within TRAJ_RTOL of the float64 trajectory, and within
    loss_tolerance = 2 * TRAJ_RTOL of the one-process float32 run on the concatenated batch (both runs are
    float32 computations of the same float64 trajectory: the triangle inequality; dp.py's docstring);
  - the checks can fail: a rank that sums instead of averaging (AdamW hides it in the loss, the gradient
    check does not) and a rank that skips its last bucket (gradients and replicas) are both caught.
Each launch runs its specs one after the other in the same rank processes (one start-up, one compilation).
"""
import numpy as np
import pytest

from kernels_src.model import dp
from kernels_src.model.gpt import GPT
from kernels_src.model.reference import Config, ReferenceGPT, adamw_step

STEPS = 4


def _spec(n, fault=None):
    s = dp.make_spec("tiny", ranks=n, steps=STEPS, spread=0.1, record=True, fault=fault)
    s["quiet"] = True
    return s


def _reference(spec):
    """float64 trajectory on the concatenated batch: losses per step, and step 1's gradients."""
    cfg, p = dp._params(spec)
    ref = ReferenceGPT(cfg, p)
    m = {k: np.zeros_like(v) for k, v in ref.p.items()}
    v = {k: np.zeros_like(x) for k, x in ref.p.items()}
    losses, g0 = [], None
    for s in range(spec["steps"]):
        ids, tg = dp.global_batch(spec, s)
        loss, g = ref.loss_and_grads(ids, tg)
        g0 = g if s == 0 else g0
        adamw_step(ref.p, g, m, v, s + 1, dp.lr_at(spec, s))
        losses.append(loss)
    return losses, g0


def _unflat(spec, flat):
    cfg, p = dp._params(spec)
    model = GPT(cfg, p, "cpu")
    flat = np.asarray(flat, np.float32)
    return {n: flat[a:b].reshape(model.shapes[n]) for n, (a, b) in model.offsets.items()}


def check_run(spec, results, ref_losses, ref_g0):
    """Every assertion of a correct data-parallel run (raises AssertionError naming the first that fails)."""
    digests = [r["digests"] for r in results]
    for s in range(spec["steps"]):
        assert len({d[s] for d in digests}) == 1, f"step {s + 1}: the replicas' parameters differ"
    for r in results:
        g = _unflat(spec, r["grads0"])
        for name, gr in ref_g0.items():
            e = np.abs(g[name] - gr).max()
            assert np.isfinite(g[name]).all(), name
            assert e <= dp.GRAD_RTOL * np.abs(gr).max() + 1e-9, \
                f"rank {r['rank']} step 1 gradient {name}: max err {e:.3g} vs max |g| {np.abs(gr).max():.3g}"
    for s, (got, want) in enumerate(zip(results[0]["loss"], ref_losses)):
        assert abs(got - want) <= dp.TRAJ_RTOL * abs(want), f"step {s + 1}: loss {got} vs float64 {want}"
    for r in results[1:]:
        assert r["loss"] == results[0]["loss"], "ranks disagree on the global loss"


@pytest.fixture(scope="module")
def two_ranks():
    specs = [_spec(2), _spec(2, "sum"), _spec(2, "skip_last_bucket")]
    return specs, dp.run_cpu(specs, timeout=120)


@pytest.mark.parametrize("n", [2, 3])
def test_dp_matches_reference_and_one_process(n, two_ranks):
    spec = _spec(n)
    results = two_ranks[1][0] if n == 2 else dp.run_cpu(spec, timeout=120)
    ref_losses, ref_g0 = _reference(spec)
    check_run(spec, results, ref_losses, ref_g0)
    one = dp.one_process(spec)
    for s, (a, b) in enumerate(zip(one["loss"], ref_losses)):  # the one-process run is on the same trajectory
        assert abs(a - b) <= dp.TRAJ_RTOL * abs(b), f"one process, step {s + 1}: {a} vs float64 {b}"
    for s, (a, b) in enumerate(zip(results[0]["loss"], one["loss"])):
        assert abs(a - b) <= dp.loss_tolerance(b), f"step {s + 1}: {n} ranks {a} vs one process {b}"
    assert ref_losses[-1] < ref_losses[0]  # it learns


@pytest.mark.parametrize("fault", ["sum", "skip_last_bucket"])
def test_the_checks_catch_a_broken_data_parallel_step(fault, two_ranks):
    specs, res = two_ranks
    i = [s["fault"] for s in specs].index(fault)
    ref_losses, ref_g0 = _reference(specs[i])
    with pytest.raises(AssertionError, match="gradient|replicas"):
        check_run(specs[i], res[i], ref_losses, ref_g0)
    if fault == "skip_last_bucket":  # the gains' gradients stayed per rank: the replicas drift apart
        assert res[i][0]["digests"][0] != res[i][1]["digests"][0]


def test_buckets_tile_the_gradient_buffer_in_backward_order():
    cfg = Config(vocab=11, ctx=8, width=16, heads=2, layers=3)
    spec = dp.make_spec("tiny")
    spec["config"] = dict(vocab=11, ctx=8, width=16, heads=2, layers=3)
    _, p = dp._params(spec)
    model = GPT(cfg, p, "cpu")
    for cap, nb in ((0, 5), (10**9, 3)):  # per block: 3 blocks + wte + gains; one cap for all: 1 + wte + gains
        bs = dp.plan_buckets(model, cap)
        assert len(bs) == nb and [b.index for b in bs] == list(range(nb))
        cover = np.zeros(model.n_params, int)
        for b in bs:
            cover[b.lo:b.hi] += 1
        assert (cover == 1).all()
        after = [b.after for b in bs if b.after is not None]
        assert after == sorted(after, reverse=True)  # last block first
        assert bs[-1].lo == model.n_matrix and bs[-1].hi == model.n_params and bs[-1].after is None
        wte = model.offsets["wte"]
        assert any((b.lo, b.hi) == wte and b.after is None for b in bs)  # wte waits for the embedding


def test_gpu_launcher_keeps_multicast_off():
    from kernels_src.dist.env import SAFE_ENV

    envs = dp.gpu_rank_envs(2, 29500, base={"NCCL_NVLS_ENABLE": "1", "PATH": "/bin"})
    for r, env in enumerate(envs):
        assert env["RANK"] == str(r) and env["WORLD_SIZE"] == "2"
        for k, v in SAFE_ENV.items():
            assert env[k] == v


@pytest.mark.parametrize("argv", [["--ranks", "0"], ["--ranks", "2", "--device", "tpu"],
                                  ["--ranks", "2", "--steps", "-1"], ["--ranks", "2", "--seq", "999"],
                                  ["--ranks", "2", "--json", "/no/such/dir/x.json"],
                                  ["--ranks", "2", "--bucket-mb", "-1"], ["--ranks", "2", "--config", "huge"]])
def test_bad_input_is_one_line_and_exit_2(argv, capsys):
    from kernels_src import cli

    try:
        code = cli.main(["train-dp", *argv])
    except SystemExit as e:  # argparse's own usage errors
        code = e.code
    err = capsys.readouterr().err
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1, err


def test_building_the_command_line_imports_neither_the_model_nor_the_ops():
    """train-dp's parser sits in tools/, so `kernels --help` (and every other command) does not register every op."""
    import subprocess
    import sys

    code = ("import sys, kernels_src.cli as c; c.build_parser(); "
            "print(sorted(m for m in ('kernels_src.model', 'kernels_src.ops') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "[]", (r.stdout, r.stderr)


def test_summary_speedup_is_n_ranks_over_one():
    """The JSON's speedup: tokens/s of the n-rank run over the one-rank run at the same batch per rank."""
    spec = dp.make_spec("tiny", ranks=2, steps=5, warmup=1)
    rank = {"loss": [1.0] * 5, "step_s": [9.0, 0.1, 0.1, 0.1, 0.1], "allreduce_ms": [0.0] * 5,
            "exposed_ms": [0.0] * 5, "buckets": [], "replicas_identical": True, "final_digest": "x"}
    single = {"step_s": [9.0, 0.15, 0.15, 0.15, 0.15], "tokens_per_step": spec["batch_per_rank"] * spec["seq"]}
    res = dp.summarize(spec, [rank, dict(rank)], single=single)
    tok = {r["ranks"]: r["tokens_per_s"] for r in res["runs"]}
    assert tok[2] == pytest.approx(2 * spec["batch_per_rank"] * spec["seq"] / 0.1)
    assert tok[1] == pytest.approx(spec["batch_per_rank"] * spec["seq"] / 0.15)
    assert res["speedup"] == pytest.approx(2 * 0.15 / 0.1)
