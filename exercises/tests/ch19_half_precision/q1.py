from otter.test_files import test_case

OK_FORMAT = False

name = "q1"
points = [1]

@test_case(points=None, hidden=False)
def test_q1_decode():
    from kernels_src.grading import check_cpu
    check_cpu('fp16_decode', op='fp16_decode', args=('out', 'h'), forbid=('np.float16',))

