from otter.test_files import test_case

OK_FORMAT = False

name = "q5"
points = [1]

@test_case(points=None, hidden=False)
def test_q5_predict():
    from kernels_src.grading import check_cpu
    check_cpu('predict_step_us', op='adamw_per_tensor_time', args=('us', 'T'))

