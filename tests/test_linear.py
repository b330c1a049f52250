"""theta = F u and its adjoint: the numba products against numpy's, in float64."""

import numpy as np
import pytest

from scipy.special import logsumexp, softmax

from sklearn_margcrf._linear import _LOSS_BLOCK, feature_scores, logistic_loss_and_gradient, weight_gradient


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n, d, m", [(37, 5, 2), (200, 42, 4), (3, 1, 8), (0, 4, 2), (5, 0, 3)])
def test_products_match_numpy_in_float64(dtype, n, d, m):
    rng = np.random.default_rng(n + d + m)
    features = rng.normal(size=(n, d)).astype(dtype)
    coef = rng.normal(size=(m, d))
    score_grad = rng.normal(size=(n, m))
    score_grad[::3] = 0.0  # skipped rows must still be exact
    exact = features.astype(np.float64)  # the float32 values, promoted exactly
    scores = feature_scores(features, coef)
    assert scores.dtype == np.float64 and scores.shape == (n, m)
    np.testing.assert_allclose(scores, exact @ coef.T, rtol=1e-12, atol=1e-12)
    gradient = weight_gradient(score_grad, features)
    assert gradient.dtype == np.float64 and gradient.shape == (m, d)
    np.testing.assert_allclose(gradient, score_grad.T @ exact, rtol=1e-12, atol=1e-12)


def test_products_accept_read_only_memory_maps(tmp_path):
    features = np.random.default_rng(0).random((50, 7)).astype(np.float32)
    np.save(tmp_path / "f.npy", features)
    mapped = np.load(tmp_path / "f.npy", mmap_mode="r")
    coef = np.arange(14.0).reshape(2, 7)
    np.testing.assert_array_equal(feature_scores(mapped, coef), feature_scores(features, coef))
    grad = np.ones((50, 2))
    np.testing.assert_array_equal(weight_gradient(grad, mapped), weight_gradient(grad, features))


def test_the_pair_is_adjoint():
    # <G, F U^T> = <G^T U, F>: the gradient of sum(score_grad * scores) w.r.t. coef
    rng = np.random.default_rng(1)
    features, coef, score_grad = rng.normal(size=(30, 6)), rng.normal(size=(3, 6)), rng.normal(size=(30, 3))
    lhs = np.sum(score_grad * feature_scores(features, coef))
    rhs = np.sum(weight_gradient(score_grad, features) * coef)
    assert lhs == pytest.approx(rhs, rel=1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n, d, m", [(37, 5, 2), (2 * _LOSS_BLOCK + 3, 12, 3), (3, 1, 8), (0, 4, 2)])
def test_logistic_loss_and_gradient_match_the_formula(dtype, n, d, m):
    rng = np.random.default_rng(n + d + m)
    features = rng.normal(size=(n, d)).astype(dtype)
    targets = rng.integers(0, m, size=n)
    coef = 3.0 * rng.normal(size=(m, d))
    scores = features.astype(np.float64) @ coef.T
    rows = np.arange(n)
    value, grad = logistic_loss_and_gradient(features, targets, coef)
    assert value == pytest.approx(np.sum(logsumexp(scores, axis=1) - scores[rows, targets]), rel=1e-12, abs=1e-12)
    residual = softmax(scores, axis=1)
    residual[rows, targets] -= 1.0
    assert grad.dtype == np.float64 and grad.shape == (m, d)
    np.testing.assert_allclose(grad, residual.T @ features.astype(np.float64), rtol=1e-10, atol=1e-10)


def test_logistic_loss_and_gradient_are_finite_for_huge_scores():
    # scores of +-1e4 would overflow exp without the shift by the largest one
    features = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    coef = np.array([[1e4, -1e4], [-1e4, 1e4]])
    value, grad = logistic_loss_and_gradient(features, np.array([0, 0, 1]), coef)
    # row 0 is right with certainty, row 1 wrong by 2e4, row 2 a tie (log 2);
    # residuals p - onehot: (0, 0), (-1, 1), (0.5, -0.5)
    assert value == pytest.approx(2e4 + np.log(2.0), rel=1e-12)
    np.testing.assert_allclose(grad, [[0.5, -0.5], [-0.5, 0.5]], atol=1e-12)


def test_logistic_gradient_is_the_derivative_of_the_loss():
    rng = np.random.default_rng(4)
    features, targets, coef = rng.normal(size=(40, 3)), rng.integers(0, 3, size=40), rng.normal(size=(3, 3))
    _, grad = logistic_loss_and_gradient(features, targets, coef)
    h = 1e-6
    for k, f in np.ndindex(coef.shape):
        step = np.zeros_like(coef)
        step[k, f] = h
        up, _ = logistic_loss_and_gradient(features, targets, coef + step)
        down, _ = logistic_loss_and_gradient(features, targets, coef - step)
        assert grad[k, f] == pytest.approx((up - down) / (2 * h), rel=1e-6, abs=1e-7)
