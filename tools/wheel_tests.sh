#!/usr/bin/env bash
# Test lstmcy as a packager ships it: build the sdist and, from it, the wheel (python -m
# build), check what each holds, install the wheel into a fresh virtual environment and run
# the checkout's test suite and the README's demo against it from a directory outside the
# checkout. The checkout and the interpreter's own packages are not touched.
#
# Usage: tools/wheel_tests.sh [pytest options...]     (default: -q)
# Environment:
#   PYTHON=python3.11                 interpreter for the build and the venv (default: python)
#   LSTMCY_WHEEL_KEEP=1               keep the temporary directory (printed at the end)
#   LSTMCY_WHEEL_TEST_TIMEOUT=1800    seconds before a hung test run is aborted
#
# What the suite needs from the checkout (README, docs/, benchmarks/, tools/fuzz.py, the
# aclnn stub's C source) it reads there; only lstmcy itself comes from the wheel. Every
# interpreter of the venv (pytest's and the subprocesses the tests start) refuses to import
# lstmcy from anywhere but the venv's site-packages.
set -euo pipefail

PYTHON=${PYTHON:-python}
SRC_ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/lstmcy-wheel.XXXXXX")
cleanup() {
    if [[ "${LSTMCY_WHEEL_KEEP:-0}" != "0" ]]; then
        echo "wheel test directory kept in $WORK"
    else
        rm -rf "$WORK"
    fi
}
trap cleanup EXIT
fail() { echo "wheel_tests.sh: $*" >&2; exit 1; }
clock=$(date +%s)
lap() { local now; now=$(date +%s); echo "== $1: $((now - clock)) s"; clock=$now; }

# Build from a copy of the tracked files plus new, not ignored ones (uncommitted work
# included), so that the checkout's build products (in-place *.so, generated *.c,
# *.egg-info) can neither leak into the sdist nor be overwritten by this build.
TREE="$WORK/tree"
mkdir -p "$TREE"
(cd "$SRC_ROOT" && git ls-files -z --cached --others --exclude-standard \
    | xargs -0 -I{} sh -c 'test -e "{}" && echo "{}"' \
    | tar -cf - -T -) | tar -xf - -C "$TREE"

echo "== installing the build frontend (python -m build) in its own venv"
"$PYTHON" -m venv "$WORK/buildenv"
"$WORK/buildenv/bin/python" -m pip install -q build

echo "== python -m build: the sdist, then the wheel from the sdist"
# The extensions compile side by side (build_ext's parallel option, read from this file).
printf '[build_ext]\nparallel = %s\n' "$(nproc)" >"$WORK/build.cfg"
DIST_EXTRA_CONFIG="$WORK/build.cfg" "$WORK/buildenv/bin/python" -m build --outdir "$WORK/dist" "$TREE" >"$WORK/build.log" 2>&1 || {
    tail -60 "$WORK/build.log"
    fail "python -m build failed (log above)"
}
# A deprecation the build tools print today is a build that stops working later. (The
# compiler's command lines name NPY_NO_DEPRECATED_API: not a warning.)
if grep -i "deprecat" "$WORK/build.log" | grep -v "NPY_NO_DEPRECATED_API"; then
    fail "the build prints the deprecation warnings above"
fi
lap "build"

