"""Warm starts of inference between L-BFGS evaluations (``MarginalCRF(inference_warm_start=...)``).

Two measurements on one problem (``--data horses``: the first ``--images``
Weizmann horses at ``--scale``, ``HorseFeatures`` in float32, as
examples/horses.py makes them; ``--data synthetic``: the noisy images of
bench_fit.py):

``accuracy``
    The iterates ``w_0, w_1, ...`` of a cold fit (``--mode-of-path``). At each
    ``w_k`` (k >= 1) the objective's gradient of every gradient mode, started
    cold and started warm from where inference ended at ``w_{k-1}`` (as a warm
    fit does), against the implicit gradient at ``tol=1e-10``: relative error
    ``|g - g_ref| / |g_ref|`` (median and largest over the iterates) and the
    inference iterations of the evaluation.
``fit``
    Fits warm and cold, alternated (``--repeat`` pairs), per gradient mode:
    total inference iterations (``n_inference_iter_``; machine-independent),
    wall and CPU time (median; ``n_jobs=1``, so the CPU time is the fit's,
    the steadier figure on a shared machine), L-BFGS iterations, final
    objective, training error and the largest weight difference to the cold
    fit.
``dask``
    Fits warm and cold on a Dask ``LocalCluster`` (2 one-thread processes),
    where the ends travel with the tasks and results: wall time, the
    kernels' time summed over workers and the time outside them.

Run::

    python benchmarks/bench_warm_start.py [--data horses] [--images 16] [--scale 0.25]
        [--path PATH] [--inference trw] [--tol 1e-4] [--max-iter 30] [--repeat 1] [--part accuracy fit dask]
"""

import argparse
import time
import warnings

import _common  # noqa: F401  (single-threaded numba, the package on the path)
import numpy as np

from sklearn_margcrf import MarginalCRF
from sklearn_margcrf._parallel import ImageBatches
from sklearn_margcrf.estimator import _check_X, _check_y

MODES = ("backprop", "perturbation", "implicit")


def horses(n_images, scale, path):
    from skimage.transform import resize

    from sklearn_margcrf.datasets import load_horses
    from sklearn_margcrf.features import HorseFeatures, reduced_shape

    data = load_horses(path, subset="train", max_images=n_images)
    images, labels = [], []
    for image, mask in zip(data.images, data.labels):
        shape = reduced_shape(image.shape, scale)
        images.append(resize(image, shape + image.shape[2:], order=1, anti_aliasing=True,
                             preserve_range=True).astype(image.dtype))
        labels.append((resize(mask.astype(np.float64), shape, order=1, anti_aliasing=True) > 0.5).astype(np.int64))
    return HorseFeatures(dtype=np.float32).fit_transform(images), labels


def synthetic(n_images):
    from bench_fit import make_images

    return make_images(n_images, 60, 80)


def quiet_fit(model, X, y):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return model.fit(X, y)


def model(args, mode, warm, **extra):
    params = dict(inference=args.inference, gradient_mode=mode, tol=args.tol, max_iter=args.max_iter, reg=args.reg,
                  inference_warm_start=warm)
    return MarginalCRF(**dict(params, **extra))


def accuracy(args, X, y):
    iterates = []

    def record(progress):
        if progress.stage == "fit":
            iterates.append((progress.unary_coef, progress.pairwise_coef))

    quiet_fit(model(args, args.mode_of_path, False, callback=record), X, y)
    samples, _, _ = _check_X(X)
    labels, _ = _check_y(y, samples)
    # mean field has no implicit mode; its back-propagation at the fixed point is the same derivative
    exact_mode = "backprop" if args.inference == "mean_field" else "implicit"
    crf = model(args, exact_mode, False)
    shape_f, shape_g = iterates[0][0].shape, iterates[0][1].shape
    n_labelled = sum(int(np.count_nonzero(lab >= 0)) for lab in labels)
    reg = args.reg
    reference = crf.set_params(tol=1e-10, inference_max_iter=100000)._objective(crf.loss, args.inference, shape_f, shape_g)
    print(f"gradient error against {exact_mode} at tol=1e-10, at {len(iterates) - 1} iterates of a cold "
          f"{args.mode_of_path} fit (inference tol={args.tol:g}); iterations per evaluation")
    print(f"{'mode':>13} {'start':>5} {'median error':>13} {'max error':>10} {'iterations':>11}")
    with ImageBatches(samples, labels, 1) as batches:
        ref = [reference.loss_gradient(reference.pack(*w), batches, n_labelled, reg)[1] for w in iterates[1:]]
        for mode in MODES if args.inference != "mean_field" else MODES[:2]:
            objective = model(args, mode, True)._objective(crf.loss, args.inference, shape_f, shape_g)
            for warm in (False, True):
                errors, counts = [], []
                for k in range(1, len(iterates)):
                    w = objective.pack(*iterates[k])
                    if warm:
                        with objective.warm_starts(batches) as starts:
                            objective.loss_gradient(objective.pack(*iterates[k - 1]), batches, n_labelled, reg, starts)
                            _, grad, diagnostics, _ = objective.loss_gradient(w, batches, n_labelled, reg, starts)
                    else:
                        _, grad, diagnostics, _ = objective.loss_gradient(w, batches, n_labelled, reg)
                    errors.append(np.linalg.norm(grad - ref[k - 1]) / np.linalg.norm(ref[k - 1]))
                    counts.append(diagnostics.inference_iterations)
                print(f"{mode:>13} {'warm' if warm else 'cold':>5} {np.median(errors):13.2e} {max(errors):10.2e} "
                      f"{np.mean(counts):11.0f}")


