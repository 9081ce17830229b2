from otter.test_files import test_case

OK_FORMAT = False

name = "q6"
points = [1]

@test_case(points=None, hidden=False)
def test_q6_split_plan():
    from kernels_src.grading import check_cpu
    check_cpu('split_plan', op='decode_split_plan', args=('bps', 'splits', 'cases'))

