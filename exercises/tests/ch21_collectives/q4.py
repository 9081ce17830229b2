from otter.test_files import test_case

OK_FORMAT = False

name = "q4"
points = [1]

@test_case(points=None, hidden=False)
def test_q4_alpha_beta():
    from kernels_src.grading import check_cpu
    check_cpu('alpha_beta', op='alpha_beta_predict', args=('out', 'b', 't'))

