from otter.test_files import test_case

OK_FORMAT = False

name = "q3"
points = [1]

@test_case(points=None, hidden=False)
def test_q3_stride_parity():
    from kernels_src.grading import check_gpu
    check_gpu('axpy_stride_gpu', kernels=('axpy_stride_kernel',), op='axpy', args=('out', 'a', 'x', 'y'), sizes=[(1,), (255,), (700,)])

