from otter.test_files import test_case

OK_FORMAT = False

name = "q7"
points = [1]

@test_case(points=None, hidden=False)
def test_q7_dp4a():
    from kernels_src.grading import check_gpu
    check_gpu('q8_0_dp4a_gpu', kernels=('quantize_x_kernel', 'q8_0_dp4a_kernel'), op='q8_0_dp4a_gemv', args=('y', 'x', 'Wq'), sizes=[(32, 1), (64, 7)])

