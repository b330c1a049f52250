"""Gradient speed and memory of truncated TRW + back TRW, one thread.

200 x 300 4-connected grid, theta uniform in [-1, 1], rho = 0.5, univariate
logistic loss ``-sum_i log mu_i(label_i)`` with random labels. Prints:

1. for K = 2 and 8, float64 and float32, 20 iterations: the forward pass
   alone and forward(keep_stack) + backward, in fresh memory and with the
   scratch arrays of the previous run reused (as the per-image computations
   of a fit run), minimum over ``--repeat`` runs of
   the CPU time (``time.process_time``; steadier than wall time on a shared
   machine), and the peak extra memory of forward + backward: the growth of
   the process's peak resident set over a run, measured in a fresh process
   per configuration (so numba's own allocations count too);
2. K = 2 at n_iter = 200: the full stack against ``checkpoints=14``, for
   truncated TRW and for truncated mean field;
3. two threads, each computing ``loss_and_grad`` of its own image, against
   the same two calls one after the other (the kernels release the GIL),
   and the same for a scalar loop and a memory-bound triad: what two
   threads of this machine give code that needs no memory and code that
   needs nothing else;
4. equal-accuracy speed: iterations and seconds until every unary marginal is
   within 1e-3 of the converged ones, for our sequential schedule and for a
   flooding (parallel-update) schedule written here for comparison.

    python benchmarks/bench_gradients.py [--repeat R] [--iters N] [--only SECTION]
"""

import concurrent.futures
import math
import resource
import sys
import time

from _common import best_time, grid_arguments, random_grid_model  # noqa: E402 (sets up sys.path)

import numpy as np  # noqa: E402
from numba import njit  # noqa: E402

from sklearn_margcrf import loss_and_grad  # noqa: E402
from sklearn_margcrf._workspace import workspace  # noqa: E402
from sklearn_margcrf.mean_field import mean_field_backward, mean_field_forward  # noqa: E402
from sklearn_margcrf.trw import trw_backward, trw_forward  # noqa: E402


def problem(height, width, K, dtype, seed=0):
    edges, unary, pairwise, rng = random_grid_model(height, width, K, seed=seed)
    rho = np.full(len(edges), 0.5)
    labels = rng.integers(0, K, size=height * width)
    return edges, unary.astype(dtype), pairwise.astype(dtype), rho, labels


def logistic_adjoint(unary_marginals, labels):
    """dL/dmu of the univariate logistic loss ``-sum_i log mu_i(label_i)``."""
    rows = np.arange(len(labels))
    g_mu = np.zeros_like(unary_marginals)
    g_mu[rows, labels] = -1 / unary_marginals[rows, labels]
    return g_mu


def gradient(edges, unary, pairwise, rho, labels, n_iter, checkpoints=None):
    state = trw_forward(edges, unary, pairwise, rho, n_iter=n_iter, keep_stack=True, checkpoints=checkpoints)
    return trw_backward(state, logistic_adjoint(state.unary_marginals, labels), None, mode="truncated")


def mean_field_gradient(edges, unary, pairwise, rho, labels, n_iter, checkpoints=None):
    """:func:`gradient` with mean field (``rho`` unused)."""
    state = mean_field_forward(edges, unary, pairwise, n_iter=n_iter, keep_stack=True, checkpoints=checkpoints)
    return mean_field_backward(state, logistic_adjoint(state.unary_marginals, labels), None, mode="truncated")


def in_workspace(func, *args):
    """``func(*args)`` with the scratch arrays of the previous call reused, as
    the per-image computations of a fit run (``sklearn_margcrf._workspace``):
    no fresh pages to fault in."""
    with workspace():
        func(*args)


def peak_extra_memory(edges, unary, pairwise, rho, labels, n_iter, checkpoints=None, run=gradient):
    """Peak memory of one forward + backward (``run``) beyond its inputs (MB):
    what numpy allocates (tracemalloc) plus what the TRW kernels allocate
    themselves, which tracemalloc does not see: the forward's previous
    marginals (n x K; mean field's kernels allocate K values)."""
    import tracemalloc

    run(edges, unary, pairwise, rho, labels, 1, checkpoints)  # compile outside the measurement
    tracemalloc.start()
    try:
        run(edges, unary, pairwise, rho, labels, n_iter, checkpoints)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    n, K = unary.shape
    return (peak + (n * K * unary.itemsize if run is gradient else 0)) / 1e6


def section_speed(args):
    print(f"1. truncated TRW, {args.iters} iterations, {args.height}x{args.width}, rho=0.5, univariate logistic; "
          f"minimum CPU seconds of {args.repeat} runs; peak extra memory beyond the inputs")
    for K in (2, 8):
        for dtype in ("float64", "float32"):
            edges, unary, pairwise, rho, labels = problem(args.height, args.width, K, getattr(np, dtype))
            _, forward = best_time(lambda: trw_forward(edges, unary, pairwise, rho, n_iter=args.iters), args.repeat)
            _, both = best_time(lambda: gradient(edges, unary, pairwise, rho, labels, args.iters), args.repeat)
            _, reused = best_time(lambda: in_workspace(gradient, edges, unary, pairwise, rho, labels, args.iters),
                                  args.repeat)
            memory = peak_extra_memory(edges, unary, pairwise, rho, labels, args.iters)
            print(f"   K={K} {dtype}: forward {forward:.3f} s, forward+backward {both:.3f} s "
                  f"({reused:.3f} s with scratch memory reused, as in a fit), peak extra memory {memory:.0f} MB")


