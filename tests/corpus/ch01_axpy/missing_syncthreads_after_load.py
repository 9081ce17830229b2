# %% q3
@cuda.jit
def block_sum_kernel(out, a, x, y):
    s = cuda.shared.array(THREADS, float32)
    t = cuda.threadIdx.x
    i = cuda.grid(1)
    v = float32(0.0)
    if i < x.size:
        v = a * x[i] + y[i]
    s[t] = v
    stride = THREADS // 2
    while stride > 0:
        if t < stride:
            s[t] += s[t + stride]
        cuda.syncthreads()
        stride //= 2
    if t == 0:
        out[cuda.blockIdx.x] = s[0]


def block_sum_gpu(out, a, x, y):
    block_sum_kernel[out.size, THREADS](out, a, x, y)
