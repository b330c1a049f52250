"""Fit-time benchmark of MarginalCRF: parallel speed-up and overhead outside the kernels.

Images: ``--horses N`` takes the first N Weizmann horse training images at
``--scale`` (default 0.5) with the paper's features (HorseFeatures, float32);
otherwise noisy binary images of ``--height`` x ``--width`` (the paper's
denoising noise model, n = 1.25). TRW with ``--n-iter`` truncated iterations,
univariate logistic loss, a fixed number of L-BFGS iterations (stopping rule
off, no early stop, no restart: every run follows the same trajectory, since
the fit does not depend on n_jobs or the backend).

Each backend (``--backends``: loky, threading, multiprocessing, dask-processes
= a Dask LocalCluster of 2 one-thread worker processes, dask-threads = one
worker process with 2 threads) fits twice, with ``--lbfgs-iter`` and with
one L-BFGS iteration; the differences of wall and kernel time between the two
are the cost of the iterations after the first, free of start-up (packing the
batches, starting workers, the first evaluation). Reported per backend:

* seconds per L-BFGS iteration, and the speed-up against n_jobs = 1;
* the median and range of the speed-up within ``--repeat`` pairs of a
  one-worker and a two-worker fit run back to back (steadier than the best
  times when the machine drifts), and the same with each fit's seconds per
  iteration timed inside its long fit (from the end of the first L-BFGS
  iteration to the end of the last, through the ``callback``), which does
  not see the start-up of the fits at all;
* the ratio of that time to the kernel time (seconds inside the per-image
  ``loss_and_grad``, summed over workers) divided by the workers: 1 would
  be a parallel map without overhead (target <= 1.15);
* that the weights are bit for bit those of n_jobs = 1.

Run on a quiet machine::

    python benchmarks/bench_fit.py --horses 16 [--scale 0.5] [--lbfgs-iter 6] [--repeat 3]
    python benchmarks/bench_fit.py [--images 8] [--height 100] [--width 150]
"""

import argparse
import contextlib
import os
import sys
import time
import warnings

import joblib
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir))

from sklearn.exceptions import ConvergenceWarning  # noqa: E402

from sklearn_margcrf._graph import grid_edges  # noqa: E402
from sklearn_margcrf.features import split_by_orientation  # noqa: E402
from sklearn_margcrf.estimator import MarginalCRF  # noqa: E402
from sklearn_margcrf.sample import CRFSample  # noqa: E402