def fits(args, X, y):
    print(f"fits of {args.max_iter} L-BFGS iterations, inference tol={args.tol:g}, {args.repeat} pair(s) alternated")
    print(f"{'mode':>13} {'start':>5} {'inference it.':>13} {'wall s':>7} {'CPU s':>6} {'L-BFGS it.':>10} "
          f"{'objective':>12} {'train err.':>10} {'max |dw|':>9}")
    quiet_fit(model(args, args.modes[0], True, max_iter=2), X, y)  # numba caches loaded before any timing
    for mode in args.modes:
        runs = {False: [], True: []}
        for _ in range(args.repeat):
            for warm in (False, True):
                cpu = time.process_time()
                fitted = quiet_fit(model(args, mode, warm), X, y)
                runs[warm].append((fitted, time.process_time() - cpu))
        cold = runs[False][0][0]
        for warm in (False, True):
            m = runs[warm][0][0]
            dw = max(np.abs(m.unary_coef_ - cold.unary_coef_).max(), np.abs(m.pairwise_coef_ - cold.pairwise_coef_).max())
            wall = np.median([r.fit_time_ for r, _ in runs[warm]])
            cpu = np.median([c for _, c in runs[warm]])
            print(f"{mode:>13} {'warm' if warm else 'cold':>5} {m.n_inference_iter_:13d} {wall:7.2f} {cpu:6.2f} "
                  f"{m.n_iter_:10d} {m.loss_curve_[-1]:12.8f} {1 - m.score(X, y):10.4f} {dw:9.2e}")


def dask(args, X, y):
    """Fits warm and cold on a Dask LocalCluster of 2 one-thread processes,
    where the ends travel with the tasks: wall time against the kernels' time."""
    import distributed
    import joblib

    mode = args.modes[0]
    print(f"Dask LocalCluster, 2 processes of 1 thread, {mode}, {args.max_iter} L-BFGS iterations")
    print(f"{'start':>5} {'inference it.':>13} {'wall s':>7} {'kernel s':>8} {'outside s':>9}")
    with distributed.LocalCluster(processes=True, n_workers=2, threads_per_worker=1, dashboard_address=None) as cluster:
        with distributed.Client(cluster), joblib.parallel_config(backend="dask"):
            quiet_fit(model(args, mode, True, max_iter=2, n_jobs=2), X, y)
            for _ in range(args.repeat):
                for warm in (False, True):
                    m = quiet_fit(model(args, mode, warm, n_jobs=2), X, y)
                    print(f"{'warm' if warm else 'cold':>5} {m.n_inference_iter_:13d} {m.fit_time_:7.2f} "
                          f"{m.kernel_time_:8.2f} {m.fit_time_ - m.kernel_time_ / 2:9.2f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", choices=("horses", "synthetic"), default="horses")
    parser.add_argument("--path", default=None, help="the horses' folder (default: load_horses' search)")
    parser.add_argument("--images", type=int, default=16)
    parser.add_argument("--scale", type=float, default=0.25)
    parser.add_argument("--inference", default="trw")
    parser.add_argument("--tol", type=float, default=1e-4)
    parser.add_argument("--reg", type=float, default=1e-3)
    parser.add_argument("--max-iter", type=int, default=30)
    parser.add_argument("--mode-of-path", default="implicit")
    parser.add_argument("--modes", nargs="+", default=list(MODES))
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--part", nargs="+", choices=("accuracy", "fit", "dask"), default=["accuracy", "fit"])
    args = parser.parse_args()
    start = time.perf_counter()
    X, y = horses(args.images, args.scale, args.path) if args.data == "horses" else synthetic(args.images)
    print(f"{args.data}: {len(X)} images, {sum(len(lab.ravel()) for lab in y)} pixels, {args.inference}, "
          f"features {time.perf_counter() - start:.1f} s")
    if "accuracy" in args.part:
        accuracy(args, X, y)
    if "fit" in args.part:
        fits(args, X, y)
    if "dask" in args.part:
        dask(args, X, y)


if __name__ == "__main__":
    main()
