#!/usr/bin/env bash
# CI for lstmcy.sktime and lstmcy.aeon, after the main install (lstmcy importable, with its
# compiled extensions, in the system Python). sktime installs beside the system packages;
# aeon pins numpy versions of its own, so it goes into a plain venv that imports this
# checkout's lstmcy through PYTHONPATH (same Python, numpy 2 ABI). Runs both libraries'
# check_estimator, the pipeline tests and the fast variant of the 5-seed defaults test.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
PY=${PYTHON:-python}
PYTEST_ARGS=(-q -p no:cacheprovider -rs)

echo "== sktime (system environment)"
# Installing must not move numpy, scipy, scikit-learn or torch: check with a dry run.
changes=$("$PY" -m pip install --dry-run sktime 2>/dev/null | sed -n 's/^Would install //p')
if echo "$changes" | tr ' ' '\n' | grep -Eq '^(numpy|scipy|scikit[-_]learn|torch)-'; then
    echo "sktime would change $changes: installing it into a venv instead"
    SKTIME_VENV=${TMPDIR:-/tmp}/lstmcy-sktime-venv
    "$PY" -m venv "$SKTIME_VENV"
    "$SKTIME_VENV/bin/pip" install -q sktime pytest threadpoolctl
    SKTIME_PY="$SKTIME_VENV/bin/python"
    export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
else
    "$PY" -m pip install -q sktime
    SKTIME_PY=$PY
fi
"$SKTIME_PY" -m pytest "${PYTEST_ARGS[@]}" tests/test_sktime.py tests/test_estimators_defaults.py

echo "== aeon (venv)"
AEON_VENV=${TMPDIR:-/tmp}/lstmcy-aeon-venv
[ -x "$AEON_VENV/bin/python" ] || "$PY" -m venv "$AEON_VENV"
"$AEON_VENV/bin/pip" install -q aeon pytest threadpoolctl
PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" "$AEON_VENV/bin/python" -m pytest \
    "${PYTEST_ARGS[@]}" tests/test_aeon.py
