from otter.test_files import test_case

OK_FORMAT = False

name = "q2"
points = [1]

@test_case(points=None, hidden=False)
def test_q2_softmax_bwd():
    from kernels_src.grading import check_gpu
    check_gpu('softmax_bwd_gpu', kernels=('softmax_bwd_kernel',), op='softmax_bwd', args=('dx', 'dy', 'y'), sizes=[(1, 1), (3, 7), (2, 33)])

