from otter.test_files import test_case

OK_FORMAT = False

name = "q2"
points = [2]

@test_case(points=None, hidden=False)
def test_q2_fused():
    from kernels_src.grading import check_gpu
    check_gpu('add_rmsnorm_gpu', kernels=('add_rmsnorm_kernel',), op='add_rmsnorm', args=('s', 'y', 'rstd', 'a', 'b', 'gamma'))

