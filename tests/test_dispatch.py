"""The dispatcher (kernels_src.runtime.dispatch, chapter 14): its decisions for a set of shapes, tables that must
be refused, calls nothing can serve, the split-K GEMM it dispatches to, and the model's parity with the
float64 reference whatever variant is picked (CPU backend and the CUDA simulator)."""
import json

import numpy as np
import pytest

from kernels_src import device
from kernels_src.model.gpt import GPT, backend
from kernels_src.model.reference import Config, ReferenceGPT, init_params
from kernels_src.model import explain as X
from kernels_src.runtime import dispatch as D

MM = {"gemm": ("M", "N", "K")}


def _decide(dev, role, M, N, K, table=None):
    return D.Dispatcher(dev, table=table if table is not None else {}, check=False).decide(role, {"M": M, "N": N, "K": K})


@pytest.mark.parametrize("dev,role,shape,variant,rule", [
    ("gpu", "gemm", (1, 1536, 512), "gemv/gpu/splitk_grid", "gemv"),                # a decode step's product
    ("gpu", "gemm_nt", (1, 96, 512), "gemv_wx/gpu/warp_per_row_vec4", "gemv"),      # the tied head at decode
    ("gpu", "gemm", (2, 1536, 512), "gemm/gpu/warptile", "large"),                  # M above gemv_max_m = 1
    ("gpu", "gemm_tn", (512, 1536, 4096), "gemm/gpu/splitk", "splitk"),             # training's dW: 48 tiles
    ("gpu", "gemm_tn", (96, 512, 4096), "gemm/gpu/splitk", "splitk"),               # the head's dW
    ("gpu", "gemm", (4096, 1536, 512), "gemm/gpu/warptile", "large"),               # forward: 384 tiles
    ("gpu", "gemm_tn", (2048, 2048, 4096), "gemm/gpu/warptile", "large"),           # 256 tiles fill the GPU
    ("gpu", "gemm_tn", (512, 512, 512), "gemm/gpu/warptile", "large"),              # K too short to split
    ("sim", "gemm", (1, 17, 9), "gemv/gpu/splitk", "gemv"),                          # no shuffles in the simulator
    ("sim", "gemm_nt", (1, 17, 9), "gemv_wx/gpu/warp_per_row_smem", "gemv"),
    ("sim", "gemm", (33, 17, 9), "gemm/gpu/coalesced", "large"),
    ("cpu", "gemm", (1, 17, 9), "gemv/cpu/rows8_prange", "gemv"),
    ("cpu", "gemm_tn", (512, 1536, 4096), "gemm/cpu/zmm_par", "large_zmm"),  # unchecked: as on AVX-512
])
def test_decisions_by_shape(dev, role, shape, variant, rule):
    d = _decide(dev, role, *shape)
    assert (d.variant, d.rule) == (variant, rule), d
    assert d.why


@pytest.mark.parametrize("dev,fmt,N,K,variant,rule", [
    # the large capstone's decode products are latency bound (few blocks, ~1 MB each): rung 10, a word a lane
    # (rungs 8-9 read x 128 bytes apart across a warp's lanes: measured slower for Q4_0 than for Q8_0)
    ("gpu", "q4_0", 2304, 768, "qgemv_q4_0/gpu/packed_words", "small"),
    ("gpu", "q4_0", 768, 3072, "qgemv_q4_0/gpu/packed_words", "small"),
    ("gpu", "q8_0", 3072, 768, "qgemv_q8_0/gpu/packed_words", "small"),
    ("sim", "q8_0", 7, 64, "qgemv_q8_0/gpu/packed_words", "small"),     # no shuffles: rung 10
    # above qgemv_split_max_weights, DRAM bound: rung 6, the sweep's winner at 4096^2-8192^2
    ("gpu", "q4_0", 8192, 8192, "qgemv_q4_0/gpu/packed_warp", "fixed"),
    ("gpu", "q8_0", 14336, 4096, "qgemv_q8_0/gpu/packed_warp", "fixed"),
    ("cpu", "q4_0", 2304, 768, "qgemv_q4_0/cpu/packed_rows4", "fixed"),
])
def test_quantized_gemv_decisions(dev, fmt, N, K, variant, rule):
    d = D.Dispatcher(dev, table={}, check=False).decide(f"qgemv_{fmt}", {"N": N, "K": K})
    assert (d.variant, d.rule) == (variant, rule), d
    t = {"thresholds": {"qgemv_split_max_weights": 0}}  # a table can turn rung 10 off
    assert D.Dispatcher(dev, table=t, check=False).decide(f"qgemv_{fmt}", {"N": N, "K": K}).rule == "fixed"


