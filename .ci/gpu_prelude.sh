# Source this at the start of every device-tool command (see ../shared/GPU.md):
#   run(command="source .ci/gpu_prelude.sh && ...", carry=[".whl"])
# The H100 image has numpy 2.5, which numba-cuda 0.30.4 cannot use; .whl/ carries numpy 2.3.5 + tqdm.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || return 1
export PYTHONPATH=/tmp/site:$PWD KERNELS_DEVICE=gpu PYTHONUNBUFFERED=1
python3 -c 'import numpy, numba, numba_cuda; print("numpy", numpy.__version__, "numba", numba.__version__, "numba-cuda", numba_cuda.__version__)'
