# %% q1
@njit
def axpy_cpu(x, y, a):
    return a * x + y
