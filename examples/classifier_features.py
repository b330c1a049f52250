"""A per-pixel classifier under the CRF, on the Weizmann horses.

Today's pixel labelling gets its unary evidence from a strong per-pixel
classifier and lets a CRF add spatial coherence. This script fits gradient
boosting (scikit-learn's ``HistGradientBoostingClassifier``) on the paper's
100 horse features (:class:`~sklearn_margcrf.features.HorseFeatures`) and
compares, on the paper's split of 200 training and 128 test images:

- ``boosting``: the classifier alone, pixel by pixel (no CRF);
- ``boosting + CRF``: :class:`~sklearn_margcrf.features.ClassifierFeatures`
  turns its out-of-fold log-probabilities (cross-fitted over the training
  images, ``--cv`` folds) into the node features of a CRF learned with the
  univariate logistic loss and truncated TRW (the paper's 42 edge features);
- ``paper: univariate logistic TRW``: the paper's model, the same CRF on the
  100 features directly (Table "Training and test errors on the horses
  dataset");
- ``paper: independent``: the paper's per-pixel logistic regression.

The pipeline of the second model is plain scikit-learn::

    make_pipeline(ClassifierFeatures(HistGradientBoostingClassifier(), cv=5),
                  MarginalCRF(loss="univariate_logistic", inference="trw", n_iter=20))

Run::

    python examples/classifier_features.py [--data PATH] [--quick] [--out DIR] [--scale S]

Images and labels are downscaled by ``--scale`` before the features are
computed, as in ``horses.py`` (whose loading and feature cache it shares);
errors are measured at that resolution. ``--quick`` uses 20 training and 10
test images at scale 0.25 and 20 L-BFGS iterations per fit (a few minutes
on 2 cores). The full protocol (scale 0.5, the half grid of ``horses.py``, 200 L-BFGS iterations) has not been
run; its CRF fits cost about as much as one cell of ``horses.py`` each.
"""

import json
from pathlib import Path

import numpy as np

import _common
import horses

QUICK = dict(n_train=20, n_test=10, scale=0.25, max_iter=20, boosting_iter=50)
FULL = dict(n_train=200, n_test=128, scale=0.5, max_iter=200, boosting_iter=200)

#: Table "Training and test errors on the horses dataset" (train, test; 20 iterations).
PAPER = {"paper: univariate logistic TRW": (0.064, 0.093), "paper: independent": (0.095, 0.125)}


def _arguments(parser):
    parser.add_argument("--n-train", type=int, default=None, help="training images (default 200; --quick 20)")
    parser.add_argument("--n-test", type=int, default=None, help="test images (default 128; --quick 10)")
    parser.add_argument("--split", type=int, default=200, help="the first SPLIT ids train, the rest test (default 200)")
    parser.add_argument("--scale", type=float, default=None, help="downscale images and labels (default 0.5, the half grid, as horses.py; --quick 0.25)")
    parser.add_argument("--max-iter", type=int, default=None, help="L-BFGS iterations per CRF fit (default 200; --quick 20)")
    parser.add_argument("--n-iter", type=int, default=20, help="truncated TRW iterations (default 20)")
    parser.add_argument("--boosting-iter", type=int, default=None, help="boosting iterations (default 200; --quick 50)")
    parser.add_argument("--cv", type=int, default=5, help="folds of training images for the cross-fitted features (default 5)")
    parser.add_argument("--cache", default=None, help="folder of the cached features (default OUT/horses_features)")


def _settings(args):
    _common.check_sizes(_common.fill_defaults(args, QUICK, FULL))
    if args.cache is None:
        args.cache = str(Path(args.out) / "horses_features")
    return args


class WithoutCRF:
    """The classifier of a fitted :class:`ClassifierFeatures` alone: its
    probabilities per pixel, shaped like the image (no CRF)."""

    def __init__(self, features):
        self.features = features

    def predict_proba(self, X):
        return [np.exp(s.node_features).reshape(s.grid_shape + (-1,)) for s in self.features.transform(X)]


