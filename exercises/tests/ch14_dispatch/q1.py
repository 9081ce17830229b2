from otter.test_files import test_case

OK_FORMAT = False

name = "q1"
points = [1]

@test_case(points=None, hidden=False)
def test_q1_policy():
    from kernels_src.grading import check_cpu
    check_cpu('policy', op='dispatch_policy', args=('code', 'shapes'), sizes=[(15,)])

