"""Mean field in float32, with a checkpointed stack, and without the GIL."""

import warnings

import numba
import numpy as np
import pytest

from reference import random_model
from sklearn_margcrf import mean_field
from sklearn_margcrf._graph import grid_edges
from sklearn_margcrf.exceptions import BackpropDivergenceError
from sklearn_margcrf.mean_field import _mean_field_forward, mean_field_backward, mean_field_forward

DTYPES = [np.float32, np.float64]


def grid_problem(n_states, seed, scale=1.0, shape=(4, 5), dtype=np.float64):
    rng = np.random.default_rng(seed)
    edges = grid_edges(*shape)
    unary, pairwise = random_model(edges, shape[0] * shape[1], n_states, rng, scale=scale)
    grads = (rng.normal(size=unary.shape), rng.normal(size=pairwise.shape))
    return edges, unary.astype(dtype), pairwise.astype(dtype), grads


def relative_error(a, b):
    return np.linalg.norm(np.ravel(a) - np.ravel(b)) / np.linalg.norm(np.ravel(b))


def assert_identical(got, expected):
    for a, b in zip(got, expected):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)


# --------------------------------------------------------------------------- float32

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n_states", [2, 3])
def test_every_output_has_the_compute_dtype(dtype, n_states):
    edges, unary, pairwise, grads = grid_problem(n_states, 0, dtype=dtype)
    state = mean_field_forward(edges, unary, pairwise, n_iter=3, keep_stack=True)
    for array in (state.unary, state.pairwise, state.unary_marginals, state.initial_marginals,
                  state.pairwise_marginals, state.stack, state.stack_buffer):
        assert array.dtype == dtype
    # float64 adjoints are converted to the state's dtype, not the other way round
    for result in (mean_field_backward(state, *grads),
                   mean_field_backward(state, None, None)):
        assert [g.dtype for g in result] == [dtype, dtype]
    converged = mean_field_forward(edges, unary, pairwise, tol=1e-5)
    assert converged.converged and converged.unary_marginals.dtype == dtype
    result = mean_field_backward(converged, *grads, mode="fixed_point", tol=1e-6)
    assert [g.dtype for g in result] == [dtype, dtype]
    checkpointed = mean_field_forward(edges, unary, pairwise, n_iter=5, keep_stack=True,
                                      checkpoints=2)
    assert checkpointed.stack_buffer.dtype == dtype
    assert [g.dtype for g in mean_field_backward(checkpointed, *grads)] == [dtype, dtype]


@pytest.mark.parametrize("n_states", [2, 3, 5])
def test_float32_agrees_with_float64(n_states):
    edges, unary, pairwise, grads = grid_problem(n_states, 1, shape=(6, 7))
    for n_iter in (1, 5, 20):
        results = {}
        for dtype in DTYPES:
            state = mean_field_forward(edges, unary.astype(dtype), pairwise.astype(dtype),
                                       n_iter=n_iter, keep_stack=True)
            results[dtype] = (state.unary_marginals,) + mean_field_backward(state, *grads)
        mu32, gu32, gp32 = results[np.float32]
        mu64, gu64, gp64 = results[np.float64]
        np.testing.assert_allclose(mu32, mu64, rtol=0, atol=1e-5)
        assert relative_error(gu32, gu64) < 1e-4
        assert relative_error(gp32, gp64) < 1e-4