def _models(args):
    from sklearn.ensemble import HistGradientBoostingClassifier
    from sklearn.pipeline import make_pipeline

    from sklearn_margcrf import MarginalCRF
    from sklearn_margcrf.features import ClassifierFeatures

    crf = dict(loss="univariate_logistic", inference="trw", gradient_mode="truncated", n_iter=args.n_iter,
               reg=1e-3, max_iter=args.max_iter, n_jobs=args.n_jobs, objective_tol=0.0)  # the paper's fixed budget
    boosting = HistGradientBoostingClassifier(max_iter=args.boosting_iter, random_state=0)
    return {
        "boosting + CRF": make_pipeline(ClassifierFeatures(boosting, cv=args.cv), MarginalCRF(**crf)),
        "paper: univariate logistic TRW": MarginalCRF(**crf),
        "paper: independent": MarginalCRF(inference="independent", reg=1e-4, max_iter=args.max_iter, objective_tol=0.0),
    }


def run(args, X_train, y_train, X_test, y_test):
    """Fit the models; return {name: record} and {name: predictor}."""
    models = _models(args)
    seconds = {name: _common.timed_fit(model, X_train, y_train) for name, model in models.items()}
    # the pipeline's classifier, fitted on all training images, without the CRF
    predictors = {"boosting": WithoutCRF(models["boosting + CRF"][0]), **models}
    results = {}
    for name, model in predictors.items():
        results[name] = {
            "train": _common.error_rate(model, X_train, y_train),
            "test": _common.error_rate(model, X_test, y_test),
            "seconds": seconds.get(name),
        }
        print(f"  {name:<32} train {results[name]['train']:.3f}  test {results[name]['test']:.3f}", flush=True)
    return results, predictors


def _table(args, results):
    rows = [(name, [r["train"], r["test"], r["seconds"], *PAPER.get(name, (None, None))]) for name, r in results.items()]
    return _common.format_table(
        f"Horses: gradient boosting under a CRF ({args.n_train} train / {args.n_test} test images at scale "
        f"{args.scale:g}, TRW {args.n_iter} it., at most {args.max_iter} L-BFGS it., {args.cv}-fold cross-fitted "
        f"features; the boosting + CRF fit includes the {args.cv + 1} boosting fits, of which the boosting row is one)",
        ["model", "train err", "test err", "fit (s)", "paper tr.", "paper te."],
        rows,
    )


def _figure(args, image, labels, marginals):
    """Input, truth and P(horse) of every model for one test image."""
    from sklearn_margcrf.plot import plot_marginals

    plt = _common.pyplot()
    n_cols = 2 + len(marginals)
    aspect = image.shape[0] / image.shape[1]
    fig, axes = plt.subplots(1, n_cols, figsize=(2.2 * n_cols, 0.8 + 2.2 * aspect), squeeze=False)
    axes = axes[0]
    plot_marginals(image, None, truth=labels, ax=axes[:2], titles=["input", "truth"], legend=False)
    for ax, (name, proba) in zip(axes[2:], marginals.items()):
        plot_marginals(None, proba, states=[1], ax=ax, titles=[name.replace(": ", ":\n").replace(" + ", " +\n")])
    fig.suptitle("Predicted marginals p(horse) for a test image", fontsize=9)
    return _common.save_figure(fig, args.out, "classifier_features_marginals.png")


def main(argv=None):
    """Run the comparison; return {model name: {"train", "test", "seconds"}}."""
    args = _common.start_run("Classifier features on horses", __doc__, argv, _arguments, _settings)
    with _common.Timer() as total, _common.blas_single_thread():
        X_train, y_train, _, _ = horses._load(args, "train", args.n_train)
        X_test, y_test, test_images, _ = horses._load(args, "test", args.n_test)  # errors at --scale
        print(f"  {len(X_train)} train / {len(X_test)} test images at scale {args.scale:g}", flush=True)
        results, predictors = run(args, X_train, y_train, X_test, y_test)
        marginals = {name: model.predict_proba(X_test[:1])[0] for name, model in predictors.items()}
    text = _table(args, results) + f"\n\nTotal wall time: {total.seconds:.1f} s on {_common.run_description(args.n_jobs)}"
    _common.report(text, args.out, "classifier_features_table.txt")
    (Path(args.out) / "classifier_features_results.json").write_text(json.dumps(results, indent=1) + "\n")
    _figure(args, test_images[0], y_test[0], marginals)
    return results


if __name__ == "__main__":
    main()
