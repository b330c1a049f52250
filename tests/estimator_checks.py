"""Structured common checks for estimators whose X is a list of samples.

scikit-learn's data-dependent common checks feed 2-D arrays, which a
structured estimator rightly rejects. This suite, in the manner of
imbalanced-learn's ``imblearn/utils/estimator_checks.py``, re-states the
conventions that matter on structured data:

* ``fit`` returns self, is idempotent, overwrites no parameter and mutates no
  input; fitted attributes end in ``_`` and appear only after fit;
* ``NotFittedError`` before fit; ``fit`` and ``score`` take ``y``;
* a pickle round trip predicts the same;
* results do not depend on ``n_jobs``;
* read-only (memory-mapped) inputs are accepted.

Use :func:`parametrize_with_checks` on a list of estimators, or
:func:`yield_structured_checks` to run them by hand. Every check has the
signature ``check(name, estimator_orig)`` and builds its own small data set.
"""

import copy
import inspect
import pickle
import warnings
from functools import partial

import joblib
import numpy as np
import pytest
from sklearn.base import clone
from sklearn.exceptions import ConvergenceWarning, NotFittedError
from sklearn.utils._testing import create_memmap_backed_data

from sklearn_margcrf._graph import grid_edges
from sklearn_margcrf.features import split_by_orientation
from sklearn_margcrf.sample import CRFSample

__all__ = [
    "make_structured_data",
    "parametrize_with_checks",
    "yield_structured_checks",
]


def make_structured_data(n_samples=4, shape=(4, 5), n_states=2, seed=0, grid=True, hidden=0.1):
    """Small noisy-label grids: X a list of samples, y a list of label arrays.

    Node features ``[1, noisy one-hot of the label]``, edge features
    ``[horizontal, vertical]``. ``grid=True`` gives :class:`CRFSample` with a
    grid shape and (H, W) labels; ``False`` plain triples and (n,) labels.
    A fraction ``hidden`` of the labels is -1.
    """
    rng = np.random.default_rng(seed)
    height, width = shape
    edges = grid_edges(height, width)
    edge_features = split_by_orientation(np.ones((len(edges), 1)), (height, width))
    X, y = [], []
    for _ in range(n_samples):
        labels = np.zeros((height, width), dtype=np.int64)
        for state in range(1, n_states):
            r0, c0 = rng.integers(0, height - 1), rng.integers(0, width - 1)
            labels[r0 : r0 + rng.integers(1, height), c0 : c0 + rng.integers(1, width)] = state
        onehot = np.eye(n_states)[labels.ravel()]
        noisy = onehot + rng.normal(scale=0.8, size=onehot.shape)
        node_features = np.hstack([np.ones((height * width, 1)), noisy])
        if hidden:
            labels = np.where(rng.uniform(size=labels.shape) < hidden, -1, labels)
        if grid:
            X.append(CRFSample(node_features, edges.copy(), edge_features.copy(), grid_shape=shape))
            y.append(labels)
        else:
            X.append((node_features, edges.copy(), edge_features.copy()))
            y.append(labels.ravel())
    # every label appears at least once
    for state in range(n_states):
        y[0].reshape(-1)[state] = state
    return X, y


def _fit_quietly(estimator, X, y):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return estimator.fit(X, y)


def _fitted_attributes(estimator):
    return {k: v for k, v in vars(estimator).items() if k.endswith("_") and not k.startswith("__")}


def _assert_predictions_equal(p1, p2, atol=0.0):
    assert len(p1) == len(p2)
    for a, b in zip(p1, p2):
        assert a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=0, atol=atol)


def _deep_copy_data(X, y):
    return copy.deepcopy(X), copy.deepcopy(y)


def _assert_data_equal(X, y, X0, y0):
    for s, s0 in zip(X, X0):
        for a, b in zip(s, s0):
            np.testing.assert_array_equal(a, b)
        assert getattr(s, "grid_shape", None) == getattr(s0, "grid_shape", None)
    for a, b in zip(y, y0):
        np.testing.assert_array_equal(a, b)


# ---------------------------------------------------------------------------
# Checks
# ---------------------------------------------------------------------------


