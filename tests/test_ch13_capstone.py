"""Chapter 13: the capstone GPT built from course kernels, against the float64 NumPy reference model.

Stated tolerances (float32 model vs float64 reference, tiny model, one fixed batch):
  logits           |err| <= 1e-5 + 1e-4 |ref|
  loss             |err| <= 1e-5 |ref|
  each gradient    max |err| <= 1e-4 * max |ref| of that tensor (+1e-9)
  AdamW trajectory the loss at each of 10 steps within 1e-4 relative
  KV cache         greedy tokens identical, token for token
"""
import numpy as np
import pytest

from kernels_src.model import data
from kernels_src.model.gpt import GPT, backend
from kernels_src.model.reference import Config, ReferenceGPT, adamw_step, init_params

LOGIT_TOL = (1e-4, 1e-5)  # (rtol, atol)
LOSS_RTOL = 1e-5
GRAD_RTOL = 1e-4  # relative to the tensor's largest reference entry
TRAJ_RTOL = 1e-4


def _params(cfg, seed=1, spread=0.1):
    """GPT-2 init plus noise, so logits are far from uniform and every gradient is non-trivial."""
    p = init_params(cfg, seed)
    rng = np.random.default_rng(seed + 100)
    return {k: v + spread * rng.standard_normal(v.shape) for k, v in p.items()}


