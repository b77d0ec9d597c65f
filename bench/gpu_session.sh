#!/usr/bin/env bash
# The CUDA checks and figures of issue 14, for a session that is lent a GPU machine (the
# `device` tool). Nothing can be downloaded there, and pycuda ships as source, so:
#
#   bench/gpu_session.sh fetch        # here: the wheels tuner needs there, and pycuda's sdist, into .whl/ (~14 MB)
#   bench/gpu_session.sh run          # there (the device tool's run, carry [".whl"]): install, build pycuda,
#                                     # run tests/test_cuda.py, then bench.gpu; logs and JSON go to $OUT
#   .whl/pycuda-built.tgz (an earlier run's $OUT/pycuda-built.tgz) skips pycuda's build
#   TEST_S, BENCH_S, PROBE_S, TUNE_S (seconds), TRIALS, ROUNDS, WORKLOADS, TEST_MARK size the run half to the lease
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
  repo=$PWD
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  # the toolkit: CUDA_ROOT, else the one above nvcc, else /usr/local/cuda (the one with cuda.h)
  for d in "${CUDA_ROOT:-}" "$(dirname "$(dirname "$(readlink -f "$(command -v nvcc || echo /x/x)")")")" /usr/local/cuda; do
    [ -f "$d/include/cuda.h" ] && { CUDA_ROOT=$d; break; }
  done
  export PYTHONPATH="/tmp/site:$repo" CUDA_ROOT PYTHONUNBUFFERED=1
  (nvidia-smi -L; nvcc --version | tail -1; python3 --version) 2>&1 | tee "$OUT/machine.txt" || true
  # pycuda links -lcuda: the driver's library where ldconfig knows it, else the toolkit's stub, else an
  # empty stub named like the driver (the loader finds the real libcuda.so.1 at run time)
  mkdir -p /tmp/cudadrv
  lib=$(ldconfig -p | awk '/libcuda\.so/ {print $NF; exit}')
  [ -n "$lib" ] || lib=$(ls "$CUDA_ROOT"/lib64/stubs/libcuda.so "$CUDA_ROOT"/targets/*/lib/stubs/libcuda.so 2>/dev/null | head -1 || true)
  if [ -n "$lib" ]; then ln -sf "$lib" /tmp/cudadrv/libcuda.so
  else echo "" | gcc -shared -x c - -Wl,-soname,libcuda.so.1 -o /tmp/cudadrv/libcuda.so; fi
  # pycuda ships as source, built in place; its objects compile in parallel (setuptools compiles one
  # extension's sources one by one: 3 minutes on 2 cores)
  rm -rf /tmp/pycuda-src && mkdir /tmp/pycuda-src && tar xzf .whl/pycuda-*.tar.gz -C /tmp/pycuda-src --strip-components 1
  # a build brought back from an earlier run ($OUT/pycuda-built.tgz, put in .whl/) skips the build
  if [ -f .whl/pycuda-built.tgz ]; then tar xzf .whl/pycuda-built.tgz -C /tmp/pycuda-src; else
  (cd /tmp/pycuda-src && python3 configure.py --cuda-root="$CUDA_ROOT" --cudadrv-lib-dir=/tmp/cudadrv \
     --no-cuda-enable-curand --cxxflags=-O1,-g0 >/dev/null && python3 - build_ext --inplace >"$OUT/pycuda_build.log" 2>&1 <<'PY') \
    || { tail -30 "$OUT/pycuda_build.log"; exit 1; }
import os, runpy, sys
from concurrent.futures import ThreadPoolExecutor
import setuptools  # noqa: F401  (its distutils)
from distutils import ccompiler

def compile_parallel(self, sources, output_dir=None, macros=None, include_dirs=None, debug=0,
                     extra_preargs=None, extra_postargs=None, depends=None):
    macros, objects, extra_postargs, pp_opts, build = self._setup_compile(
        output_dir, macros, include_dirs, sources, depends, extra_postargs)
    cc_args = self._get_cc_args(pp_opts, debug, extra_preargs)
    with ThreadPoolExecutor(os.cpu_count()) as pool:
        list(pool.map(lambda o: self._compile(o, *build[o], cc_args, extra_postargs, pp_opts), objects))
    return objects

ccompiler.CCompiler.compile = compile_parallel
sys.argv = ["setup.py", *sys.argv[1:]]
runpy.run_path("setup.py", run_name="__main__")
PY
  (cd /tmp/pycuda-src && tar czf "$OUT/pycuda-built.tgz" pycuda); fi
  export PYTHONPATH="/tmp/site:/tmp/pycuda-src:$repo"
  python3 -c "import pycuda.autoinit, pycuda.driver as d; print('pycuda sees', d.Device(0).name())"
  # the figures first; each step under a limit of its own (seconds), so one slow step leaves the others time
  timeout -s INT "${BENCH_S:-300}" python3 -m bench.gpu --trials "${TRIALS:-128}" --rounds "${ROUNDS:-5}" \
    --time-limit "${TUNE_S:-60}" ${WORKLOADS:+--workloads "$WORKLOADS"} --out "$OUT/gpu.json" --no-progress \
    2>&1 | tee "$OUT/bench_gpu.log" || true
  timeout -s INT "${PROBE_S:-120}" python3 -m bench.gpu_gemm_probe --out "$OUT/gemm_probe.json" \
    2>&1 | tee "$OUT/gemm_probe.log" || true
  timeout -s INT "${TEST_S:-180}" python3 -m pytest -q -p no:cacheprovider -m "${TEST_MARK:-gpu}" tests/test_cuda.py \
    2>&1 | tee "$OUT/test_cuda.log" || true
  # the tune log: the corpus a GPU cost model is trained on
  gzip -c logs/bench/gpu.*.jsonl > "$OUT/gpu_tune_log.jsonl.gz" 2>/dev/null || true ;;
*)
  echo "usage: bench/gpu_session.sh fetch|run" >&2; exit 2 ;;
esac