@pytest.mark.parametrize("n_states", [2, 3])
def test_float32_fixed_point_agrees_with_float64(n_states):
    edges, unary, pairwise, grads = grid_problem(n_states, 2, shape=(5, 6))
    pairwise = 0.5 * pairwise
    results = {}
    for dtype, tol in ((np.float32, 1e-7), (np.float64, 1e-13)):
        state = mean_field_forward(edges, unary.astype(dtype), pairwise.astype(dtype), tol=tol)
        assert state.converged
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            results[dtype] = (state.unary_marginals,) + mean_field_backward(
                state, *grads, mode="fixed_point", tol=tol)
    mu32, gu32, gp32 = results[np.float32]
    mu64, gu64, gp64 = results[np.float64]
    np.testing.assert_allclose(mu32, mu64, rtol=0, atol=1e-5)
    assert relative_error(gu32, gu64) < 1e-4
    assert relative_error(gp32, gp64) < 1e-4


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n_states", [2, 4])
def test_large_parameters_are_stable_in_either_dtype(dtype, n_states):
    """The max shift keeps every marginal finite and normalised for |theta| up to 1e3."""
    edges, unary, pairwise, grads = grid_problem(n_states, 3, scale=1e3, dtype=dtype)
    atol = 10 * np.finfo(dtype).eps
    state = mean_field_forward(edges, unary, pairwise, n_iter=5, keep_stack=True, checkpoints=2)
    for mu in (state.initial_marginals, state.unary_marginals):
        assert np.all(np.isfinite(mu)) and np.all(mu >= 0)
        np.testing.assert_allclose(mu.sum(axis=1), 1.0, rtol=0, atol=atol)
    assert all(np.all(np.isfinite(g)) for g in mean_field_backward(state, *grads))
    converged = mean_field_forward(edges, unary, pairwise)
    assert converged.converged
    np.testing.assert_allclose(converged.unary_marginals.sum(axis=1), 1.0, rtol=0, atol=atol)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = mean_field_backward(converged, *grads, mode="fixed_point")
    assert all(np.all(np.isfinite(g)) for g in result)


@pytest.mark.parametrize("dtype", DTYPES)
def test_fixed_point_divergence_is_caught_before_overflow(dtype):
    """Adjoints that blow up stop the sweeps while still finite in either dtype."""
    edges, unary, pairwise, grads = grid_problem(2, 4, dtype=dtype)
    # strong couplings at the uniform marginals: the reverse sweeps diverge
    state = mean_field_forward(edges, 0 * unary, 20 * pairwise, n_iter=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = mean_field_backward(state, *grads, mode="fixed_point", tol=1e-30, max_iter=100000)
    assert all(np.all(np.isfinite(g)) for g in result)
    assert np.abs(result[0]).max() > 1e20
    with pytest.warns(RuntimeWarning, match="not converged"), pytest.raises(BackpropDivergenceError):
        mean_field_backward(state, *grads, mode="fixed_point", max_iter=100000,
                            on_divergence="raise")


# --------------------------------------------------------------------------- checkpoints

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n_states", [2, 3])
@pytest.mark.parametrize("n_iter", [1, 2, 5, 8, 13])
def test_checkpointed_gradient_equals_full_stack(dtype, n_states, n_iter):
    edges, unary, pairwise, grads = grid_problem(n_states, n_iter, dtype=dtype)
    full = mean_field_forward(edges, unary, pairwise, n_iter=n_iter, keep_stack=True)
    expected = mean_field_backward(full, *grads)
    for checkpoints in sorted({1, 2, 3, max(n_iter - 1, 1), n_iter, n_iter + 5}):
        state = mean_field_forward(edges, unary, pairwise, n_iter=n_iter, keep_stack=True,
                                   checkpoints=checkpoints)
        kept = min(checkpoints, n_iter)
        kept_iterations = state.checkpoint_plan.kept_iterations
        assert kept_iterations.shape == (kept,) and kept_iterations[0] == 0
        # the kept snapshots, and a work slot when checkpointed
        assert state.stack_buffer.shape == (kept + (kept < n_iter),) + unary.shape
        assert state.checkpointed == (kept < n_iter)
        np.testing.assert_array_equal(state.unary_marginals, full.unary_marginals)
        assert_identical(mean_field_backward(state, *grads), expected)
        # a second backward on the same state re-plans the overwritten snapshots
        assert_identical(mean_field_backward(state, *grads), expected)


def test_checkpoints_bound_the_stack_buffer():
    edges, unary, pairwise, grads = grid_problem(2, 5)
    state = mean_field_forward(edges, unary, pairwise, n_iter=200, keep_stack=True, checkpoints=14)
    assert state.stack_buffer.shape == (15,) + unary.shape  # 14 snapshots and the work slot
    assert mean_field_forward(edges, unary, pairwise, n_iter=200, keep_stack=True,
                              checkpoints=None).stack_buffer.shape == (200,) + unary.shape
    assert mean_field_forward(edges, unary, pairwise, n_iter=200,
                              checkpoints=14).stack_buffer is None


def test_checkpointed_stack_is_not_a_full_stack():
    edges, unary, pairwise, grads = grid_problem(3, 6)
    state = mean_field_forward(edges, unary, pairwise, n_iter=6, keep_stack=True, checkpoints=2)
    full = mean_field_forward(edges, unary, pairwise, n_iter=6, keep_stack=True)
    with pytest.raises(ValueError, match="checkpoints"):
        state.stack  # noqa: B018
    assert "2 checkpoints" in repr(state)
    np.testing.assert_array_equal(full.checkpoint_plan.kept_iterations, np.arange(6))
    plan = state.checkpoint_plan
    assert plan.kept_iterations.shape == (2,)
    for t in plan.kept_iterations:  # the kept snapshots
        np.testing.assert_array_equal(state.stack_buffer[plan.forward_slots[t], ::-1], full.stack[t])


def test_checkpoints_must_be_positive_integers():
    edges, unary, pairwise, grads = grid_problem(2, 7)
    for bad in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match="checkpoints"):
            mean_field_forward(edges, unary, pairwise, n_iter=3, keep_stack=True, checkpoints=bad)


