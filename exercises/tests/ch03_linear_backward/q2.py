from otter.test_files import test_case

OK_FORMAT = False

name = "q2"
points = [1]

@test_case(points=None, hidden=False)
def test_q2_gpu_parity():
    from kernels_src.grading import check_gpu
    check_gpu('dw_gpu', kernels=('dw_kernel',), op='linear_bwd_dw', args=('dW', 'X', 'G'))