@pytest.mark.parametrize("dev,N,K,variant,rule", [
    ("gpu", 3072, 768, "qgemv_gelu_q4_0/gpu/packed_words", "small"),  # the up projection: one launch
    ("sim", 128, 32, "qgemv_gelu_q4_0/gpu/packed_words", "small"),
    ("gpu", 14336, 4096, "qgemv_gelu_q4_0/gpu/unfused", "fixed"),     # above the threshold: rung 6, then the GELU
    ("cpu", 3072, 768, "qgemv_gelu_q4_0/cpu/fused_prange", "fixed"),
])
def test_fused_up_projection_decisions(dev, N, K, variant, rule):
    d = D.Dispatcher(dev, table={}, check=False).decide("qgemv_gelu_q4_0", {"N": N, "K": K})
    assert (d.variant, d.rule) == (variant, rule), d


def test_decisions_follow_the_table():
    table = {"thresholds": {"gemv_max_m": 4, "splitk_min_k": 100000},
             "entries": [{"role": "gemm", "shape": [4096, 512, 2048], "best": "gemm/gpu/splitk",
                          "us": {"gemm/gpu/splitk": 80.0, "gemm/gpu/warptile": 120.0}}]}
    assert _decide("gpu", "gemm", 4, 768, 768, table).rule == "gemv"          # threshold raised to 4
    assert _decide("gpu", "gemm_tn", 512, 1536, 4096, table).variant == "gemm/gpu/warptile"  # split-K off
    d = _decide("gpu", "gemm", 4096, 512, 2048, table)                         # an exact entry wins
    assert (d.variant, d.rule) == ("gemm/gpu/splitk", "table") and d.entry["best"] == "gemm/gpu/splitk"
    assert "warptile 120 us" in d.why
    assert _decide("gpu", "gemm", 4096, 512, 2049, table).rule == "large"     # one K off: no entry


def test_every_policy_names_registered_variants():
    from kernels_src import registry

    for role, rules in D.POLICIES.items():
        for r in rules:
            for dev, key in r.variants.items():
                if key:
                    registry.get_variant(key)  # raises KeyError naming what exists


@pytest.mark.parametrize("entry,message", [
    ({"role": "gemm", "shape": [64, 64, 64], "best": "gemm/gpu/warptile_v2"}, "gemm/gpu/warptile_v2, which is not registered"),
    ({"role": "gemm", "shape": [64, 64, 64], "best": "gelu/gpu/ilp4"}, "role gemm runs ops"),
    ({"role": "gemm", "shape": [64, 64, 64], "best": "gemm/gpu/warptile", "us": {"gemm/gpu/gone": 1.0}}, "gemm/gpu/gone"),
    ({"role": "matmul", "shape": [64, 64, 64], "best": "gemm/gpu/warptile"}, "unknown role 'matmul'"),
    ({"role": "gemm", "shape": [64, 64], "best": "gemm/gpu/warptile"}, "needs shape [M, N, K]"),
    ({"role": "gemm", "shape": [64, 64, 64], "best": "warptile"}, "not an 'op/backend/variant' key"),
])
def test_a_bad_table_is_refused_with_a_clear_error(tmp_path, entry, message):
    path = tmp_path / "nvidia-h100-80gb-hbm3.json"
    path.write_text(json.dumps({"schema": 1, "entries": [entry]}))
    with pytest.raises(D.DispatchTableError, match="not registered|role|unknown|shape|key") as e:
        D.Dispatcher("gpu", table=path, check=False)
    assert message in str(e.value) and str(path) in str(e.value)


