"""``loss_and_grad``: every (loss, inference, gradient mode) against finite differences."""

import warnings

import numpy as np
import pytest
from reference import brute_force, chain_edges, joint_scores, random_model

from sklearn_margcrf import grid_edges, infer, loss_and_grad
from sklearn_margcrf.exceptions import BackpropDivergenceError, BackpropFallbackWarning
from sklearn_margcrf.gradients import GRADIENT_MODES, LOSSES, MIN_MULTIPLIER, check_combination

MARGINAL_AND_LIKELIHOOD = ["univariate_logistic", "clique_logistic", "univariate_quadratic", "smooth_classification", "surrogate_likelihood"]
INFERENCES = ["trw", "lbp", "mean_field", "exact"]


def valid(loss, inference, mode):
    try:
        check_combination(loss, inference, mode)
    except ValueError:
        return False
    return True


def make_problem(shape, seed, n_states=3):
    rng = np.random.default_rng(seed)
    edges = grid_edges(*shape)
    n = shape[0] * shape[1]
    unary, pairwise = random_model(edges, n, n_states, rng, scale=1.0)
    labels = rng.integers(0, n_states, size=n)
    labels[rng.integers(0, n)] = -1  # one hidden label
    return edges, unary, pairwise, labels


def finite_difference_gradient(f, unary, pairwise, eps):
    theta = np.concatenate([unary.ravel(), pairwise.ravel()])
    grad = np.empty_like(theta)
    for k in range(theta.size):
        up, down = theta.copy(), theta.copy()
        up[k] += eps
        down[k] -= eps
        grad[k] = (f(up) - f(down)) / (2 * eps)
    return grad


def relative_error(a, b):
    return np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-12)


CASES = [
    (loss, inference, mode, sides)
    for loss in MARGINAL_AND_LIKELIHOOD
    for inference in INFERENCES
    for mode in GRADIENT_MODES
    for sides in ((1, 2, 4) if mode == "perturbation" else (2,))
    if valid(loss, inference, mode)
]
TOLERANCE = {("perturbation", 1): 2e-2, ("perturbation", 2): 1e-3, ("perturbation", 4): 1e-4}


@pytest.mark.parametrize("shape,seed", [((3, 3), 0), ((3, 4), 1)])
@pytest.mark.parametrize("loss,inference,mode,sides", CASES)
def test_gradient_matches_finite_differences(loss, inference, mode, sides, shape, seed):
    edges, unary, pairwise, labels = make_problem(shape, seed)
    converged = mode != "truncated"
    kwargs = dict(loss=loss, inference=inference, gradient_mode=mode, n_iter=5, alpha=5.0, sides=sides, tol=1e-12, max_iter=100000)
    if inference == "trw":
        kwargs["rho"] = 0.5
    value, grad_unary, grad_pairwise = loss_and_grad(edges, unary, pairwise, labels, **kwargs)
    assert np.isfinite(value)

    # The same function, differentiated numerically: truncated modes vary theta
    # through n_iter iterations; the others through converged inference.
    fd_kwargs = dict(kwargs, gradient_mode="truncated" if not converged else ("implicit" if inference == "exact" else "backprop"))
    if inference == "mean_field" and converged:
        fd_kwargs["gradient_mode"] = "backprop"
    n_unary = unary.size

    def f(theta):
        return loss_and_grad(edges, theta[:n_unary].reshape(unary.shape), theta[n_unary:].reshape(pairwise.shape), labels, **fd_kwargs)[0]

    numeric = finite_difference_gradient(f, unary, pairwise, eps=1e-5)
    analytic = np.concatenate([grad_unary.ravel(), grad_pairwise.ravel()])
    assert relative_error(analytic, numeric) <= TOLERANCE.get((mode, sides), 1e-6)


@pytest.mark.parametrize("loss", ["pseudolikelihood", "piecewise"])
def test_inference_free_losses_match_finite_differences(loss):
    edges, unary, pairwise, labels = make_problem((3, 4), 2)
    value, gu, gp = loss_and_grad(edges, unary, pairwise, labels, loss=loss)
    n_unary = unary.size

    def f(theta):
        return loss_and_grad(edges, theta[:n_unary].reshape(unary.shape), theta[n_unary:].reshape(pairwise.shape), labels, loss=loss)[0]

    numeric = finite_difference_gradient(f, unary, pairwise, eps=1e-6)
    assert relative_error(np.concatenate([gu.ravel(), gp.ravel()]), numeric) <= 1e-7


