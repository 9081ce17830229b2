from otter.test_files import test_case

OK_FORMAT = False

name = "q1"
points = [1]

@test_case(points=None, hidden=False)
def test_q1_predict():
    from kernels_src.grading import check_cpu
    check_cpu('predict_step_us', op='decode_step_prediction', args=('t_us', 'bytes_k', 'launch_us', 'bw_gbs'))

