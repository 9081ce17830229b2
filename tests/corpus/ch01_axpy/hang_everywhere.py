# %% q2
@cuda.jit
def axpy_kernel(out, a, x, y):
    i = cuda.grid(1)
    step = cuda.blockDim.x // 1024  # 0 with 128 threads: the loop never advances
    while i < out.size:
        out[i] = a * x[i] + y[i]
        i += step


def axpy_gpu(out, a, x, y):
    threads = 128
    axpy_kernel[ceil_div(out.size, threads), threads](out, a, x, y)
# %% end
while True:  # the notebook itself hangs too
    pass