SDISTS=("$WORK"/dist/*.tar.gz)
WHEELS=("$WORK"/dist/*.whl)
[[ ${#SDISTS[@]} -eq 1 && -f ${SDISTS[0]} ]] || fail "expected one sdist in $WORK/dist"
[[ ${#WHEELS[@]} -eq 1 && -f ${WHEELS[0]} ]] || fail "expected one wheel in $WORK/dist"
SDIST=${SDISTS[0]}
WHEEL=${WHEELS[0]}

echo "== contents of $(basename "$SDIST") and $(basename "$WHEEL")"
"$PYTHON" - "$TREE" "$SDIST" "$WHEEL" <<'EOF'
import email
import fnmatch
import os
import sys
import sysconfig
import tarfile
import zipfile

tree, sdist, wheel = sys.argv[1:]
problems = []


def files_under(directory, patterns):
    found = set()
    for dirpath, _, names in os.walk(os.path.join(tree, directory)):
        for name in names:
            if any(fnmatch.fnmatch(name, p) for p in patterns):
                found.add(os.path.relpath(os.path.join(dirpath, name), tree))
    return found


modules = files_under("lstmcy", ["*.py"])

# The sdist: every file the build reads, and no build product or test.
with tarfile.open(sdist) as tar:
    names = [m.name for m in tar.getmembers() if m.isfile()]
top = names[0].split("/")[0]
in_sdist = {n.split("/", 1)[1] for n in names if "/" in n}
needed = ({"setup.py", "pyproject.toml", "MANIFEST.in", "README.md", "LICENSE", "PKG-INFO"}
          | files_under("src", ["*.pyx", "*.pxd", "*.pxi", "*.h"]) | modules)
problems += [f"sdist lacks {name}" for name in sorted(needed - in_sdist)]
problems += [f"sdist member outside {top}/: {n}" for n in names if not n.startswith(top + "/")]
for name in sorted(in_sdist):
    parts = name.split("/")
    # setuptools writes its metadata as lstmcy.egg-info/ at the top; any other is a leftover.
    stray_egg_info = any(p.endswith(".egg-info") for p in parts) and parts[0] != "lstmcy.egg-info"
    if (stray_egg_info or parts[0] in ("build", "tests", "dist") or "__pycache__" in parts
            or name.endswith((".so", ".c", ".o", ".pyc", ".pyo", ".pyd"))):
        problems.append(f"sdist holds a build product or test: {name}")

# The wheel: every module of the package, every extension, the license, nothing of the build.
with zipfile.ZipFile(wheel) as whl:
    in_wheel = set(whl.namelist())
    dist_info = next(n.split("/")[0] for n in in_wheel if n.split("/")[0].endswith(".dist-info"))
    metadata = email.message_from_bytes(whl.read(f"{dist_info}/METADATA"))
problems += [f"wheel lacks {m}" for m in sorted(modules - in_wheel)]
extensions = ["_blas", "_threadpool", "_lstm"]
if sysconfig.get_platform().endswith(("x86_64", "amd64")):
    extensions += ["_lstm_avx2", "_lstm_avx512"]
suffix = sysconfig.get_config_var("EXT_SUFFIX")
problems += [f"wheel lacks the extension lstmcy/{e}{suffix}" for e in extensions
             if f"lstmcy/{e}{suffix}" not in in_wheel]
for name in sorted(in_wheel):
    if name.startswith(dist_info + "/"):
        continue
    if not name.startswith("lstmcy/") or name.endswith((".c", ".pyx", ".pxd", ".pxi", ".h", ".o")):
        problems.append(f"wheel holds {name}")
if metadata["License-Expression"] != "BSD-3-Clause":
    problems.append(f"wheel License-Expression is {metadata['License-Expression']!r}")
if f"{dist_info}/licenses/LICENSE" not in in_wheel:
    problems.append("wheel lacks licenses/LICENSE")
if problems:
    sys.exit("\n".join(problems))
print(f"sdist: {len(names)} files, every .pyx/.pxd/.pxi/.h and module, no build product or test")
print(f"wheel: {len(modules)} modules, {len(extensions)} extensions, License-Expression "
      f"{metadata['License-Expression']}")
EOF

echo "== fresh venv: torch==2.13.0 (the tests' oracle) and the wheel with [sklearn,test]"
VENV="$WORK/venv"
"$PYTHON" -m venv "$VENV"
VPY="$VENV/bin/python"
"$VPY" -m pip install -q torch==2.13.0
"$VPY" -m pip install -q "$WHEEL[sklearn,test]"
SITE=$("$VPY" -c "import sysconfig; print(sysconfig.get_path('platlib'))")
# The guard: a .pth file runs at the start of every interpreter of the venv.
GUARD_LOG="$WORK/guard.log"
: >"$GUARD_LOG"
cat >"$SITE/_lstmcy_wheel_guard.py" <<'EOF'
"""Refuse to import lstmcy from anywhere but this site-packages (tools/wheel_tests.sh)."""
import os
import sys
from importlib.machinery import PathFinder

SITE = os.path.dirname(os.path.abspath(__file__))


class OnlyTheInstalledLstmcy:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name != "lstmcy":
            return None
        spec = PathFinder.find_spec(name, path)
        origin = spec.origin if spec is not None else None
        if origin and not os.path.abspath(origin).startswith(SITE + os.sep):
            message = f"lstmcy imported from {origin}, not from {SITE} (argv {sys.argv})"
            log = os.environ.get("LSTMCY_WHEEL_GUARD_LOG")
            if log:  # recorded too, in case the ImportError is caught
                with open(log, "a") as fh:
                    fh.write(message + "\n")
            raise ImportError(message)
        return spec


sys.meta_path.insert(0, OnlyTheInstalledLstmcy)
EOF
echo "import _lstmcy_wheel_guard" >"$SITE/_lstmcy_wheel_guard.pth"
lap "venv"

RUN="$WORK/run"
mkdir -p "$RUN"
cd "$RUN"
# As if the venv were activated: the tests find the lstmcy console script on PATH.
export PATH="$VENV/bin:$PATH" VIRTUAL_ENV="$VENV" LSTMCY_WHEEL_GUARD_LOG="$GUARD_LOG"
export PYTHONDONTWRITEBYTECODE=1  # no __pycache__ in the checkout's tests/
unset PYTHONPATH
"$VPY" - "$SITE" "$SRC_ROOT" <<'EOF'
import importlib
import os
import shutil
import sys

import lstmcy
from lstmcy._engine import dispatch as _dispatch

site, checkout = (os.path.realpath(p) for p in sys.argv[1:])
modules = [lstmcy] + [importlib.import_module(f"lstmcy.{name}") for name in
                      ("_blas", "_threadpool", "_lstm")] + [_dispatch.kernels]
for module in modules:
    path = os.path.realpath(module.__file__)
    print(f"{module.__name__}: {path}")
    assert path.startswith(site + os.sep) and not path.startswith(checkout + os.sep), path
script = os.path.realpath(shutil.which("lstmcy"))
assert script.startswith(os.path.realpath(sys.prefix) + os.sep), script
EOF

# tests/test_torch_compile.py's child imports the tests' helpers from "tests", relative to
# the directory pytest runs in.
ln -s "$SRC_ROOT/tests" "$RUN/tests"
# benchmarks/bench_estimators.py (imported by tests, also through benchmarks/report.py)
# puts the checkout first on sys.path to benchmark the checkout's lstmcy; tests that hand
# sys.path on to a child (test_fork.py, test_thread_count.py) would then give the child the
# checkout's lstmcy. This plugin takes the checkout off sys.path again after each test.
cat >"$RUN/lstmcy_wheel_plugin.py" <<'EOF'
import os
import sys

CHECKOUT = os.path.realpath(os.environ["LSTMCY_WHEEL_CHECKOUT"])


def pytest_runtest_teardown(item, nextitem):
    sys.path[:] = [p for p in sys.path if os.path.realpath(p or os.curdir) != CHECKOUT]
EOF
status=0
echo "== the suite ($SRC_ROOT/tests) against the wheel, from $RUN"
# --import-mode=append: tests/ (the helpers torch_oracle.py, hostile.py, ...) goes at the
# end of sys.path, so nothing in the checkout can shadow the installed package. The plugin
# is found in the current directory (python -m pytest puts it on sys.path).
LSTMCY_WHEEL_CHECKOUT="$SRC_ROOT" timeout -s ABRT "${LSTMCY_WHEEL_TEST_TIMEOUT:-1800}" \
    "$VPY" -m pytest "$SRC_ROOT/tests" --import-mode=append -p no:cacheprovider \
    -p lstmcy_wheel_plugin "${@:--q}" || status=$?
if [[ $status -eq 124 || $status -eq 134 ]]; then
    echo "wheel test run timed out (hung?) after ${LSTMCY_WHEEL_TEST_TIMEOUT:-1800} s" >&2
fi
lap "tests"

echo "== README: python -m lstmcy demo"
"$VPY" -m lstmcy demo || status=$?
lap "demo"

if [[ -s "$GUARD_LOG" ]]; then
    cat "$GUARD_LOG"
    echo "wheel_tests.sh: lstmcy was imported from outside the wheel (above)" >&2
    [[ $status -ne 0 ]] || status=1
fi
exit $status