def _batch(cfg, B, T, seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(0, cfg.vocab, (B, T)), rng.integers(0, cfg.vocab, (B, T))


def _compare(model, ref, ids, tg):
    logits_r, loss_r = ref.forward(ids, tg)
    grads_r = ref.backward()
    logits, loss = model.forward(ids, tg)
    model.backward()
    got = model.be.host(logits)
    want = logits_r.reshape(got.shape)
    err = np.abs(got - want)
    assert np.all(err <= LOGIT_TOL[1] + LOGIT_TOL[0] * np.abs(want)), f"logits: max err {err.max():.3g}"
    assert abs(loss - loss_r) <= LOSS_RTOL * abs(loss_r), (loss, loss_r)
    grads = model.grads()
    for name, gr in grads_r.items():
        e = np.abs(grads[name] - gr).max()
        assert np.isfinite(grads[name]).all(), name
        assert e <= GRAD_RTOL * np.abs(gr).max() + 1e-9, f"{name}: max err {e:.3g} vs max |g| {np.abs(gr).max():.3g}"


def test_fixed_batch_cpu():
    cfg = Config(vocab=29, ctx=16, width=32, heads=2, layers=2)
    p = _params(cfg)
    ids, tg = _batch(cfg, 2, 11)
    _compare(GPT(cfg, p, "cpu"), ReferenceGPT(cfg, p), ids, tg)


def test_fixed_batch_gpu_simulated(sim_greenlets):
    """The GPU backend (in the simulator here; on the H100 in the chapter's run): one tiny batch."""
    from kernels_src import device

    if not device.GPU_VARIANTS_RUN:
        pytest.skip(device.REASON)
    cfg = Config(vocab=7, ctx=8, width=16, heads=2, layers=1)
    p = _params(cfg)
    ids, tg = _batch(cfg, 1, 5)
    _compare(GPT(cfg, p, backend("gpu")), ReferenceGPT(cfg, p), ids, tg)


def test_adamw_trajectory_10_steps():
    """llm.c's test_gpt2: ten AdamW steps on both models, the losses agree at every step."""
    cfg = Config(vocab=29, ctx=16, width=32, heads=2, layers=2)
    p = _params(cfg)
    model, ref = GPT(cfg, p, "cpu"), ReferenceGPT(cfg, p)
    m = {k: np.zeros_like(v) for k, v in ref.p.items()}
    v = {k: np.zeros_like(x) for k, x in ref.p.items()}
    hyper = dict(beta1=0.9, beta2=0.95, eps=1e-8, wd=0.1)
    ids, tg = _batch(cfg, 2, 12)  # one batch, learned by heart: the loss must fall
    for step in range(1, 11):
        loss_r, g = ref.loss_and_grads(ids, tg)
        adamw_step(ref.p, g, m, v, step, 1e-2, **hyper)
        loss = model.train_step(ids, tg, 1e-2, **hyper)
        assert abs(loss - loss_r) <= TRAJ_RTOL * abs(loss_r), f"step {step}: {loss} vs {loss_r}"
    first = ReferenceGPT(cfg, p).forward(ids, tg)[1]
    assert loss_r < 0.8 * first  # it learned


def test_reference_gradients_finite_differences():
    cfg = Config(vocab=11, ctx=8, width=8, heads=2, layers=2)
    p = _params(cfg, spread=0.3)
    ids, tg = _batch(cfg, 2, 7)
    ref = ReferenceGPT(cfg, p)
    _, g = ref.loss_and_grads(ids, tg)
    rng = np.random.default_rng(3)
    for name in ref.p:
        for _ in range(3):
            idx = tuple(rng.integers(0, s) for s in ref.p[name].shape)
            old = ref.p[name][idx]
            ref.p[name][idx] = old + 1e-6
            lp = ref.forward(ids, tg)[1]
            ref.p[name][idx] = old - 1e-6
            lm = ref.forward(ids, tg)[1]
            ref.p[name][idx] = old
            fd = (lp - lm) / 2e-6
            assert abs(fd - g[name][idx]) <= 1e-6 + 1e-5 * abs(fd), (name, idx, fd, g[name][idx])


def test_greedy_kv_cache_equals_no_cache():
    cfg = Config(vocab=data.VOCAB, ctx=32, width=32, heads=2, layers=2)
    model = GPT(cfg, _params(cfg, spread=0.2), "cpu")
    prompt = list(data.encode("The kernel "))
    with_cache = model.generate(prompt, 16, cache=True)
    without = model.generate(prompt, 16, cache=False)
    assert with_cache == without


def test_sampling_draws_through_the_sample_op_and_repeats_from_its_seed():
    """Each sampled token is chapter 16's float64 sample reference on that step's logits, at (seed, step); the
    same seed gives the same text, another seed another; top_k = 1 is greedy; bad knobs fail at once."""
    from kernels_src.ops.sampling import sample_ref

    cfg = Config(vocab=data.VOCAB, ctx=32, width=32, heads=2, layers=2)
    model = GPT(cfg, _params(cfg, spread=0.2), "cpu")
    prompt = list(data.encode("The kernel "))
    knobs = dict(temperature=1.3, top_k=12, top_p=0.9)
    toks = model.generate(prompt, 12, seed=7, **knobs)
    for i in range(len(prompt), len(toks)):
        logits = model.be.host(model.forward(np.array([toks[:i]], np.int32))[0])[-1]
        want = sample_ref(logits[None, :].astype(np.float64), knobs["temperature"], knobs["top_k"], knobs["top_p"],
                          7, i)[0]
        assert toks[i] == want, (i, toks[i], want)
    assert model.generate(prompt, 12, seed=7, cache=False, **knobs) == toks
    assert model.generate(prompt, 12, seed=8, **knobs) != toks
    assert model.generate(prompt, 12, temperature=0.9, top_k=1, seed=5) == model.generate(prompt, 12)
    with pytest.raises(ValueError, match="top_p"):
        model.generate(prompt, 3, temperature=1.0, top_p=0.0)


def test_quantized_decode_matches_dequantized_forward():
    """Q8_0 decode through the dequantizing GEMV = the fp32 forward on the dequantized weights."""
    cfg = Config(vocab=data.VOCAB, ctx=16, width=32, heads=2, layers=1)
    p = _params(cfg, spread=0.2)
    model = GPT(cfg, p, "cpu")
    qw, deq = model.quantize("q8_0")
    toks = [5, 17, 40, 2]
    kv = model.new_cache()
    for pos, t in enumerate(toks):
        dec = model.decode_step([t], pos, kv, qw)[0]
    p2 = dict(model.params())
    p2.update(deq)
    fwd = GPT(cfg, p2, "cpu").forward(np.array([toks]))[0][-1]
    assert np.abs(dec - fwd).max() <= 1e-4 * np.abs(fwd).max() + 1e-5
    err = max(np.abs(deq[n] - model.params()[n]).max() / np.abs(model.params()[n]).max() for n in deq)
    assert 0 < err < 1e-2  # Q8_0: 8 bits per weight, errors around a percent of the largest weight at most


def test_corpus_and_tokenizer():
    text = data.corpus("ch0[12]_*.md")
    assert len(text) > 5000 and "```" not in text and "code-cell" not in text
    ids = data.encode("Hello, kernel!\n")
    assert data.decode(ids) == "Hello, kernel!\n" and data.VOCAB == 96 and ids.max() < 96


def test_exercise_oracles_equal_the_reference_model():
    """The exercise ops' oracles (kernels_src/ops/transformer_block.py) are built from the ops' own oracles, below
    the model; they must equal the reference model's block and its L = 0 backward."""
    from kernels_src.ops import transformer_block as tb
    from kernels_src.ops.rope import cos_sin_cache

    rng = np.random.default_rng(7)
    T, C = 9, 16
    cfg = Config(vocab=T, ctx=T, width=C, heads=tb.BLOCK_HEADS, layers=1)
    p = _params(cfg)
    x = p["wte"]  # token t embeds to x[t]: the block's input, for ids 0 .. T-1
    cos, sin = cos_sin_cache(T, C // tb.BLOCK_HEADS, dtype=np.float64)
    y = tb.block_reference(x, *(p[f"h0.{n}"] for n in ("g1", "wqkv", "wo", "g2", "wfc", "wproj")), cos, sin)
    ref = ReferenceGPT(cfg, p)
    ref.forward(np.arange(T)[None])
    np.testing.assert_allclose(y, ref.cache["xL"][0], rtol=1e-12, atol=1e-12)

    theta, ids, targets, V, C = tb.fd_inputs((6, 4), np.float64, rng)
    cfg0 = Config(vocab=V, ctx=len(ids), width=C, heads=1, layers=0)
    _, g = ReferenceGPT(cfg0, tb.unpack(theta, V, C)).loss_and_grads(ids[None], targets[None])
    np.testing.assert_allclose(tb.fd_reference(theta, ids, targets, V, C),
                               np.concatenate([g["wte"].ravel(), g["gf"]]), rtol=1e-12, atol=1e-14)


def _ce_cpu_keys():
    import kernels_src

    return [v.key for name in ("cross_entropy", "cross_entropy_bwd") for v in kernels_src.get_op(name).variants
            if v.backend == "cpu" and not v.baseline]


@pytest.mark.parametrize("size", [(1, 1), (3, 17), (5, 130)])
@pytest.mark.parametrize("key", _ce_cpu_keys())
def test_cross_entropy_cpu_rungs_on_awkward_shapes(key, size):
    """Every CPU rung of the fused cross-entropy and its backward against the float64 reference, outputs poisoned."""
    import kernels_src
    from kernels_src import parity

    v = kernels_src.get_variant(key)
    rep = parity.check_variant(v, kernels_src.get_op(v.op), size)
    assert rep.ok, str(rep)