def test_bad_thresholds_and_files_are_refused(tmp_path):
    with pytest.raises(D.DispatchTableError, match="unknown threshold 'gemv_max_n'"):
        D.Dispatcher("gpu", table={"thresholds": {"gemv_max_n": 2}})
    with pytest.raises(D.DispatchTableError, match="does not exist"):
        D.Dispatcher("gpu", table=tmp_path / "none.json")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(D.DispatchTableError, match="not valid JSON"):
        D.Dispatcher("gpu", table=tmp_path / "bad.json")


def test_the_committed_tables_are_valid():
    for path in sorted(D.TABLES.glob("*.json")):
        t = D.load_table(path)
        assert t["entries"] and set(t["thresholds"]) <= set(D.DEFAULTS)
        for e in t["entries"]:
            assert e["best"] in e["us"] and e["us"][e["best"]] == min(e["us"].values())


def test_unsupported_calls_name_role_shape_and_what_exists():
    d = D.Dispatcher("gpu", table={}, check=False)
    with pytest.raises(D.UnsupportedCall) as e:
        d.decide("attention", {"B": 1, "H": 2, "S": 64, "D": 256})
    msg = str(e.value)
    assert "'attention'" in msg and "D=256" in msg and "attention/gpu/flash_shfl" in msg and "D <= 128" in msg
    assert "attention/gpu/row" in msg
    with pytest.raises(D.UnsupportedCall, match=r"qgemv_q8_0.*K=40.*K a multiple of 32"):
        d.decide("qgemv_q8_0", {"N": 64, "K": 40})
    with pytest.raises(D.UnsupportedCall, match=r"'gemm'.*float64.*gemm/cpu/packed_par \(it takes float32"):
        D.Dispatcher("cpu").pick("gemm", np.empty((3, 5)), np.empty((3, 4)), np.empty((4, 5)))
    with pytest.raises(D.UnsupportedCall, match="no dispatch policy for role 'conv2d'"):
        d.decide("conv2d", {})
    with pytest.raises(D.DispatchError, match="override for unknown role"):
        D.Dispatcher("cpu", overrides={"matmul": "gemm/cpu/numpy"})


def test_decisions_are_cached_per_shape():
    d = D.Dispatcher("cpu")
    a = [np.zeros((1, 8), np.float32), np.zeros((1, 4), np.float32), np.zeros((4, 8), np.float32)]
    b = [np.zeros((3, 8), np.float32), np.zeros((3, 4), np.float32), np.zeros((4, 8), np.float32)]
    assert d.pick("gemm", *a) is d.pick("gemm", *a)
    assert d.pick("gemm", *a).rule == "gemv" and d.pick("gemm", *b).rule in ("large_zmm", "large")


@pytest.mark.parametrize("avx512", [True, False])
def test_the_cpu_gemm_falls_back_to_rung_8_without_avx512(monkeypatch, avx512):
    """Rung 9 needs AVX-512 (its requires= says so): where it is skipped, the next rule serves the call."""
    v = D.registry.get_variant("gemm/cpu/zmm_par")
    monkeypatch.setattr(v, "requires", lambda: (avx512, "" if avx512 else "needs AVX-512 (this CPU has none)"))
    d = D.Dispatcher("cpu", table={}).decide("gemm", {"M": 64, "N": 64, "K": 64})
    assert (d.variant, d.rule) == (("gemm/cpu/zmm_par", "large_zmm") if avx512 else ("gemm/cpu/packed_par", "large"))


