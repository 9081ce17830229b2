# %% q1
@njit
def axpy_cpu(out, a, x, y):
    for i in range(out.size + 1):
        out[i] = a * x[i] + y[i]
