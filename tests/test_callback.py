"""MarginalCRF(callback=...): one call per L-BFGS iteration, copies of the
weights, stopping on request."""

import pickle
import warnings

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils._param_validation import InvalidParameterError

from estimator_checks import make_structured_data
from sklearn_margcrf.estimator import MarginalCRF


class Recorder:
    """Keeps every progress report; asks to stop at ``stop = (stage, n_iter)``."""

    def __init__(self, stop=None, scribble=False):
        self.reports = []
        self.stop = stop
        self.scribble = scribble

    def __call__(self, progress):
        self.reports.append({key: (np.copy(v) if isinstance(v, np.ndarray) else v) for key, v in progress.items()})
        if self.scribble:  # the fit must not depend on what the callback does to its arrays
            progress.unary_coef[...] = np.nan
            progress.pairwise_coef[...] = np.nan
        return (progress.stage, progress.n_iter) == self.stop

    def stage(self, name):
        return [r for r in self.reports if r["stage"] == name]


def _quiet_fit(model, X, y):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return model.fit(X, y)


def test_one_report_per_iteration_of_every_stage():
    X, y = make_structured_data()
    recorder = Recorder()
    model = _quiet_fit(MarginalCRF(loss="smooth_classification", n_iter=2, max_iter=3, callback=recorder), X, y)
    assert [r["stage"] for r in recorder.reports] == sorted(
        (r["stage"] for r in recorder.reports), key=["independent", "surrogate_likelihood", "fit"].index
    )
    for name in ("independent", "surrogate_likelihood", "fit"):
        reports = recorder.stage(name)
        assert [r["n_iter"] for r in reports] == list(range(1, len(reports) + 1))
        assert all(r["n_restarts"] == 0 for r in reports)
        assert all(r["pairwise_coef"].shape == (2, 2, 2) and r["unary_coef"].shape == (2, 3) for r in reports)
    assert all(np.all(r["pairwise_coef"] == 0) for r in recorder.stage("independent"))
    fit = recorder.stage("fit")
    assert len(fit) == model.n_iter_
    assert [r["objective"] for r in fit] == model.loss_curve_
    assert [r["elapsed"] for r in fit] == model.time_curve_
    np.testing.assert_array_equal(fit[-1]["unary_coef"], model.unary_coef_)
    np.testing.assert_array_equal(fit[-1]["pairwise_coef"], model.pairwise_coef_)


def test_the_reported_weights_are_copies():
    X, y = make_structured_data()
    plain = _quiet_fit(MarginalCRF(n_iter=2, max_iter=4), X, y)
    scribbled = _quiet_fit(MarginalCRF(n_iter=2, max_iter=4, callback=Recorder(scribble=True)), X, y)
    assert scribbled.loss_curve_ == plain.loss_curve_
    np.testing.assert_array_equal(scribbled.pairwise_coef_, plain.pairwise_coef_)


def test_stopping_keeps_the_weights_of_that_iteration():
    X, y = make_structured_data()
    full = _quiet_fit(MarginalCRF(n_iter=2, max_iter=5), X, y)
    recorder = Recorder(stop=("fit", 2))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        stopped = MarginalCRF(n_iter=2, max_iter=5, callback=recorder).fit(X, y)
    # a requested stop is not a convergence failure (the initialising fit may warn)
    assert not [w for w in caught if "(fit)" in str(w.message)]
    assert stopped.n_iter_ == 2 and len(recorder.stage("fit")) == 2
    assert stopped.loss_curve_ == full.loss_curve_[:2]
    np.testing.assert_array_equal(stopped.unary_coef_, recorder.reports[-1]["unary_coef"])
    np.testing.assert_array_equal(stopped.pairwise_coef_, recorder.reports[-1]["pairwise_coef"])
    assert not np.array_equal(stopped.pairwise_coef_, full.pairwise_coef_)
    assert stopped.predict_proba(X)[0].shape == y[0].shape + (2,)


def test_stopping_in_an_initialising_fit_ends_the_fit():
    X, y = make_structured_data()
    recorder = Recorder(stop=("independent", 1))
    model = _quiet_fit(MarginalCRF(loss="smooth_classification", n_iter=2, max_iter=3, callback=recorder), X, y)
    assert [r["stage"] for r in recorder.reports] == ["independent"]
    assert model.n_iter_ == 0 and model.loss_curve_ == []
    np.testing.assert_array_equal(model.unary_coef_, recorder.reports[0]["unary_coef"])
    assert np.all(model.pairwise_coef_ == 0)
    recorder = Recorder(stop=("surrogate_likelihood", 2))
    model = _quiet_fit(MarginalCRF(loss="smooth_classification", n_iter=2, max_iter=3, callback=recorder), X, y)
    assert recorder.reports[-1]["stage"] == "surrogate_likelihood" and not recorder.stage("fit")
    np.testing.assert_array_equal(model.pairwise_coef_, recorder.reports[-1]["pairwise_coef"])


def test_stopping_skips_the_remaining_incremental_stages():
    X, y = make_structured_data(n_samples=7)
    recorder = Recorder()
    _quiet_fit(MarginalCRF(incremental=2, max_iter=4, n_iter=2, random_state=0, callback=recorder), X, y)
    stages = list(dict.fromkeys(r["stage"] for r in recorder.reports if r["stage"] != "independent"))
    assert stages == ["fit[2 images]", "fit[4 images]", "fit"]
    recorder = Recorder(stop=("fit[2 images]", 1))
    model = _quiet_fit(MarginalCRF(incremental=2, max_iter=4, n_iter=2, random_state=0, callback=recorder), X, y)
    assert recorder.reports[-1]["stage"] == "fit[2 images]" and model.n_iter_ == 1


def test_exceptions_of_the_callback_propagate():
    X, y = make_structured_data()

    def fail(progress):
        raise KeyboardInterrupt("user stop")

    with pytest.raises(KeyboardInterrupt, match="user stop"):
        MarginalCRF(n_iter=2, max_iter=3, n_jobs=2, callback=fail).fit(X, y)


def test_callback_must_be_callable():
    X, y = make_structured_data()
    with pytest.raises(InvalidParameterError, match="'callback' parameter"):
        MarginalCRF(callback="print").fit(X, y)


def test_a_model_with_a_picklable_callback_clones_and_pickles():
    model = MarginalCRF(callback=print)
    assert clone(model).callback is print
    assert pickle.loads(pickle.dumps(model)).callback is print
