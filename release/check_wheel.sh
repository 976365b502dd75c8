#!/usr/bin/env bash
# The wheel as a user without a compiler gets it, with the xds extra (examples/xds_mtls.py runs on it): a fresh
# virtualenv, a PATH holding nothing but its Python (and openssl, which the TLS examples run), binary packages only;
# then every example, run from that install.
#
#   release/check_wheel.sh dist/grpc_retry-…-manylinux….whl
set -euo pipefail
cd "$(dirname "$0")/.."
wheel=$1
venv=$(mktemp -d)
bare=$(mktemp -d)
trap 'rm -rf "$venv" "$bare"' EXIT
python3 -m venv "$venv"
printf '#!/bin/sh\nexec "%s" "$@"\n' "$venv/bin/python" > "$bare/python"  # the venv's (a link would lose it)
chmod +x "$bare/python"
ln -s "$(command -v openssl)" "$bare/openssl"
for compiler in cc gcc g++ c++ clang; do
    if PATH="$bare" command -v "$compiler" >/dev/null 2>&1; then echo "a compiler is on PATH" >&2; exit 1; fi
done
PATH="$bare" CC=false python -m pip install -q --only-binary=:all: "$wheel[xds]"
(cd "$bare" && PATH="$bare" python -c "import sys, grpc_retry; assert sys.prefix == '$venv', sys.prefix")
for example in examples/*.py; do
    case "$example" in examples/_*) continue ;; esac
    (cd examples && PATH="$bare" python "$(basename "$example")" >/dev/null) || { echo "failed: $example" >&2; exit 1; }
    echo "ran from the wheel: $example"
done
