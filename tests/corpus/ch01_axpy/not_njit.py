# %% q1
def axpy_cpu(out, a, x, y):
    for i in range(out.size):
        out[i] = a * x[i] + y[i]