def test_the_cpu_picks_are_the_committed_boards_best_rungs():
    """Each CPU rule runs the fastest course rung of its op on the committed CPU scoreboard (kernels cpuboard), so a
    faster rung added to a chapter reaches the model too: for every op a role's CPU rules name, the first rule
    naming that op names the board's best rung."""
    from kernels_src.figures import cpu as cpufig

    board = cpufig.load_board()
    if board is None:
        pytest.skip("no committed CPU scoreboard")
    best = {r["op"]: r["best"] for r in board["rows"]}
    stale = []
    for role, rules in D.POLICIES.items():
        first = {}
        for rule in rules:
            key = rule.variants.get("cpu")
            if key:
                first.setdefault(key.split("/")[0], key)
        stale += [f"{role}: {key}, but the board's best is {op}/cpu/{best[op]}" for op, key in first.items()
                  if op in best and key != f"{op}/cpu/{best[op]}"]
    assert not stale, "\n".join(stale)


def test_explain_lists_every_call_of_a_step():
    cfg = Config(vocab=29, ctx=16, width=32, heads=2, layers=2)
    rows = X.explain("train", cfg, dev="gpu", table={}, batch=2)
    roles = {r["role"] for r in rows}
    assert {"gemm", "gemm_nt", "gemm_tn", "attention", "attention_bwd", "adamw"} <= roles
    # 2 layers: 4 forward products each, 1 head; backward: wproj/wfc/wo/wqkv dX and dW, head dW + dxf
    assert sum(r["calls"] for r in rows if r["role"] in D.MATMUL_ROLES) == 2 * 4 + 1 + 2 * 8 + 2
    dec = X.explain("decode", cfg, dev="gpu", table={})
    assert {r["variant"] for r in dec if r["role"] == "gemm"} == {"gemv/gpu/splitk_grid"}
    text = X.explain_text(dec)
    assert "gemv_wx/gpu/warp_per_row_vec4" in text


def test_cli_explains(capsys):
    from kernels_src.cli import main

    assert main(["dispatch", "--explain", "decode", "--config", "vocab=29,ctx=16,width=32,heads=2,layers=1"]) == 0
    out = capsys.readouterr().out
    assert "gemv/gpu/splitk_grid" in out and "rule" in out
    assert main(["dispatch", "--explain", "train", "--config", "width=oops"]) == 2


# ------------------------------------------------------------------------------------------ split-K GEMM
@pytest.mark.parametrize("M,N,K,S", [(9, 13, 70, 3), (5, 8, 40, 2), (3, 4, 33, 5), (1, 1, 1, 1), (6, 7, 20, 1)])
def test_splitk_gemm_slices(M, N, K, S):
    """Rung 12 with a forced slice count (5 slices of 3 K tiles: the last two are empty and write zeros)
    against the float64 reference, output poisoned with NaN."""
    if not device.GPU_VARIANTS_RUN:
        pytest.skip(device.REASON)
    from kernels_src.ops import gemm

    rng = np.random.default_rng(M * N + K)
    A, B = (rng.standard_normal(s).astype(np.float32) for s in ((M, K), (K, N)))
    C = device.cuda.to_device(np.full((M, N), np.nan, np.float32))
    gemm.gemm_splitk_launch(C, device.cuda.to_device(A), device.cuda.to_device(B), slices=S)
    want = A.astype(np.float64) @ B
    got = C.copy_to_host()
    rtol, atol = gemm.gemm_tol((M, N, K), np.float32)
    assert np.all(np.abs(got - want) <= atol + rtol * np.abs(want)), np.abs(got - want).max()


def test_splitk_slices_fill_the_gpu():
    from kernels_src.ops import gemm

    assert gemm.splitk_slices(512, 1536, 4096) == 6  # 48 tiles -> 288 blocks
    assert gemm.splitk_slices(4096, 4096, 4096) == 1  # 1024 tiles: no split
    assert gemm.splitk_slices(96, 512, 64) == 1  # 4 K tiles: too short to split


# ------------------------------------------------------------------------------------------ the model
def _params(cfg, seed=1, spread=0.1):
    p = init_params(cfg, seed)
    rng = np.random.default_rng(seed + 100)
    return {k: v + spread * rng.standard_normal(v.shape) for k, v in p.items()}