def section_checkpoints(args):
    n_iter = 200
    print(f"2. checkpointed reverse mode, K=2, n_iter={n_iter}")
    for method, run in (("", gradient), ("mean field ", mean_field_gradient)):
        for dtype in ("float64", "float32"):
            edges, unary, pairwise, rho, labels = problem(args.height, args.width, 2, getattr(np, dtype))
            for checkpoints in (None, 1):  # compile both paths (1 of 2 iterations: checkpointed)
                run(edges, unary, pairwise, rho, labels, 2, checkpoints)
            # pairs of runs, full stack then checkpointed, back to back (the
            # ratio within a pair is what the machine's drift does not
            # reach), in fresh memory and with the scratch memory reused
            ratios, runs = {}, {}
            for reuse in (False, True):
                times = {n_iter: [], 14: []}
                for _ in range(max(args.repeat // 2, 2)):
                    for checkpoints in times:
                        start = time.process_time()
                        if reuse:
                            in_workspace(run, edges, unary, pairwise, rho, labels, n_iter, checkpoints)
                        else:
                            run(edges, unary, pairwise, rho, labels, n_iter, checkpoints)
                        times[checkpoints].append(time.process_time() - start)
                ratios[reuse] = np.divide(times[14], times[n_iter])
                runs[reuse] = times
            fresh = runs[False]
            for checkpoints in fresh:
                memory = peak_extra_memory(edges, unary, pairwise, rho, labels, n_iter, checkpoints, run)
                what = "full stack" if checkpoints == n_iter else f"checkpoints={checkpoints}"
                print(f"   {method}{dtype} {what}: {min(fresh[checkpoints]):.3f} s, peak extra memory {memory:.0f} MB")
            print(f"   {method}{dtype} time ratio checkpointed / full: median {np.median(ratios[False]):.2f} over "
                  f"{len(ratios[False])} pairs (range {ratios[False].min():.2f}-{ratios[False].max():.2f}); "
                  f"with scratch memory reused {np.median(ratios[True]):.2f} "
                  f"({ratios[True].min():.2f}-{ratios[True].max():.2f})")


def two_thread_speedup(one, inputs, repeat, pool):
    """Wall times of ``one(x)`` for both ``inputs`` one after the other and
    in the two threads of ``pool``, ``repeat`` pairs of the two back to
    back: the minima of each, and the speed-ups of the pairs (within a pair
    the machine's drift matters least)."""
    list(pool.map(one, inputs))  # compile, start the threads
    sequential, threaded = [], []
    for _ in range(repeat):
        start = time.perf_counter()
        for x in inputs:
            one(x)
        sequential.append(time.perf_counter() - start)
        start = time.perf_counter()
        list(pool.map(one, inputs))
        threaded.append(time.perf_counter() - start)
    return min(sequential), min(threaded), np.divide(sequential, threaded)


@njit(cache=True, nogil=True)
def _scalar_loop(n):
    """A chain of multiply-adds in registers: no memory traffic at all."""
    x = 0.0
    for _ in range(n):
        x = x * 0.9999999 + 1.0
    return x


@njit(cache=True, nogil=True)
def _triad(a, b, c, reps):
    """STREAM's triad ``a = b + s c``, ``reps`` times: memory traffic only."""
    for _ in range(reps):
        for i in range(a.size):
            a[i] = b[i] + 0.5 * c[i]


def section_threads(args):
    print(f"3. two threads, each loss_and_grad of its own {args.height}x{args.width} image (K=2, "
          f"{args.iters} TRW iterations, float64)")
    images = [problem(args.height, args.width, 2, np.float64, seed=s) for s in (1, 2)]

    def one(image):
        edges, unary, pairwise, rho, labels = image
        return loss_and_grad(edges, unary, pairwise, labels, rho=0.5, n_iter=args.iters)

    # the machine's own ceiling: two threads of code that needs no memory,
    # and of code that needs nothing else, over 16 MB per thread (about the
    # data a gradient streams through each iteration here; the last-level
    # cache is a few MB); the scalar loop lasts about as long as a gradient,
    # the triad about a quarter of it (1.4 ms a pass on the Zen 1 EPYC)
    n_triad = 2 ** 20 * 16 // 24
    triads = [tuple(np.ones(n_triad) for _ in range(3)) for _ in range(2)]
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        sequential, threaded, speedups = two_thread_speedup(one, images, args.repeat, pool)
        print(f"   one after the other {sequential:.3f} s, two threads {threaded:.3f} s: "
              f"speed-up {sequential / threaded:.2f}x (wall time, minima of {args.repeat}); {spread(speedups)}")
        reps = max(1, round(sequential / 2 / 0.005))
        _, _, scalar = two_thread_speedup(lambda k: _scalar_loop(reps * 2_000_000), (0, 1), args.repeat, pool)
        _, _, triad = two_thread_speedup(lambda k: _triad(*triads[k], reps), (0, 1), args.repeat, pool)
    print(f"   this machine's two threads: a scalar loop (no memory traffic) {spread(scalar)}; a STREAM triad over "
          f"16 MB per thread (memory traffic only) {spread(triad)}")


def spread(speedups):
    return f"pairs' speed-ups median {np.median(speedups):.2f}x ({speedups.min():.2f}-{speedups.max():.2f})"


@njit(cache=True, nogil=True)
def _flooding_iterations(edges, unary, pairwise, rho, n_iter, messages, mu):
    """TRW with the flooding schedule: every message of an iteration is
    computed from the previous iteration's messages. ``messages[c, s]`` is
    the message from edge c into node edges[c, s]; returns the unary
    marginals after ``n_iter`` iterations in ``mu``."""
    n, K = unary.shape
    E = edges.shape[0]
    belief = np.empty((n, K), unary.dtype)
    new = np.empty_like(messages)
    cav = np.empty(K, unary.dtype)
    table = np.empty_like(pairwise)  # exp((theta_c - max theta_c) / rho_c), once
    for c in range(E):
        top = pairwise[c].max()
        for a in range(K):
            for b in range(K):
                table[c, a, b] = math.exp((pairwise[c, a, b] - top) / rho[c])
    for it in range(n_iter + 1):
        for i in range(n):
            top = unary[i].max()
            for x in range(K):
                belief[i, x] = math.exp(unary[i, x] - top)
        for c in range(E):
            for s in range(2):
                v = edges[c, s]
                for x in range(K):
                    belief[v, x] *= messages[c, s, x] ** rho[c]
        if it == n_iter:
            break
        for c in range(E):
            for s in range(2):  # into edges[c, s], from u = edges[c, 1 - s]
                u = edges[c, 1 - s]
                for x in range(K):
                    cav[x] = belief[u, x] / messages[c, 1 - s, x]
                total = 0.0
                for xv in range(K):
                    acc = 0.0
                    for xu in range(K):
                        acc += (table[c, xu, xv] if s == 1 else table[c, xv, xu]) * cav[xu]
                    new[c, s, xv] = acc
                    total += acc
                for x in range(K):
                    new[c, s, x] = max(new[c, s, x] / total, 1e-300)
        messages[:] = new
    for i in range(n):
        total = belief[i].sum()
        for x in range(K):
            mu[i, x] = belief[i, x] / total


def flooding_marginals(edges, unary, pairwise, rho, n_iter):
    K = unary.shape[1]
    messages = np.full((len(edges), 2, K), 1.0 / K)
    mu = np.empty_like(unary)
    _flooding_iterations(edges, unary, pairwise, rho, n_iter, messages, mu)
    return mu


def iterations_to(run, reference, accuracy, limit=400):
    """Smallest n_iter whose marginals are within ``accuracy`` of ``reference``
    (doubling, then bisection)."""
    def close(k):
        return np.abs(run(k) - reference).max() < accuracy

    high = 1
    while not close(high):
        high *= 2
        if high > limit:
            return None
    low = high // 2
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if close(middle) else (middle, high)
    return high


def section_accuracy(args):
    print("4. equal accuracy: iterations and CPU seconds until every unary marginal is within 1e-3 of the "
          "converged TRW marginals (float64)")
    for K in (2, 8):
        edges, unary, pairwise, rho, _ = problem(args.height, args.width, K, np.float64)
        converged = trw_forward(edges, unary, pairwise, rho, tol=1e-9, max_iter=2000).unary_marginals
        schedules = {
            "ours (sequential)": lambda k: trw_forward(edges, unary, pairwise, rho, n_iter=k).unary_marginals,
            "flooding": lambda k: flooding_marginals(edges, unary, pairwise, rho, k),
        }
        for name, run in schedules.items():
            n = iterations_to(run, converged, 1e-3)
            if n is None:
                print(f"   K={K} {name}: not within 1e-3 after 400 iterations")
                continue
            _, seconds = best_time(lambda: run(n), max(args.repeat // 2, 2))
            print(f"   K={K} {name}: {n} iterations, {seconds:.3f} s")


SECTIONS = {"speed": section_speed, "checkpoints": section_checkpoints, "threads": section_threads,
            "accuracy": section_accuracy}


def main():
    args = grid_arguments(__doc__, extra=[("--only", dict(choices=sorted(SECTIONS), default=None))])
    for name, section in SECTIONS.items():
        if args.only in (None, name):
            section(args)
    print(f"(peak RSS of this process {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB)")


if __name__ == "__main__":
    main()
