# Where pyshard segfaults on the GPU machine (scripts/gpu-check.sh, GPU_CHECK_THEN=this):
# importing cupy (so ml_dtypes) after pyshard's core crashed in ml_dtypes' finfo.
PY=${PY:-python3}
t() { echo "--- $1"; shift; timeout 60 "$@" > /tmp/d.log 2>&1; rc=$?; grep -a -v "^  File\|^$\|^Current\|^Extension" /tmp/d.log | head -4; echo "rc=$rc"; }
t "ml_dtypes alone" $PY -c 'import ml_dtypes; print("ok")'
t "mpi4py then ml_dtypes" $PY -c 'from mpi4py import MPI; import ml_dtypes; print("ok")'
t "pyshard then ml_dtypes" $PY -X faulthandler -c 'import pyshard; import ml_dtypes; print("ok")'
t "core then ml_dtypes" $PY -X faulthandler -c 'import pyshard._core; import ml_dtypes; print("ok")'
t "core+device_present then ml_dtypes" $PY -X faulthandler -c 'import pyshard._core as c; print(c.cuda_device_present()); import ml_dtypes; print("ok")'
t "cuInit then ml_dtypes" $PY -X faulthandler -c 'import ctypes; print(ctypes.CDLL("libcuda.so.1").cuInit(0)); import ml_dtypes; print("ok")'
t "mpi4py+cuInit then ml_dtypes" $PY -X faulthandler -c 'from mpi4py import MPI; import ctypes; print(ctypes.CDLL("libcuda.so.1").cuInit(0)); import ml_dtypes; print("ok")'
t "ml_dtypes then pyshard then cupy" $PY -X faulthandler -c 'import ml_dtypes, pyshard as ps; print(ps.cuda_available()); import jax; print("ok")'
t "pyshard then jax" $PY -X faulthandler -c 'import pyshard; import jax; print("ok")'
t "torch then pyshard cuda" $PY -X faulthandler -c 'import torch, pyshard as ps; print(ps.cuda_available())'
$PY -c 'import ml_dtypes, numpy; print("ml_dtypes", ml_dtypes.__version__, "numpy", numpy.__version__)'
echo "--- cuda-gdb backtrace"
GDB=$(command -v cuda-gdb || ls /usr/local/cuda/bin/cuda-gdb 2>/dev/null)
timeout 90 "$GDB" -batch -ex run -ex bt -ex "info sharedlibrary" --args $PY -c 'import pyshard._core as c; c.cuda_device_present(); import ml_dtypes' 2>&1 |
  grep -a -v "^\[New Thread\|^\[Thread\|Downloading\|^$" | head -120
