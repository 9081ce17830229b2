from otter.test_files import test_case

OK_FORMAT = False

name = "q1"
points = [1]

@test_case(points=None, hidden=False)
def test_q1_rmsnorm():
    from kernels_src.grading import check_gpu
    check_gpu('rmsnorm_gpu', kernels=('rmsnorm_kernel',), op='rmsnorm', args=('y', 'rstd', 'x', 'gamma'), sizes=[(1, 1), (3, 7), (2, 33)])

