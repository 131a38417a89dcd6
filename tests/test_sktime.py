"""lstmcy.sktime: sktime's own check_estimator, its pipelines and model selection, and its
loaders' outputs taken as they come. Skipped without sktime (pip install -e ".[sktime]")."""
import warnings

import numpy as np
import pytest

pytest.importorskip("sktime", reason="lstmcy.sktime needs sktime: pip install -e '.[sktime]'")

from timeseries_data import packaged  # noqa: E402
from lstmcy import estimators  # noqa: E402
from lstmcy.sktime import LSTMClassifier, LSTMRegressor  # noqa: E402

QUICK = dict(hidden_size=8, max_iter=20, n_iter_no_change=None, random_state=0)


@pytest.mark.parametrize("cls", [LSTMClassifier, LSTMRegressor], ids=lambda c: c.__name__)
def test_sktime_check_estimator(cls):
    from sktime.utils.estimator_checks import check_estimator
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        results = check_estimator(cls, raise_exceptions=False)
    failed = {name: str(result)[:300] for name, result in results.items() if result != "PASSED"}
    assert len(results) > 100 and not failed


def test_tags_say_multivariate_unequal_length_and_parameters_match_the_sklearn_estimator():
    clf = LSTMClassifier()
    assert clf.get_tag("capability:multivariate") and clf.get_tag("capability:unequal_length")
    assert not clf.get_tag("capability:missing_values")
    assert clf.get_tag("X_inner_mtype")[0] == "numpy3D"
    params = clf.get_params()
    assert "channels_first" not in params
    assert set(params) == set(estimators.LSTMClassifier().get_params()) - {"channels_first"}


def test_equal_to_the_sklearn_estimator_on_channels_first_data():
    X, y = packaged("BasicMotions", "train")
    ours = LSTMClassifier(**QUICK).fit(X, y)
    sklearn_one = estimators.LSTMClassifier(channels_first=True, **QUICK).fit(X, y)
    np.testing.assert_array_equal(ours.predict_proba(X), sklearn_one.predict_proba(X))
    assert ours.estimator_.input_size_ == 6


def test_default_loader_outputs_nested_and_unequal_length():
    from sktime.datasets import load_UCR_UEA_dataset
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        X, y = load_UCR_UEA_dataset("JapaneseVowels", split="train")  # nested, 7-29 steps
    assert type(X).__name__ == "DataFrame"
    clf = LSTMClassifier(**dict(QUICK, max_iter=3)).fit(X, y)
    assert clf.estimator_.input_size_ == 12
    from sktime.datatypes import convert_to
    for mtype in ("pd-multiindex", "df-list"):
        np.testing.assert_array_equal(clf.predict_proba(convert_to(X, mtype)),
                                      clf.predict_proba(X))


def test_a_transformer_before_it_keeps_channels_and_lengths():
    from sktime.transformations.panel.padder import PaddingTransformer
    X, y = packaged("BasicMotions", "train")
    pipe = PaddingTransformer() * LSTMClassifier(**dict(QUICK, max_iter=2))
    assert type(pipe).__name__ == "ClassifierPipeline"
    pipe.fit(X, y)
    inner = pipe.classifier_.estimator_
    assert inner.input_size_ == 6 and inner.n_features_in_ == 6
    assert pipe.predict(X[:5]).shape == (5,)


def test_grid_search():
    from sktime.classification.model_selection import TSCGridSearchCV
    from sklearn.model_selection import KFold
    X, y = packaged("BasicMotions", "train")
    search = TSCGridSearchCV(LSTMClassifier(**dict(QUICK, max_iter=2)),
                             {"hidden_size": [4, 8]}, cv=KFold(2))
    search.fit(X, y)
    assert search.best_params_["hidden_size"] in (4, 8)


def test_evaluate_and_classification_benchmark_score_the_model_each_fold_fits():
    from sklearn.metrics import accuracy_score
    from sklearn.model_selection import KFold
    from sktime.benchmarking.classification import ClassificationBenchmark
    from sktime.classification.model_evaluation import evaluate
    X, y = packaged("BasicMotions", "train")
    cv = KFold(2, shuffle=True, random_state=0)
    learns = dict(QUICK, hidden_size=16, max_iter=30, learning_rate_init=0.01)
    expected = [LSTMClassifier(**learns).fit(X[train], y[train]).score(X[test], y[test])
                for train, test in cv.split(X)]
    assert min(expected) >= 0.6  # four classes: it learnt
    results = evaluate(LSTMClassifier(**learns), X=X, y=y, cv=cv, scoring=accuracy_score,
                       error_score="raise")
    np.testing.assert_allclose(results["test_accuracy_score"], expected)
    benchmark = ClassificationBenchmark()
    benchmark.add_estimator(LSTMClassifier(**learns), estimator_id="lstmcy")
    benchmark.add_task((X, y), cv, [accuracy_score], task_id="BasicMotions", error_score="raise")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        summary = benchmark.run()
    assert len(summary) == 1
    np.testing.assert_allclose(summary["accuracy_score_mean"], np.mean(expected))
