from otter.test_files import test_case

OK_FORMAT = False

name = "q1"
points = [1]

@test_case(points=None, hidden=False)
def test_q1_layernorm():
    from kernels_src.grading import check_gpu
    check_gpu('layernorm_gpu', kernels=('layernorm_kernel',), op='layernorm', args=('y', 'mean', 'rstd', 'x', 'gamma', 'beta'), sizes=[(1, 1), (3, 7), (2, 33)])

