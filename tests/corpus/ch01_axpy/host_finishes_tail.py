# %% q2
@cuda.jit
def axpy_kernel(out, a, x, y):
    i = cuda.grid(1)
    if i < out.size // 2:
        out[i] = a * x[i] + y[i]


def axpy_gpu(out, a, x, y):
    axpy_kernel[ceil_div(out.size, 128), 128](out, a, x, y)
    h = out.size // 2
    out[h:] = a * x.copy_to_host()[h:] + y.copy_to_host()[h:]  # the host does the second half