def check_fit_score_takes_y(name, estimator_orig):
    for method in ("fit", "score"):
        params = list(inspect.signature(getattr(estimator_orig, method)).parameters)
        assert params[:2] == ["X", "y"], f"{name}.{method} must take (X, y), got {params}"


def check_estimators_unfitted(name, estimator_orig):
    X, _ = make_structured_data()
    estimator = clone(estimator_orig)
    for method in ("predict", "predict_proba"):
        with pytest.raises(NotFittedError):
            getattr(estimator, method)(X)


def check_fit_returns_self(name, estimator_orig):
    X, y = make_structured_data()
    estimator = clone(estimator_orig)
    assert _fit_quietly(estimator, X, y) is estimator


def check_no_attributes_before_fit_and_trailing_underscore(name, estimator_orig):
    X, y = make_structured_data()
    estimator = clone(estimator_orig)
    assert not _fitted_attributes(estimator)
    params_before = set(vars(estimator))
    _fit_quietly(estimator, X, y)
    added = set(vars(estimator)) - params_before
    bad = [a for a in added if not (a.endswith("_") or a.startswith("_"))]
    assert not bad, f"{name}.fit set public attributes without a trailing underscore: {bad}"
    for attribute in ("classes_", "n_iter_", "loss_curve_", "n_states_"):
        assert hasattr(estimator, attribute), attribute


def check_dont_overwrite_parameters(name, estimator_orig):
    X, y = make_structured_data()
    estimator = clone(estimator_orig)
    params = copy.deepcopy(estimator.get_params())
    _fit_quietly(estimator, X, y)
    after = estimator.get_params()
    for key, value in params.items():
        assert joblib.hash(after[key]) == joblib.hash(value), (
            f"{name}.fit changed the parameter {key!r} from {value!r} to {after[key]!r}"
        )


def check_fit_does_not_mutate_inputs(name, estimator_orig):
    X, y = make_structured_data()
    X0, y0 = _deep_copy_data(X, y)
    estimator = _fit_quietly(clone(estimator_orig), X, y)
    estimator.predict(X)
    estimator.predict_proba(X)
    estimator.score(X, y)
    _assert_data_equal(X, y, X0, y0)


def check_fit_idempotent(name, estimator_orig):
    X, y = make_structured_data(seed=1)
    X_other, y_other = make_structured_data(seed=2, n_states=3)
    estimator = clone(estimator_orig).set_params(warm_start=False)
    first = _fit_quietly(estimator, X, y).predict_proba(X)
    coef = estimator.unary_coef_.copy(), estimator.pairwise_coef_.copy()
    _fit_quietly(estimator, X_other, y_other)  # a different fit in between
    second = _fit_quietly(estimator, X, y).predict_proba(X)
    np.testing.assert_allclose(estimator.unary_coef_, coef[0], rtol=0, atol=1e-12)
    np.testing.assert_allclose(estimator.pairwise_coef_, coef[1], rtol=0, atol=1e-12)
    _assert_predictions_equal(first, second, atol=1e-12)


def check_pickle_roundtrip(name, estimator_orig):
    X, y = make_structured_data()
    estimator = _fit_quietly(clone(estimator_orig), X, y)
    restored = pickle.loads(pickle.dumps(estimator))
    assert restored.get_params() == estimator.get_params()
    _assert_predictions_equal(estimator.predict_proba(X), restored.predict_proba(X))
    assert restored.score(X, y) == estimator.score(X, y)
    restored_unfitted = pickle.loads(pickle.dumps(clone(estimator_orig)))
    assert repr(restored_unfitted) == repr(clone(estimator_orig))


def check_n_jobs_invariance(name, estimator_orig):
    X, y = make_structured_data(n_samples=5)
    serial = _fit_quietly(clone(estimator_orig).set_params(n_jobs=1), X, y)
    parallel = _fit_quietly(clone(estimator_orig).set_params(n_jobs=2), X, y)
    # bit for bit: images are summed in a fixed order and L-BFGS uses one BLAS thread
    np.testing.assert_array_equal(parallel.unary_coef_, serial.unary_coef_)
    np.testing.assert_array_equal(parallel.pairwise_coef_, serial.pairwise_coef_)
    assert parallel.n_iter_ == serial.n_iter_
    _assert_predictions_equal(serial.predict_proba(X), parallel.predict_proba(X))