@pytest.mark.parametrize("dtype", DTYPES)
def test_checkpointed_run_to_convergence(dtype):
    """n_iter=None with fewer snapshots: same iterations, marginals and gradient."""
    edges, unary, pairwise, grads = grid_problem(2, 8, dtype=dtype)
    full = mean_field_forward(edges, unary, 1.5 * pairwise, tol=1e-5, keep_stack=True)
    assert full.converged and full.n_iter > 3 and not full.checkpointed
    expected = mean_field_backward(full, *grads)
    checkpointed = mean_field_forward(edges, unary, 1.5 * pairwise, tol=1e-5, keep_stack=True,
                                      checkpoints=3)
    assert checkpointed.checkpoint_plan.kept_iterations.shape == (3,)
    # checkpoints=None over the memory budget keeps as many snapshots as fit
    budgeted = _mean_field_forward(edges, unary, 1.5 * pairwise, None, 1e-5, 1000, True, None,
                                   8 * unary.nbytes)
    assert budgeted.stack_buffer.shape[0] == 8
    for state in (checkpointed, budgeted):
        assert state.checkpointed
        assert (state.n_iter, state.converged, state.last_change) == (
            full.n_iter, full.converged, full.last_change)
        np.testing.assert_array_equal(state.unary_marginals, full.unary_marginals)
        assert_identical(mean_field_backward(state, *grads), expected)


def test_checkpointed_backward_leaves_fixed_point_mode_intact():
    edges, unary, pairwise, grads = grid_problem(3, 9)
    state = mean_field_forward(edges, unary, 0.5 * pairwise, n_iter=60, keep_stack=True,
                               checkpoints=4)
    assert state.converged
    before = mean_field_backward(state, *grads, mode="fixed_point")
    mean_field_backward(state, *grads)
    assert_identical(mean_field_backward(state, *grads, mode="fixed_point"), before)
    fresh = mean_field_forward(edges, unary, 0.5 * pairwise, n_iter=60)
    assert_identical(mean_field_backward(fresh, *grads, mode="fixed_point"), before)


# --------------------------------------------------------------------------- GIL

@pytest.mark.skipif(numba.config.DISABLE_JIT, reason="no kernels without the JIT")
def test_every_kernel_releases_the_gil():
    kernels = [value for value in vars(mean_field).values()
               if isinstance(value, numba.core.registry.CPUDispatcher)
               and value.py_func.__module__ == mean_field.__name__]
    assert len(kernels) >= 8
    for kernel in kernels:
        assert kernel.targetoptions.get("nogil"), kernel.py_func.__name__
