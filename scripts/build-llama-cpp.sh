#!/usr/bin/env bash
# Build llama-cpp-python 0.3.36 from its source on PyPI into .venv, with the patches in patches/:
# llama-cpp-row-independent-attention.patch (no KV split for a lone query row in flash attention,
# so a row of a one-token pass equals the same row of a verify pass bit for bit) and
# llama-cpp-ordered-cells.patch (a token takes a cell above its sequence's cells, so a sequence's
# cells stay in position order in a pool shared with others: its rows do not depend on them) and
# llama-cpp-row-exact-matmul.patch (one kernel for Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q5_K and Q6_K products of
# 1 to 63 rows, each weight block unpacked once for all rows and each row summed in the same order
# whatever the pass holds: a verify pass of N rows costs little more than one, and its rows equal
# one-token passes bit for bit). Repacking is off (-DGGML_CPU_REPACK=OFF): repacked Q4_0/Q4_K
# weights take kernels that change with the number of rows, and the row-exact kernel reads ggml's
# own block layout.
# And llama-cpp-cpu-variants.patch: the CPU back end is built twice, for AVX2 (ggml's "haswell"
# variant) and for AVX-512 with VNNI ("cascadelake": Intel Xeons since 2019, AMD Zen 4), and libggml
# loads the best one the CPU runs at start, from its own folder (where this build installs them).
# So nothing depends on the machine that built it (no -march=native), and each CPU gets its kernels.
# No AMX (a default build crashed in its AMX kernel on an Intel Xeon; ggml's AMX variant is not
# built). Skipped when this exact build is already installed. About 10 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=0.3.36
PATCHES=(patches/llama-cpp-row-independent-attention.patch patches/llama-cpp-ordered-cells.patch
    patches/llama-cpp-row-exact-matmul.patch patches/llama-cpp-cpu-variants.patch)
STAMP=".venv/llama-cpp-build-$(cat "${PATCHES[@]}" | sha256sum | cut -c1-16)-$VERSION"
if [[ -f "$STAMP" ]] && .venv/bin/python -c "import llama_cpp" 2>/dev/null; then
    exit 0
fi
if ! command -v g++ >/dev/null && command -v apt-get >/dev/null && [[ $(id -u) == 0 ]]; then
    apt-get update -qq && apt-get install -y -qq --no-install-recommends g++ >/dev/null  # cmake, ninja: PyPI
fi
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
.venv/bin/pip download --quiet --disable-pip-version-check --no-deps --no-binary :all: \
    "llama-cpp-python==$VERSION" -d "$WORK"
tar xzf "$WORK/llama_cpp_python-$VERSION.tar.gz" -C "$WORK"
for patch in "${PATCHES[@]}"; do
    (cd "$WORK/llama_cpp_python-$VERSION" && git apply -p1 "$OLDPWD/$patch")
done
echo "setup: building llama-cpp-python $VERSION with ${PATCHES[*]} (about 10 minutes on 2 cores)"
start=$SECONDS
CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_BACKEND_DL=ON -DGGML_CPU_ALL_VARIANTS=ON \
-DGGML_CPU_VARIANTS=haswell;cascadelake -DGGML_CPU_REPACK=OFF" \
CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \
    .venv/bin/pip install --quiet --disable-pip-version-check --no-deps "$WORK/llama_cpp_python-$VERSION"
.venv/bin/pip install --quiet --disable-pip-version-check diskcache==5.6.3  # its one dependency not already here
# What the build guarantees, for the backend to read (llama_cpp.applied_patches): the patches' names.
PACKAGE=$(.venv/bin/python -c "import llama_cpp, pathlib; print(pathlib.Path(llama_cpp.__file__).parent)")
printf '%s\n' "${PATCHES[@]##*/}" > "$PACKAGE/quickdraft-patches.txt"
rm -f .venv/llama-cpp-build-*
touch "$STAMP"
echo "setup: llama.cpp built in $((SECONDS - start)) s"
