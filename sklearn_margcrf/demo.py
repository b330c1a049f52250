"""The README's main command: ``python -m sklearn_margcrf.demo [--out PATH]``.

Trains a CRF on the built-in binary denoising problem
(:func:`~sklearn_margcrf.datasets.make_denoising_problem`: seeded synthetic
shapes, the paper's noise ``y = x (1 - t**n) + (1 - x) t**n``, no download)
with the univariate logistic loss, TRW inference and truncated fitting (paper
Sec. "Truncated Fitting"), next to the independent model (per-pixel logistic
regression) and the surrogate likelihood fitted the same way; prints the test
errors and saves a figure of input, truth and predicted marginals.

Every step is a plain scikit-learn object::

    model = make_pipeline(DenoisingFeatures(),
                          MarginalCRF(loss="univariate_logistic", inference="trw",
                                      gradient_mode="truncated", n_iter=20))
    model.fit(train_images, train_labels)
    marginals = model.predict_proba(test_images)   # list of (H, W, 2)

Run ``python -m sklearn_margcrf.demo --help`` for the options.
"""

import argparse
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
from sklearn.exceptions import ConvergenceWarning

__all__ = ["main", "run_demo"]

DEFAULT_FIGURE = "sklearn_margcrf_demo.png"


def _models(n_iter, max_iter, reg, n_jobs):
    from sklearn.pipeline import make_pipeline

    from .estimator import MarginalCRF
    from .features import DenoisingFeatures

    common = dict(reg=reg, max_iter=max_iter, n_jobs=n_jobs)
    return [
        (
            "independent (per-pixel logistic)",
            make_pipeline(DenoisingFeatures(), MarginalCRF(inference="independent", **common)),
        ),
        (
            f"surrogate likelihood, TRW, truncated {n_iter} it.",
            make_pipeline(
                DenoisingFeatures(),
                MarginalCRF(
                    loss="surrogate_likelihood",
                    inference="trw",
                    gradient_mode="truncated",
                    n_iter=n_iter,
                    **common,
                ),
            ),
        ),
        (
            f"univariate logistic, TRW, truncated {n_iter} it.",
            make_pipeline(
                DenoisingFeatures(),
                MarginalCRF(
                    loss="univariate_logistic",
                    inference="trw",
                    gradient_mode="truncated",
                    n_iter=n_iter,
                    **common,
                ),
            ),
        ),
    ]


def _error(model, images, labels):
    """Hamming error over the labelled pixels of all images (1 - ``model.score``)."""
    wrong = total = 0
    for predicted, truth in zip(model.predict(images), labels):
        truth = np.asarray(truth)
        mask = truth >= 0
        wrong += int(np.sum(np.asarray(predicted)[mask] != truth[mask]))
        total += int(mask.sum())
    return wrong / max(total, 1)


def _figure_path(out):
    """``out`` if given; else the current directory if writable, else a temp dir."""
    if out is not None:
        path = Path(out).expanduser()
        path.parent.mkdir(parents=True, exist_ok=True)
        return path.resolve()
    if os.access(os.getcwd(), os.W_OK):
        return (Path.cwd() / DEFAULT_FIGURE).resolve()
    return Path(tempfile.mkdtemp(prefix="sklearn_margcrf_")) / DEFAULT_FIGURE


def _save_figure(path, images, labels, rows):
    """One row per test image: noisy input, truth, P(x = 1) of each model."""
    from matplotlib.figure import Figure  # no pyplot: no global backend state

    from .plot import plot_marginals

    n_rows = len(images)
    n_cols = 2 + len(rows)
    figure = Figure(figsize=(2.3 * n_cols, 2.0 * n_rows + 0.4), layout="constrained")
    axes = np.asarray(figure.subplots(n_rows, n_cols, squeeze=False))
    titles = ["noisy input", "truth"] + [name.replace(", ", ",\n", 1) for name, _ in rows]
    for r in range(n_rows):
        shown = titles if r == 0 else [""] * n_cols  # titles on the first row only
        plot_marginals(images[r], None, truth=labels[r], ax=axes[r, :2], titles=shown[:2], legend=False)
        for c, (_, marginals) in enumerate(rows, start=2):
            plot_marginals(None, marginals[r], states=[1], ax=axes[r, c], titles=shown[c : c + 1])
    for axis in axes[0]:
        axis.title.set_fontsize(8)
    figure.suptitle("Binary denoising: predicted marginals P(x = 1)", fontsize=10)
    figure.savefig(path, dpi=100)
    return path


