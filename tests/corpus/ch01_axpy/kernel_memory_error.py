# %% q3
@cuda.jit
def block_sum_kernel(out, a, x, y):
    s = cuda.shared.array(THREADS, float32)
    t = cuda.threadIdx.x
    i = cuda.grid(1)
    if t == 5:
        scratch = np.ones(1 << 42, np.float64)  # 32 TB: NumPy raises its MemoryError in this one thread
    v = float32(0.0)
    if i < x.size:
        v = a * x[i] + y[i]
    s[t] = v
    cuda.syncthreads()
    if t == 0:
        acc = float32(0.0)
        for k in range(THREADS):
            acc += s[k]
        out[cuda.blockIdx.x] = acc


def block_sum_gpu(out, a, x, y):
    block_sum_kernel[out.size, THREADS](out, a, x, y)
