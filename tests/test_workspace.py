"""Scratch memory reused between the per-image computations of a fit and
between the calls of the public functions (``sklearn_margcrf._workspace``):
reuse within a thread, isolation between threads and from what callers
keep, bounded retention, release after a fit and once idle."""

import gc
import os
import threading
import time
import tracemalloc
import warnings
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from estimator_checks import make_structured_data

from sklearn_margcrf import MarginalCRF, grid_edges, infer, loss_and_grad
from sklearn_margcrf._workspace import _IDLE_SECONDS, keep_until_idle, release, scratch, workspace


def test_scratch_outside_a_workspace_is_fresh_memory():
    a = scratch((100, 3), np.float64)
    b = scratch((100, 3), np.float64)
    assert a.shape == (100, 3) and a.dtype == np.float64
    assert not np.shares_memory(a, b)


def test_workspaces_of_a_thread_reuse_the_buffers_of_earlier_ones():
    release()
    with workspace():
        a = scratch(1000, np.float64)
        b = scratch((10, 10), np.float32)
        assert not np.shares_memory(a, b)  # distinct within a workspace
        address = a.ctypes.data
    with workspace():
        c = scratch((30, 30), np.float64)  # smaller: fits the larger buffer
        d = scratch(1000, np.int64)
        assert not np.shares_memory(c, d)
        assert address in (c.ctypes.data, d.ctypes.data)
    release()


def test_threads_do_not_share_buffers():
    release()
    with workspace():
        scratch(5000, np.float64)
    seen = []

    def other():
        with workspace():
            seen.append(scratch(5000, np.float64))
            with workspace():  # nested: part of the outer one
                seen.append(scratch(5000, np.float64))
            assert not np.shares_memory(seen[0], seen[1])

    with workspace():
        mine = scratch(5000, np.float64)
        thread = threading.Thread(target=other)
        thread.start()
        thread.join()
        assert len(seen) == 2
        assert not any(np.shares_memory(mine, theirs) for theirs in seen)
    release()


