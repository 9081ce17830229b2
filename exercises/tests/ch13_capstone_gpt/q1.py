from otter.test_files import test_case

OK_FORMAT = False

name = "q1"
points = [1]

@test_case(points=None, hidden=False)
def test_q1_block():
    from kernels_src.grading import check_cpu
    check_cpu('block_forward', op='block_forward', args=('y', 'x', 'g1', 'wqkv', 'wo', 'g2', 'wfc', 'wproj', 'cos', 'sin'))

