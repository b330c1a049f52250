"""A pickled ``MarginalCRF`` records the package version; unpickling it under
another version warns, as scikit-learn does for its own estimators."""

import pickle
import warnings

import numpy as np
import pytest
from estimator_checks import make_structured_data
from sklearn.exceptions import InconsistentVersionWarning as SklearnInconsistentVersionWarning

import sklearn_margcrf
from sklearn_margcrf import MarginalCRF
from sklearn_margcrf.exceptions import InconsistentVersionWarning


@pytest.fixture(scope="module")
def fitted():
    X, y = make_structured_data(n_samples=2, shape=(3, 3))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return MarginalCRF(n_iter=2, max_iter=2).fit(X, y), X


def _pickled_under(model, version, monkeypatch):
    """The pickle of ``model`` as the package at ``version`` would write it."""
    with monkeypatch.context() as patch:
        patch.setattr(sklearn_margcrf.estimator, "__version__", version)
        return pickle.dumps(model)


def test_pickle_records_the_version_and_loads_silently_under_it(fitted):
    model, X = fitted
    assert model.__getstate__()["_sklearn_margcrf_version"] == sklearn_margcrf.__version__
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        restored = pickle.loads(pickle.dumps(model))
    assert not hasattr(restored, "_sklearn_margcrf_version")  # not an attribute of the model
    np.testing.assert_array_equal(restored.unary_coef_, model.unary_coef_)
    np.testing.assert_array_equal(restored.predict_proba(X)[0], model.predict_proba(X)[0])


def test_unpickling_under_another_version_warns(fitted, monkeypatch):
    model, _ = fitted
    data = _pickled_under(model, "0.0.1", monkeypatch)
    with pytest.warns(InconsistentVersionWarning, match=r"MarginalCRF from sklearn_margcrf version 0\.0\.1") as record:
        restored = pickle.loads(data)
    warning = record[0].message
    assert (warning.original_version, warning.current_version) == ("0.0.1", sklearn_margcrf.__version__)
    assert isinstance(warning, SklearnInconsistentVersionWarning)  # one filter covers both packages
    np.testing.assert_array_equal(restored.pairwise_coef_, model.pairwise_coef_)  # the model is still loaded


def test_a_pickle_without_a_recorded_version_warns(fitted):
    model, _ = fitted
    state = model.__getstate__()
    del state["_sklearn_margcrf_version"]
    with pytest.warns(InconsistentVersionWarning, match="an unrecorded version"):
        MarginalCRF().__setstate__(state)
