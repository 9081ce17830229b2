from otter.test_files import test_case

OK_FORMAT = False

name = "q2"
points = [1]

@test_case(points=None, hidden=False)
def test_q2_unpack():
    from kernels_src.grading import check_gpu
    check_gpu('q4_0_unpack_gpu', kernels=('q4_0_unpack_kernel',), op='q4_0_dequantize', args=('out', 'Xq'), sizes=[(1, 32), (3, 64)])

