"""Shared pytest configuration: opt-in markers for slow and large tests.

* ``@pytest.mark.slow``: long-running tests (the long fuzz run, ...). Skipped unless
  ``--runslow`` is given or ``LSTMCY_TEST_SLOW=1`` is set.
* ``@pytest.mark.large``: tests that allocate more than 2**31 bytes in one buffer
  (several GB of RAM in total). Skipped unless ``--runlarge`` is given or
  ``LSTMCY_TEST_LARGE=1`` is set.

Fixture ``fake_machine``: the machine lstmcy's thread counts see, for one test.
"""
import contextlib
import os

import pytest

_OPT_IN = {
    # marker: (command-line option, environment variable, description)
    "slow": ("--runslow", "LSTMCY_TEST_SLOW", "long-running tests"),
    "large": ("--runlarge", "LSTMCY_TEST_LARGE",
              "tests with a buffer larger than 2**31 bytes (needs ~9 GB of RAM, ~40 s)"),
}


def pytest_addoption(parser):
    for marker, (option, env, description) in _OPT_IN.items():
        parser.addoption(option, action="store_true", default=False,
                         help=f"run {description} (marker '{marker}'; or set {env}=1)")


def pytest_configure(config):
    for marker, (option, env, description) in _OPT_IN.items():
        config.addinivalue_line("markers", f"{marker}: {description} (opt-in with {option} "
                                           f"or {env}=1)")


def _enabled(config, marker):
    option, env, _ = _OPT_IN[marker]
    return config.getoption(option) or os.environ.get(env, "") not in ("", "0")


def pytest_collection_modifyitems(config, items):
    for marker, (option, env, _) in _OPT_IN.items():
        if _enabled(config, marker):
            continue
        skip = pytest.mark.skip(reason=f"opt-in: pass {option} or set {env}=1")
        for item in items:
            if marker in item.keywords:
                item.add_marker(skip)


@pytest.fixture
def fake_machine():
    """``fake_machine(cpus, **view)`` makes lstmcy see a machine whose process may use
    ``cpus`` CPUs until the test ends: no cgroup quota, no ``OMP_NUM_THREADS`` and an
    automatic thread count unless the keywords (:class:`lstmcy._engine.threads.MachineView`'s)
    say otherwise; :func:`lstmcy.set_num_threads` inside the test changes the fake only.
    Returns the view."""
    from lstmcy._engine import threads as _threads

    with contextlib.ExitStack() as views:
        def fake(cpus, **view):
            view = {"cgroup_root": None, "environ": {}, **view}
            return views.enter_context(
                _threads.machine_view(_threads.MachineView(affinity=cpus, **view)))
        yield fake
