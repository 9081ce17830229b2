# %% q2
@cuda.jit(device=True)
def fma_one(a, x, y):
    return a * x + y


@cuda.jit
def axpy_kernel(out, a, x, y):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = fma_one(a, x[i], y[i])


def axpy_gpu(out, a, x, y):
    threads = 128
    axpy_kernel[ceil_div(out.size, threads), threads](out, a, x, y)
