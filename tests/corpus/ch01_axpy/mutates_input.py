# %% q1
@njit
def axpy_cpu(out, a, x, y):
    for i in range(out.size):
        x[i] = a * x[i]
        out[i] = x[i] + y[i]
