"""The scaling model of ``benchmarks/scaling.py`` runs on the kernels' current schedules.

The model rebuilds each call's task graph from its trace, so a new kind of schedule (the
forward's input product inside the recurrence, its projection from a packed w_ih, dx from
a packed w_ih, a units split) must not break it. Small cases of each kind go through the
model; the predictions must be those of a replay of the traced work: N workers take at
least 1/N of it (each count is traced with its own schedule, so the counts' work differs
a little).
"""
import json
import math
import os
import sys

import pytest

from lstmcy._engine import schedule as _schedule

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")
if BENCH not in sys.path:
    sys.path.insert(0, BENCH)

import scaling  # noqa: E402
from cases import Case  # noqa: E402

CASES = {
    # (T, B, I, H, L): the BLAS projection (too few sequences for the fused product)
    "projection": Case("projection", 6, 3, 3, 16, 1),
    # x's product inside the recurrence (fused_input), row groups
    "fused": Case("fused", 5, 16, 32, 64, 1),
    # dx from a packed w_ih (packed_dx), two layers, both directions
    "packed-dx": Case("packed-dx", 4, 4, 64, 128, 2, bidirectional=True),
    # two rows: too thin for row groups, the recurrence split by units
    "units": Case("units", 4, 2, 16, 384, 1),
    # the projection from w_ih^T packed once (packed_projection): two pieces of 128 steps
    "packed-projection": Case("packed-projection", 130, 2, 64, 128, 1),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_model_replays_every_kind_of_schedule(name):
    case = CASES[name]
    result = scaling.model_case(case, repeats=1)
    rows = {row["n"]: row for row in result["rows"]}
    assert sorted(rows) == list(scaling.COUNTS)
    assert rows[1]["speedup"] == 1.0
    for n, row in rows.items():
        assert math.isfinite(row["speedup"]) and row["speedup"] > 0, (n, row)
        assert row["bound"] in ("span", "work")
        assert row["predicted_ns"] >= row["work_ns"] / n * (1 - 1e-9), (n, row)
    assert math.isfinite(result["measured_1_to_2"]) and result["measured_1_to_2"] > 0
    assert result["handoff_us"] >= 0


def test_the_cases_cover_the_schedules_they_name():
    def forward(case, n):
        return _schedule.forward_schedule(case.T, case.B, case.I, case.H, case.D, n)

    assert not forward(CASES["projection"], 2).fused_input
    assert forward(CASES["fused"], 2).fused_input
    assert _schedule.packed_dx(CASES["packed-dx"].I, CASES["packed-dx"].H)
    assert forward(CASES["units"], 8).split == _schedule.SPLIT_UNITS
    assert forward(CASES["packed-projection"], 2).packed_projection


def test_the_json_names_the_machine_and_the_commit_and_keeps_the_contention_run(tmp_path):
    out = tmp_path / "scaling.json"
    out.write_text(json.dumps({"results": [], "contention": {"results": ["kept"]}}))
    scaling.main(["--shapes", "fused", "--repeats", "1", "--json", str(out)],
                 cases=[CASES["fused"]])
    doc = json.loads(out.read_text())
    assert doc["machine"] and doc["results"][0]["case"] == "fused"
    assert "lstmcy" in doc  # a commit, or None outside a git checkout
    assert doc["contention"] == {"results": ["kept"]}


def _backward_tasks():
    tools = os.path.join(os.path.dirname(BENCH), "tools")
    if tools not in sys.path:
        sys.path.insert(0, tools)
    import backward_tasks
    return backward_tasks


@pytest.mark.parametrize("name", ["packed-dx", "units"])
def test_backward_tasks_split_a_backward_by_kind_of_task(name):
    """tools/backward_tasks.py: per layer call, the kinds of task that ran (the products
    among them), each kind's busy time, and no more busy time than the threads had."""
    tasks = _backward_tasks()
    case = CASES[name]
    rows = tasks.split(case, threads=2, repeats=1)
    assert [layer for layer, _, _ in rows] == list(reversed(range(case.L)))
    for layer, span, busy in rows:
        assert span > 0
        ran = {kind for kind, seconds in busy.items() if seconds > 0}
        assert "weights (dW, db)" in ran and "dx" in ran
        assert ran & {"recurrence", "unit step"}
        assert set(busy) == set(tasks.TASK_NAMES.values())
        # Medians of separate runs: a little slack over threads x makespan.
        assert sum(busy.values()) <= 2 * span * 1.5
        assert tasks.product_flops(case, layer, "dx") > 0
        assert tasks.product_flops(case, layer, "gather") is None
