from otter.test_files import test_case

OK_FORMAT = False

name = "q1"
points = [1]

@test_case(points=None, hidden=False)
def test_q1_offsets():
    from kernels_src.grading import check_cpu
    check_cpu('expert_offsets', op='moe_offsets', args=('offsets', 'counts', 'B', 'cap'))

