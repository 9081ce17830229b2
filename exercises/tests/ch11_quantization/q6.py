from otter.test_files import test_case

OK_FORMAT = False

name = "q6"
points = [1]

@test_case(points=None, hidden=False)
def test_q6_rms():
    from kernels_src.grading import check_cpu
    check_cpu('predict_rms', op='quant_rms_predict', args=('r', 'X'), dtype='float64', sizes=[(8, 1024)])

