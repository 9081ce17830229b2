from otter.test_files import test_case

OK_FORMAT = False

name = "q5"
points = [1]

@test_case(points=None, hidden=False)
def test_q5_predict():
    from kernels_src.grading import check_cpu
    check_cpu('predict_smem_tflops', op='gemm_smem_prediction', args=('t', 'M', 'N', 'K'))

