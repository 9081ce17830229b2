from otter.test_files import test_case

OK_FORMAT = False

name = "q2"
points = [1]

@test_case(points=None, hidden=False)
def test_q2_dropout():
    from kernels_src.grading import check_gpu
    check_gpu('dropout_gpu', kernels=('dropout_kernel',), op='dropout', args=('y', 'x', 'p', 'seed', 'offset'), sizes=[(1,), (7,), (130,)])

