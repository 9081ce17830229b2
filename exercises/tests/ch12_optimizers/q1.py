from otter.test_files import test_case

OK_FORMAT = False

name = "q1"
points = [1]

@test_case(points=None, hidden=False)
def test_q1_sgd():
    from kernels_src.grading import check_cpu
    check_cpu('sgd_momentum_cpu', op='sgd_momentum', args=('p_new', 'b_new', 'p', 'g', 'b'))

