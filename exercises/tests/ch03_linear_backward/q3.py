from otter.test_files import test_case

OK_FORMAT = False

name = "q3"
points = [1]

@test_case(points=None, hidden=False)
def test_q3_gpu_parity():
    from kernels_src.grading import check_gpu
    check_gpu('dx_gpu', kernels=('dx_kernel',), op='linear_bwd_dx', args=('dX', 'G', 'W'))