@pytest.mark.parametrize("inference", ["trw", "lbp", "mean_field"])
@pytest.mark.parametrize("loss", ["univariate_logistic", "univariate_quadratic", "smooth_classification"])
def test_truncated_zero_iterations_is_the_independent_model(loss, inference):
    edges, unary, pairwise, labels = make_problem((3, 3), 3)
    value, gu, gp = loss_and_grad(edges, unary, pairwise, labels, loss=loss, inference=inference, n_iter=0)
    no_edges = np.zeros((0, 2), dtype=np.int64)
    ind_value, ind_gu, ind_gp = loss_and_grad(no_edges, unary, np.zeros((0, 3, 3)), labels, loss=loss, inference=inference, n_iter=0)
    assert value == pytest.approx(ind_value, rel=1e-12)
    np.testing.assert_allclose(gu, ind_gu, atol=1e-12)
    np.testing.assert_array_equal(gp, 0.0)
    if loss == "univariate_logistic":  # logistic regression by hand
        p = np.exp(unary - unary.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        seen = labels >= 0
        assert value == pytest.approx(-np.log(p[seen, labels[seen]]).sum())
        expected = p.copy()
        expected[seen, labels[seen]] -= 1
        expected[~seen] = 0
        np.testing.assert_allclose(gu, expected, atol=1e-12)


@pytest.mark.parametrize("mode", ["implicit", "perturbation"])
def test_exact_surrogate_likelihood_is_the_true_likelihood(mode):
    edges, unary, pairwise, labels = make_problem((3, 3), 4, n_states=2)
    labels[labels < 0] = 1
    value, gu, gp = loss_and_grad(edges, unary, pairwise, labels, loss="surrogate_likelihood", inference="exact", gradient_mode=mode)
    mu, mu2, log_z = brute_force(edges, unary, pairwise)
    score = unary[np.arange(9), labels].sum() + pairwise[np.arange(len(edges)), labels[edges[:, 0]], labels[edges[:, 1]]].sum()
    assert value == pytest.approx(log_z - score, abs=1e-10)
    f_unary = np.zeros_like(unary)
    f_unary[np.arange(9), labels] = 1
    f_pair = np.zeros_like(pairwise)
    f_pair[np.arange(len(edges)), labels[edges[:, 0]], labels[edges[:, 1]]] = 1
    np.testing.assert_allclose(gu, mu - f_unary, atol=1e-10)
    np.testing.assert_allclose(gp, mu2 - f_pair, atol=1e-10)


def test_exact_surrogate_em_is_the_true_marginal_likelihood():
    edges, unary, pairwise, labels = make_problem((3, 3), 5, n_states=2)
    labels[[0, 4]] = -1
    value, _, _ = loss_and_grad(edges, unary, pairwise, labels, loss="surrogate_likelihood", inference="exact", gradient_mode="implicit")
    scores, states = joint_scores(edges, unary, pairwise)
    seen = labels >= 0
    match = np.all(states[:, seen] == labels[seen], axis=1)
    log_z = np.log(np.exp(scores).sum())
    log_z_clamped = np.log(np.exp(scores[match]).sum())
    assert value == pytest.approx(log_z - log_z_clamped, abs=1e-10)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(loss="hinge"), "loss must be one of"),
        (dict(inference="bp"), "inference must be one of"),
        (dict(gradient_mode="autodiff"), "gradient_mode must be one of"),
        (dict(gradient_mode="implicit", inference="mean_field"), "implicit"),
        (dict(gradient_mode="truncated", inference="exact"), "exact"),
        (dict(alpha=0.0), "alpha"),
        (dict(alpha=-5.0), "alpha"),
        (dict(sides=3, gradient_mode="perturbation"), "sides"),
        (dict(multiplier=0.0, gradient_mode="perturbation"), "multiplier"),
        (dict(labels=np.array([0, 2, 0])), r"label 2 but n_states=2: labels must lie in \[0, 1\] \(-1 = hidden\)"),
        (dict(labels=np.array([0, -2, 0])), r"label -2: labels must be >= 0, or -1"),
        (dict(labels=np.array([0.0, 0.5, 1.0])), "integer labels.*not whole numbers"),
        (dict(labels=np.array([0.0, np.inf, 1.0])), "integer labels.*not whole numbers"),
        (dict(labels=np.array([0.0, np.nan, 1.0])), "integer labels.*not whole numbers"),
        (dict(labels=np.array(["a", "b", "c"])), "integer labels"),
        (dict(labels=np.array([0, 1])), "labels must have shape"),
        (dict(n_iter=None), "integer n_iter"),
        (dict(multiplier=1e-12, gradient_mode="perturbation"), "multiplier must be at least"),
        # no inference runs for these losses, but rho is still checked
        (dict(loss="pseudolikelihood", rho=-1.0), "rho must be positive"),
        (dict(loss="piecewise", rho="bogus"), "rho must be"),
        (dict(loss="pseudolikelihood", inference="mean_field", rho=0.5), "rho applies"),
    ],
)
def test_bad_input(kwargs, match):
    labels = kwargs.pop("labels", np.array([0, 1, -1]))
    with pytest.raises(ValueError, match=match):
        loss_and_grad([[0, 1], [1, 2]], np.zeros((3, 2)), np.zeros((2, 2, 2)), labels, **kwargs)


