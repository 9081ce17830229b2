"""Hidden inputs that separate right from wrong, found by mutation (issue 28, class 8).

Each mutant is a plausible wrong answer: the master solution with one small edit (an off-by-one, epsilon in the
wrong place, a missing bias correction, a wrong stride or mask, a dropped term). Every mutant must fail one of
its question's hidden checks on every seed tried: a mutant that survives means the hidden inputs cannot tell
that mistake from a right answer. The mutated code runs in this process (GPU answers in the CUDA simulator)
with the grader's own cases, poisoned outputs and tolerances, as tests/test_grading_seeds.py does.
"""
import types

import pytest

from _grading_support import generated
from kernels_src import device
from kernels_src.grading import bundle as bundle_mod
from kernels_src.grading import corpus
from kernels_src.grading.submission import load_autograder
from test_grading_seeds import _engine, _failures

SEEDS = (0, 1, 2)
# The prediction questions (a model of a kernel's time or speed-up, "predict_*") are graded against the H100's
# measurements with a band (+-30 to 50 %, kernels_src/ops/exercises_seq.py): a model mistake smaller than the band
# (8 bytes per element for 12, a launch time left out at sizes where it is small) is inside the question's own
# definition of right, so their mutants are mistakes the band excludes (units, an inverted ratio, a missing term).
# (exercise, question, name, text in the master's answer, its replacement)
MUTANTS = [
    ("ch01_axpy", "q1", "loop stops one short", "range(out.size)", "range(out.size - 1)"),
    ("ch01_axpy", "q2", "guard one short", "if i < out.size:", "if i < out.size - 1:"),
    ("ch01_axpy", "q2", "grid rounds down", "ceil_div(out.size, threads)", "max(1, out.size // threads)"),
    ("ch01_axpy", "q3", "stride loop one short", "while i < out.size:", "while i < out.size - 1:"),
    ("ch01_axpy", "q3", "stride is the block", "stride = cuda.gridsize(1)", "stride = cuda.gridsize(1) + 1"),
    ("ch02_regression", "q1", "mean over n - 1", "loss[0] = s_rr / n", "loss[0] = s_rr / max(n - 1, 1)"),
    ("ch02_regression", "q1", "gradient without the 2", "db[0] = 2.0 * s_r / n", "db[0] = s_r / n"),
    ("ch02_regression", "q2", "threads past the end add their residual", "    if i < n:\n        r = w * x[i] + b - y[i]",
     "    r = w * x[min(i, n - 1)] + b - y[min(i, n - 1)]"),
    ("ch03_linear_backward", "q1", "sum over m one short", "for m in range(M):", "for m in range(M - 1):"),
    ("ch03_linear_backward", "q3", "guard on the wrong dimension", "k < dX.shape[1]:", "k < dX.shape[0]:"),
    ("ch06_activations", "q1", "bias of the wrong column", "v[j] = x[r, c] + b[c]", "v[j] = x[r, c] + b[r % b.size]"),
    ("ch06_activations", "q2", "derivative without the tanh' term", "(s + TWO * v * s * (ONE - s) * K * (ONE + C3 * v * v))",
     "(s + TWO * v * s * (ONE - s) * K)"),
    ("ch09_attention", "q1", "causal mask one short", "lim = min(lim, i + T - S + 1)", "lim = min(lim, i + T - S)"),
    ("ch09_attention", "q6", "block end not clipped at S", "last = min(i0 + br, S) - 1", "last = i0 + br - 1"),
    ("ch09_attention", "q6", "causal bound one short", "lim = min(lim, last + T - S + 1)", "lim = min(lim, last + T - S)"),
    ("ch09_attention", "q6", "tile count rounds down", "tiles[r] = (lim + bc - 1) // bc", "tiles[r] = lim // bc"),
    ("ch13_capstone_gpt", "q2", "ignored targets not zeroed", "dead = tg < 0 or ls == -math.inf",
     "dead = ls == -math.inf"),
    ("ch04_gemv", "q2", "k slice one short", "k1 = min(k0 + KSLICE, x.size)", "k1 = min(k0 + KSLICE, x.size - 1)"),
    ("ch05_gemm", "q1", "k loop one short", "for k in range(A.shape[1]):", "for k in range(A.shape[1] - 1):"),
    ("ch05_gemm", "q2", "tile guard ignores K", "if i < M and k0 + tx < K else", "if i < M else"),
    ("ch07_norms", "q1", "eps outside the square root", "math.sqrt(sq[0] / float32(N) + float32(EPS))",
     "(math.sqrt(sq[0] / float32(N)) + float32(EPS))"),
    ("ch07_norms", "q2", "dx without the xhat term", "- sg - xhat * sgx)", "- sg)"),
    ("ch08_softmax", "q1", "fully masked row not handled", "if m == -math.inf:\n            for j",
     "if False:\n            for j"),
    ("ch08_softmax", "q2", "fully masked row not handled", "if m == ninf:\n            y[i, c] = 0.0",
     "if False:\n            y[i, c] = 0.0"),
    ("ch10_rope_kv_cache", "q1", "rotation sign flipped", "y[t, h, i] = a * c - b * s", "y[t, h, i] = a * c + b * s"),
    ("ch10_rope_kv_cache", "q4", "masked split not skipped", "if m == -math.inf:\n                continue",
     "if False:\n                continue"),
    ("ch10_rope_kv_cache", "q6", "thread cap forgotten", "b = min(65536 // (regs * threads), 32, 2048 // threads)",
     "b = min(65536 // (regs * threads), 32)"),
    ("ch10_rope_kv_cache", "q6", "chunk not whole tiles", "chunk = (length + s * tile - 1) // (s * tile) * tile",
     "chunk = (length + s - 1) // s"),
    ("ch10_rope_kv_cache", "q6", "ties go to more splits", "(cost == best_cost and used < best)",
     "(cost == best_cost and used > best)"),
    ("ch10_rope_kv_cache", "q6", "waves rounded down", "(pairs * used + slots - 1) // slots * chunk",
     "(pairs * used) // slots * chunk"),
    ("ch10_rope_kv_cache", "q7", "empty states not guarded", "if m == -math.inf:\n        return",
     "if False:\n        return"),
    ("ch10_rope_kv_cache", "q7", "old state not rescaled", "wa = math.exp(a[0] - m)", "wa = 1.0"),
    ("ch10_rope_kv_cache", "q7", "tree merges the wrong neighbour", "merge_pair(buf[k], buf[k + h])",
     "merge_pair(buf[k], buf[k + 1])"),
    ("ch11_quantization", "q1", "round half to even", "int(math.floor(abs(v) + 0.5))", "int(round(abs(v)))"),
    ("ch11_quantization", "q2", "low and high nibbles swapped",
     "out[m, c] = float32((lo & 15) - 8) * d\n        out[m, c + 16] = float32((lo >> 4) - 8) * d",
     "out[m, c] = float32((lo >> 4) - 8) * d\n        out[m, c + 16] = float32((lo & 15) - 8) * d"),
    ("ch11_quantization", "q2", "bytes of the word swapped (big-endian)", "lo = u & 255\n        hi = u >> 8",
     "hi = u & 255\n        lo = u >> 8"),
    ("ch11_quantization", "q2", "missing -8 offset", "float32((hi >> 4) - 8) * d", "float32(hi >> 4) * d"),
    ("ch11_quantization", "q2", "no mask after the shift", "lo = u & 255", "lo = u"),
    ("ch11_quantization", "q2", "uint16 arithmetic (wraps in the simulator)", "u = int32(w16[m, 9 * b + 1 + t])",
     "u = w16[m, 9 * b + 1 + t]"),
    ("ch11_quantization", "q2", "scale word read as quants", "w16[m, 9 * b + 1 + t]", "w16[m, 9 * b + t]"),
    ("ch11_quantization", "q3", "wrong block stride", "qs[n, 34 * b + 2 + j]", "qs[n, 32 * b + 2 + j]"),
    ("ch11_quantization", "q6", "step = amax, not amax/8", "s4 += (amax / 8.0) ** 2", "s4 += amax ** 2"),
    ("ch11_quantization", "q6", "divides by 12, not by sqrt(12)", "r[1] = math.sqrt(s4 / (12.0 * nblocks))",
     "r[1] = math.sqrt(s4 / nblocks) / 12.0"),
    ("ch11_quantization", "q6", "Q4_0 step from 7 levels", "(amax / 8.0)", "(amax / 7.0)"),
    ("ch11_quantization", "q6", "half a step (the max error), not the RMS", "r[0] = math.sqrt(s8 / (12.0 * nblocks))",
     "r[0] = math.sqrt(s8 / (4.0 * nblocks))"),
    ("ch11_quantization", "q6", "signed max, not the largest magnitude", "amax = max(amax, abs(float(X[m, 32 * b + j])))",
     "amax = max(amax, float(X[m, 32 * b + j]))"),
    ("ch12_optimizers", "q1", "nesterov uses the plain step", "p_new[i] = p[i] - lr * (gt + momentum * bi)",
     "p_new[i] = p[i] - lr * bi"),
    ("ch12_optimizers", "q2", "epsilon inside the square root",
     "mi / (math.sqrt(vi) * inv_sqrt_bc2 + eps)", "mi / (math.sqrt(vi + eps) * inv_sqrt_bc2)"),
    ("ch12_optimizers", "q2", "decay as a subtraction (an infinite weight: inf - inf)", "pi = p[i] * decay",
     "pi = p[i] - p[i] * (1 - decay)"),
    ("ch12_optimizers", "q3", "missing bias correction of m", "du_bc[i] = -lr * (m / (1.0 - beta1))",
     "du_bc[i] = -lr * m"),
    ("ch12_optimizers", "q3", "epsilon inside the square root", "(math.sqrt(v / (1.0 - beta2)) + eps)",
     "(math.sqrt(v / (1.0 - beta2) + eps))"),
    ("ch12_optimizers", "q6", "ties always round up", "u + 0x7FFF + ((u >> 16) & 1)", "u + 0x8000"),
    ("ch12_optimizers", "q6", "truncates instead of rounding", "u + 0x7FFF + ((u >> 16) & 1)", "u"),
    ("ch12_optimizers", "q6", "NaN not handled", "if x[i] != x[i]:", "if False:"),
    ("ch12_optimizers", "q7", "rounds to nearest", "(r[i, k] & 0xFFFF)", "0x7FFF"),
    ("ch12_optimizers", "q7", "8 random bits instead of 16", "(r[i, k] & 0xFFFF)", "(r[i, k] & 0xFF)"),
    ("ch12_optimizers", "q7", "truncates", "(r[i, k] & 0xFFFF)", "0"),
    ("ch12_optimizers", "q8", "stride of one block", "i += cuda.gridsize(1)", "i += cuda.blockDim.x"),
    ("ch12_optimizers", "q8", "tree starts at a quarter", "s = THREADS_NORM // 2", "s = THREADS_NORM // 4"),
    ("ch12_optimizers", "q8", "stores thread 0's own sum", "partials[cuda.blockIdx.x] = buf[0]",
     "partials[cuda.blockIdx.x] = acc"),
    ("ch21_collectives", "q1", "ring walks the wrong way", "return (r - s) % n, (r - s - 1) % n",
     "return (r + s) % n, (r + s - 1) % n"),
    ("ch21_collectives", "q1", "receive names the chunk it sends", "return (r - s) % n, (r - s - 1) % n",
     "return (r - s) % n, (r - s) % n"),
    ("ch21_collectives", "q1", "all-gather starts from the rank's own chunk", "return (r + 1 - s) % n, (r - s) % n",
     "return (r - s) % n, (r - s - 1) % n"),
    ("ch21_collectives", "q2", "chunk start ignores the remainder", "lo = c * q + min(c, e)", "lo = c * q"),
    ("ch21_collectives", "q2", "the chunk this rank sends, not the one it receives", "c = (r - s - 1) % n",
     "c = (r - s) % n"),
    ("ch21_collectives", "q2", "the rest of the buffer not copied", "for i in range(L):\n        out[i] = buf[i]",
     "for i in range(lo):\n        out[i] = buf[i]"),
    ("ch21_collectives", "q3", "all-reduce without the 2", "out[i, 0] = 2.0 * f * algbw", "out[i, 0] = f * algbw"),
    ("ch21_collectives", "q3", "GiB instead of GB", "algbw = nbytes[i] / seconds[i] / 1e9",
     "algbw = nbytes[i] / seconds[i] / 2.0 ** 30"),
    ("ch21_collectives", "q3", "all-gather counted like all-reduce", "out[i, 2] = f * algbw",
     "out[i, 2] = 2.0 * f * algbw"),
    ("ch21_collectives", "q4", "beta from one point (alpha ignored)", "out[i, 1] = 1.0 / us_per_byte / 1e3",
     "out[i, 1] = b[i, 1] / t[i, 1] / 1e3"),
    ("ch21_collectives", "q4", "alpha is the first time", "alpha = t[i, 0] - b[i, 0] * us_per_byte",
     "alpha = t[i, 0]"),
    ("ch21_collectives", "q4", "beta in MB/s", "out[i, 1] = 1.0 / us_per_byte / 1e3", "out[i, 1] = 1.0 / us_per_byte"),
    ("ch20_tensor_cores", "q1", "A registers 1 and 2 swapped", "A[g + 8, t], A[g, t + 4]", "A[g, t + 4], A[g + 8, t]"),
    ("ch20_tensor_cores", "q1", "B read transposed", "B[t, g], B[t + 4, g]", "B[g, t], B[g, t + 4]"),
    ("ch20_tensor_cores", "q2", "second k half at t + 1", "kb = k + t + 4", "kb = k + t + 1"),
    ("ch20_tensor_cores", "q2", "store column not doubled", "col = cuda.blockIdx.x * 8 + 2 * t",
     "col = cuda.blockIdx.x * 8 + t"),
    ("ch20_tensor_cores", "q3", "truncation instead of rounding", "out[i] = (b + 0x1000) & 0xFFFFE000",
     "out[i] = b & 0xFFFFE000"),
    ("ch20_tensor_cores", "q3", "inf and NaN rounded like numbers", "if (b >> 23) & 0xFF == 0xFF:", "if False:"),
    ("ch15_scan_histogram_sort", "q1", "carry not added", "out[g] = carry + buf[t]", "out[g] = buf[t]"),
    ("ch15_scan_histogram_sort", "q2", "flush adds 1, not the count", "cuda.atomic.add(counts, j, sh[j])",
     "cuda.atomic.add(counts, j, 1)"),
    ("ch15_scan_histogram_sort", "q3", "scatter walks backwards (unstable)", "for i in range(keys.size):\n        d = (keys[i]",
     "for i in range(keys.size - 1, -1, -1):\n        d = (keys[i]"),
    ("ch15_scan_histogram_sort", "q4", "two-pass reads x once", "us[i, 0] = 12.0 * n[i]", "us[i, 0] = 8.0 * n[i]"),
    ("ch15_scan_histogram_sort", "q5", "carry added after a head too", "out[g] = v if f != 0 else carry + v",
     "out[g] = carry + v"),
    ("ch15_scan_histogram_sort", "q5", "operator applied right to left", "                if f == 0:\n                    v = lv + v",
     "                if lf == 0:\n                    v = lv + v"),
    ("ch15_scan_histogram_sort", "q5", "carry never restarts", "carry = last_v if last_f != 0 else carry + last_v",
     "carry = carry + last_v"),
    ("ch16_random_dropout_sampling", "q1", "key bumped before the first round", "if r > 0:", "if r >= 0:"),
    ("ch16_random_dropout_sampling", "q1", "high and low halves swapped", "(p1 >> S32) ^ c1 ^ k0, p1 & LO",
     "(p1 & LO) ^ c1 ^ k0, p1 >> S32"),
    ("ch16_random_dropout_sampling", "q2", "dropped element multiplied by 0", "y[i] = 0.0", "y[i] = x[i] * 0.0"),
    ("ch16_random_dropout_sampling", "q2", "words rotated", "words[j] >> uint64(8)", "words[(j + 1) % 4] >> uint64(8)"),
    ("ch16_random_dropout_sampling", "q3", "boundary > instead of >=", "if acc >= p * total:", "if acc > p * total:"),
    ("ch19_half_precision", "q1", "subnormal scale off by one", "math.ldexp(float(m), -24)", "math.ldexp(float(m), -25)"),
    ("ch19_half_precision", "q1", "exponent bias 16", "m / 1024.0, e - 15)", "m / 1024.0, e - 16)"),
    ("ch19_half_precision", "q1", "subnormals decoded as normals", "if e == 0:", "if False:"),
    ("ch19_half_precision", "q1", "inf and NaN swapped", "math.inf if m == 0 else math.nan",
     "math.nan if m == 0 else math.inf"),
    ("ch19_half_precision", "q2", "squares summed in fp16", "v = float32(x[row, c])", "v = x[row, c]"),
    ("ch19_half_precision", "q2", "eps outside the square root", "math.sqrt(buf[0] / float32(n) + float32(EPS))",
     "(math.sqrt(buf[0] / float32(n)) + float32(EPS))"),
    ("ch19_half_precision", "q3", "the whole spacing, not half", "k - 2 - bits", "k - 1 - bits"),
    ("ch19_half_precision", "q3", "binade off by one", "k - 2 - bits", "k - 3 - bits"),
    ("ch17_convolution", "q1", "halo not loaded", "range(t, TILE + R - 1, TILE)", "range(t, TILE, TILE)"),
    ("ch17_convolution", "q1", "padding offset dropped", "i = p0 - pad + e", "i = p0 + e"),
    ("ch17_convolution", "q1", "negative indices read from the end", "if 0 <= i < x.size", "if i < x.size"),
    ("ch17_convolution", "q2", "r and s swapped in the row", "row = (c * R + r) * S + s", "row = (c * S + s) * R + r"),
    ("ch17_convolution", "q2", "padding not subtracted", "h = (j // Q) * stride - pad + r", "h = (j // Q) * stride + r"),
    ("ch17_convolution", "q2", "stride ignored across columns", "v = (j % Q) * stride - pad + s", "v = (j % Q) - pad + s"),
    ("ch17_convolution", "q3", "padding counts as 0", "acc = float32(-np.inf)", "acc = float32(0.0)"),
    ("ch17_convolution", "q3", "NaN ignored", "if a > acc or a != a:", "if a > acc:"),
    ("ch18_moe", "q1", "counts not rounded up to B", "run += (c + B - 1) // B * B", "run += c"),
    ("ch18_moe", "q1", "rounded down", "run += (c + B - 1) // B * B", "run += c // B * B"),
    ("ch18_moe", "q1", "capacity ignored", "if cap > 0 and c > cap:", "if False:"),
    ("ch18_moe", "q2", "slots walked backwards (later tokens first)", "for t in range(T):", "for t in range(T - 1, -1, -1):"),
    ("ch18_moe", "q2", "capacity off by one", "if cap > 0 and taken[e] >= cap:", "if cap > 0 and taken[e] > cap:"),
    ("ch18_moe", "q3", "dropped slot read", "if r >= 0:", "if True:"),
    ("ch18_moe", "q3", "first choice's weight for every slot", "acc += w[t, j] * Y[r, c]", "acc += w[t, 0] * Y[r, c]"),
    ("ch18_moe", "q4", "padding not rounded up", "padded += (counts[e] + B - 1) // B * B", "padded += counts[e]"),
    ("ch18_moe", "q4", "one FLOP per multiply-add", "us[0] = 2.0 * rows * d * n", "us[0] = rows * d * n"),
    ("ch01_axpy", "q4", "GB/s used as bytes per microsecond", "(GBPS * 1e3)", "GBPS"),
    ("ch01_axpy", "q4", "launch time left out", "us[i] = LAUNCH_US + 12.0", "us[i] = 12.0"),
    ("ch02_regression", "q3", "one atomic per element, not three", "3.0 * n[i] * NS_PER_ATOMIC",
     "n[i] * NS_PER_ATOMIC"),
    ("ch02_regression", "q3", "reduction reads 12 bytes", "8.0 * n[i] / (GBPS", "12.0 * n[i] / (GBPS"),
    ("ch03_linear_backward", "q4", "a warp's 32 lanes", "LANES = 8.0", "LANES = 32.0"),
    ("ch04_gemv", "q1", "task's k range one short", "min(t * step + step, K)", "min(t * step + step, K - 1)"),
    ("ch04_gemv", "q1", "last task's partial not summed", "for t in range(TASKS):", "for t in range(TASKS - 1):"),
    ("ch04_gemv", "q3", "W's bytes without N", "4.0 * K[i] * N[i]", "4.0 * K[i]"),
    ("ch04_gemv", "q3", "CPU time in ns, not us", "K[i] * NS_PER_STEP * 1e-3", "K[i] * NS_PER_STEP"),
    ("ch05_gemm", "q4", "k block one short", "for k in range(k0, k1):", "for k in range(k0, k1 - 1):"),
    ("ch05_gemm", "q4", "k blocks of BKC - 1", "for k0 in range(0, K, BKC):", "for k0 in range(0, K, BKC + 1):"),
    ("ch05_gemm", "q5", "a quarter, not an eighth", "SHARE = 1.0 / 8.0", "SHARE = 1.0 / 4.0"),
    ("ch06_activations", "q3", "speed-up upside down", "s[i] = unfused / fused", "s[i] = fused / unfused"),
    ("ch07_norms", "q3", "the write forgotten", "8.0 * M[i] * N[i]", "4.0 * M[i] * N[i]"),
    ("ch08_softmax", "q3", "safe softmax reads twice", "(3.0 + 1.0)", "(2.0 + 1.0)"),
    ("ch09_attention", "q2", "old accumulator not rescaled", "acc[d] = acc[d] * a + p * v[b, hk, j, d]",
     "acc[d] = acc[d] + p * v[b, hk, j, d]"),
    ("ch09_attention", "q2", "no 1/sqrt(D) scale", "x *= scale", "x *= 1.0"),
    ("ch09_attention", "q2", "GQA head index not divided", "hk = h // g", "hk = h % k.shape[1]"),
    ("ch11_quantization", "q4", "range not widened to include 0", "lo = 0.0\n        hi = 0.0",
     "lo = math.inf\n        hi = -math.inf"),
    ("ch11_quantization", "q4", "zero point sign flipped", "zp = round(-lo / scale) - 128", "zp = round(lo / scale) - 128"),
    ("ch11_quantization", "q4", "no clamp to int8", "qv = min(127.0, max(-128.0, round(float(X[m, k]) / scale) + zp))",
     "qv = round(float(X[m, k]) / scale) + zp"),
    ("ch11_quantization", "q5", "Q4_0 bits per weight for Q8_0", "s[0] = EFF_Q8_0 * bpw[0] / bpw[1]",
     "s[0] = EFF_Q8_0 * bpw[0] / bpw[2]"),
    ("ch11_quantization", "q7", "byte not masked before the shift (sign extension)", "((b1 & 0xFF) << 8)", "(b1 << 8)"),
    ("ch11_quantization", "q7", "activations' scale left out", "* xd[b] * float32(s)", "* float32(s)"),
    ("ch11_quantization", "q7", "quants read from the scale's bytes", "o = 34 * b + 2 + 4 * t", "o = 34 * b + 4 * t"),
    ("ch11_quantization", "q7", "block of zeros divides by zero",
     "idv = float32(1.0) / d if d != 0 else float32(0.0)", "idv = float32(1.0) / d"),
    ("ch12_optimizers", "q4", "half a ulp off by one binade", "math.ldexp(1.0, e - 12)", "math.ldexp(1.0, e - 11)"),
    ("ch12_optimizers", "q4", "equality counted as lost", "abs(u[i]) < math.ldexp", "abs(u[i]) <= 2.0 * math.ldexp"),
    ("ch12_optimizers", "q5", "launches and traffic added", "max(T[i] * LAUNCH_US, 28.0 * N_PARAMS / (GBPS * 1e3))",
     "T[i] * LAUNCH_US + 28.0 * N_PARAMS / (GBPS * 1e3)"),
    ("ch12_optimizers", "q5", "one launch, not one per tensor", "max(T[i] * LAUNCH_US,", "max(LAUNCH_US,"),
    ("ch13_capstone_gpt", "q3", "one-sided difference", "g[i] = (lp - lm) / (2 * h)", "g[i] = (lp - lm) / h"),
    ("ch13_capstone_gpt", "q3", "parameter not restored", "        th[i] = old\n", "        th[i] = old - h\n"),
    ("ch03_linear_backward", "q2", "sum over m one short", "for m in range(X.shape[0]):",
     "for m in range(X.shape[0] - 1):"),
    ("ch03_linear_backward", "q2", "G read transposed", "acc += X[m, k] * G[m, n]", "acc += X[m, n % X.shape[1]] * G[m, k % G.shape[1]]"),
    ("ch13_capstone_gpt", "q1", "no residual around the MLP", "y[t, c] = x1[t, c] + mlp[t, c]", "y[t, c] = mlp[t, c]"),
    ("ch13_capstone_gpt", "q1", "second norm on x, not x1", "rmsnorm_rows(h, x1, g2)", "rmsnorm_rows(h, x, g2)"),
    ("ch13_capstone_gpt", "q1", "RoPE on q only", "    rope_inplace(k, cos, sin, HEADS)\n", ""),
    ("ch10_rope_kv_cache", "q2", "rotation sign flipped (interleaved)", "x[t, h, d] * c - x[t, h, d + 1] * s",
     "x[t, h, d] * c + x[t, h, d + 1] * s"),
    ("ch10_rope_kv_cache", "q2", "tail dims not copied", "        y[t, h, d] = x[t, h, d]\n        return",
     "        return"),
    ("ch10_rope_kv_cache", "q3", "max not taken (the first score)", "m = sc[0]\n    for l in range(1, n):",
     "m = sc[0]\n    for l in range(1, 1):"),
    ("ch10_rope_kv_cache", "q3", "GQA head not divided", "kh = h // (q.shape[1] // K.shape[1])", "kh = h % K.shape[1]"),
    ("ch10_rope_kv_cache", "q5", "scaled by the query's bytes only", "t_us[i] = t0_us * (2.0 * b * hkv * lengths[i] * d * 4",
     "t_us[i] = t0_us * (2.0 * b * hkv * 32768 * d * 4"),
    ("ch05_gemm", "q3", "B tile guard ignores K", "if k0 + r < K and col0 + c < N else", "if col0 + c < N else"),
    ("ch05_gemm", "q3", "no barrier after the tile's use", "                    acc[r, c] += a[r] * b[c]\n        cuda.syncthreads()",
     "                    acc[r, c] += a[r] * b[c]"),
    ("ch05_gemm", "q3", "B column from ty", "b[c] = Bs[kk, tx * TN + c]", "b[c] = Bs[kk, ty * TN + c]"),
    ("ch09_attention", "q3", "causal mask one short (flash)", "        lim = min(lim, i + T - S + 1)\n    if i >= S:",
     "        lim = min(lim, i + T - S)\n    if i >= S:"),
    ("ch09_attention", "q3", "old accumulator not rescaled (flash)", "                acc[d] *= a", "                acc[d] *= 1.0"),
    ("ch09_attention", "q4", "dv not zeroed first", "                    dv[b, hk, j, d] = 0.0\n", "                    pass\n"),
    ("ch09_attention", "q4", "scale applied after the lse", "math.exp(x * scale - lse[b, h, i])",
     "math.exp((x - lse[b, h, i]) * scale)"),
    ("ch09_attention", "q5", "tiles seen rounded down", "seen += (n + bc - 1) // bc", "seen += n // bc"),
    ("ch14_dispatch", "q1", "tile count rounds down", "((M + TILE - 1) // TILE) * ((N + TILE - 1) // TILE)",
     "(M // TILE) * (N // TILE)"),
    ("ch14_dispatch", "q1", "GEMV bound strict", "if M <= GEMV_MAX_M:", "if M < GEMV_MAX_M:"),
    ("ch14_dispatch", "q1", "split-K threshold strict", "K >= SPLITK_MIN_K", "K > SPLITK_MIN_K"),
    ("ch14_dispatch", "q1", "tile limit inclusive", "tiles < SPLITK_MAX_TILES", "tiles <= SPLITK_MAX_TILES"),
    ("ch14_dispatch", "q2", "slice count rounds down", "S = ceil_div(A.shape[1], SLICE)", "S = max(1, A.shape[1] // SLICE)"),
    ("ch14_dispatch", "q2", "sum skips the last slice", "for z in range(P.shape[0]):", "for z in range(P.shape[0] - 1):"),
    ("ch14_dispatch", "q2", "slice end not clipped at K", "min(K, z * SLICE + SLICE)", "min(K - 1, z * SLICE + SLICE)"),
    ("ch14_runtime", "q1", "launch floor ignored", "tot += t if t > launch_us else launch_us", "tot += t"),
    ("ch14_runtime", "q1", "launch added, not overlapped", "tot += t if t > launch_us else launch_us",
     "tot += t + launch_us"),
    ("ch14_runtime", "q1", "GB/s taken as bytes per microsecond", "bytes_k[i] / (bw_gbs * 1e3)", "bytes_k[i] / bw_gbs"),
    ("ch14_runtime", "q2", "eps outside the square root", "math.sqrt(buf[0] / float32(n) + float32(EPS))",
     "(math.sqrt(buf[0] / float32(n)) + float32(EPS))"),
    ("ch14_runtime", "q2", "y from a, not from the sum", "y[row, c] = s[row, c] * r * gamma[c]",
     "y[row, c] = a[row, c] * r * gamma[c]"),
    ("ch14_runtime", "q2", "mean over the block, not the row", "buf[0] / float32(n)", "buf[0] / float32(THREADS)"),
    ("ch14_runtime", "q2", "tree starts at a quarter", "half = THREADS // 2", "half = THREADS // 4"),
]


