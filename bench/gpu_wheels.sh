#!/usr/bin/env bash
# The wheels bench/gpu_session.sh installs on a lent GPU machine that lacks slipstream's
# dependencies (it has torch, transformers and pyarrow but no pydantic, math-verify or tomli-w,
# and no network): downloaded here, for its Python (3.12, x86_64), into .whl/ (git-ignored;
# pass it to the device call with carry=[".whl"], about 10 MB).
#
#   bash bench/gpu_wheels.sh [PYTHON_VERSION]      # default 3.12
set -euo pipefail
cd "$(dirname "$0")/.."
py=${1:-3.12}
python3 -m pip download -q -d .whl --only-binary=:all: --implementation cp \
    --python-version "$py" --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
    pydantic math-verify tomli-w
ls .whl
