# %% q2
@cuda.jit
def axpy_kernel(out, a, x, y):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = a * x[i] + y[i]


def axpy_gpu(out, a, x, y):
    out.copy_to_device(a * x.copy_to_host() + y.copy_to_host())
