#!/usr/bin/env bash
# llama.cpp on a GPU (issue 31 item 4): build llama-cpp-python for this GPU's architecture only, write a
# random-weight GGUF of a bench shape on the spot, and run bench/llamacpp_decode.py on it (every layer on the GPU).
#
#   bash bench/gpu_llamacpp.sh prepare      # on a machine with PyPI: fills .whl/ and .gpu/ (see docs/gpu.md)
#   bash bench/gpu_llamacpp.sh [SHAPE]      # on the GPU machine: build, write the GGUF, measure (default llama-1b)
#
# `prepare` downloads llama-cpp-python's sdist (repacked without llama.cpp's test vocabularies, docs and git
# objects: 73 MiB -> a few, so it travels), the wheels the GPU image lacks, and writes the default model's
# tokenizer as a tokenizer-only GGUF (.gpu/tokenizer.gguf) and as Hugging Face files (.gpu/tokenizer/), so that
# neither script needs the 98 MB default model there. The build is for the GPU's own compute capability only
# (CMAKE_CUDA_ARCHITECTURES, 90 on an H100/H200), which keeps it within minutes; set CUDA_ARCH to override.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
LLAMA_CPP_VERSION=0.3.36
wheels=${WHEELS:-$root/.whl}
carry=${GPU_CARRY:-$root/.gpu}

if [ "${1:-}" = "prepare" ]; then
  mkdir -p "$wheels" "$carry"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  python3 -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$LLAMA_CPP_VERSION" -d "$tmp"
  (
    cd "$tmp"
    tar xzf "llama_cpp_python-$LLAMA_CPP_VERSION.tar.gz"
    src="llama_cpp_python-$LLAMA_CPP_VERSION"
    rm -rf "$src/.git" "$src/vendor/llama.cpp/docs" "$src/vendor/llama.cpp/media"
    find "$src/vendor/llama.cpp/models" -name '*.gguf*' -delete
    tar czf "$wheels/llama_cpp_python-$LLAMA_CPP_VERSION.tar.gz" "$src"
  )
  # What the GPU image lacks (docs/device notes list its packages): llama-cpp-python's diskcache, the engine's
  # platformdirs and gguf. Pure-Python wheels, so any platform's pip fetches the right ones.
  python3 -m pip download -q --no-deps --only-binary=:all: -d "$wheels" diskcache platformdirs "gguf>=0.10"
  python3 bench/gpu_gguf.py --tokenizer-only "$carry/tokenizer.gguf"
  python3 bench/gpu_figures.py --save-tokenizer "$carry/tokenizer"
  du -sh "$wheels" "$carry"
  echo "carry .whl and .gpu (both ignored by git: echo /.gpu/ >> .git/info/exclude)"
  exit 0
fi

shape=${1:-llama-1b}
arch=${CUDA_ARCH:-$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -n 1 | tr -d '.[:space:]')}
venv=${VENV:-/tmp/llamacpp-gpu}
start=$(date +%s)
# The image's own packages (numpy, jinja2, scikit-build-core, cmake, ninja) serve the build: no index needed.
python3 -m venv --system-site-packages "$venv"
# shellcheck disable=SC1091
. "$venv/bin/activate"
python -m pip install -q --no-index --find-links "$wheels" diskcache platformdirs gguf
echo "=== building llama-cpp-python $LLAMA_CPP_VERSION for CUDA, compute capability $arch only ==="
CMAKE_ARGS="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=$arch" CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \
  python -m pip install --no-index --find-links "$wheels" --no-build-isolation --no-deps --no-cache-dir \
  "$wheels/llama_cpp_python-$LLAMA_CPP_VERSION.tar.gz"
echo "=== built in $(( $(date +%s) - start )) s ==="
python -c "import llama_cpp; assert llama_cpp.llama_supports_gpu_offload(), 'not a GPU build'; print('GPU build')"
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
tokenizer_args=()
[ -f "$carry/tokenizer.gguf" ] && tokenizer_args=(--tokenizer-from "$carry/tokenizer.gguf")
model=/tmp/gpu-$shape.gguf
python bench/gpu_gguf.py --shape "$shape" --out "$model" "${tokenizer_args[@]}"
python bench/llamacpp_decode.py --model "$model"                               # ratio_vs_llamacpp= (greedy)
python bench/llamacpp_decode.py --model "$model" --preset Balanced --record-stages  # ratio_app_vs_llamacpp=
echo "=== all in $(( $(date +%s) - start )) s ==="
