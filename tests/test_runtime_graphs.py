"""The runtime's launch plans and CUDA graphs (chapter 14): a replayed decode step gives the same logits
and tokens as the step run through the registered launchers; without a real GPU, the fallback says why."""
import numpy as np
import pytest

from kernels_src import device
from kernels_src.model.gpt import GPT
from kernels_src.model.reference import Config, init_params
from kernels_src.runtime import graphs

CFG = Config(vocab=29, ctx=16, width=64, heads=2, layers=2)
gpu_only = pytest.mark.skipif(device.MODE != "gpu", reason=f"CUDA graphs need a real GPU (mode: {device.MODE})")


def test_fallback_says_why_where_capture_is_impossible():
    ok, why = graphs.available()
    if device.MODE == "gpu":
        assert ok, why
        return
    assert not ok and why
    with pytest.warns(RuntimeWarning, match="running the step eagerly"):
        r = graphs.StepRunner(lambda: 7, mode="auto")
    assert r.mode == "eager" and r() == 7 and r() == 7
    with pytest.raises(RuntimeError, match="real GPU"):
        graphs.StepRunner(lambda: None, mode="graph")
    with pytest.raises(ValueError, match="not one of"):
        graphs.StepRunner(lambda: None, mode="fast")


def test_cpu_decoder_matches_decode_step():
    m = GPT(CFG, init_params(CFG, 0), "cpu")
    dec = m.decoder(m.new_cache(), mode="auto")
    assert dec.mode == "eager" and "CPU" in dec.runner.why
    kv = m.new_cache()
    for pos, t in enumerate([1, 5, 7, 2]):
        np.testing.assert_array_equal(dec.step([t], pos), m.decode_step([t], pos, kv))
    with pytest.raises(ValueError, match="outside the context"):
        dec.step([1], CFG.ctx)


@gpu_only
@pytest.mark.parametrize("mode", ["plan", "graph"])
@pytest.mark.parametrize("fmt", [None, "q8_0"])
def test_replayed_decode_equals_eager(mode, fmt):
    """Same kernels on the same buffers in the same order: the logits are bit-identical at every position,
    which also shows the position and cache length are read from the device, not frozen at capture."""
    cfg = Config(vocab=29, ctx=64, width=64, heads=2, layers=2)
    m = GPT(cfg, init_params(cfg, 0), "gpu")
    qw = m.quantize(fmt)[0] if fmt else None
    eager, fast = m.decoder(m.new_cache(), qw, mode="eager"), m.decoder(m.new_cache(), qw, mode=mode)
    rng = np.random.default_rng(0)
    for pos, t in enumerate(rng.integers(0, cfg.vocab, 40)):
        a = eager.step([int(t)], pos)
        b = fast.step([int(t)], pos)
        assert np.isfinite(a).all()
        np.testing.assert_array_equal(a, b, err_msg=f"{mode} {fmt} at position {pos}")
    assert fast.runner.plan is not None and len(fast.runner.plan) > 10


@gpu_only
def test_generate_graph_gives_the_same_tokens():
    cfg = Config(vocab=29, ctx=48, width=64, heads=2, layers=2)
    m = GPT(cfg, init_params(cfg, 1), "gpu")
    prompt = [3, 1, 4, 1, 5]
    eager = m.generate(prompt, 30, mode="eager")
    assert m.generate(prompt, 30, mode="graph") == eager
    assert m.generate(prompt, 30, mode="plan") == eager
    assert m.generate(prompt, 30, temperature=0.8, seed=3, mode="graph") == \
        m.generate(prompt, 30, temperature=0.8, seed=3, mode="eager")