def run_demo(
    *,
    n_train=10,
    n_test=10,
    shape=(60, 80),
    noise=1.25,
    n_iter=20,
    max_iter=100,
    reg=1e-3,
    n_jobs=None,
    random_state=0,
    out=None,
    n_show=3,
    stream=None,
):
    """Fit the three models, print their errors, save the figure.

    Returns
    -------
    results : dict
        ``errors`` ({model name: (train error, test error)}), ``fit_times``
        ({name: seconds}) and ``figure`` (the saved figure's path).
    """
    from .datasets import make_denoising_problem

    stream = sys.stdout if stream is None else stream

    def say(text=""):
        print(text, file=stream, flush=True)

    images, labels = make_denoising_problem(
        n_train + n_test, shape=shape, noise=noise, random_state=random_state
    )
    train_x, train_y = images[:n_train], labels[:n_train]
    test_x, test_y = images[n_train:], labels[n_train:]
    say(
        f"Binary denoising (paper Sec. 'Binary Denoising Data') on synthetic shapes: "
        f"{n_train} training and {n_test} test images of {shape[0]}x{shape[1]}, noise n = {noise}"
    )
    say(f"{'model':<44}{'train err':>10}{'test err':>10}{'fit (s)':>9}")
    errors, fit_times, shown = {}, {}, []
    stopped_early = False
    n_show = min(n_show, n_test)
    for name, model in _models(n_iter, max_iter, reg, n_jobs):
        start = time.perf_counter()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ConvergenceWarning)
            model.fit(train_x, train_y)
        fit_times[name] = time.perf_counter() - start
        if any(issubclass(w.category, ConvergenceWarning) for w in caught):
            name_shown = name + " *"
            stopped_early = True
        else:
            name_shown = name
        errors[name] = (_error(model, train_x, train_y), _error(model, test_x, test_y))
        say(f"{name_shown:<44}{errors[name][0]:>10.3f}{errors[name][1]:>10.3f}{fit_times[name]:>9.1f}")
        shown.append((name, model.predict_proba(test_x[:n_show])))
    if stopped_early:
        say(f"* L-BFGS stopped at max_iter={max_iter} before converging (raise --max-iter)")
    path = _figure_path(out)
    _save_figure(path, test_x[:n_show], test_y[:n_show], shown)
    say(f"Figure (input, truth, predicted marginals) saved to {path}")
    return {"errors": errors, "fit_times": fit_times, "figure": str(path)}


def _shape(text):
    try:
        height, width = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected HxW, e.g. 60x80, got {text!r}") from None
    return height, width


def main(argv=None):
    """Command-line entry point; returns the results of :func:`run_demo`."""
    parser = argparse.ArgumentParser(
        prog="python -m sklearn_margcrf.demo",
        description=(
            "Train a CRF (univariate logistic loss, TRW, truncated fitting) on a built-in "
            "binary denoising problem; compare it with the independent model and the "
            "surrogate likelihood; save a figure of the predicted marginals."
        ),
    )
    parser.add_argument("--out", default=None, help=f"figure path (default: ./{DEFAULT_FIGURE})")
    parser.add_argument("--n-train", type=int, default=10, help="training images (default 10)")
    parser.add_argument("--n-test", type=int, default=10, help="test images (default 10)")
    parser.add_argument("--shape", type=_shape, default=(60, 80), help="image size HxW (default 60x80)")
    parser.add_argument("--noise", type=float, default=1.25, help="noise level n (default 1.25)")
    parser.add_argument("--n-iter", type=int, default=20, help="TRW iterations (default 20)")
    parser.add_argument("--max-iter", type=int, default=100, help="L-BFGS iterations (default 100)")
    parser.add_argument("--reg", type=float, default=1e-3, help="ridge penalty per pixel (default 1e-3)")
    parser.add_argument("--n-jobs", type=int, default=None, help="joblib workers (default 1)")
    parser.add_argument("--seed", type=int, default=0, help="random seed of the problem (default 0)")
    args = parser.parse_args(argv)
    return run_demo(
        n_train=args.n_train,
        n_test=args.n_test,
        shape=args.shape,
        noise=args.noise,
        n_iter=args.n_iter,
        max_iter=args.max_iter,
        reg=args.reg,
        n_jobs=args.n_jobs,
        random_state=args.seed,
        out=args.out,
    )


if __name__ == "__main__":
    main()
