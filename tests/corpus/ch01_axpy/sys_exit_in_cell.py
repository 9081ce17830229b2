# %% q1
raise SystemExit("stop here")  # ends this cell (the grader keeps going), so axpy_cpu is never defined


@njit
def axpy_cpu(out, a, x, y):
    for i in range(out.size):
        out[i] = a * x[i] + y[i]
