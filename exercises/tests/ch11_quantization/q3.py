from otter.test_files import test_case

OK_FORMAT = False

name = "q3"
points = [1]

@test_case(points=None, hidden=False)
def test_q3_dot():
    from kernels_src.grading import check_gpu
    check_gpu('q8_0_dot_gpu', kernels=('q8_0_dot_kernel',), op='qgemv_q8_0', args=('y', 'x', 'Wq'), sizes=[(32, 1), (64, 7)])

