from otter.test_files import test_case

OK_FORMAT = False

name = "q7"
points = [1]

@test_case(points=None, hidden=False)
def test_q7_sr():
    from kernels_src.grading import check_cpu
    check_cpu('sr_mean_bf16', op='bf16_sr_mean', args=('mean', 'x', 'r'))

