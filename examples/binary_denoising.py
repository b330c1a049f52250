"""Binary denoising (Domke 2013, Sec. "Binary Denoising Data", Table "Binary
denoising error rates", Fig. "Predicted marginals for an example binary
denoising test image").

BSDS300 images resized to 200 x 300 (300 x 200 for portrait images) and
binarised at their mean are the labels x; the noisy input is
``y = x (1 - t**n) + (1 - x) t**n`` with t uniform per pixel, for the noise
levels n = 1.25, 1.5 and 5 (lower is noisier). 32 training and 100 test
images. Unary features ``[1, y_i]``, edge features ``[horizontal, vertical]``
(:class:`~sklearn_margcrf.features.DenoisingFeatures`).

Protocol of the paper (the default): TRW inference; the marginal-based losses
are learned by back TRW run to convergence (``gradient_mode="backprop"``) with
an inference threshold of 1e-4; the surrogate likelihood uses the same
converged inference (its gradient at convergence is ``f - mu``, the paper's
direct form); pseudolikelihood and piecewise likelihood need no inference in
learning and are evaluated with TRW (threshold 1e-4); every model starts from
the independent model (per-pixel logistic regression), and smooth
classification from the surrogate likelihood fit. ``--gradient-mode truncated
--n-iter N`` is a faster alternative (truncated fitting, N iterations in
learning and prediction).

Run::

    python examples/binary_denoising.py [--data PATH] [--quick] [--out DIR] [--n-jobs N]

``--quick`` uses 8 training and 20 test images at a quarter of the resolution
(50 x 75) and 15 L-BFGS iterations per fit; the full run takes hours (see
``docs/``). The paper does not state its ridge penalty for this experiment:
we use lambda = 1e-3 for the inference-based losses and 1e-4 for
pseudolikelihood, piecewise and the independent model, as in its horses and
backgrounds tables (``--reg`` sets one value for all).

Caveat: ``gradient_mode="backprop"`` runs the reverse sweeps at the messages
where inference stopped; at the paper's threshold 1e-4 these are not close
enough to a fixed point when the coupling is strong, and the sweeps can
diverge (RuntimeWarning "did not converge in 10000 reverse sweeps", a huge
gradient, L-BFGS stopping after a few iterations). ``--tol 1e-6`` avoids this
at a few times the inference cost; ``--gradient-mode truncated`` avoids it
altogether.
"""

import copy
import json
from pathlib import Path

import _common

NOISE_LEVELS = (1.25, 1.5, 5.0)

#: key -> (table name, MarginalCRF parameters). Order of the paper's table.
ROWS = {
    "surrogate": ("surrogate likelihood", dict(loss="surrogate_likelihood")),
    "ulogistic": ("univariate logistic", dict(loss="univariate_logistic")),
    "clogistic": ("clique logistic", dict(loss="clique_logistic")),
    "uquad": ("univariate quad", dict(loss="univariate_quadratic")),
    "smooth5": ("smooth class. a=5", dict(loss="smooth_classification", alpha=5.0)),
    "smooth15": ("smooth class. a=15", dict(loss="smooth_classification", alpha=15.0)),
    "smooth50": ("smooth class. a=50", dict(loss="smooth_classification", alpha=50.0)),
    "pseudo": ("pseudo-likelihood", dict(loss="pseudolikelihood")),
    "piecewise": ("piecewise", dict(loss="piecewise")),
    "independent": ("independent", dict(inference="independent")),
}

#: Table "Binary denoising error rates": train/test for n = 1.25, 1.5, 5.
PAPER = {
    "surrogate likelihood": (0.149, 0.143, 0.103, 0.097, 0.031, 0.030),
    "univariate logistic": (0.133, 0.126, 0.102, 0.096, 0.031, 0.030),
    "clique logistic": (0.132, 0.126, 0.102, 0.096, 0.031, 0.030),
    "univariate quad": (0.132, 0.126, 0.102, 0.096, 0.031, 0.030),
    "smooth class. a=5": (0.136, 0.129, 0.105, 0.099, 0.032, 0.030),
    "smooth class. a=15": (0.132, 0.126, 0.102, 0.096, 0.031, 0.030),
    "smooth class. a=50": (0.132, 0.125, 0.102, 0.096, 0.030, 0.030),
    "pseudo-likelihood": (0.207, 0.204, 0.117, 0.112, 0.032, 0.030),
    "piecewise": (0.466, 0.481, 0.466, 0.481, 0.063, 0.058),
    "independent": (0.421, 0.424, 0.367, 0.368, 0.129, 0.129),
}

