"""Property-based tests of ``infer`` and ``loss_and_grad`` on random models
(:mod:`strategies`): graphs of every kind, K = 2..5, parameter scales from
0.01 to 1000, hidden labels, iteration settings.

The profile in ``tests/conftest.py`` bounds the number of examples; run
``HYPOTHESIS_PROFILE=long python -m pytest tests/test_properties*.py`` for
a longer search.
"""

import warnings

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from strategies import TREE_KINDS, make_graph, models

from sklearn_margcrf import infer, loss_and_grad
from sklearn_margcrf.gradients import GRADIENT_MODES, LOSSES, check_combination

RHO_CHOICES = (None, 0.5, 1.0, "uniform_spanning_tree", "forest_cover", "per_edge")
VALID_RHO = (None, "auto", "uniform_spanning_tree", "forest_cover")  # TRW's log partition is an upper bound


def _rho(choice, model):
    if choice == "per_edge":
        return np.random.default_rng(model.n_nodes).uniform(0.1, 1.0, size=model.edges.shape[0])
    return choice


def _run(func, *args, **kwargs):
    """func(*args, **kwargs) and whether a TRW message ended at its floor
    (then the marginals may be off by design; see ``infer``)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = func(*args, **kwargs)
    floored = any("at the floor" in str(w.message) for w in caught)
    return out, floored


def _assert_normalised(result):
    for marginals, axes in ((result.unary, (1,)), (result.pairwise, (1, 2))):
        assert np.all(np.isfinite(marginals))
        assert np.all(marginals >= 0) and np.all(marginals <= 1 + 1e-12)
        np.testing.assert_allclose(marginals.sum(axis=axes), 1.0, atol=1e-9)
    assert np.isfinite(result.log_partition)


def _exact_log_partition(model):
    return infer(model.edges, model.unary, model.pairwise, method="exact").log_partition


# ---------------------------------------------------------------------------
# infer
# ---------------------------------------------------------------------------


@given(
    model=models(),
    method=st.sampled_from(("trw", "lbp", "mean_field", "exact")),
    n_iter=st.sampled_from((None, 0, 1, 7)),
    rho=st.sampled_from(RHO_CHOICES),
    tol=st.sampled_from((1e-1, 1e-6, 1e-12)),
    max_iter=st.sampled_from((1, 3, 1000)),
)
def test_infer_is_finite_and_normalised(model, method, n_iter, rho, tol, max_iter):
    kwargs = {}
    if method == "trw":
        kwargs["rho"] = _rho(rho, model)
    if method != "exact":
        kwargs.update(n_iter=n_iter, tol=tol, max_iter=max_iter)
    result, _ = _run(infer, model.edges, model.unary, model.pairwise, method=method, **kwargs)
    _assert_normalised(result)
    if method == "exact":
        assert result.converged and result.n_iter == 0
    elif n_iter is not None:
        assert result.n_iter == n_iter
    else:
        assert 1 <= result.n_iter <= max_iter and (result.converged or result.n_iter == max_iter)


@given(model=models(), rho=st.sampled_from(RHO_CHOICES), method=st.sampled_from(("trw", "lbp")))
def test_trw_is_locally_consistent_at_convergence(model, rho, method):
    rho = _rho(rho, model) if method == "trw" else None
    result, floored = _run(infer, model.edges, model.unary, model.pairwise, method=method, rho=rho, tol=1e-10, max_iter=5000)
    assume(result.converged and not floored)
    i, j = model.edges[:, 0], model.edges[:, 1]
    np.testing.assert_allclose(result.pairwise.sum(axis=2), result.unary[i], atol=1e-6)
    np.testing.assert_allclose(result.pairwise.sum(axis=1), result.unary[j], atol=1e-6)


@given(model=models(), n_iter=st.sampled_from((None, 0, 1, 7)))
def test_mean_field_log_partition_is_a_lower_bound(model, n_iter):
    # theta . mu + H(mu) <= log Z for any product distribution mu, converged or not
    result = infer(model.edges, model.unary, model.pairwise, method="mean_field", n_iter=n_iter)
    log_z = _exact_log_partition(model)
    assert result.log_partition <= log_z + 1e-9 * max(1.0, abs(log_z))


@given(model=models(), rho=st.sampled_from(VALID_RHO))
def test_trw_log_partition_is_an_upper_bound_at_convergence(model, rho):
    result, floored = _run(infer, model.edges, model.unary, model.pairwise, method="trw", rho=rho, tol=1e-10, max_iter=5000)
    assume(result.converged and not floored)
    log_z = _exact_log_partition(model)
    assert result.log_partition >= log_z - 1e-6 * max(1.0, abs(log_z))


@given(
    model=models(kinds=TREE_KINDS + ("no_edges",), log10_scale=st.floats(-2.0, 1.5)),
    method=st.sampled_from(("trw", "lbp")),
)
def test_trw_and_lbp_are_exact_on_forests(model, method):
    # rho = 1 on every edge of a forest (the "auto" rule): the bound is tight
    result, floored = _run(infer, model.edges, model.unary, model.pairwise, method=method, tol=1e-12, max_iter=5000)
    assert result.converged and not floored
    exact = infer(model.edges, model.unary, model.pairwise, method="exact")
    np.testing.assert_allclose(result.unary, exact.unary, atol=1e-8)
    np.testing.assert_allclose(result.pairwise, exact.pairwise, atol=1e-8)
    np.testing.assert_allclose(result.log_partition, exact.log_partition, rtol=1e-10, atol=1e-8)


# ---------------------------------------------------------------------------
# loss_and_grad
# ---------------------------------------------------------------------------

COMBINATIONS = []
for _loss in LOSSES:
    for _inference in ("trw", "lbp", "mean_field", "exact"):
        for _mode in GRADIENT_MODES:
            try:
                check_combination(_loss, _inference, _mode)
            except ValueError:
                continue
            COMBINATIONS.append((_loss, _inference, _mode))


def test_every_refused_combination_is_refused_with_a_reason():
    # the combinations the property tests skip are refused up front, by name
    rng = np.random.default_rng(0)
    n_nodes, edges = make_graph("grid", 2, rng)
    unary, pairwise = rng.normal(size=(n_nodes, 3)), rng.normal(size=(edges.shape[0], 3, 3))
    labels = rng.integers(0, 3, size=n_nodes)
    for loss in LOSSES:
        for inference in ("trw", "lbp", "mean_field", "exact"):
            for mode in GRADIENT_MODES:
                if (loss, inference, mode) in COMBINATIONS:
                    continue
                with pytest.raises(ValueError, match="gradient_mode="):
                    loss_and_grad(edges, unary, pairwise, labels, loss=loss, inference=inference, gradient_mode=mode)


def _loss_kwargs(combination, n_iter, sides, alpha):
    loss, inference, mode = combination
    kwargs = dict(loss=loss, inference=inference, gradient_mode=mode, sides=sides, alpha=alpha)
    kwargs["n_iter"] = n_iter if mode == "truncated" else None
    return kwargs


@given(
    model=models(),
    combination=st.sampled_from(COMBINATIONS),
    n_iter=st.sampled_from((0, 1, 3, 10)),
    sides=st.sampled_from((1, 2, 4)),
    alpha=st.sampled_from((5.0, 50.0)),
)
def test_loss_and_grad_is_finite(model, combination, n_iter, sides, alpha):
    kwargs = _loss_kwargs(combination, n_iter, sides, alpha)
    with warnings.catch_warnings():
        # floored messages, unconverged inference, backprop fallback: reported, not errors
        warnings.simplefilter("ignore")
        try:
            value, grad_unary, grad_pairwise = loss_and_grad(
                model.edges, model.unary, model.pairwise, model.labels, **kwargs
            )
        except ValueError as exc:
            # a refusal (implicit differentiation at saturated marginals) says what to do instead
            assert "use gradient_mode=" in str(exc), exc
            return
    assert np.isfinite(value)
    assert grad_unary.shape == model.unary.shape and grad_pairwise.shape == model.pairwise.shape
    assert np.all(np.isfinite(grad_unary)) and np.all(np.isfinite(grad_pairwise))


# tolerance on a directional derivative, relative to |grad| |direction|
FD_TOLERANCE = {"perturbation": {1: 3e-2, 2: 1e-3, 4: 1e-4}}


@given(
    # (stronger pairwise parameters give mean field several fixed points to jump between)
    model=models(n_states=st.integers(2, 3), log10_scale=st.floats(-2.0, 0.0), max_size=3, pairwise_ratios=(1.0, 0.1)),
    combination=st.sampled_from(COMBINATIONS),
    n_iter=st.sampled_from((0, 1, 4)),
    sides=st.sampled_from((1, 2, 4)),
    seed=st.integers(0, 2**32 - 1),
)
def test_loss_and_grad_matches_finite_differences(model, combination, n_iter, sides, seed):
    """On small well-conditioned models the gradient is the derivative of the value.

    Along a random direction: ``(f(theta + h d) - f(theta - h d)) / 2h = grad . d``.
    """
    kwargs = _loss_kwargs(combination, n_iter, sides, 15.0)
    kwargs.update(tol=1e-12, max_iter=20000)
    mode = combination[2]
    if combination[0] == "smooth_classification":
        # the loss switches its rival label where two wrong labels tie: keep away from ties
        assume(_smallest_wrong_label_gap(model, kwargs) > 1e-4)
    rng = np.random.default_rng(seed)
    d_unary, d_pairwise = rng.standard_normal(model.unary.shape), rng.standard_normal(model.pairwise.shape)

    def value_at(step):
        return loss_and_grad(
            model.edges, model.unary + step * d_unary, model.pairwise + step * d_pairwise, model.labels, **kwargs
        )

    h = 1e-5
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value, grad_unary, grad_pairwise = value_at(0.0)
        numeric = (value_at(h)[0] - value_at(-h)[0]) / (2 * h)
    # the fixed-point modes differentiate a converged fixed point; warnings say there is none
    assume(not caught)
    analytic = np.sum(grad_unary * d_unary) + np.sum(grad_pairwise * d_pairwise)
    norm = np.sqrt(np.sum(grad_unary**2) + np.sum(grad_pairwise**2)) * np.sqrt(np.sum(d_unary**2) + np.sum(d_pairwise**2))
    rtol = FD_TOLERANCE.get(mode, {}).get(sides, 1e-5)
    assert abs(numeric - analytic) <= rtol * norm + 1e-7, (numeric, analytic)


def _smallest_wrong_label_gap(model, kwargs):
    """Smallest gap between the two largest wrong-label marginals of an observed node."""
    method, n_iter = kwargs["inference"], kwargs["n_iter"]
    result = infer(model.edges, model.unary, model.pairwise, method=method, n_iter=n_iter if method != "exact" else None,
                   tol=1e-12, max_iter=20000)
    gaps = [np.inf]
    for mu, label in zip(result.unary, model.labels):
        if label >= 0 and mu.size > 2:
            wrong = np.sort(np.delete(mu, label))
            gaps.append(wrong[-1] - wrong[-2])
    return min(gaps)