@pytest.mark.parametrize("which", ["unary", "pairwise"])
def test_complex_potentials_are_refused_not_cast(which):
    model = dict(unary=np.zeros((3, 2)), pairwise=np.zeros((2, 2, 2)))
    model[which] = model[which] + 1j
    with pytest.raises(TypeError, match=f"{which} must be an array of real numbers"):
        loss_and_grad([[0, 1], [1, 2]], model["unary"], model["pairwise"], [0, 1, -1])


@pytest.mark.parametrize("sides", [1, 2, 4])
def test_smallest_multiplier_still_moves_theta(sides):
    # At m = eps**(2/3) the largest step component is eps * (1 + ||theta||):
    # the perturbed inference differs and the gradient is not exactly zero
    # (below it, theta +- r g can round back to theta).
    edges, unary, pairwise, labels = make_problem((2, 2), 7, n_states=2)
    _, grad_unary, _ = loss_and_grad(edges, unary, pairwise, labels, inference="trw", gradient_mode="perturbation",
                                     tol=1e-12, sides=sides, multiplier=MIN_MULTIPLIER)
    assert np.all(np.isfinite(grad_unary)) and np.any(grad_unary != 0)


@pytest.mark.parametrize("loss", ["pseudolikelihood", "piecewise"])
def test_inference_free_losses_ignore_the_iteration_count(loss):
    # documented: these losses ignore inference and gradient_mode, so the
    # truncated mode's need for an integer n_iter does not apply
    edges, unary, pairwise, labels = make_problem((2, 3), 8, n_states=2)
    expected = loss_and_grad(edges, unary, pairwise, labels, loss=loss, n_iter=5)
    got = loss_and_grad(edges, unary, pairwise, labels, loss=loss, n_iter=None)
    assert got[0] == expected[0]
    np.testing.assert_array_equal(got[1], expected[1])
    np.testing.assert_array_equal(got[2], expected[2])


def test_every_documented_loss_is_accepted():
    edges, unary, pairwise, labels = make_problem((2, 2), 6, n_states=2)
    for loss in LOSSES:
        value, gu, gp = loss_and_grad(edges, unary, pairwise, labels, loss=loss, n_iter=3)
        assert np.isfinite(value) and gu.shape == unary.shape and gp.shape == pairwise.shape


@pytest.mark.parametrize("inference", ["trw", "lbp", "mean_field"])
@pytest.mark.parametrize("tol", [1e-4, 1e-6])
def test_backprop_gradient_is_as_accurate_as_its_threshold(inference, tol):
    # Inference and the reverse sweeps both stop at tol: the gradient differs
    # from the one at convergence by the order of tol, not more.
    edges, unary, pairwise, labels = make_problem((6, 6), 5)
    kwargs = dict(inference=inference, gradient_mode="backprop", max_iter=100000)
    converged = loss_and_grad(edges, unary, pairwise, labels, tol=1e-12, **kwargs)
    loose = loss_and_grad(edges, unary, pairwise, labels, tol=tol, **kwargs)
    exact = np.concatenate([converged[1].ravel(), converged[2].ravel()])
    approx = np.concatenate([loose[1].ravel(), loose[2].ravel()])
    assert np.abs(approx - exact).max() <= 10 * tol * np.abs(exact).max()


def frustrated_problem():
    """A frustrated, strongly coupled 4x4 grid on which loopy BP does not
    converge: stack-free reverse sweeps at its last messages do not either."""
    rng = np.random.default_rng(245)
    edges = grid_edges(4, 4)
    unary, pairwise = rng.normal(0, 0.3, (16, 2)), rng.normal(0, 2.5, (len(edges), 2, 2))
    return edges, unary, pairwise, rng.integers(0, 2, 16)


