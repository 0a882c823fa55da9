#!/usr/bin/env bash
# Assembles a CUDA 12.4 toolkit tree with no toolkit installed beforehand, for
# `CUDA_MAJOR=12 build-cuda.sh`, and prints its directory (the only line on stdout).
# PyPI's -cu12 nvcc wheels hold ptxas but no nvcc, so the compiler comes from Debian:
#
#   from                                         what
#   Debian trixie non-free nvidia-cuda-toolkit   nvcc, cicc, ptxas, fatbinary, cudafe++, nvlink,
#     12.4.131~12.4.1-2 (87 MB .deb, not         cuobjdump, nvdisasm, libdevice
#     installed: apt-get download + dpkg -x)
#   PyPI nvidia-cuda-runtime-cu12 12.4.127       CUDA headers, libcudart.so.12
#   PyPI nvidia-cuda-nvcc-cu12 12.4.131          crt/ headers (the .deb's are in nvidia-cuda-dev, 934 MB)
#   PyPI nvidia-cuda-cccl-cu12 12.6.77           nv/, cuda/, cub/, thrust/ (12.4.127 is yanked: no nv/target)
#   PyPI nvidia-cublas-cu12 12.4.5.8, nvidia-curand-cu12 10.3.5.147, nvidia-cuda-nvrtc-cu12 12.4.127
#                                                the libraries the binary links (and loads on the nodes)
#
# The tree has the usual layout (bin/nvcc beside its own nvcc.profile, nvvm/bin/cicc,
# nvvm/libdevice, include/, lib/ with unversioned .so links), so nvcc, cudarc and the
# kernels' build scripts use it as they would a toolkit from NVIDIA. Nothing is installed
# system-wide; apt's lists and cache are throwaway directories under VENV.
#
#   usage: cuda12-toolkit.sh VENV       (prints VENV/cuda12; idempotent: a stamp per version)
#   env:   CUDA12_DEB=path/to/nvidia-cuda-toolkit_12.4.131~12.4.1-2_amd64.deb (no apt-get here)
#          DEBIAN_MIRROR=http://deb.debian.org/debian
set -euo pipefail
# shellcheck source=../lib/err.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib/err.sh"
VENV=${1:?usage: cuda12-toolkit.sh VENV}
DEB_NAME=nvidia-cuda-toolkit
DEB_VERSION=12.4.131~12.4.1-2
DEB_SHA256=cd5fe85aee38d108b315f408a688641478f2402622a10c677478eb7a6c4e5319
WHEELS=(nvidia-cuda-runtime-cu12==12.4.127 nvidia-cuda-nvcc-cu12==12.4.131
  nvidia-cuda-cccl-cu12==12.6.77 nvidia-cublas-cu12==12.4.5.8 nvidia-curand-cu12==10.3.5.147
  nvidia-cuda-nvrtc-cu12==12.4.127)
TREE=$VENV/cuda12
# The tree's layout version is part of the stamp: a tree assembled by an older script (one that
# copied fewer headers) is assembled again, not reused.
LAYOUT=2
STAMP="layout $LAYOUT $DEB_VERSION ${WHEELS[*]}"
if [ -f "$TREE/.stamp" ] && [ "$(cat "$TREE/.stamp")" = "$STAMP" ] && [ -x "$TREE/bin/nvcc" ]; then
  echo "$TREE"
  exit 0
fi

# A venv cut short has python but no pip. First: --clear empties the whole directory.
[ -x "$VENV/bin/pip" ] || python3 -m venv --clear "$VENV"

# 1. The .deb, authenticated twice: by Debian's signed index (apt) and by the pinned sha256.
APT=$VENV/apt
deb=${CUDA12_DEB:-}
if [ -z "$deb" ]; then
  command -v apt-get >/dev/null || {
    echo "cuda12-toolkit.sh: no apt-get here: download ${DEB_NAME}_${DEB_VERSION}_amd64.deb from Debian trixie non-free (pool/non-free/n/$DEB_NAME/) and set CUDA12_DEB to it, or set CUDA12_HOME to a CUDA 12 toolkit" >&2
    exit 2
  }
  keyring=/usr/share/keyrings/debian-archive-keyring.gpg
  [ -r "$keyring" ] || {
    echo "cuda12-toolkit.sh: $keyring is missing (package debian-archive-keyring): set CUDA12_DEB to the .deb, or CUDA12_HOME to a CUDA 12 toolkit" >&2
    exit 2
  }
  mkdir -p "$APT/lists/partial" "$APT/cache/archives/partial" "$APT/deb"
  echo "deb [signed-by=$keyring] ${DEBIAN_MIRROR:-http://deb.debian.org/debian} trixie non-free" >"$APT/sources.list"
  opts=(-o "Dir::Etc::sourcelist=$APT/sources.list" -o Dir::Etc::sourceparts=- \
    -o "Dir::State::Lists=$APT/lists" -o "Dir::Cache=$APT/cache" -o "APT::Sandbox::User=$(id -un)" -q)
  echo "cuda12-toolkit: $DEB_NAME $DEB_VERSION from Debian trixie non-free" >&2
  apt-get "${opts[@]}" update >&2
  (cd "$APT/deb" && apt-get "${opts[@]}" download "$DEB_NAME=$DEB_VERSION" >&2)
  deb=$(ls "$APT"/deb/"${DEB_NAME}"_*.deb)
