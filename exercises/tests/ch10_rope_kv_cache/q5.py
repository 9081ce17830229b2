from otter.test_files import test_case

OK_FORMAT = False

name = "q5"
points = [1]

@test_case(points=None, hidden=False)
def test_q5_predict():
    from kernels_src.grading import check_cpu
    check_cpu('predict_decode_us', op='decode_time_prediction', args=('t_us', 'lengths', 't0_us'))

