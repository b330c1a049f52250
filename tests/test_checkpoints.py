"""Checkpointed reverse mode: the same gradients as the full stack, in less memory."""

import numpy as np
import pytest

from sklearn_margcrf import grid_edges, loss_and_grad
import heapq
import itertools

from sklearn_margcrf._checkpoints import STACK_MEMORY_BUDGET, checkpoint_plan
from sklearn_margcrf.mean_field import mean_field_forward
from sklearn_margcrf.trw import trw_forward


def model(K, dtype, seed=0):
    rng = np.random.default_rng(seed)
    edges = grid_edges(3, 4)
    unary = rng.normal(size=(12, K)).astype(dtype)
    pairwise = rng.normal(size=(len(edges), K, K)).astype(dtype)
    labels = rng.integers(0, K, 12)
    return edges, unary, pairwise, labels


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("inference,rho", [("trw", 0.5), ("trw", 0.7), ("lbp", None), ("mean_field", None)])
@pytest.mark.parametrize("loss", ["univariate_logistic", "clique_logistic", "surrogate_likelihood"])
@pytest.mark.parametrize("n_iter", [1, 7, 12])
def test_checkpointed_gradient_equals_full_stack(n_iter, loss, inference, rho, dtype):
    edges, unary, pairwise, labels = model(3, dtype)
    kw = dict(loss=loss, inference=inference, rho=rho, n_iter=n_iter)
    full = loss_and_grad(edges, unary, pairwise, labels, checkpoints=n_iter, **kw)
    for checkpoints in sorted({1, 2, 3, max(n_iter - 1, 1), n_iter + 5}):
        value, grad_unary, grad_pairwise = loss_and_grad(edges, unary, pairwise, labels, checkpoints=checkpoints, **kw)
        assert value == full[0]
        # the recomputed iterations repeat the forward pass's arithmetic exactly
        np.testing.assert_array_equal(grad_unary, full[1])
        np.testing.assert_array_equal(grad_pairwise, full[2])
    default = loss_and_grad(edges, unary, pairwise, labels, **kw)
    np.testing.assert_array_equal(default[1], full[1])


def test_checkpoints_bound_the_snapshots_kept():
    edges, unary, pairwise, _ = model(2, np.float64)
    rho = np.full(len(edges), 0.5)
    for n_iter, checkpoints in [(200, 14), (20, 3), (20, 1), (20, 20), (20, 50)]:
        state = trw_forward(edges, unary, pairwise, rho, n_iter=n_iter, keep_stack=True, checkpoints=checkpoints)
        kept = min(checkpoints, n_iter)
        assert len(state.checkpoint_plan.kept_iterations) == kept
        # the kept snapshots, and a work slot to recompute the others in
        assert state.stack_buffer.shape[0] == kept + (kept < n_iter)
        assert state.checkpointed == (kept < n_iter)
        if state.checkpointed:  # the per-iteration view exists only when every snapshot was kept
            with pytest.raises(ValueError, match="the stack is incomplete"):
                state.stack
        else:
            assert state.stack.shape[0] == n_iter
    for forward in (lambda **kw: trw_forward(edges, unary, pairwise, rho, **kw),
                    lambda **kw: mean_field_forward(edges, unary, pairwise, **kw)):
        assert forward(n_iter=200, keep_stack=True, checkpoints=14).stack_buffer.shape[0] == 15  # instead of 200


@pytest.mark.parametrize("inference", ["trw", "mean_field"])
def test_a_checkpointed_state_gives_the_same_gradient_twice(inference):
    """The backward pass recomputes snapshots into the slots of used
    checkpoints: a second backward from the same state must not see them."""
    from sklearn_margcrf.inference import KERNELS

    edges, unary, pairwise, _ = model(3, np.float64)
    rng = np.random.default_rng(5)
    g_mu, g_mu2 = rng.normal(size=unary.shape), rng.normal(size=pairwise.shape)
    kernel = KERNELS[inference]
    full = kernel.forward(edges, unary, pairwise, np.full(len(edges), 0.5), 9, 1e-6, 100, True, None)
    expected = kernel.backward(full, g_mu, g_mu2, mode="truncated")
    state = kernel.forward(edges, unary, pairwise, np.full(len(edges), 0.5), 9, 1e-6, 100, True, 3)
    for _ in range(3):
        got = kernel.backward(state, g_mu, g_mu2, mode="truncated")
        np.testing.assert_array_equal(got[0], expected[0])
        np.testing.assert_array_equal(got[1], expected[1])


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "all"])
def test_checkpoints_must_be_a_positive_integer(bad):
    edges, unary, pairwise, labels = model(2, np.float64)
    with pytest.raises(ValueError, match="checkpoints must be None or an integer >= 1"):
        loss_and_grad(edges, unary, pairwise, labels, checkpoints=bad)


def replay(plan):
    """Run a plan on iteration numbers instead of messages: assert that every
    reverse finds the snapshot of the iteration due next (last to first) in
    the slot it reads, and return the iterations recomputed."""
    slots = [None] * plan.n_slots
    for t, slot in enumerate(plan.forward_slots):
        if slot >= 0:
            slots[slot] = t
    due, recomputed = plan.n_iter - 1, 0
    for step in plan.steps:
        if step[0] == "advance":
            _, load, n_sweeps, store = step
            if load >= 0:
                slots[plan.work_slot] = slots[load]
            slots[plan.work_slot] += n_sweeps
            recomputed += n_sweeps
            if store >= 0:
                slots[store] = slots[plan.work_slot]
        else:
            for slot in step[1]:
                assert slots[slot] == due
                due -= 1
    assert due == -1
    return recomputed


