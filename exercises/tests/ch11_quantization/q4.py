from otter.test_files import test_case

OK_FORMAT = False

name = "q4"
points = [1]

@test_case(points=None, hidden=False)
def test_q4_asym():
    from kernels_src.grading import check_cpu
    check_cpu('int8_asym_roundtrip', op='int8_asym_roundtrip', args=('out', 'X'))

