"""float32 computation: infer and loss_and_grad compute in float32 when the
model is float32, agree with float64, keep every output's dtype, and stay
finite over the stated range of |theta|."""

import warnings

import numpy as np
import pytest

from sklearn_margcrf import grid_edges, infer, loss_and_grad
from sklearn_margcrf.gradients import GRADIENT_MODES, LOSSES, check_combination
from sklearn_margcrf.trw import trw_backward, trw_forward

METHODS = ("trw", "lbp", "mean_field", "exact")


def model(K=3, shape=(3, 4), scale=1.0, seed=0):
    rng = np.random.default_rng(seed)
    edges = grid_edges(*shape)
    n = shape[0] * shape[1]
    unary = rng.uniform(-scale, scale, (n, K))
    pairwise = rng.uniform(-scale, scale, (len(edges), K, K))
    labels = rng.integers(0, K, n)
    labels[::5] = -1  # some hidden nodes
    return edges, unary, pairwise, labels


def single(*arrays):
    return tuple(a.astype(np.float32) for a in arrays)


@pytest.mark.parametrize("method", METHODS)
def test_infer_in_float32_agrees_with_float64(method):
    edges, unary, pairwise, _ = model()
    n_iter = None if method == "exact" else 30
    r64 = infer(edges, unary, pairwise, method=method, n_iter=n_iter)
    r32 = infer(edges, *single(unary, pairwise), method=method, n_iter=n_iter)
    assert r32.unary.dtype == r32.pairwise.dtype == np.float32
    assert np.asarray(r32.log_partition).dtype == np.float32
    assert r64.unary.dtype == np.float64 and np.asarray(r64.log_partition).dtype == np.float64
    np.testing.assert_allclose(r32.unary, r64.unary, atol=2e-6)
    np.testing.assert_allclose(r32.pairwise, r64.pairwise, atol=2e-6)
    np.testing.assert_allclose(r32.log_partition, r64.log_partition, rtol=1e-5)


def test_mixed_precision_computes_in_float64():
    edges, unary, pairwise, _ = model()
    result = infer(edges, unary.astype(np.float32), pairwise, n_iter=5)
    assert result.unary.dtype == np.float64
    reference = infer(edges, unary.astype(np.float32).astype(np.float64), pairwise, n_iter=5)
    np.testing.assert_array_equal(result.unary, reference.unary)


def _applies(loss, inference, mode):
    try:
        check_combination(loss, inference, mode)
    except ValueError:
        return False
    return not (loss in ("pseudolikelihood", "piecewise") and (inference, mode) != ("trw", "truncated"))


COMBINATIONS = [(lo, inf, mo) for lo in LOSSES for inf in METHODS for mo in GRADIENT_MODES if _applies(lo, inf, mo)]


