from otter.test_files import test_case

OK_FORMAT = False

name = "q2"
points = [1]

@test_case(points=None, hidden=False)
def test_q2_rs_step():
    from kernels_src.grading import check_cpu
    check_cpu('reduce_scatter_step', op='reduce_scatter_step', args=('out', 'buf', 'msg', 'n', 'r', 's'))

