# %% q2
@cuda.jit
def axpy_kernel(out, a, x, y):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = a * x[i] + y[i]


def axpy_gpu(out, a, x, y):
    scratch = np.ones((out.size, 1 << 30), dtype=np.float32)  # 4 GB per element
    axpy_kernel[ceil_div(out.size, 128), 128](out, a, x, y)