def _mutated_module(slug, question, old, new):
    code = corpus.master_solutions(slug)[question]
    assert old in code, f"{slug}/{question}: the mutant's text is not in the master's answer: {old!r}"
    nb = corpus.build_submission(slug, {question: code.replace(old, new, 1)})
    b = bundle_mod.from_notebook(nb)
    mod = types.ModuleType("submission")
    mod.__file__ = f"<{slug} mutant>"
    exec(compile(b.source, mod.__file__, "exec"), mod.__dict__)  # noqa: S102  (the project's own solution, edited)
    return mod


def test_every_mutant_edits_its_master():
    for slug, q, _, old, _ in MUTANTS:
        assert old in corpus.master_solutions(slug)[q], (slug, q, old)


@pytest.mark.slow
@pytest.mark.parametrize("slug,question,name,old,new", MUTANTS, ids=[f"{m[0]}/{m[1]}/{m[2]}" for m in MUTANTS])
def test_mutant_fails_a_hidden_check(slug, question, name, old, new):
    ag = load_autograder(generated(slug) / "build" / slug)
    specs = [s for case in ag.plan[question] for s in case if s.hidden]
    assert specs, f"{slug}/{question} has no hidden check"
    if any(s.kind == "gpu" for s in specs) and not device.GPU_VARIANTS_RUN:
        pytest.skip(f"GPU answers cannot run here ({device.REASON})")
    mod = _mutated_module(slug, question, old, new)
    survived = []
    with _engine(slug):  # simulated blocks' threads as greenlets, as in the seed sweep: a mutant must fail on the
        for seed in SEEDS:  # inputs, whatever the schedule (one a GPU may run), not on an unlucky interleaving
            caught = False
            for spec in specs:
                fn = getattr(mod, spec.function)
                if _failures(spec, fn, seed):
                    caught = True
                    break
            if not caught:
                survived.append(seed)
    assert not survived, (f"{slug}/{question}: the mutant '{name}' passes every hidden check on seed(s) {survived}: "
                          "the hidden inputs cannot tell it from a right answer")
