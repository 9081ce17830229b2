# %% q2
@cuda.jit
def axpy_kernel(out, a, x, y):
    i = cuda.grid(1)
    if i >= 7:
        raise ValueError("index past the tile limit 7")
    if i < out.size:
        out[i] = a * x[i] + y[i]


def axpy_gpu(out, a, x, y):
    axpy_kernel[ceil_div(out.size, 128), 128](out, a, x, y)
