from otter.test_files import test_case

OK_FORMAT = False

name = "q4"
points = [1]

@test_case(points=None, hidden=False)
def test_q4_predict():
    from kernels_src.grading import check_cpu
    check_cpu('predict_db_speedup', op='db_speedup_prediction', args=('s', 'M', 'N'))

