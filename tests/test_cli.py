"""Tests of the command line: ``python -m lstmcy`` / the ``lstmcy`` script (check, demo, bench)."""
import os
import shutil
import subprocess
import sys

import pytest

import lstmcy.__main__ as cli


def run_module(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "lstmcy", *args], capture_output=True, text=True,
                          timeout=timeout)


def test_help_lists_the_commands():
    result = run_module("--help")
    assert result.returncode == 0
    for command in ("check", "demo", "bench"):
        assert command in result.stdout


def test_console_script_help():
    script = shutil.which("lstmcy")
    if script is None:
        pytest.skip("the lstmcy console script is not on PATH (package not installed)")
    result = subprocess.run([script, "--help"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and "demo" in result.stdout


def test_no_command_is_an_error():
    result = run_module()
    assert result.returncode == 2
    assert "COMMAND" in result.stderr or "required" in result.stderr


def test_unknown_option_is_an_error(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["demo", "--no-such-option"])
    assert exc.value.code == 2
    assert "unrecognized arguments: --no-such-option" in capsys.readouterr().err


def test_check_reports_the_worst_error(capsys):
    assert cli.main(["check", "--cases", "2", "--seed", "1"]) == 0
    assert "worst relative error" in capsys.readouterr().out


# --------------------------------------------------------------------------- demo

def test_demo_short_run_through_python_m(tmp_path):
    pytest.importorskip("sklearn")
    result = subprocess.run(
        [sys.executable, "-m", "lstmcy", "demo", "--max-iter", "2", "--target", "0",
         "--plot", str(tmp_path / "loss.png")],
        capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "epoch   1/2: loss = " in out and "epoch   2/2: loss = " in out
    assert "Held-out accuracy: " in out and "Target reached" in out
    assert "Loss curve: " in out
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert "matplotlib is not installed" in out
        assert not (tmp_path / "loss.png").exists()
    else:
        assert (tmp_path / "loss.png").stat().st_size > 0


def test_demo_below_target_exits_1(capsys):
    pytest.importorskip("sklearn")
    code = cli.main(["demo", "--max-iter", "1", "--hidden-size", "2", "--target", "1.0",
                     "--no-plot", "--quiet"])
    out = capsys.readouterr().out
    assert code == 1
    assert "below the target 100%" in out
    assert "epoch   1/1" not in out  # --quiet: no per-epoch lines


def test_demo_without_matplotlib_says_so(monkeypatch, capsys, tmp_path):
    pytest.importorskip("sklearn")
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    path = tmp_path / "loss.png"
    assert cli.main(["demo", "--max-iter", "1", "--target", "0", "--quiet",
                     "--plot", str(path)]) == 0
    assert "matplotlib is not installed" in capsys.readouterr().out
    assert not path.exists()


def test_demo_without_sklearn_exits_2(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "sklearn", None)
    assert cli.main(["demo"]) == cli.EXIT_UNAVAILABLE == 2
    assert "pip install -e '.[sklearn]'" in capsys.readouterr().err


# --------------------------------------------------------------------------- bench

def test_bench_without_the_suite_exits_2(capsys, tmp_path):
    missing = tmp_path / "benchmarks" / "run.py"
    assert cli.main(["bench", "--suite", str(missing)]) == 2
    err = capsys.readouterr().err
    assert str(missing) in err and "not there" in err


@pytest.mark.parametrize("argv, expected_args", [
    (["bench"], ["--quick"]),
    (["bench", "--json", "out.json"], ["--quick", "--json", "out.json"]),
    (["bench", "--full"], []),
])
def test_bench_runs_the_suite_and_returns_its_status(tmp_path, argv, expected_args):
    script = tmp_path / "run.py"
    record = tmp_path / "args.txt"
    script.write_text("import sys\n"
                      f"open({str(record)!r}, 'w').write(repr(sys.argv[1:]))\n"
                      "sys.exit(3)\n")
    assert cli.main(argv + ["--suite", str(script)]) == 3
    assert record.read_text() == repr(expected_args)


def test_bench_finds_the_source_tree_suite():
    script = cli._benchmark_script()
    repo = os.path.dirname(os.path.dirname(os.path.abspath(cli.__file__)))
    assert script == os.path.join(repo, "benchmarks", "run.py")