@pytest.mark.filterwarnings("ignore:gradient_mode='backprop'. lbp inference did not converge:RuntimeWarning")
def test_backprop_falls_back_to_the_stored_iterations_when_reverse_sweeps_diverge():
    edges, unary, pairwise, labels = frustrated_problem()
    with pytest.warns(BackpropFallbackWarning, match="forward iterations"):
        value, gu, gp = loss_and_grad(edges, unary, pairwise, labels, inference="lbp", gradient_mode="backprop", tol=1e-3)
    n_iter = infer(edges, unary, pairwise, method="lbp", tol=1e-3).n_iter
    expected = loss_and_grad(edges, unary, pairwise, labels, inference="lbp", gradient_mode="truncated", n_iter=n_iter)
    # (a fixed count on this grid runs the grid kernels, the run to tol the slot kernels: equal up to rounding)
    assert value == pytest.approx(expected[0], rel=1e-13, abs=0)
    np.testing.assert_allclose(gu, expected[1], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(gp, expected[2], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("gradient_mode", ["perturbation", "implicit"])
def test_fixed_point_gradient_modes_warn_when_inference_did_not_converge(gradient_mode):
    # Loopy BP on a frustrated, strongly coupled grid does not converge; the
    # perturbation and implicit gradients assume a fixed point and must say so.
    rng = np.random.default_rng(0)
    edges = grid_edges(6, 6)
    unary = rng.normal(size=(36, 2)) * 0.1
    signs = rng.choice([-1.0, 1.0], len(edges))[:, None, None]
    pairwise = np.tile([[1.0, -1.0], [-1.0, 1.0]], (len(edges), 1, 1)) * signs * 3.0
    labels = rng.integers(0, 2, 36)
    assert not infer(edges, unary, pairwise, method="lbp", max_iter=200).converged
    kwargs = dict(inference="lbp", gradient_mode=gradient_mode)
    with pytest.warns(RuntimeWarning, match=f"gradient_mode='{gradient_mode}': lbp inference did not converge"):
        loss_and_grad(edges, unary, pairwise, labels, max_iter=200, **kwargs)
    # a weakly coupled model converges and gives no warning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loss_and_grad(edges, unary, pairwise / 10, labels, max_iter=200, **kwargs)


@pytest.mark.parametrize("kernel", ["trw", "mean_field"])
def test_fixed_point_backward_can_raise_instead_of_warning(kernel):
    edges, unary, pairwise, labels = make_problem((3, 3), 7)
    if kernel == "trw":
        from sklearn_margcrf.trw import trw_backward as backward, trw_forward

        state = trw_forward(edges, unary, pairwise, np.full(len(edges), 0.5), tol=1e-12)
    else:
        from sklearn_margcrf.mean_field import mean_field_backward as backward, mean_field_forward

        state = mean_field_forward(edges, unary, pairwise, tol=1e-12)
    grad = np.random.default_rng(0).normal(size=unary.shape)  # not constant: its backnorm is not zero
    with pytest.raises(BackpropDivergenceError, match="did not converge"):
        backward(state, grad, None, mode="fixed_point", tol=1e-14, max_iter=1, on_divergence="raise")
    with pytest.warns(RuntimeWarning, match="did not converge"):
        backward(state, grad, None, mode="fixed_point", tol=1e-14, max_iter=1)


@pytest.mark.parametrize("loss", ["clique_logistic", "univariate_logistic"])
def test_truncated_trw_gradient_stays_finite_at_large_parameters(loss):
    # |theta| ~ 190 on 8-node graphs: messages and the normalisers of their
    # updates get tiny together, and back TRW used to overflow to NaN
    rng = np.random.default_rng(0)
    for _ in range(20):
        pairs = [(i, j) for i in range(8) for j in range(i + 1, 8) if rng.random() < 0.35]
        edges = np.array(pairs, dtype=np.int64).reshape(-1, 2)
        unary, pairwise = random_model(edges, 8, 3, rng, scale=190.0)
        labels = rng.integers(0, 3, size=8)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # messages at the floor
            value, grad_unary, grad_pairwise = loss_and_grad(edges, unary, pairwise, labels, loss=loss, n_iter=10)
        assert np.isfinite(value)
        assert np.all(np.isfinite(grad_unary)) and np.all(np.isfinite(grad_pairwise))


def test_implicit_gradient_at_saturated_marginals_is_refused_with_a_remedy():
    # |theta| ~ 500 on a chain: marginals of 0 make the KKT system singular
    edges = chain_edges(5)
    unary, pairwise = random_model(edges, 5, 2, np.random.default_rng(0), scale=500.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # messages at the floor
        with pytest.raises(ValueError, match="numerically singular.*use gradient_mode='truncated' or 'backprop'"):
            loss_and_grad(edges, unary, pairwise, np.zeros(5, dtype=np.int64), loss="univariate_quadratic",
                          gradient_mode="implicit", n_iter=None)
