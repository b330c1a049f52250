"""MarginalCRF's stopping rule: L-BFGS stops once the objective fell by less
than ``objective_tol * |f|`` over the last ``n_iter_no_change`` iterations;
``objective_tol=0`` turns it off, ``max_iter`` stays the cap."""

import warnings

import numpy as np
import pytest
from estimator_checks import make_structured_data
from sklearn.exceptions import ConvergenceWarning

from sklearn_margcrf import MarginalCRF

X, Y = make_structured_data(n_samples=5)
COMMON = dict(n_iter=3, init="zeros", n_jobs=1, lbfgs_tol=0.0, max_restarts=0)


def _fit(**params):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = MarginalCRF(**{**COMMON, **params}).fit(X, Y)
    return model, [w for w in caught if issubclass(w.category, ConvergenceWarning)]


def _first_stall(curve, window, tol):
    """The first iteration k > window (1-based) at which the rule holds on
    ``loss_curve_`` (which starts after the first iteration)."""
    for k in range(window + 1, len(curve) + 1):
        if curve[k - 1 - window] - curve[k - 1] < tol * abs(curve[k - 1]):
            return k
    return None


def test_off_runs_lbfgs_to_its_own_end_and_the_rule_stops_where_its_definition_says():
    reference, _ = _fit(objective_tol=0.0, max_iter=60)
    curve = reference.loss_curve_
    assert reference.n_iter_ > 20  # the rule, off, did not stop it early
    for window, tol in [(3, 1e-3), (5, 1e-4), (2, 1e-2)]:
        expected = _first_stall(curve, window, tol)
        assert expected is not None and expected > window + 1  # not decided by the unrecorded start
        model, convergence_warnings = _fit(objective_tol=tol, n_iter_no_change=window, max_iter=60)
        assert model.n_iter_ == expected
        # the same L-BFGS path up to the stop, and no warning: the stage converged
        np.testing.assert_array_equal(model.loss_curve_, curve[:expected])
        assert not convergence_warnings


def test_a_longer_window_or_a_smaller_tol_stops_later():
    base, _ = _fit(objective_tol=1e-3, n_iter_no_change=3, max_iter=60)
    longer, _ = _fit(objective_tol=1e-3, n_iter_no_change=8, max_iter=60)
    tighter, _ = _fit(objective_tol=1e-5, n_iter_no_change=3, max_iter=60)
    assert base.n_iter_ < longer.n_iter_
    assert base.n_iter_ < tighter.n_iter_
    assert base.loss_curve_[-1] > tighter.loss_curve_[-1]


def test_max_iter_stays_the_cap_and_still_warns():
    model, convergence_warnings = _fit(objective_tol=1e-12, n_iter_no_change=3, max_iter=4)
    assert model.n_iter_ == 4
    assert convergence_warnings and "max_iter=4" in str(convergence_warnings[0].message)


def test_the_rule_applies_to_the_initialising_fit_too():
    seen = []

    def record(progress):
        seen.append((progress.stage, progress.n_iter))

    _fit(init="independent", objective_tol=1e-2, n_iter_no_change=2, max_iter=60, callback=record)
    independent = [n for stage, n in seen if stage == "independent"]
    off = []
    _fit(init="independent", objective_tol=0.0, max_iter=60, callback=lambda p: off.append((p.stage, p.n_iter)))
    assert 0 < max(independent) < max(n for stage, n in off if stage == "independent")


@pytest.mark.parametrize("params", [dict(n_iter_no_change=0), dict(objective_tol=-1e-3), dict(n_iter_no_change=1.5)])
def test_bad_values_are_refused_by_name(params):
    name = next(iter(params))
    with pytest.raises(ValueError, match=name):
        MarginalCRF(**params).fit(X, Y)
