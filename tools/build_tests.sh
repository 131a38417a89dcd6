#!/usr/bin/env bash
# Build an instrumented copy of lstmcy in a temporary directory and run tests against it.
# The installed/editable lstmcy is not touched.
#
# Usage: tools/build_tests.sh KIND [pytest arguments...]
#   KIND  debug   Cython bounds and initialisation checks, -O0 -g, the test hooks
#         asan    AddressSanitizer + UndefinedBehaviorSanitizer (LSTMCY_SANITIZE=address,undefined)
#         tsan    ThreadSanitizer (LSTMCY_SANITIZE=thread), with tools/tsan.supp
#   e.g. tools/build_tests.sh asan -x -q tests/test_validation.py
#        tools/build_tests.sh asan -- python tools/fuzz.py --time 120   (a command of its own)
# Environment:
#   LSTMCY_BUILD_KEEP=1   keep the temporary directory (printed at the end)
#   PYTHON=python3.11     interpreter to use (default: python)
#   LSTMCY_BUILD_TEST_TIMEOUT=1800   seconds before a hung test run is aborted
#
# debug: an out-of-range index inside a kernel raises IndexError instead of reading or
# writing outside a buffer; a kernel that reads a memoryview that was never initialised
# raises instead of crashing.
# asan/tsan: the interpreter is not instrumented, so the sanitizer's runtime is preloaded
# and CPython's own allocator is switched off (PYTHONMALLOC=malloc) so that ASan sees every
# buffer. Every sanitizer report aborts its process (exit code 66 with a report in the
# log), which fails the run; a report in a forked child or subprocess is caught by the
# report scan at the end.
set -euo pipefail

KIND=${1:?usage: tools/build_tests.sh debug|asan|tsan [pytest arguments...]}
shift
PYTHON=${PYTHON:-python}
SRC_ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/lstmcy-$KIND.XXXXXX")
cleanup() {
    if [[ "${LSTMCY_BUILD_KEEP:-0}" != "0" ]]; then
        echo "$KIND build kept in $WORK"
    else
        rm -rf "$WORK"
    fi
}
trap cleanup EXIT

case "$KIND" in
    debug) BUILD_ENV=(LSTMCY_DEBUG=1) ;;
    asan) BUILD_ENV=(LSTMCY_SANITIZE=address,undefined); RUNTIME=libasan.so ;;
    tsan) BUILD_ENV=(LSTMCY_SANITIZE=thread); RUNTIME=libtsan.so ;;
    *) echo "unknown build kind '$KIND': expected debug, asan or tsan" >&2; exit 2 ;;
esac

start=$(date +%s)
CLONE="$WORK/lstmcy"
mkdir -p "$CLONE"
# Tracked files plus new, not ignored ones (so uncommitted tests are included); build
# products (*.so, generated *.c, build/) are ignored and not copied.
(cd "$SRC_ROOT" && git ls-files -z --cached --others --exclude-standard \
    | xargs -0 -I{} sh -c 'test -e "{}" && echo "{}"' \
    | tar -cf - -T -) | tar -xf - -C "$CLONE"

echo "== building $KIND extensions in $CLONE"
(cd "$CLONE" && env "${BUILD_ENV[@]}" "$PYTHON" setup.py -q build_ext --inplace -j 2 \
    >"$WORK/build.log" 2>&1) || {
    tail -50 "$WORK/build.log"
    echo "$KIND build failed" >&2
    exit 1
}
built=$(date +%s)

export PYTHONPATH="$CLONE${PYTHONPATH:+:$PYTHONPATH}"
export LSTMCY_BUILD_KIND=$KIND
if [[ $KIND == debug ]]; then
    # The debug copy has the baseline kernels only; an editable install elsewhere can still
    # supply optimised AVX2/AVX-512 builds to the package's import path, so pin the build.
    export LSTMCY_KERNELS=baseline
