from otter.test_files import test_case

OK_FORMAT = False

name = "q3"
points = [1]

@test_case(points=None, hidden=False)
def test_q3_busbw():
    from kernels_src.grading import check_cpu
    check_cpu('bus_bandwidth', op='collective_busbw', args=('out', 'n', 'nbytes', 'seconds'))

