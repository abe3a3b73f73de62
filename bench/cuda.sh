#!/bin/bash
# Issue 43's device check: one prepared run on a fresh NVIDIA machine (about 9 minutes).
# It builds llama.cpp's llama-bench and llama-server with CUDA from the llama-cpp-python
# 0.3.36 sdist's source, writes the synthetic files, then runs bench/cuda_speed.py (decode,
# prefill, 8 streams over HTTP, greedy tokens against the reference path). Figures go to
# stdout and $OUT/cuda_speed.txt.
#
# What travels with the working tree (ignored paths, named in the device tool's `carry`):
#   .llama/llama.cpp.tar.gz  llama.cpp's source without models, docs, tests and other backends
#   .whl/                    the server's packages that machine lacks (fastapi, pydantic, uvicorn, ...)
# bench/README.md says how to make both. Then: device run, carry [".llama", ".whl"],
# command "bash bench/cuda.sh", timeout 600.
#
# On a CPU, `bash bench/cuda.sh --dry-run` goes the same way at toy sizes: llama.cpp built
# for the CPU (or LLAMA_BENCH / LLAMA_SERVER given), our Triton kernels through the interpreter.
set -euo pipefail
export PYTHONUNBUFFERED=1
ROOT=$(pwd)
OUT=${OUT:-/tmp/cuda-bench-out}
WORK=${WORK:-/tmp/cuda-bench}
DRY=${1:-}
mkdir -p "$OUT" "$WORK"

# our package as gguf_serve without installing it (nothing can be fetched there): links to the folders
mkdir -p "$WORK/pkg/gguf_serve"
for d in gguf_io engine server; do ln -sfn "$ROOT/$d" "$WORK/pkg/gguf_serve/$d"; done
export PYTHONPATH="$WORK/pkg"
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$WORK/site" .whl/*.whl
  export PYTHONPATH="$WORK/site:$PYTHONPATH"
fi
python3 -c "import gguf_serve.engine, torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, \
'cuda', torch.cuda.is_available() and torch.cuda.get_device_name(0))"

# llama.cpp: CUDA for Hopper (sm_90), only the two programs, in the background while the files are written
if [ -z "${LLAMA_BENCH:-}" ]; then
  mkdir -p "$WORK/llama" && tar xzf .llama/llama.cpp.tar.gz -C "$WORK/llama"
  if [ "$DRY" = "--dry-run" ]; then CUDA="-DGGML_CUDA=OFF"; else CUDA="-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90"; fi
  ( cmake -S "$WORK/llama" -B "$WORK/llama/build" -G Ninja -DCMAKE_BUILD_TYPE=Release $CUDA -DLLAMA_CURL=OFF \
      -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF > "$OUT/llama_build.log" 2>&1 \
    && cmake --build "$WORK/llama/build" --target llama-bench llama-server -j "$(nproc)" >> "$OUT/llama_build.log" 2>&1 \
    ; echo "rc=$?" >> "$OUT/llama_build.log" ) &
  BUILD=$!
  export LLAMA_BENCH="$WORK/llama/build/bin/llama-bench" LLAMA_SERVER="$WORK/llama/build/bin/llama-server"
fi
T0=$(date +%s)
if [ "$DRY" = "--dry-run" ]; then
  export TRITON_INTERPRET=1
  ARGS="--dry-run --files qwen3-4b,qwen35-4b,qwen3-30b-a3b-12l"
else
  ARGS=""
fi
python3 bench/cuda_speed.py --write-only $ARGS --folder "$WORK/files"
echo "files written in $(( $(date +%s) - T0 )) s"
if [ -n "${BUILD:-}" ]; then
  wait "$BUILD" || true
  tail -3 "$OUT/llama_build.log"
  echo "llama.cpp built in $(( $(date +%s) - T0 )) s"
fi
python3 bench/cuda_speed.py $ARGS --folder "$WORK/files" 2>&1 | tee "$OUT/cuda_speed.txt"