def test_the_pool_keeps_at_most_one_and_a_quarter_of_the_largest_computation():
    release()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        for n in (10_000, 20_000, 40_000, 80_000, 10_000, 10_000):
            with workspace():
                scratch(n, np.float64)
                scratch(n // 2, np.float64)
        kept = tracemalloc.get_traced_memory()[0] - base
        largest = 80_000 * 1.5 * 8 * 1.125  # one computation's buffers, with their headroom
        assert 0.9 * largest < kept <= 1.25 * largest + 4096
        release()
        gc.collect()
        assert tracemalloc.get_traced_memory()[0] - base < 4096
    finally:
        tracemalloc.stop()


def test_the_pool_stays_bounded_when_small_arrays_take_large_buffers():
    """A small array handed a large free buffer makes the next large one take
    a new buffer; the pool's bound follows what the computations ask for, so
    such mismatches do not make it grow from one computation to the next."""
    release()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        rng = np.random.default_rng(0)
        asked = [(1_000_000, 100_000)] + [tuple(rng.permutation([150_000, 200_000, 250_000, 1_000_000]))
                                          for _ in range(30)]
        for sizes in asked:
            with workspace():
                for n in sizes:
                    scratch(n, np.uint8)
        kept = tracemalloc.get_traced_memory()[0] - base
        most = max(sum(sizes) for sizes in asked)
        assert kept <= 1.25 * (1.125 * most + 64) + 4096
        # what one computation asks for is still served from the pool
        with workspace():
            a = scratch(1_000_000, np.uint8)
            b = scratch(250_000, np.uint8)
        assert tracemalloc.get_traced_memory()[0] - base < kept + 4096  # no new buffer
        del a, b
    finally:
        release()
        tracemalloc.stop()


def test_gradients_computed_in_a_workspace_equal_those_outside():
    edges = grid_edges(6, 7)
    rng = np.random.default_rng(0)
    unary = rng.normal(size=(42, 2))
    pairwise = rng.normal(size=(len(edges), 2, 2))
    labels = rng.integers(0, 2, size=42)
    want = loss_and_grad(edges, unary, pairwise, labels, n_iter=5, rho=0.5)
    for _ in range(3):  # later workspaces reuse the buffers of earlier ones
        with workspace():
            got = loss_and_grad(edges, unary, pairwise, labels, n_iter=5, rho=0.5)
            assert got[0] == want[0]
            np.testing.assert_array_equal(got[1], want[1])
            np.testing.assert_array_equal(got[2], want[2])
    release()


def test_the_marginals_of_each_image_survive_the_computations_of_the_next():
    # one thread computes the images of a call one after the other, each in
    # the memory of the one before: what it returns must be copied out
    X, y = make_structured_data(n_samples=4, shape=(5, 6), n_states=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = MarginalCRF(max_iter=3, n_iter=5, n_jobs=1).fit(X, y)
        together = model.predict_proba(X)
        alone = [model.predict_proba(X[k:k + 1])[0] for k in range(len(X))]
    for p, q in zip(together, alone):
        np.testing.assert_array_equal(p, q)
    assert not np.array_equal(together[0], together[1])


def test_a_fit_leaves_no_scratch_memory_in_the_calling_thread():
    X, y = make_structured_data(n_samples=3, shape=(20, 30), n_states=2)
    model = MarginalCRF(max_iter=2, n_iter=10, n_jobs=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.fit(X, y)  # compile and warm up
        gc.collect()
        tracemalloc.start()
        try:
            base = tracemalloc.get_traced_memory()[0]
            model.fit(X, y)
            gc.collect()
            left = tracemalloc.get_traced_memory()[0] - base
        finally:
            tracemalloc.stop()
    # one image's scratch (its stack of 10 snapshots alone) is about 0.4 MB
    assert left < 100_000


def _traced_during(step):
    """Bytes traced by tracemalloc after ``step()`` and a collection, less
    those traced before (collections of the young generations: a full one
    drops kept buffers)."""
    gc.collect(1)
    base = tracemalloc.get_traced_memory()[0]
    step()
    gc.collect(1)
    return tracemalloc.get_traced_memory()[0] - base


def _one_task(n=200_000):
    """A task's computation: the address of its scratch buffer."""
    with workspace():
        return scratch(n, np.float64).ctypes.data


def test_kept_buffers_serve_the_next_task_and_go_when_none_comes():
    # what a cluster's worker does at the end of each task
    release()
    tracemalloc.start()
    try:
        address = _one_task()
        keep_until_idle(idle=1.0)
        assert _one_task() == address  # the next task, within the idle time
        keep_until_idle(idle=1.0)
        assert _traced_during(lambda: time.sleep(2.0)) <= -200_000 * 8  # dropped once idle
        address = _one_task()
        keep_until_idle(idle=60.0)
        assert _traced_during(lambda: time.sleep(0.2)) > -200_000 * 4  # kept meanwhile
        assert _traced_during(release) <= -200_000 * 8  # at once, whatever the timer
    finally:
        release()
        tracemalloc.stop()


def test_a_workspace_begun_before_the_idle_time_ends_keeps_the_buffers():
    release()
    address = _one_task()
    keep_until_idle(idle=0.05)
    with workspace():
        time.sleep(0.5)  # the timer fires while this workspace is open
        assert scratch(200_000, np.float64).ctypes.data == address
    time.sleep(0.5)  # and it did not drop them after the workspace either
    assert _one_task() == address
    release()


def test_a_full_garbage_collection_drops_kept_buffers_while_no_workspace_is_open():
    # loky collects garbage before it replaces a worker process for its
    # size: what a worker keeps between tasks must not count then
    release()
    tracemalloc.start()
    try:
        _one_task()
        keep_until_idle(idle=60.0)
        assert _traced_during(lambda: gc.collect(1)) > -200_000 * 4  # not a full collection: kept
        with workspace():
            assert _traced_during(gc.collect) > -200_000 * 4  # a workspace is open: kept
        keep_until_idle(idle=60.0)
        assert _traced_during(gc.collect) <= -200_000 * 8
        # buffers kept otherwise (a map's own threads keep theirs until its end) stay
        done, collected = threading.Event(), threading.Event()

        def thread():
            _one_task()
            done.set()
            collected.wait()

        other = threading.Thread(target=thread)
        other.start()
        done.wait()
        try:
            assert _traced_during(gc.collect) > -200_000 * 4
        finally:
            collected.set()
            other.join()
    finally:
        release()
        tracemalloc.stop()


# ---------------------------------------------------------------------------
# the public functions: each call's scratch serves the thread's next call
# ---------------------------------------------------------------------------


def _public_problem(seed, shape=(12, 15), n_states=2):
    edges = grid_edges(*shape)
    rng = np.random.default_rng(seed)
    n = shape[0] * shape[1]
    unary = rng.normal(size=(n, n_states))
    pairwise = rng.normal(size=(len(edges), n_states, n_states))
    return edges, unary, pairwise, rng.integers(0, n_states, size=n)


def _public_calls(problem):
    """What loss_and_grad and infer return for ``problem`` (arrays only)."""
    edges, unary, pairwise, labels = problem
    _, grad_unary, grad_pairwise = loss_and_grad(edges, unary, pairwise, labels, n_iter=5, rho=0.5)
    result = infer(edges, unary, pairwise, n_iter=5, rho=0.5)
    return [grad_unary, grad_pairwise, result.unary, result.pairwise, result.rho]


@pytest.mark.parametrize("n_states", [2, 3])
def test_what_a_public_call_returns_survives_the_next_call(n_states):
    first = _public_calls(_public_problem(0, n_states=n_states))
    kept = [np.copy(a) for a in first]
    second = _public_calls(_public_problem(1, n_states=n_states))  # in the scratch memory of the first
    for a, b in zip(first, kept):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(first[0], second[0])


def test_a_thread_reuses_the_scratch_of_its_last_public_call_until_a_full_collection():
    problem = _public_problem(0, shape=(40, 40))
    edges, unary, pairwise, labels = problem
    snapshots = 30 * 4 * 1600 * 8  # the stack of 30 iterations, one number per message (4 per pixel)
    loss_and_grad(edges, unary, pairwise, labels, n_iter=30, rho=0.5)  # compile or load outside the measurement
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        allocated = []  # the most memory a call allocated beyond what was allocated before it
        for _ in range(3):
            before = tracemalloc.get_traced_memory()[0]
            tracemalloc.reset_peak()
            loss_and_grad(edges, unary, pairwise, labels, n_iter=30, rho=0.5)
            allocated.append(tracemalloc.get_traced_memory()[1] - before)
        assert allocated[0] > snapshots
        assert allocated[2] < allocated[0] - snapshots  # the stack's buffer came from the call before
        assert tracemalloc.get_traced_memory()[0] - base > snapshots  # kept for the next call
        gc.collect()
        assert tracemalloc.get_traced_memory()[0] - base < snapshots / 10
    finally:
        tracemalloc.stop()


def test_the_scratch_of_public_calls_goes_once_the_thread_is_idle():
    problem = _public_problem(0, shape=(40, 40))
    _public_calls(problem)  # compile or load outside the measurement
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        _public_calls(problem)
        kept = tracemalloc.get_traced_memory()[0] - base
        time.sleep(_IDLE_SECONDS + 1.5)  # the timer fires at 2 s; a margin for a busy machine
        gc.collect(1)  # not a full collection
        assert tracemalloc.get_traced_memory()[0] - base < kept / 10
    finally:
        tracemalloc.stop()


def test_threads_calling_the_public_functions_at_once_get_their_own_results():
    problems = [_public_problem(seed) for seed in range(4)]
    want = [_public_calls(problem) for problem in problems]

    def calls(k):
        return [_public_calls(problems[k % 4]) for _ in range(5)]

    with ThreadPoolExecutor(2) as pool:
        got = list(pool.map(calls, range(8)))
    for k, runs in enumerate(got):
        for run in runs:
            for a, b in zip(run, want[k % 4]):
                np.testing.assert_array_equal(a, b)


def _forked_child_drops_when_idle(connection):
    release()  # the buffers inherited (allocated before tracemalloc started); the timer's object stays
    time.sleep(1.0)  # past the inherited timer's due time, so that only a new timer can drop what is kept now
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    _one_task()
    keep_until_idle(idle=0.2)
    kept = tracemalloc.get_traced_memory()[0] - base
    time.sleep(1.5)
    connection.send((kept, tracemalloc.get_traced_memory()[0] - base))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_process_drops_its_kept_buffers_when_idle():
    # joblib's multiprocessing backend forks on Linux: the child inherits the
    # parent's pool with its timer's object, but not the timer's thread
    import multiprocessing

    release()
    _one_task()
    keep_until_idle(idle=0.5)  # a timer running at the fork
    parent, child = multiprocessing.get_context("fork").Pipe()
    process = multiprocessing.get_context("fork").Process(target=_forked_child_drops_when_idle, args=(child,))
    process.start()
    try:
        assert parent.poll(30), "the forked child sent nothing"
        kept, left = parent.recv()
    finally:
        process.join(30)
        release()
    assert kept > 200_000 * 4  # the task's buffer was kept...
    assert left < kept - 200_000 * 4  # ...and dropped once the child was idle
