from otter.test_files import test_case

OK_FORMAT = False

name = "q3"
points = [1]

@test_case(points=None, hidden=False)
def test_q3_bound():
    from kernels_src.grading import check_cpu
    check_cpu('error_bound', op='half_error_bound', args=('out', 'x', 'bits'), forbid=('np.frexp', 'np.log2'))