QUICK = dict(n_train=8, n_test=20, scale=0.25, max_iter=15)
FULL = dict(n_train=32, n_test=100, scale=1.0, max_iter=200)


def _arguments(parser):
    parser.add_argument("--noise", type=float, nargs="+", default=list(NOISE_LEVELS), help="noise levels n (default: 1.25 1.5 5)")
    parser.add_argument("--n-train", type=int, default=None, help="training images (default 32; --quick 8)")
    parser.add_argument("--n-test", type=int, default=None, help="test images (default 100; --quick 20)")
    parser.add_argument("--scale", type=float, default=None, help="image size relative to 200x300 (default 1; --quick 0.25)")
    parser.add_argument("--max-iter", type=int, default=None, help="L-BFGS iterations per fit (default 200; --quick 15)")
    parser.add_argument(
        "--rows", default="all",
        help="comma-separated rows to run: " + ", ".join(ROWS) + " (default: all)",
    )
    parser.add_argument(
        "--gradient-mode", choices=("backprop", "truncated"), default="backprop",
        help="backprop: back TRW to convergence, threshold --tol (the paper); truncated: --n-iter iterations",
    )
    parser.add_argument("--n-iter", type=int, default=20, help="TRW iterations with --gradient-mode truncated (default 20)")
    parser.add_argument("--tol", type=float, default=1e-4, help="inference threshold (default 1e-4, the paper)")
    parser.add_argument("--reg", type=float, default=None, help="one ridge penalty for all rows (default: 1e-3, and 1e-4 for pseudo/piecewise/independent)")
    parser.add_argument("--figure-image", type=int, default=0, help="index of the test image in the figure (default 0)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the noise (default 0)")


def _settings(args):
    _common.check_sizes(_common.fill_defaults(args, QUICK, FULL))
    args.rows = _common.select(args.rows, ROWS)
    return args


def _reg(args, key):
    if args.reg is not None:
        return args.reg
    return 1e-4 if key in ("pseudo", "piecewise", "independent") else 1e-3


def _model(args, key):
    from sklearn_margcrf import MarginalCRF

    params = dict(
        inference="trw",
        gradient_mode=args.gradient_mode,
        n_iter=args.n_iter,
        tol=args.tol,
        reg=_reg(args, key),
        max_iter=args.max_iter,
        init="independent",
        n_jobs=args.n_jobs,
    )
    params.update(ROWS[key][1])
    return MarginalCRF(**params)


def _load(args, noise):
    from sklearn_margcrf.datasets import load_bsds_denoising
    from sklearn_margcrf.features import DenoisingFeatures

    shape = (max(2, round(200 * args.scale)), max(2, round(300 * args.scale)))
    try:
        data = load_bsds_denoising(
            args.data, noise=noise, n_train=args.n_train, n_test=args.n_test, shape=shape,
            random_state=args.seed,
        )
    except FileNotFoundError as exc:
        raise SystemExit(f"{exc}\n(pass --data PATH; see ../shared/data/README.md)") from None
    features = DenoisingFeatures()
    X = features.transform(data.images)
    split = {}
    for name, index in (("train", data.train_index), ("test", data.test_index)):
        split[name] = ([X[i] for i in index], [data.labels[i] for i in index], [data.images[i] for i in index])
    return split, shape


def run_noise_level(args, noise):
    """Fit every row at one noise level; return {key: result dict} and the figure data."""
    split, shape = _load(args, noise)
    X_train, y_train, _ = split["train"]
    X_test, y_test, test_images = split["test"]
    k = min(max(args.figure_image, 0), len(X_test) - 1)
    figure = {"input": test_images[k], "truth": y_test[k]}
    results = {}
    fitted = {}
    for key in args.rows:
        name, params = ROWS[key]
        model = _model(args, key)
        note = ""
        if params.get("loss") == "smooth_classification" and "surrogate" in fitted:
            # The estimator's init="independent" does independent -> surrogate
            # likelihood -> smooth classification; the surrogate likelihood
            # row already holds that fit with the same settings: start from it.
            model = copy.deepcopy(fitted["surrogate"]).set_params(**params, warm_start=True)
            note = " (from the surrogate likelihood fit)"
        seconds = _common.timed_fit(model, X_train, y_train)
        fitted[key] = model
        train_error = _common.error_rate(model, X_train, y_train)
        test_error = _common.error_rate(model, X_test, y_test)
        figure[key] = model.predict_proba([X_test[k]])[0][..., 1]
        results[key] = _common.fit_record(model, name, train_error, test_error, seconds)
        print(
            f"  n={noise:g}  {name:<22} train {train_error:.3f}  test {test_error:.3f}  "
            f"fit {seconds:7.1f} s  ({model.n_iter_} L-BFGS it.){note}",
            flush=True,
        )
    return results, figure, shape


