#!/usr/bin/env bash
# Build a debug copy of lstmcy (Cython bounds and initialisation checks, -O0 -g) in a
# temporary directory and run the test suite against it. The installed/editable lstmcy
# is not touched.
#
# Usage: tools/debug_build_tests.sh [pytest arguments...]
#   e.g. tools/debug_build_tests.sh -x -q tests/test_validation.py
# Environment:
#   LSTMCY_DEBUG_KEEP=1   keep the temporary directory (printed at the end)
#   PYTHON=python3.11     interpreter to use (default: python)
#   LSTMCY_DEBUG_TEST_TIMEOUT=1200   seconds before a hung test run is aborted
#
# With bounds checking on, an out-of-range index inside a kernel raises IndexError
# instead of reading or writing outside a buffer; a kernel that reads a memoryview that
# was never initialised raises instead of crashing. Any such error fails the tests.
set -euo pipefail

PYTHON=${PYTHON:-python}
SRC_ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/lstmcy-debug.XXXXXX")
cleanup() {
    if [[ "${LSTMCY_DEBUG_KEEP:-0}" != "0" ]]; then
        echo "debug build kept in $WORK"
    else
        rm -rf "$WORK"
    fi
}
trap cleanup EXIT

start=$(date +%s)
CLONE="$WORK/lstmcy"
mkdir -p "$CLONE"
# Tracked files plus new, not ignored ones (so uncommitted tests are included); build
# products (*.so, generated *.c, build/) are ignored and not copied.
(cd "$SRC_ROOT" && git ls-files -z --cached --others --exclude-standard \
    | xargs -0 -I{} sh -c 'test -e "{}" && echo "{}"' \
    | tar -cf - -T -) | tar -xf - -C "$CLONE"

echo "== building debug extensions in $CLONE"
(cd "$CLONE" && LSTMCY_DEBUG=1 "$PYTHON" setup.py -q build_ext --inplace >"$WORK/build.log" 2>&1) || {
    tail -50 "$WORK/build.log"
    echo "debug build failed" >&2
    exit 1
}
built=$(date +%s)

export PYTHONPATH="$CLONE${PYTHONPATH:+:$PYTHONPATH}"
# The debug copy has the baseline kernels only; an editable install elsewhere can still
# supply optimised AVX2/AVX-512 builds to the package's import path, so pin the build.
export LSTMCY_KERNELS=baseline
cd "$CLONE"
# Make sure the tests will import the debug copy, and that it really has the checks.
"$PYTHON" - "$CLONE" <<'EOF'
import importlib
import os
import sys

import lstmcy
from lstmcy import _dispatch, _lstm, _threadpool

clone = sys.argv[1]
assert os.path.realpath(lstmcy.__file__).startswith(os.path.realpath(clone)), lstmcy.__file__
for module in (_lstm, _dispatch.kernels, _threadpool):
    assert os.path.realpath(module.__file__).startswith(os.path.realpath(clone)), module.__file__
assert _threadpool.HAS_TEST_HOOKS, "the debug build must have the test hooks"
# The C generated with boundscheck on raises IndexError on every out-of-range index.
with open(os.path.join(clone, "src", "lstmcy", "_lstm.c")) as fh:
    assert "__Pyx_RaiseBufferIndexError" in fh.read(), "the kernels were built without boundscheck"
for module in (_lstm, importlib.import_module("lstmcy._blas"), _threadpool):
    c_file = os.path.join(clone, "src", "lstmcy", module.__name__.split(".")[-1] + ".c")
    assert os.path.getmtime(c_file) <= os.path.getmtime(module.__file__), f"{module} not rebuilt"
print(f"== testing debug build {_lstm.__file__}")
EOF

status=0
# A bounds error inside one thread of a two-thread kernel is "ignored" (noexcept nogil)
# and leaves the other thread waiting at a barrier: turn such a hang into a failure.
# SIGABRT makes pytest's faulthandler print every thread's stack first.
timeout -s ABRT "${LSTMCY_DEBUG_TEST_TIMEOUT:-1200}" "$PYTHON" -m pytest -p no:cacheprovider "$@" || status=$?
if [[ $status -eq 124 || $status -eq 134 ]]; then
    echo "debug test run timed out (hung?) after ${LSTMCY_DEBUG_TEST_TIMEOUT:-1200} s" >&2
fi
end=$(date +%s)
echo "== debug build: $((built - start)) s to build, $((end - built)) s to test (exit status $status)"
exit $status
