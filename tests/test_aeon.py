"""lstmcy.aeon: aeon's own check_estimator and its pipelines. Skipped without aeon (pip
install -e ".[aeon]"; aeon pins numpy and scikit-learn versions of its own, so
.ci/timeseries.sh runs this file in a separate environment)."""
import warnings

import numpy as np
import pytest

pytest.importorskip("aeon", reason="lstmcy.aeon needs aeon: pip install -e '.[aeon]'")

from lstmcy import estimators  # noqa: E402
from lstmcy.aeon import LSTMClassifier, LSTMRegressor  # noqa: E402

QUICK = dict(hidden_size=8, max_iter=5, n_iter_no_change=None, random_state=0)


@pytest.mark.parametrize("cls", [LSTMClassifier, LSTMRegressor], ids=lambda c: c.__name__)
def test_aeon_check_estimator(cls):
    from aeon.testing.estimator_checking import check_estimator
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        results = check_estimator(cls, raise_exceptions=False)
    failed = {name: str(result)[:300] for name, result in results.items()
              if result != "PASSED" and not str(result).startswith("SKIP")}
    # the checks of unequal-length and multivariate collections ran
    assert any("UnequalLengthMultivariate" in name for name in results)
    assert not failed


def test_pipeline_keeps_channels_and_unequal_lengths():
    from aeon.datasets import load_basic_motions
    from aeon.pipeline import make_pipeline
    from aeon.transformations.collection import Normalizer
    X, y = load_basic_motions(split="train")
    pipe = make_pipeline(Normalizer(), LSTMClassifier(**QUICK)).fit(X, y)
    assert pipe.predict(X[:4]).shape == (4,)
    ragged = [x[:, :50 + i] for i, x in enumerate(X)]  # np-list, unequal lengths
    clf = LSTMClassifier(**QUICK).fit(ragged, y)
    assert clf.estimator_.input_size_ == 6
    sklearn_one = estimators.LSTMClassifier(channels_first=True, **QUICK).fit(ragged, y)
    np.testing.assert_array_equal(clf.predict_proba(ragged), sklearn_one.predict_proba(ragged))
