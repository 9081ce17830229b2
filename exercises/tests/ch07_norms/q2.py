from otter.test_files import test_case

OK_FORMAT = False

name = "q2"
points = [1]

@test_case(points=None, hidden=False)
def test_q2_layernorm_bwd():
    from kernels_src.grading import check_cpu
    check_cpu('layernorm_bwd_cpu', op='layernorm_bwd', args=('dx', 'dgamma', 'dbeta', 'dy', 'x', 'mean', 'rstd', 'gamma'))

