"""benchmarks/RESULTS.md is what ``benchmarks/report.py --results-md`` writes from the
result files it cites (so it is regenerated, not edited by hand), and those files are
the ones kept in git."""
import json
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import report  # noqa: E402


def _load(relative):
    with open(os.path.join(ROOT, relative)) as fh:
        return json.load(fh)


def test_results_md_is_generated_from_the_files_it_cites():
    with open(os.path.join(ROOT, "benchmarks", "RESULTS.md")) as fh:
        text = fh.read()
    headline = re.search(r"`(benchmarks/results/[^`]+\.json)`, measured with", text).group(1)
    paths = {"headline": headline}
    extra = {}
    for key in ("scaling", "estimators"):
        match = re.search(rf"From `(benchmarks/results/{key}\.json)`", text)
        if match:
            paths[key] = match.group(1)
            extra[key] = _load(match.group(1))
    assert report.results_md(_load(headline), paths, **extra) == text


def test_the_other_runs_are_sections_of_the_headline_scaling_and_estimators_files():
    with open(os.path.join(ROOT, "benchmarks", "RESULTS.md")) as fh:
        text = fh.read()
    assert "From `benchmarks/results/scaling.json`, section `contention`." in text
    assert "From `benchmarks/results/estimators.json`, section `ragged`." in text
    assert "results" in _load("benchmarks/results/scaling.json")["contention"]
    assert "records" in _load("benchmarks/results/estimators.json")["ragged"]
    headline = re.search(r"`(benchmarks/results/[^`]+\.json)`, measured with", text).group(1)
    assert f"From `{headline}`, section `dp_sgd`." in text
    assert "results" in _load(headline)["dp_sgd"]
    assert f"From `{headline}`, section `step`." in text
    assert "results" in _load(headline)["step"]


def test_every_cited_result_file_exists_and_is_not_ignored():
    with open(os.path.join(ROOT, "benchmarks", "RESULTS.md")) as fh:
        cited = set(re.findall(r"`(benchmarks/results/[^`]+\.json)`", fh.read()))
    with open(os.path.join(ROOT, ".gitignore")) as fh:
        kept = {line[1:].strip() for line in fh if line.startswith("!benchmarks/results/")}
    # The headline, scaling and estimators' runs: no more, and nothing kept that is not cited.
    assert cited == kept and len(cited) <= 3
    for path in cited:
        assert os.path.exists(os.path.join(ROOT, path)), path