def _check_train(model, ref, ids, tg):
    logits_r, loss_r = ref.forward(ids, tg)
    grads_r = ref.backward()
    logits, loss = model.forward(ids, tg)
    model.backward()
    got = model.be.host(logits)
    want = logits_r.reshape(got.shape)
    assert np.all(np.abs(got - want) <= 1e-5 + 1e-4 * np.abs(want))
    assert abs(loss - loss_r) <= 1e-5 * abs(loss_r)
    g = model.grads()
    for k, gr in grads_r.items():
        assert np.isfinite(g[k]).all() and np.abs(g[k] - gr).max() <= 1e-4 * np.abs(gr).max() + 1e-9, k


def _check_decode(model, ref_p, cfg, toks):
    ref = ReferenceGPT(cfg, ref_p).forward(np.array([toks]))[0].reshape(len(toks), -1)
    kv = model.new_cache()
    for pos, t in enumerate(toks):
        got = model.decode_step([t], pos, kv)[0]
        assert np.abs(got - ref[pos]).max() <= 1e-5 + 1e-4 * np.abs(ref[pos]).max(), pos


# Tables that steer every product of the tiny model to one plan: GEMV for every row count, split-K always.
ALL_GEMV = {"thresholds": {"gemv_max_m": 10 ** 6, "splitk_min_k": 10 ** 9}}
ALL_SPLITK = {"thresholds": {"gemv_max_m": 0, "splitk_min_k": 1, "splitk_max_tiles": 10 ** 6}}


@pytest.mark.parametrize("table", [None, ALL_GEMV], ids=["defaults", "gemv_everywhere"])
def test_model_matches_reference_cpu(table):
    cfg = Config(vocab=29, ctx=16, width=32, heads=2, layers=2)
    p = _params(cfg)
    rng = np.random.default_rng(0)
    ids, tg = rng.integers(0, cfg.vocab, (2, 11)), rng.integers(0, cfg.vocab, (2, 11))
    model = GPT(cfg, p, backend("cpu", table))
    _check_train(model, ReferenceGPT(cfg, p), ids, tg)
    used = {model.be.table[r] for r in ("gemm", "gemm_nt")}
    assert (table is ALL_GEMV) == all(k.startswith("gemv") for k in used), used
    _check_decode(GPT(cfg, p, backend("cpu", table)), p, cfg, [5, 17, 3, 20])


def test_model_matches_reference_simulated_splitk(monkeypatch, sim_greenlets):
    """The GPU backend in the simulator, every product through the split-K GEMM with 2 slices (K tiles of 16:
    B*T = 22 token rows are two tiles), then decode steps through the GEMVs."""
    if not device.GPU_VARIANTS_RUN:
        pytest.skip(device.REASON)
    from kernels_src.ops import gemm

    monkeypatch.setattr(gemm, "SPLITK_MIN_TILES", 1)
    cfg = Config(vocab=7, ctx=12, width=16, heads=2, layers=1)
    p = _params(cfg)
    rng = np.random.default_rng(0)
    ids, tg = rng.integers(0, cfg.vocab, (2, 11)), rng.integers(0, cfg.vocab, (2, 11))
    # sim_greenlets: each block's threads as greenlets, not OS threads (several times faster); what is tested
    # here is the dispatch and the model's numbers, and every kernel's barriers are checked with OS threads by
    # the race test of tests/test_registry.py.
    model = GPT(cfg, p, backend("gpu", ALL_SPLITK))
    model.be.log = []
    _check_train(model, ReferenceGPT(cfg, p), ids, tg)
    tn = [d for d in model.be.log if d.role == "gemm_tn"]
    assert tn and all(d.variant == "gemm/gpu/splitk" for d in tn)
    assert gemm.splitk_slices(16, 48, 22) == 2
    _check_decode(GPT(cfg, p, backend("gpu")), p, cfg, [5, 2, 6])
