from otter.test_files import test_case

OK_FORMAT = False

name = "q1"
points = [1]

@test_case(points=None, hidden=False)
def test_q1_rope_half():
    from kernels_src.grading import check_cpu
    check_cpu('rope_half_cpu', op='rope', args=('y', 'x', 'pos', 'cos', 'sin'))

