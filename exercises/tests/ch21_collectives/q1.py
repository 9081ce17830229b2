from otter.test_files import test_case

OK_FORMAT = False

name = "q1"
points = [1]

@test_case(points=None, hidden=False)
def test_q1_ring_schedule():
    from kernels_src.grading import check_cpu
    check_cpu('ring_allreduce_with_schedule', op='ring_allreduce_schedule', args=('out', 'x'))