def least_recomputation(n_iter, n_snapshots):
    """Exhaustive search (Dijkstra over every state of the slots) for the
    fewest recomputed iterations that reverse ``n_iter`` iterations with
    ``n_snapshots`` slots and a work slot, where the forward pass keeps any
    snapshots it likes (the first one always)."""
    start = [(0, frozenset(kept) | {0}, None, n_iter - 1)
             for size in range(n_snapshots) for kept in itertools.combinations(range(1, n_iter), size)]
    heapq.heapify(start)
    queue, done = start, set()
    while queue:
        cost, kept, work, due = heapq.heappop(queue)
        if due < 0:
            return cost
        if (kept, work, due) in done:
            continue
        done.add((kept, work, due))
        if due in kept or work == due:
            heapq.heappush(queue, (cost, kept, work, due - 1))
        for source in kept | ({work} if work is not None else set()):
            for target in range(source + 1, due + 1):
                moves = [kept] + [kept - evicted | {target} for evicted in [frozenset()] + [{k} for k in kept]]
                for new in moves:
                    if len(new) <= n_snapshots:
                        heapq.heappush(queue, (cost + target - source, frozenset(new), target, due))


@pytest.mark.parametrize("n_iter", [1, 2, 3, 5, 7])
def test_checkpoint_plans_are_right_and_optimal(n_iter):
    for checkpoints in range(1, n_iter + 2):
        plan = checkpoint_plan(n_iter, checkpoints, 1)
        assert replay(plan) == plan.recomputed
        assert plan.recomputed == (least_recomputation(n_iter, checkpoints) if checkpoints < n_iter else 0)


@pytest.mark.parametrize("n_iter", [20, 200, 1000])
def test_checkpoint_plans_of_long_truncations(n_iter):
    costs = []
    for checkpoints in [c for c in (1, 2, 3, 14, 30, n_iter - 1, n_iter) if c <= n_iter]:
        plan = checkpoint_plan(n_iter, checkpoints, 1)
        assert replay(plan) == plan.recomputed
        assert plan.n_slots == checkpoints + (checkpoints < n_iter)
        costs.append(plan.recomputed)
    assert costs == sorted(costs, reverse=True) and costs[-1] == 0  # more snapshots, less recomputation
    assert costs[0] == n_iter * (n_iter - 1) // 2  # one snapshot: each iteration from the first


def test_automatic_checkpoints_respect_the_budget():
    assert checkpoint_plan(200, None, STACK_MEMORY_BUDGET // 400).n_slots == 200  # everything fits: every one kept
    plan = checkpoint_plan(200, None, STACK_MEMORY_BUDGET // 30)
    assert plan.n_slots == 30 and plan.n_snapshots == 29  # as many as fit beside the work slot
    plan = checkpoint_plan(200, None, STACK_MEMORY_BUDGET)  # nothing fits: the least memory possible
    assert (plan.n_snapshots, plan.n_slots) == (1, 2)


def traced_peak(function):
    """Peak of the memory numpy allocates while ``function()`` runs (bytes),
    from a full garbage collection, which drops the scratch buffers that
    earlier calls kept for reuse."""
    import gc
    import tracemalloc

    gc.collect()
    tracemalloc.start()
    try:
        function()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("inference", ["trw", "mean_field"])
def test_loss_and_grad_checkpoints_reach_the_kernels(inference):
    """The gradient does not change, so the keyword shows in the memory: the
    full stack of 60 iterations is about 60 snapshots, 4 checkpoints need 5."""
    rng = np.random.default_rng(0)
    edges = grid_edges(40, 40)
    unary, pairwise = rng.normal(size=(1600, 2)), rng.normal(size=(len(edges), 2, 2))
    labels = rng.integers(0, 2, 1600)
    # TRW with two labels on a grid keeps one number per message, in planes
    # that include the absent neighbours (4 per pixel); mean field K per pixel
    snapshot = (4 * 1600 if inference == "trw" else 1600 * 2) * 8

    def peak(checkpoints):
        return traced_peak(lambda: loss_and_grad(edges, unary, pairwise, labels, inference=inference, n_iter=60,
                                                 checkpoints=checkpoints))

    peak(None), peak(4)  # compile (or load) both paths outside the measurement
    # 55 snapshots fewer; other arrays blur the peaks a little
    assert peak(None) - peak(4) >= 30 * snapshot


def test_estimator_checkpoints_reach_the_kernels():
    from sklearn_margcrf import MarginalCRF

    rng = np.random.default_rng(1)
    edges = grid_edges(40, 40)
    X = [(rng.normal(size=(1600, 3)), edges, np.ones((len(edges), 1)))]
    y = [rng.integers(0, 2, 1600)]

    def peak(checkpoints):
        model = MarginalCRF(n_iter=60, max_iter=1, init="zeros", checkpoints=checkpoints)
        with pytest.warns(Warning):  # max_iter reached
            return traced_peak(lambda: model.fit(X, y))

    peak(None), peak(4)  # compile (or load) both paths outside the measurement
    snapshot = 4 * 1600 * 8  # one number per message (see above)
    assert peak(None) - peak(4) >= 30 * snapshot
    with pytest.raises(ValueError, match="checkpoints"):
        MarginalCRF(checkpoints=0).fit(X, y)
