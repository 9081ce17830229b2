from otter.test_files import test_case

OK_FORMAT = False

name = "q3"
points = [1]

@test_case(points=None, hidden=False)
def test_q3_tf32_round():
    from kernels_src.grading import check_cpu
    check_cpu('tf32_round_cpu', op='tf32_round', args=('y', 'x'))