def _tables(args, results, shapes):
    levels = list(results)
    header = ["Loss"] + [f"{n:g} {part}" for n in levels for part in ("tr", "te")]
    rows = []
    for key in args.rows:
        values = []
        for n in levels:
            values += [results[n][key]["train"], results[n][key]["test"]]
        rows.append((ROWS[key][0], values))
    if args.gradient_mode == "backprop":
        mode = f"TRW, back-propagation to threshold {args.tol:g}"
    else:
        mode = f"TRW, truncated fitting with {args.n_iter} iterations"
    shape = shapes[levels[0]]
    reg = f"lambda={args.reg:g}" if args.reg is not None else "lambda=1e-3 (1e-4 for pseudo-likelihood, piecewise, independent)"
    title = (
        "Binary denoising error rates (Domke 2013, Table 'Binary denoising error rates')\n"
        f"{mode}; {args.n_train} training / {args.n_test} test images of {shape[0]}x{shape[1]} "
        f"(portrait transposed); {reg}; at most {args.max_iter} L-BFGS iterations per fit.\n"
        "Columns: noise level n, train (tr) / test (te) error rate.\n"
        "Paper: TRW, back-propagation, threshold 1e-4, 32 / 100 images of 200x300."
    )
    paper = {name: PAPER[name] for name, _ in rows if name in PAPER}
    if list(levels) != list(NOISE_LEVELS):
        paper = None  # the paper's columns would not line up
    table = _common.format_table(title, header, rows, paper=paper)

    time_header = ["Fit seconds (s), L-BFGS its (it)"] + [f"{n:g} {part}" for n in levels for part in ("s", "it")]
    time_rows = []
    for key in args.rows:
        values = []
        for n in levels:
            values += [f"{results[n][key]['seconds']:.1f}", results[n][key]["lbfgs_iterations"]]
        time_rows.append((ROWS[key][0], values))
    note = ""
    if any(ROWS[k][1].get("loss") == "smooth_classification" for k in args.rows) and "surrogate" in args.rows:
        note = "\nsmooth class. rows start from the surrogate likelihood fit; its time is not included."
    timing = _common.format_table(
        f"Timings on {_common.run_description(args.n_jobs)}{note}", time_header, time_rows
    )
    return table + "\n\n" + timing


def _figure(args, figures):
    plt = _common.pyplot()
    levels = list(figures)
    names = ["input"] + list(args.rows)
    labels = {"input": "input", **{k: ROWS[k][0] for k in ROWS}}
    first = figures[levels[0]]["input"]
    aspect = first.shape[0] / first.shape[1]
    width = 1.6
    fig, axes = plt.subplots(
        len(names), len(levels), figsize=(0.9 + width * len(levels), 0.3 + width * aspect * len(names)),
        squeeze=False,
    )
    for col, n in enumerate(levels):
        for row, key in enumerate(names):
            ax = axes[row, col]
            ax.imshow(figures[n][key], cmap="gray", vmin=0.0, vmax=1.0, interpolation="nearest")
            ax.set_xticks([])
            ax.set_yticks([])
            if row == 0:
                ax.set_title(f"n={n:g}", fontsize=9)
            if col == 0:
                ax.set_ylabel(labels[key], fontsize=8, rotation=0, ha="right", va="center")
    fig.suptitle("Predicted marginals p(x_i = 1) for a test image", fontsize=9)
    return _common.save_figure(fig, args.out, "binary_denoising_marginals.png")


def main(argv=None):
    """Run the experiment; return {noise: {row key: results}}."""
    args = _common.start_run("Binary denoising", __doc__, argv, _arguments, _settings)
    print(
        f"  {args.n_train} train / {args.n_test} test images, scale {args.scale:g}, rows {args.rows}, "
        f"gradient_mode={args.gradient_mode}, at most {args.max_iter} L-BFGS iterations",
        flush=True,
    )
    results, figures, shapes = {}, {}, {}
    with _common.Timer() as total, _common.blas_single_thread():
        for noise in args.noise:
            results[noise], figures[noise], shapes[noise] = run_noise_level(args, noise)
    text = _tables(args, results, shapes) + f"\n\nTotal wall time: {total.seconds:.1f} s"
    _common.report(text, args.out, "binary_denoising_table.txt")
    (Path(args.out) / "binary_denoising_results.json").write_text(
        json.dumps({f"{n:g}": r for n, r in results.items()}, indent=1) + "\n"
    )
    _figure(args, figures)
    return results


if __name__ == "__main__":
    main()
