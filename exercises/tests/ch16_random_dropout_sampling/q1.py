from otter.test_files import test_case

OK_FORMAT = False

name = "q1"
points = [1]

@test_case(points=None, hidden=False)
def test_q1_philox():
    from kernels_src.grading import check_cpu
    check_cpu('philox_cpu', op='philox', args=('out', 'ctr', 'key'))

