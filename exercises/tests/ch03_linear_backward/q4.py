from otter.test_files import test_case

OK_FORMAT = False

name = "q4"
points = [1]

@test_case(points=None, hidden=False)
def test_q4_gpu_parity():
    from kernels_src.grading import check_gpu
    check_gpu('db_gpu', kernels=('db_kernel',), op='linear_bwd_db', args=('db', 'G'))

