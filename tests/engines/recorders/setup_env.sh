#!/usr/bin/env bash
# Builds (or reuses) a side environment with a real engine on a CPU-only torch, for the
# oracles in this folder and for `make test-engines`.
#
#   bash tests/engines/recorders/setup_env.sh vllm   .peers/vllm     # vLLM 0.33.0   (~3.1 GB)
#   bash tests/engines/recorders/setup_env.sh sglang .peers/sglang   # SGLang 0.5.23 (~2.5 GB)
#
# Idempotent: an environment that passes check_env.py (which imports this checkout's
# prefixkv, as the engine tests do) is left as it is. FORCE=1 rebuilds
# it from scratch; PYTHON= picks the interpreter (3.11 by default, as the pins were made
# there); TORCH_PIP_ARGS= adds pip arguments for finding a CPU build of torch 2.13.0
# (e.g. "--index-url <a CPU wheel index>"): `pip install torch==2.13.0` must resolve to a
# CPU wheel, or pip downloads the multi-GB CUDA build, which this script then refuses.
#
# Why not `pip install vllm==0.33.0` (or sglang): their metadata pins a CUDA torch 2.14
# and a GPU stack of several GB. The prefix-cache, allocator and scheduler code needs
# none of it, so: the CPU torch first, the engine with --no-deps, then the pinned
# packages its modules import (<engine>-requirements.txt), with a constraint that keeps
# torch at 2.13.0. pip's warnings about the engine's own unmet requirements (torch 2.14,
# CUDA and server packages) are expected. Never install torchvision into the SGLang
# environment: it replaces torch with a CUDA build (torchvision_standin.py stands in).
set -euo pipefail
ENGINE=${1:?usage: setup_env.sh vllm|sglang VENV_DIR}
VENV=${2:?usage: setup_env.sh vllm|sglang VENV_DIR}
HERE=$(cd "$(dirname "$0")" && pwd)
case "$ENGINE" in
  vllm) SPEC=vllm==0.33.0 ;;
  sglang) SPEC=sglang==0.5.23 ;;
  *) echo "setup_env: unknown engine '$ENGINE' (vllm or sglang)" >&2; exit 2 ;;
esac
case "$VENV" in /*) ;; *) VENV="$PWD/$VENV" ;; esac
PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
TORCH_PIP_ARGS=${TORCH_PIP_ARGS:-}

check() { [ -x "$VENV/bin/python" ] && "$VENV/bin/python" "$HERE/check_env.py" "$ENGINE"; }

if [ "${FORCE:-0}" = 1 ]; then
  rm -rf "$VENV"
elif check 2>/dev/null; then
  echo "setup_env: $VENV is ready"
  exit 0
fi

mkdir -p "$(dirname "$VENV")"
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip install --disable-pip-version-check)
CONSTRAINT=$(mktemp)
trap 'rm -f "$CONSTRAINT"' EXIT
echo "torch==2.13.0" > "$CONSTRAINT"

# 1. The CPU torch, before anything can ask for another one. ($TORCH_PIP_ARGS splits
#    into words on purpose.)
# shellcheck disable=SC2086
"${PIP[@]}" -c "$CONSTRAINT" $TORCH_PIP_ARGS "torch==2.13.0"
"$VENV/bin/python" -c "import sys, torch; sys.exit(torch.version.cuda is not None)" || {
  echo "setup_env: pip installed a CUDA build of torch 2.13.0; make a CPU wheel reachable" \
       "(TORCH_PIP_ARGS) and rerun with FORCE=1" >&2
  exit 1
}
# 2. The engine alone.
"${PIP[@]}" --no-deps "$SPEC"
# 3. What its modules import, pinned; torch stays put.
"${PIP[@]}" -c "$CONSTRAINT" -r "$HERE/$ENGINE-requirements.txt"
# 4. This checkout, so the engine finds prefixkv's plug-in (and the check imports it).
"${PIP[@]}" --no-deps -e "$HERE/../../.."

if check; then
  echo "setup_env: $VENV is ready ($SPEC, CPU torch 2.13.0)"
else
  echo "setup_env: $VENV was built but its check failed (above); try by hand:" \
       "$VENV/bin/python $HERE/check_env.py $ENGINE" >&2
  exit 1
fi
