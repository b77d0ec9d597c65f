#!/usr/bin/env bash
# The CUDA checks and figures of issue 14, for a session that is lent a GPU machine (the
# `device` tool). Nothing can be downloaded there, and pycuda ships as source, so:
#
#   bench/gpu_session.sh fetch        # here: the wheels tuner needs there, and pycuda's sdist, into .whl/ (~14 MB)
#   bench/gpu_session.sh run          # there (the device tool's run, carry [".whl"]): install, build pycuda,
#                                     # run tests/test_cuda.py, then bench.gpu; logs and JSON go to $OUT
#
# The machine's image already has numpy, torch, onnx, onnxruntime, tqdm, filelock, matplotlib,
# hypothesis, pytest and nvcc; what it lacks is fetched here (for its Python, 3.12).
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
fetch)
  mkdir -p .whl
  plat="--python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
        --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any"
  # shellcheck disable=SC2086
  python3 -m pip download -q --no-deps --only-binary=:all: $plat -d .whl \
    xgboost-cpu cffi pycparser optuna alembic sqlalchemy greenlet colorlog mako pytools platformdirs siphash24
  # pycuda's sdist; preparing its metadata needs setuptools' bdist_wheel where pip runs
  python3 -m pip download -q --no-deps --no-binary :all: --no-build-isolation -d .whl pycuda \
    || { echo "pip could not prepare pycuda's metadata: pip install wheel setuptools, then fetch again"; exit 1; }
  du -sh .whl ;;
run)
  : "${OUT:?run this on the device machine, where OUT is set}"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH="/tmp/site:$PWD" CUDA_ROOT="${CUDA_ROOT:-/usr/local/cuda}" PYTHONUNBUFFERED=1
  python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/site .whl/pycuda-*.tar.gz \
    2>&1 | tail -20
  python3 -c "import pycuda.autoinit, pycuda.driver as d; print('pycuda sees', d.Device(0).name())"
  python3 -m pytest -q -p no:cacheprovider tests/test_cuda.py 2>&1 | tee "$OUT/test_cuda.log"
  python3 -m bench.gpu --trials "${TRIALS:-128}" --rounds 5 --no-progress 2>&1 | tee "$OUT/bench_gpu.log"
  cp bench/results/gpu-*.json "$OUT/" 2>/dev/null || true ;;
*)
  echo "usage: bench/gpu_session.sh fetch|run" >&2; exit 2 ;;
esac