fi
echo "$DEB_SHA256  $deb" | sha256sum -c --quiet - >&2 || {
  echo "cuda12-toolkit.sh: $deb is not $DEB_NAME $DEB_VERSION (sha256 differs)" >&2
  exit 2
}
rm -rf "$APT/x"
dpkg-deb -x "$deb" "$APT/x"
X=$APT/x

# 2. The wheels (headers and link-time libraries).
echo "cuda12-toolkit: ${WHEELS[*]} from PyPI" >&2
"$VENV/bin/pip" install -q "${WHEELS[@]}" >&2
NV=$("$VENV/bin/python" -c 'import site,os;print(os.path.join(site.getsitepackages()[0],"nvidia"))')

# 3. The tree.
rm -rf "$TREE"
mkdir -p "$TREE/bin/crt" "$TREE/nvvm/bin" "$TREE/nvvm/libdevice" "$TREE/include" "$TREE/lib"
cp "$X/usr/lib/nvidia-cuda-toolkit/bin/nvcc" "$TREE/bin/"
cp "$X/usr/lib/nvidia-cuda-toolkit/bin/crt/"* "$TREE/bin/crt/"
cp "$X/usr/lib/nvidia-cuda-toolkit/bin/cicc" "$TREE/nvvm/bin/"
cp "$X/usr/lib/nvidia-cuda-toolkit/libdevice/libdevice.10.bc" "$TREE/nvvm/libdevice/"
for tool in ptxas fatbinary cudafe++ nvlink cuobjdump nvdisasm bin2c nvprune; do
  cp "$X/usr/bin/$tool" "$TREE/bin/"
done
chmod +x "$TREE"/bin/* "$TREE/nvvm/bin/cicc" 2>/dev/null || true
cp -r "$NV/cuda_runtime/include/." "$NV/cuda_cccl/include/." "$TREE/include/"
# nvcc's own headers: crt/, and fatbinary_section.h, which every object nvcc builds with device
# code includes (candle's quantized-MoE kernels are such objects; PTX alone does not need it).
cp -r "$NV/cuda_nvcc/include/." "$TREE/include/"
cp "$NV/cuda_nvrtc/include/nvrtc.h" "$NV/cublas/include/"*.h "$NV/curand/include/"*.h "$TREE/include/"
rm -rf "$TREE/include/__init__.py" "$TREE/include/__pycache__"
# The libraries stay in the venv: links under their sonames and the unversioned names ld wants.
for lib in cuda_runtime/lib/libcudart.so.12 cublas/lib/libcublas.so.12 cublas/lib/libcublasLt.so.12 \
  curand/lib/libcurand.so.10 cuda_nvrtc/lib/libnvrtc.so.12; do
  name=$(basename "$lib")
  ln -sf "$NV/$lib" "$TREE/lib/$name"
  ln -sf "$name" "$TREE/lib/${name%.so.*}.so"
done
# The .deb's own profile points at Debian's install paths; this one at the tree.
cat >"$TREE/bin/nvcc.profile" <<'EOF'
TOP                = $(_HERE_)/..
NVVMIR_LIBRARY_DIR = $(TOP)/nvvm/libdevice
LD_LIBRARY_PATH   += $(TOP)/lib:
PATH              += $(TOP)/nvvm/bin:$(_HERE_):
INCLUDES          +=  "-I$(TOP)/include" $(_SPACE_)
LIBRARIES          =+ $(_SPACE_) "-L$(TOP)/lib/stubs" "-L$(TOP)/lib"
CUDAFE_FLAGS      +=
PTXAS_FLAGS       +=
EOF
"$TREE/bin/nvcc" --version | grep -q "release 12.4" || {
  echo "cuda12-toolkit.sh: $TREE/bin/nvcc does not run (nvcc --version)" >&2
  exit 2
}
rm -rf "$X"
echo "$STAMP" >"$TREE/.stamp"
echo "$TREE"
