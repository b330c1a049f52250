"""theta = F u and its adjoint: the numba products against numpy's, in float64."""

import numpy as np
import pytest

from sklearn_margcrf._linear import feature_scores, weight_gradient


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
    for out_dtype in (np.float32, np.float64):  # into an array of the compute dtype: rounded once, as astype
        out = np.full((n, m), np.nan, out_dtype)
        assert feature_scores(features, coef, out) is out
        np.testing.assert_array_equal(out, scores.astype(out_dtype))
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
