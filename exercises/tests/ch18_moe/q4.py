from otter.test_files import test_case

OK_FORMAT = False

name = "q4"
points = [1]

@test_case(points=None, hidden=False)
def test_q4_predict():
    from kernels_src.grading import check_cpu
    check_cpu('predict_grouped_us', op='moe_gemm_time_prediction', args=('us', 'counts', 'B', 'd', 'n', 'gflops'))

