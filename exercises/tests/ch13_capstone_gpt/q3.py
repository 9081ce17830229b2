from otter.test_files import test_case

OK_FORMAT = False

name = "q3"
points = [1]

@test_case(points=None, hidden=False)
def test_q3_fd():
    from kernels_src.grading import check_cpu
    check_cpu('fd_gradient', op='gpt_fd_gradient', dtype='float64', args=('g', 'theta', 'ids', 'targets', 'V', 'C'), sizes=[(1, 4), (6, 8)])

