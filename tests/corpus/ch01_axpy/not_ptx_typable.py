# %% q2
@cuda.jit
def axpy_kernel(out, a, x, y):
    i = cuda.grid(1)
    if i < out.size:
        j = i / 1  # a float: the simulator indexes with it, a real GPU cannot
        out[int(j)] = a * x[i] + y[i]
        out[i] = [a][0] * x[i] + y[i]


def axpy_gpu(out, a, x, y):
    axpy_kernel[ceil_div(out.size, 128), 128](out, a, x, y)
