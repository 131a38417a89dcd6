"""A short run of ``tools/fuzz.py`` (random valid and malformed calls in a child process).

The run fails on any crash of the child (death by a signal, or a hang), any exception
other than ValueError/TypeError, a valid call that raises, or a valid call whose results
differ from ``lstmcy.reference``. The long run is opt-in (``--runslow``).
"""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FUZZ = os.path.join(ROOT, "tools", "fuzz.py")


def run_fuzz(tmp_path, *args, timeout):
    report = tmp_path / "fuzz.json"
    proc = subprocess.run([sys.executable, FUZZ, "--json", str(report), *args],
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    summary = json.loads(report.read_text()) if report.exists() else None
    return proc, summary


def test_short_fuzz(tmp_path):
    """About 15 s of fuzzing (~1000-2000 cases): no crash, no unexpected error.
    ``LSTMCY_FUZZ_SEED`` and ``LSTMCY_FUZZ_SECONDS`` change the seed and the time (CI's
    sanitizer run fuzzes two minutes with a seed of the day)."""
    seed = int(os.environ.get("LSTMCY_FUZZ_SEED", "0"))
    seconds = float(os.environ.get("LSTMCY_FUZZ_SECONDS", "15"))
    proc, summary = run_fuzz(tmp_path, "--time", str(seconds), "--seed", str(seed),
                             "--hang-timeout", "60", timeout=seconds + 300)
    assert summary is not None, f"fuzz produced no report:\n{proc.stdout}\n{proc.stderr}"
    counts = summary["counts"]
    assert counts["crash"] == 0 and counts["error"] == 0, proc.stdout[-20000:]
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-5000:]
    # The run exercised both outcomes, so the generator is doing its job.
    assert counts["ok"] > 50 and counts["rejected"] > 50, counts


def test_fuzz_detects_a_crash(tmp_path):
    """The harness itself: a child killed by a signal is reported as a crash with its case."""
    env = dict(os.environ, LSTMCY_FUZZ_SELFTEST_CRASH_AT="3")
    # Under a sanitizer build (tools/build_tests.sh) the deliberate SIGSEGV must reach the
    # harness as a signal, not as the sanitizer's report of a crash.
    for name in ("ASAN_OPTIONS", "TSAN_OPTIONS"):
        env[name] = env.get(name, "") + ":handle_segv=0"
    report = tmp_path / "fuzz.json"
    proc = subprocess.run([sys.executable, FUZZ, "--count", "6", "--json", str(report)],
                          capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)
    summary = json.loads(report.read_text())
    assert proc.returncode == 1
    assert summary["counts"]["crash"] == 1
    assert [f["index"] for f in summary["failures"]] == [3]
    assert "SIGSEGV" in summary["failures"][0]["detail"]
    # The child was restarted after the crash and ran the remaining cases.
    assert sum(summary["counts"].values()) == 6
    assert "--replay 3" in proc.stdout


@pytest.mark.slow
def test_long_fuzz(tmp_path):
    """Ten minutes of fuzzing with glibc's heap checks (opt-in)."""
    proc, summary = run_fuzz(tmp_path, "--time", "600", "--seed", "1", "--malloc-check",
                             timeout=1200)
    assert summary is not None, proc.stderr
    assert summary["counts"]["crash"] == 0 and summary["counts"]["error"] == 0, proc.stdout[-20000:]