@pytest.mark.parametrize("loss,inference,mode", COMBINATIONS)
def test_loss_and_grad_in_float32_agrees_with_float64(loss, inference, mode):
    edges, unary, pairwise, labels = model(K=3, shape=(2, 3), scale=0.5, seed=1)
    kw = dict(loss=loss, inference=inference, gradient_mode=mode, n_iter=15, tol=1e-6, alpha=5.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # perturbation / backprop convergence notes
        v64, gu64, gp64 = loss_and_grad(edges, unary, pairwise, labels, **kw)
        v32, gu32, gp32 = loss_and_grad(edges, *single(unary, pairwise), labels, **kw)
    assert gu32.dtype == gp32.dtype == np.float32
    assert gu64.dtype == gp64.dtype == np.float64
    assert np.isfinite(v32) and np.isfinite(gu32).all() and np.isfinite(gp32).all()
    # perturbation in float32 takes a larger step (eps32 ** (1/3)): first-order error
    tol = 2e-2 if mode == "perturbation" else 1e-4
    scale = max(np.abs(gu64).max(), np.abs(gp64).max(), 1.0)
    np.testing.assert_allclose(v32, v64, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(gu32, gu64, atol=tol * scale)
    np.testing.assert_allclose(gp32, gp64, atol=tol * scale)


@pytest.mark.parametrize("loss,n_iter", [("surrogate_likelihood", 5), ("clique_logistic", 20), ("pseudolikelihood", None)])
def test_float32_loss_values_are_smooth_along_a_line(loss, n_iter):
    """On an image-sized grid (the backgrounds', 48 x 64, K = 8) the float32
    loss follows float64 along a line to a few 1e-9 of its value (the
    gap's spread): the terms are float32 but their totals float64. Float32
    totals jitter by their rounding (5e-8 to 1.2e-7 of the value here), noise
    that L-BFGS's line search chases near the end of a fit."""
    rng = np.random.default_rng(0)
    shape, K = (48, 64), 8
    edges = grid_edges(*shape)
    unary = rng.normal(0, 2, (shape[0] * shape[1], K))
    pairwise = 2 * np.eye(K) + rng.normal(0, 0.5, (len(edges), K, K))
    labels = np.argmax(unary + rng.normal(0, 2, unary.shape), axis=1)
    labels[rng.random(len(labels)) < 0.3] = -1
    direction_unary, direction_pairwise = rng.normal(size=unary.shape), rng.normal(size=pairwise.shape)
    gaps, values = [], []
    for t in np.linspace(0.0, 1e-3, 21):
        u, p = unary + t * direction_unary, pairwise + t * direction_pairwise
        v64, _, _ = loss_and_grad(edges, u, p, labels, loss=loss, n_iter=n_iter)
        v32, _, _ = loss_and_grad(edges, *single(u, p), labels, loss=loss, n_iter=n_iter)
        gaps.append(v32 - v64)
        values.append(v64)
    assert np.ptp(values) > 1e-5 * abs(values[0])  # the line moves the loss
    assert np.std(gaps) < 1.5e-8 * abs(values[0])


@pytest.mark.parametrize("rho", [0.5, 1.0])
@pytest.mark.parametrize("scale", [1.0, 20.0])
def test_float32_is_accurate_within_the_stated_range(scale, rho):
    """Up to |theta| = 20 float32 TRW marginals and truncated gradients agree with
    float64 to 1e-5 (relative, for the gradients)."""
    edges, unary, pairwise, labels = model(K=3, shape=(6, 6), scale=scale)
    r64 = infer(edges, unary, pairwise, rho=rho, n_iter=30)
    r32 = infer(edges, *single(unary, pairwise), rho=rho, n_iter=30)
    np.testing.assert_allclose(r32.unary, r64.unary, atol=5e-5)
    _, g64, h64 = loss_and_grad(edges, unary, pairwise, labels, rho=rho, n_iter=30)
    _, g32, h32 = loss_and_grad(edges, *single(unary, pairwise), labels, rho=rho, n_iter=30)
    top = max(np.abs(g64).max(), np.abs(h64).max())
    assert np.abs(g32 - g64).max() <= 3e-5 * top
    assert np.abs(h32 - h64).max() <= 3e-5 * top


@pytest.mark.parametrize("loss", ["univariate_logistic", "clique_logistic", "smooth_classification"])
@pytest.mark.parametrize("method", ["trw", "lbp", "mean_field"])
@pytest.mark.parametrize("scale", [40.0, 200.0, 1e3])
def test_float32_stays_finite_beyond_the_range(scale, method, loss):
    edges, unary, pairwise, labels = model(K=3, shape=(4, 4), scale=scale, seed=2)
    u, p = single(unary, pairwise)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # messages at the floor
        result = infer(edges, u, p, method=method, n_iter=20)
        value, gu, gp = loss_and_grad(edges, u, p, labels, loss=loss, inference=method, n_iter=20, alpha=5.0)
    assert np.isfinite(result.unary).all() and np.isfinite(result.log_partition)
    np.testing.assert_allclose(result.unary.sum(axis=1), 1.0, atol=1e-5)
    assert np.isfinite(value) and np.isfinite(gu).all() and np.isfinite(gp).all()


def test_float32_floor_warning_names_the_dtype():
    edges = grid_edges(2, 2)
    unary = np.array([[1.0, 0], [0, 1], [1, 0], [0, 0]], np.float32) * 200
    pairwise = np.tile(np.eye(2, dtype=np.float32), (4, 1, 1)) * 200
    labels = np.array([0, 1, 0, 0])
    with pytest.warns(RuntimeWarning, match=r"floor 1e-37 of float32.*85 \* rho.*float64, mean field"):
        infer(edges, unary, pairwise, rho=0.5)
    with pytest.warns(RuntimeWarning, match=r"floor 1e-37 of float32.*85 \* rho.*float64, mean field"):
        loss_and_grad(edges, unary, pairwise, labels, rho=0.5, n_iter=10)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the same model is within float64's range
        infer(edges, unary.astype(np.float64), pairwise.astype(np.float64), rho=0.5)
        loss_and_grad(edges, unary.astype(np.float64), pairwise.astype(np.float64), labels, rho=0.5, n_iter=10)
    # ten times larger is beyond float64's range too, and its warnings name float64's floor and range
    for warn in (lambda: infer(edges, 10 * unary.astype(np.float64), 10 * pairwise.astype(np.float64), rho=0.5),
                 lambda: loss_and_grad(edges, 10 * unary.astype(np.float64), 10 * pairwise.astype(np.float64), labels,
                                       rho=0.5, n_iter=10)):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            warn()
        messages = [str(w.message) for w in caught if "at the floor" in str(w.message)]
        assert len(messages) == 1 and "floor 1e-300 of float64" in messages[0] and "690 * rho" in messages[0]
        assert "float64, mean field" not in messages[0]


def test_float32_multiplier_bound():
    edges, unary, pairwise, labels = model()
    kw = dict(gradient_mode="perturbation", multiplier=1e-6)
    loss_and_grad(edges, unary, pairwise, labels, **kw)  # fine in float64
    with pytest.raises(ValueError, match="rounds away in float32"):
        loss_and_grad(edges, *single(unary, pairwise), labels, **kw)


# ---------------------------------------------------------------------------
# MarginalCRF(dtype=...)
# ---------------------------------------------------------------------------


def denoising_split(n_train, n_test, shape=(24, 32)):
    from sklearn_margcrf.datasets import make_denoising_problem

    images, labels = make_denoising_problem(n_train + n_test, shape=shape, noise=1.25, random_state=3)
    return images[:n_train], labels[:n_train], images[n_train:], labels[n_train:]


def denoising_model(**params):
    from sklearn.pipeline import make_pipeline

    from sklearn_margcrf import MarginalCRF
    from sklearn_margcrf.features import DenoisingFeatures

    return make_pipeline(DenoisingFeatures(), MarginalCRF(n_iter=10, max_iter=300, reg=1e-3, **params))


def test_float32_fit_reaches_the_float64_test_error():
    """The acceptance check of the kernel issue, on a small synthetic denoising problem."""
    pytest.importorskip("skimage")
    train_x, train_y, test_x, test_y = denoising_split(8, 8, shape=(32, 48))
    fits = {dtype: denoising_model(dtype=dtype).fit(train_x, train_y) for dtype in (np.float64, np.float32)}
    assert all(model[-1].n_iter_ < 300 for model in fits.values())  # both converged
    errors = {dtype: 1 - model.score(test_x, test_y) for dtype, model in fits.items()}
    assert abs(errors[np.float32] - errors[np.float64]) <= 0.002, errors
    crf32, crf64 = fits[np.float32][-1], fits[np.float64][-1]
    assert crf32.unary_coef_.dtype == np.float64  # the weights and L-BFGS stay in float64
    # the objective is flat near its minimum, so float32 gradients place the
    # weights only to a few 1e-3 (measured: 2.8e-3 of the largest weight)
    np.testing.assert_allclose(crf32.unary_coef_, crf64.unary_coef_, atol=5e-3 * np.abs(crf64.unary_coef_).max())
    proba32 = fits[np.float32].predict_proba(test_x[:1])[0]
    proba64 = fits[np.float64].predict_proba(test_x[:1])[0]
    assert proba32.dtype == np.float32 and proba64.dtype == np.float64
    np.testing.assert_allclose(proba32, proba64, atol=1e-2)


def test_estimator_dtype_is_the_compute_precision_whatever_the_features():
    """dtype, not the features' storage, decides the precision of the marginals."""
    from sklearn_margcrf import MarginalCRF
    from estimator_checks import make_structured_data

    X, y = make_structured_data(n_samples=3, n_states=3)
    X64 = [(nf, edges, ef) for nf, edges, ef in X]
    X32 = [(nf.astype(np.float32), edges, ef.astype(np.float32)) for nf, edges, ef in X]
    y = [labels.ravel() for labels in y]
    for features in (X64, X32):
        for dtype in (np.float32, "float32", np.float64, "float64"):
            model = MarginalCRF(n_iter=3, max_iter=3, dtype=dtype)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # max_iter reached
                model.fit(features, y)
            assert model.predict_proba(features[:1])[0].dtype == np.dtype(dtype)


@pytest.mark.parametrize("bad", [np.float16, np.int32, "bogus", complex, None])
def test_estimator_refuses_other_dtypes(bad):
    from sklearn_margcrf import MarginalCRF
    from estimator_checks import make_structured_data

    X, y = make_structured_data(n_samples=2)
    with pytest.raises(ValueError, match="dtype must be numpy.float32 or numpy.float64"):
        MarginalCRF(dtype=bad).fit(X, y)


def test_estimator_float32_multiplier_bound():
    from sklearn_margcrf import MarginalCRF
    from estimator_checks import make_structured_data

    X, y = make_structured_data(n_samples=2)
    with pytest.raises(ValueError, match="multiplier must be at least .* in dtype=float32"):
        MarginalCRF(gradient_mode="perturbation", multiplier=1e-6, dtype=np.float32).fit(X, y)


@pytest.mark.parametrize("grid", [False, True])
def test_float32_gradients_where_message_adjoints_exceed_float32(grid):
    """A message entry near float32's floor (about 4e-35) into a node whose
    marginal it does not decide (the node's unary compensates it), and a
    large adjoint of that marginal (1e6, as a heavily weighted loss gives):
    dL/dm of that entry is about 1e40, beyond float32's range, yet the
    float32 gradient is finite and agrees with float64 (back TRW keeps
    m dL/dm and takes its rare path where dL/dm would overflow; trw's
    "Numerical stability"). On an edge listed against the grid ordering
    (slot kernels) and on a 1 x 2 image grid (grid kernels)."""
    edges = grid_edges(1, 2) if grid else np.array([[1, 0]])  # not a grid ordering
    unary = np.array([[80.0, 0.0], [0.0, 39.7]])
    pairwise = np.array([[[40.0, 0.0], [0.0, 40.0]]])
    rho = np.full(1, 0.5)
    g_mu = np.array([[0.0, 0.0], [-2e6, 0.0]])
    grads = {}
    for dtype in (np.float64, np.float32):
        state = trw_forward(edges, unary.astype(dtype), pairwise.astype(dtype), rho, n_iter=3, keep_stack=True)
        assert (state.grid_kernels is not None) == grid
        grads[dtype] = trw_backward(state, g_mu.astype(dtype), None)
    assert 1e-36 < state.messages.min() < 1e-33  # above the floor
    assert 0.1 < state.unary_marginals[1, 0] < 0.9  # the node's marginal is not saturated
    top = max(np.abs(g).max() for g in grads[np.float64])
    assert top > 1e5
    for g32, g64 in zip(grads[np.float32], grads[np.float64]):
        assert g32.dtype == np.float32 and np.isfinite(g32).all()
        assert np.abs(g32 - g64).max() <= 1e-4 * top
