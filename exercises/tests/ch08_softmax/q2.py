from otter.test_files import test_case

OK_FORMAT = False

name = "q2"
points = [1]

@test_case(points=None, hidden=False)
def test_q2_softmax_online_gpu():
    from kernels_src.grading import check_gpu
    check_gpu('softmax_online_gpu', kernels=('softmax_online_kernel',), op='softmax', args=('y', 'x'), sizes=[(1, 1), (3, 7), (2, 33)])

