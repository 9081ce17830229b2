from otter.test_files import test_case

OK_FORMAT = False

name = "q6"
points = [1]

@test_case(points=None, hidden=False)
def test_q6_rne():
    from kernels_src.grading import check_cpu
    check_cpu('round_bf16_rne', op='bf16_round_nearest', args=('out', 'x'))