def make_images(n_images, height, width, noise=1.25, seed=0):
    rng = np.random.default_rng(seed)
    edges = grid_edges(height, width)
    edge_features = split_by_orientation(np.ones((len(edges), 1)), (height, width))
    X, y = [], []
    for _ in range(n_images):
        x = np.zeros((height, width), dtype=np.int64)
        for _ in range(5):
            h = rng.integers(height // 5, height // 2 + 1)
            w = rng.integers(width // 5, width // 2 + 1)
            r0, c0 = rng.integers(0, height - h + 1), rng.integers(0, width - w + 1)
            x[r0 : r0 + h, c0 : c0 + w] ^= 1
        t = rng.uniform(size=x.shape)
        noisy = x * (1 - t**noise) + (1 - x) * t**noise
        node_features = np.stack([np.ones(x.size), noisy.ravel()], axis=1)
        X.append(CRFSample(node_features, edges, edge_features, grid_shape=x.shape))
        y.append(x)
    return X, y


def load_horses(data, n_images, scale):
    """The first ``n_images`` horse training images at ``scale``, with the paper's features."""
    from skimage.transform import resize

    from sklearn_margcrf.datasets import load_horses as load
    from sklearn_margcrf.features import HorseFeatures, reduced_shape

    horses = load(data, subset="train", max_images=n_images)
    images, labels = [], []
    for image, mask in zip(horses.images, horses.labels):
        if scale != 1:
            shape = reduced_shape(image.shape, scale)
            image = resize(image, shape + image.shape[2:], order=1, anti_aliasing=True, preserve_range=True).astype(image.dtype)
            mask = (resize(mask.astype(np.float64), shape, order=1, anti_aliasing=True) > 0.5).astype(np.int64)
        images.append(image)
        labels.append(mask)
    return HorseFeatures(dtype=np.float32).transform(images), labels


BACKENDS = ("loky", "threading", "multiprocessing", "dask-processes", "dask-threads")


# Dask's periodic work slowed down (see docs/scaling.rst): the event-loop
# tick of every server (20 ms), the system monitors (500 ms) and the nannies'
# memory monitors (100 ms), and work stealing (every 100 ms), none of which a
# fit of pinned tasks needs at that pace
DASK_QUIET = {
    "distributed.admin.tick.interval": "1s",
    "distributed.admin.system-monitor.interval": "5s",
    "distributed.worker.memory.monitor-interval": "5s",
    "distributed.scheduler.work-stealing": False,
}


@contextlib.contextmanager
def backend(name, dask_profiler=True, dask_quiet=False):
    """The joblib backend ``name`` with 2 workers (a Dask LocalCluster for the
    dask ones; ``dask_profiler=False``: with the workers' statistical profiler
    off; ``dask_quiet``: with ``DASK_QUIET``; see docs/scaling.rst)."""
    if not name.startswith("dask"):
        with joblib.parallel_config(backend=name):
            yield
        return
    import dask
    from dask.distributed import Client, LocalCluster

    processes = name == "dask-processes"
    config = {"distributed.worker.profile.enabled": dask_profiler, **(DASK_QUIET if dask_quiet else {})}
    with dask.config.set(config), LocalCluster(n_workers=2 if processes else 1,
                                                 threads_per_worker=1 if processes else 2, processes=True,
                                                 dashboard_address=None) as cluster, Client(cluster):
        with joblib.parallel_config(backend="dask"):
            yield


def fit(X, y, n_jobs, lbfgs_iter, n_iter, elapsed=None):
    """(the fitted estimator, its wall seconds); ``elapsed``: a list that
    receives the seconds since the fit's start at the end of each L-BFGS iteration."""
    estimator = MarginalCRF(
        inference="trw", loss="univariate_logistic", gradient_mode="truncated", n_iter=n_iter,
        max_iter=lbfgs_iter, lbfgs_tol=0.0, max_restarts=0, init="zeros", n_jobs=n_jobs, objective_tol=0.0,
        callback=None if elapsed is None else (lambda progress: elapsed.append(progress.elapsed)),
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        start = time.perf_counter()
        estimator.fit(X, y)
        wall = time.perf_counter() - start
    return estimator, wall


def iteration_cost(X, y, n_jobs, lbfgs_iter, n_iter, repeat):
    """(seconds per L-BFGS iteration after the first, kernel seconds per
    iteration summed over workers, the long fit, seconds per iteration after
    the first within the long fit), best of ``repeat``. The first two are
    differences between the long and the short fit; the last is timed
    inside the long fit, from the end of its first iteration to the end of
    its last, so that it does not see the start-up of either fit (on a
    cluster the images travel to the workers at each fit's start, and that
    time varies by more than an iteration's)."""
    best = None
    for _ in range(repeat):
        short, _ = fit(X, y, n_jobs, 1, n_iter)
        elapsed = []
        long, _ = fit(X, y, n_jobs, lbfgs_iter, n_iter, elapsed)
        n = long.n_iter_ - short.n_iter_
        wall = (long.fit_time_ - short.fit_time_) / n
        kernel = (long.kernel_time_ - short.kernel_time_) / n
        within = (elapsed[-1] - elapsed[0]) / (len(elapsed) - 1)
        if best is None or wall < best[0]:
            best = (wall, kernel, long, within)
    return best


def add_fit_arguments(parser, horses=None, lbfgs_iter=6):
    """The options of a fit on horse images that this benchmark and
    ``bench_dask_cpu.py`` share."""
    parser.add_argument("--horses", type=int, default=horses, help="use the first N horse training images")
    parser.add_argument("--data", default=os.path.join(os.path.dirname(__file__), os.pardir, os.pardir, "shared", "data"))
    parser.add_argument("--scale", type=float, default=0.5, help="horses: downscaling factor (default 0.5)")
    parser.add_argument("--lbfgs-iter", type=int, default=lbfgs_iter)
    parser.add_argument("--n-iter", type=int, default=20)
    parser.add_argument("--dask-profiler", choices=("on", "off"), default="on",
                        help="the Dask workers' statistical profiler (distributed.worker.profile; default on, "
                             "as Dask has it)")
    parser.add_argument("--dask-quiet", action="store_true",
                        help="slow down Dask's periodic work (event-loop tick 1 s, system and memory monitors 5 s, "
                             "no work stealing; see docs/scaling.rst)")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_fit_arguments(parser)
    parser.add_argument("--images", type=int, default=8)
    parser.add_argument("--height", type=int, default=100)
    parser.add_argument("--width", type=int, default=150)
    parser.add_argument("--backends", default="loky,threading,dask-processes,dask-threads",
                        help="comma-separated, among " + ", ".join(BACKENDS))
    parser.add_argument("--repeat", type=int, default=1,
                        help="timed pairs of fits per setting (best is kept); per backend, as many pairs of a "
                             "one-worker and a two-worker fit, whose ratios give the median speed-up")
    args = parser.parse_args(argv)
    backends = [b for b in args.backends.split(",") if b]
    unknown = set(backends) - set(BACKENDS)
    if unknown:
        parser.error(f"unknown backends {sorted(unknown)}; choose among {BACKENDS}")

    if args.horses:
        X, y = load_horses(args.data, args.horses, args.scale)
        what = f"{args.horses} horse images at scale {args.scale:g} ({sum(np.size(v) for v in y)} pixels)"
    else:
        X, y = make_images(args.images, args.height, args.width)
        what = f"{args.images} images of {args.height}x{args.width}"
    print(
        f"{what}, TRW n_iter={args.n_iter}, univariate logistic, {args.lbfgs_iter} L-BFGS iterations "
        f"(the first excluded); cpu_count={os.cpu_count()}", flush=True,
    )
    warm = [X[0], X[1]], [y[0], y[1]]
    fit(*warm, n_jobs=1, lbfgs_iter=1, n_iter=args.n_iter)  # numba caches
    wall1, kernel1, reference, _ = iteration_cost(X, y, 1, args.lbfgs_iter, args.n_iter, args.repeat)
    print(f"n_jobs=1              {wall1:7.3f} s/iteration  kernels {kernel1:7.3f} s  "
          f"wall / kernels {wall1 / kernel1:5.3f}", flush=True)
    for name in backends:
        with backend(name, args.dask_profiler == "on", args.dask_quiet):
            fit(*warm, n_jobs=2, lbfgs_iter=1, n_iter=args.n_iter)  # start the workers, compile there
            # pairs of fits, n_jobs=1 and 2, minutes apart at most: the
            # ratio within a pair does not see the machine drifting; the
            # order alternates (1 then 2, 2 then 1), so that a drift within
            # a pair does not favour one side
            ratios, in_fit, best = [], [], None
            for i in range(args.repeat):
                pair = {n_jobs: iteration_cost(X, y, n_jobs, args.lbfgs_iter, args.n_iter, 1)
                        for n_jobs in ((2, 1) if i % 2 else (1, 2))}
                one, one_in_fit = pair[1][0], pair[1][3]
                wall, kernel, model, two_in_fit = pair[2]
                ratios.append(one / wall)
                in_fit.append(one_in_fit / two_in_fit)
                if best is None or wall < best[0]:
                    best = (wall, kernel, model)
            wall, kernel, model = best
        same = np.array_equal(model.unary_coef_, reference.unary_coef_) and np.array_equal(
            model.pairwise_coef_, reference.pairwise_coef_)
        print(f"n_jobs=2 {name:<13} {wall:7.3f} s/iteration  speed-up {wall1 / wall:5.2f}x  "
              f"wall / (kernels / 2) {wall / (kernel / 2):5.3f}  (kernels against n_jobs=1: {kernel / kernel1:5.3f})  "
              f"weights {'identical' if same else 'DIFFER'}\n"
              f"   within pairs (n_jobs=1 and 2): {_spread(ratios)} over {len(ratios)} pairs\n"
              f"   timed inside the long fits: {_spread(in_fit)}", flush=True)


def _spread(ratios):
    """Median, range and values of speed-ups, for the report."""
    spread = (f"speed-up median {np.median(ratios):5.2f}x, range {min(ratios):5.2f}-{max(ratios):5.2f}x "
              f"({' '.join(f'{r:.2f}' for r in ratios)})")
    if min(ratios) <= 0:  # a long fit's iterations took less than the start-up's noise
        spread += " [meaningless: the iterations are too short at this size; raise --lbfgs-iter]"
    return spread

if __name__ == "__main__":
    main()