else
    REPORTS="$WORK/reports"
    mkdir -p "$REPORTS"
    export PYTHONMALLOC=malloc
    # CPython and the libraries it loads keep memory until exit by design: leaks are not
    # reported. allocator_may_return_null: a huge request raises MemoryError as it would
    # without ASan (the tests of refused sizes rely on it). detect_stack_use_after_return:
    # a job lives in its caller's frame, and the pool's workers must be done with it
    # before that frame returns.
    export ASAN_OPTIONS="detect_leaks=0:allocator_may_return_null=1:detect_stack_use_after_return=1:abort_on_error=0:exitcode=66:log_path=$REPORTS/asan:${ASAN_OPTIONS:-}"
    export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:exitcode=66:log_path=$REPORTS/ubsan:${UBSAN_OPTIONS:-}"
    # die_after_fork=0: a forked child of the threaded parent starts lstmcy's workers anew
    # (the fork tests check that it does); TSan follows it but by default refuses.
    export TSAN_OPTIONS="suppressions=$CLONE/tools/tsan.supp:exitcode=66:halt_on_error=1:die_after_fork=0:log_path=$REPORTS/tsan:${TSAN_OPTIONS:-}"
    # libstdc++ with it: ASan intercepts C++ throws (PyTorch's errors) only if libstdc++ is
    # loaded when ASan starts, and the interpreter itself does not link it.
    export LD_PRELOAD="$(gcc -print-file-name=$RUNTIME):$(gcc -print-file-name=libstdc++.so)${LD_PRELOAD:+:$LD_PRELOAD}"
fi
cd "$CLONE"
# Make sure the tests import the instrumented copy, and that it really is instrumented.
"$PYTHON" - "$CLONE" "$KIND" <<'EOF'
import importlib
import os
import sys

import lstmcy
from lstmcy import _lstm, _threadpool
from lstmcy._engine import dispatch as _dispatch

clone, kind = sys.argv[1:]
assert os.path.realpath(lstmcy.__file__).startswith(os.path.realpath(clone)), lstmcy.__file__
for module in (_lstm, _dispatch.kernels, _threadpool):
    assert os.path.realpath(module.__file__).startswith(os.path.realpath(clone)), module.__file__
assert _threadpool.HAS_TEST_HOOKS, "the instrumented build must have the test hooks"
if kind == "debug":
    # The C generated with boundscheck on raises IndexError on every out-of-range index.
    with open(os.path.join(clone, "src", "lstmcy", "_lstm.c")) as fh:
        assert "__Pyx_RaiseBufferIndexError" in fh.read(), "the kernels were built without boundscheck"
else:
    runtime = {"asan": "__asan_init", "tsan": "__tsan_init"}[kind]
    with open(_dispatch.kernels.__file__, "rb") as fh:
        assert runtime.encode() in fh.read(), f"{_dispatch.kernels.__file__} is not instrumented"
for module in (_lstm, importlib.import_module("lstmcy._blas"), _threadpool):
    c_file = os.path.join(clone, "src", "lstmcy", module.__name__.split(".")[-1] + ".c")
    assert os.path.getmtime(c_file) <= os.path.getmtime(module.__file__), f"{module} not rebuilt"
print(f"== testing {kind} build {_dispatch.kernels.__file__}")
EOF

status=0
RUNNER=()
if [[ $KIND != debug ]] && command -v setarch >/dev/null; then
    # Without address randomisation: sanitizer runtimes of GCC < 14 refuse to start where the
    # kernel randomises mmap with more bits (vm.mmap_rnd_bits = 32 on recent kernels).
    RUNNER=(setarch "$(uname -m)" -R)
fi
# A failure inside one thread of a multi-thread kernel can leave the others waiting at a
# barrier: turn such a hang into a failure. SIGABRT makes pytest's faulthandler print every
# thread's stack first.
if [[ "${1:-}" == "--" ]]; then  # a command of its own instead of pytest
    shift
    "${RUNNER[@]}" timeout -s ABRT "${LSTMCY_BUILD_TEST_TIMEOUT:-1800}" "$@" || status=$?
else
    "${RUNNER[@]}" timeout -s ABRT "${LSTMCY_BUILD_TEST_TIMEOUT:-1800}" "$PYTHON" -m pytest -p no:cacheprovider "$@" || status=$?
fi
if [[ $status -eq 124 || $status -eq 134 ]]; then
    echo "$KIND test run timed out (hung?) after ${LSTMCY_BUILD_TEST_TIMEOUT:-1800} s" >&2
fi
if [[ $KIND != debug ]] && compgen -G "$REPORTS/*" >/dev/null; then
    # Reports from any process the tests started (forked children, subprocesses).
    for report in "$REPORTS"/*; do
        echo "== sanitizer report $report"
        cat "$report"
    done
    echo "$KIND: sanitizer reports found" >&2
    [[ $status -ne 0 ]] || status=66
fi
end=$(date +%s)
echo "== $KIND build: $((built - start)) s to build, $((end - built)) s to test (exit status $status)"
exit $status