def check_readonly_inputs(name, estimator_orig):
    X, y = make_structured_data()
    arrays = [np.asarray(a) for s in X for a in s] + [np.asarray(lab) for lab in y]
    memmapped = create_memmap_backed_data(arrays)
    X_ro, y_ro, k = [], [], 0
    for s in X:
        X_ro.append(CRFSample(*memmapped[k : k + 3], grid_shape=s.grid_shape))
        k += 3
    y_ro = memmapped[k:]
    assert not X_ro[0][0].flags.writeable and not y_ro[0].flags.writeable
    reference = _fit_quietly(clone(estimator_orig), X, y)
    estimator = _fit_quietly(clone(estimator_orig), X_ro, y_ro)
    np.testing.assert_allclose(estimator.unary_coef_, reference.unary_coef_, rtol=0, atol=1e-12)
    _assert_predictions_equal(estimator.predict_proba(X_ro), reference.predict_proba(X), atol=1e-12)
    estimator.score(X_ro, y_ro)


def check_predict_shapes(name, estimator_orig):
    X, y = make_structured_data(n_states=3)
    estimator = _fit_quietly(clone(estimator_orig), X, y)
    n_states = estimator.n_states_
    assert n_states == 3
    np.testing.assert_array_equal(estimator.classes_, np.arange(n_states))
    for sample, labels, proba, pred in zip(X, y, estimator.predict_proba(X), estimator.predict(X)):
        assert pred.shape == labels.shape
        assert proba.shape == labels.shape + (n_states,)
        np.testing.assert_allclose(proba.sum(axis=-1), 1.0, atol=1e-8)
        np.testing.assert_array_equal(pred, proba.argmax(axis=-1))
    score = estimator.score(X, y)
    assert 0.0 <= score <= 1.0
    # plain triples with (n,) labels
    X_flat, y_flat = make_structured_data(n_states=3, grid=False)
    for labels, proba in zip(y_flat, estimator.predict_proba(X_flat)):
        assert proba.shape == (labels.shape[0], n_states)


def check_n_states_fixed(name, estimator_orig):
    """With n_states given, a training set lacking a label keeps all shapes."""
    X, y = make_structured_data(n_states=2)
    estimator = _fit_quietly(clone(estimator_orig).set_params(n_states=4), X, y)
    assert estimator.unary_coef_.shape[0] == 4
    assert estimator.pairwise_coef_.shape[:2] == (4, 4)
    assert all(p.shape[-1] == 4 for p in estimator.predict_proba(X))


STRUCTURED_CHECKS = (
    check_fit_score_takes_y,
    check_estimators_unfitted,
    check_fit_returns_self,
    check_no_attributes_before_fit_and_trailing_underscore,
    check_dont_overwrite_parameters,
    check_fit_does_not_mutate_inputs,
    check_fit_idempotent,
    check_pickle_roundtrip,
    check_n_jobs_invariance,
    check_readonly_inputs,
    check_predict_shapes,
    check_n_states_fixed,
)


def yield_structured_checks(estimator):
    """Yield ``(estimator, partial(check, name))`` for every structured check."""
    name = type(estimator).__name__
    for check in STRUCTURED_CHECKS:
        yield estimator, partial(check, name)


def _check_id(obj):
    if isinstance(obj, partial):
        return obj.func.__name__
    if hasattr(obj, "get_params"):
        changed = {
            k: v for k, v in obj.get_params(deep=False).items()
            if k in ("loss", "inference", "gradient_mode", "n_iter")
        }
        return type(obj).__name__ + "(" + ",".join(f"{k}={v}" for k, v in changed.items()) + ")"
    return None


def parametrize_with_checks(estimators):
    """pytest decorator: ``@parametrize_with_checks([est1, ...])`` on a test
    taking ``(estimator, check)``, which should call ``check(estimator)``."""
    cases = [pair for estimator in estimators for pair in yield_structured_checks(estimator)]
    return pytest.mark.parametrize("estimator, check", cases, ids=_check_id)
