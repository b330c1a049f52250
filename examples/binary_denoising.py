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
inference and back-propagates through its entropy (at convergence this is
``f - mu``, the paper's direct form); pseudolikelihood and piecewise
likelihood need no inference in learning and are evaluated with TRW
(threshold 1e-4); every model starts from the independent model (per-pixel
logistic regression), and smooth classification from the surrogate
likelihood fit. ``--gradient-mode truncated --n-iter N`` is a faster
alternative (truncated fitting, N iterations in learning and prediction).

Run::

    python examples/binary_denoising.py [--data PATH] [--quick] [--out DIR] [--n-jobs N]

``--quick`` uses 8 training and 20 test images at a quarter of the resolution
(50 x 75) and 15 L-BFGS iterations per fit; the full run takes hours (see
``docs/``). The paper does not state its ridge penalty for this experiment:
we use lambda = 1e-3 for the inference-based losses and 1e-4 for
pseudolikelihood, piecewise and the independent model, as in its horses and
backgrounds tables (``--reg`` sets one value for all).

Long runs are resumable: every fit is saved every ``--segment`` L-BFGS
iterations (``--checkpoints``), and the error rates of each finished cell
beside it. Run the same command again after an interruption and it goes on
where it stopped; ``--report-only`` prints the table of the cells finished so
far without fitting. A resumed fit starts L-BFGS afresh from its last
checkpoint (as the paper re-initialises it after a bad search direction);
``--segment`` defaults to 50. ``--verbose 1`` logs every L-BFGS iteration.

Caveat: ``gradient_mode="backprop"`` runs the reverse sweeps at the messages
where inference stopped; at the paper's threshold 1e-4 these may not be close
enough to a fixed point when the coupling is strong, and the sweeps can
diverge. The gradient of that image is then taken through exactly the
iterations inference ran (the exact gradient of its reported loss), with a
``BackpropFallbackWarning``; ``--tol 1e-6`` makes this rarer at a few times
the inference cost.
"""

import functools
import json
from pathlib import Path

import numpy as np

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
#: Rows without inference in learning: cheap, and lambda = 1e-4 by default.
INFERENCE_FREE = ("pseudo", "piecewise", "independent")

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
    parser.add_argument("--dtype", choices=("float64", "float32"), default="float64",
                        help="precision of inference and its gradients (MarginalCRF dtype; default float64)")
    _common.resumable_arguments(parser, "binary_denoising")


def _settings(args):
    _common.check_sizes(_common.fill_defaults(args, QUICK, FULL))
    args.rows = _common.select(args.rows, ROWS)
    args.noise = list(dict.fromkeys(args.noise))  # each level once, in the given (run) order
    # n_iter only matters to truncated fitting; tol to the prediction of every mode
    learning = "backprop" if args.gradient_mode == "backprop" else f"truncated{args.n_iter}"
    reg = "regdefault" if args.reg is None else f"reg{args.reg:g}"
    settings = (
        f"scale{args.scale:g}-train{args.n_train}-maxiter{args.max_iter}-segment{args.segment}-"
        f"{learning}-tol{args.tol:g}-{reg}-seed{args.seed}" + ("" if args.dtype == "float64" else f"-{args.dtype}")
    )
    return _common.checkpoint_folder(args, "binary_denoising", settings)


def _reg(args, key):
    if args.reg is not None:
        return args.reg
    return 1e-4 if key in INFERENCE_FREE else 1e-3


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
        verbose=args.verbose,
        dtype=args.dtype,
        objective_tol=0.0,  # the paper's protocol: L-BFGS to its own end or max_iter, no stopping rule
    )
    params.update(ROWS[key][1])
    return MarginalCRF(**params)


def _shape(args):
    """(height, width) of the landscape images."""
    return max(2, round(200 * args.scale)), max(2, round(300 * args.scale))


def _load(args, noise):
    """{"train" / "test": (samples, labels, noisy images)} at one noise level."""
    from sklearn_margcrf.datasets import load_bsds_denoising
    from sklearn_margcrf.features import DenoisingFeatures

    try:
        data = load_bsds_denoising(
            args.data, noise=noise, n_train=args.n_train, n_test=args.n_test, shape=_shape(args),
            random_state=args.seed,
        )
    except FileNotFoundError as exc:
        raise SystemExit(f"{exc}\n(pass --data PATH; see ../shared/data/README.md)") from None
    features = DenoisingFeatures()
    X = features.transform(data.images)
    split = {}
    for name, index in (("train", data.train_index), ("test", data.test_index)):
        split[name] = ([X[i] for i in index], [data.labels[i] for i in index], [data.images[i] for i in index])
    return split


#: Run order within a noise level: the paper's main comparison first
#: (surrogate likelihood against the marginal losses), smooth classification
#: after the surrogate likelihood fit it starts from.
RUN_ORDER = ("surrogate", "ulogistic", "clogistic", "uquad", "smooth50", "smooth15", "smooth5")


def _cells(args):
    """(noise level, row key) in run order: the rows without inference in
    learning at every level first (minutes), then the others level by level
    (in ``RUN_ORDER``), so that a partial run gives whole noise levels; by
    default the noisiest first, where the losses differ most in the paper."""
    cheap = [(noise, key) for noise in args.noise for key in args.rows if key in INFERENCE_FREE]
    level = [key for key in RUN_ORDER if key in args.rows]
    return cheap + [(noise, key) for noise in args.noise for key in level]


def _cell_name(noise, key):
    return f"n{noise:g}-{key}"


def _independent_name(noise, reg):
    return f"n{noise:g}-independent-{reg:.0e}"


def _checkpoint_name(args, noise, key):
    """The checkpoint of a cell: the "independent" row is the independent start at its own lambda."""
    return _independent_name(noise, _reg(args, key)) if key == "independent" else _cell_name(noise, key)


def run(args):
    """Fit every (noise level, row) cell, resuming from the checkpoints under
    ``--checkpoints``; return {(noise, key): record} and {noise: figure panels}.

    Every model starts from the independent model with its own lambda, as
    ``init="independent"`` would; that fit is made once per (noise, lambda)
    (the "n<noise>-independent-<lambda>" checkpoint; the "independent" row is
    the one at its own lambda) and shared. Smooth classification starts from
    the surrogate likelihood fit of its noise level, as its ``init`` would
    (fitted for it when that row is not among ``--rows``).
    """
    store = _common.Checkpoints(args.checkpoints)
    # one noise level in memory at a time (a full-size one: ~0.6 GB of features)
    load = functools.lru_cache(maxsize=1)(functools.partial(_load, args))
    fits, figures, figure_samples = {}, {}, {}

    def fitted(checkpoint, noise, model, start):
        """(model, progress) of a checkpoint: fitted from ``start()`` once, or loaded when finished."""
        if checkpoint not in fits:
            if store.finished(checkpoint):  # only loaded: neither the data nor a start is needed
                X_train = y_train = weights = None
            else:
                X_train, y_train, _ = load(noise)["train"]
                weights = start()
            fits[checkpoint] = store.fit(checkpoint, model, X_train, y_train, weights, args.max_iter, args.segment)
        return fits[checkpoint]

    def independent(noise, reg):
        def zeros():
            sample = load(noise)["train"][0][0]
            n_node_features, n_edge_features = sample.node_features.shape[1], sample.edge_features.shape[1]
            return {"unary_coef": np.zeros((2, n_node_features)), "pairwise_coef": np.zeros((2, 2, n_edge_features))}

        model = _model(args, "independent").set_params(reg=reg)
        return fitted(_independent_name(noise, reg), noise, model, zeros)

    def start(noise, key):
        if ROWS[key][1].get("loss") == "smooth_classification":
            source, _ = cell_fit(noise, "surrogate")
        else:
            source, _ = independent(noise, _reg(args, key))
        return {"unary_coef": source.unary_coef_, "pairwise_coef": source.pairwise_coef_}

    def cell_fit(noise, key):
        if key == "independent":
            return independent(noise, _reg(args, key))
        return fitted(_cell_name(noise, key), noise, _model(args, key), lambda: start(noise, key))

    def panels(noise):
        """The figure's panels of a noise level: the input, then each row's marginals."""
        if noise not in figures:
            X_test, y_test, test_images = load(noise)["test"]
            k = min(max(args.figure_image, 0), len(X_test) - 1)
            figure_samples[noise] = X_test[k]
            figures[noise] = {"input": test_images[k], "truth": y_test[k]}
        return figures[noise]

    results = {}
    for noise, key in _cells(args):
        name = ROWS[key][0]
        cell = _cell_name(noise, key)
        if args.report_only and not store.finished(_checkpoint_name(args, noise, key)):
            continue
        model, progress = cell_fit(noise, key)
        record = store.record(f"{cell}.errors-test{args.n_test}", lambda: _common.fit_record(
            model, name, _common.error_rate(model, *load(noise)["train"][:2]),
            _common.error_rate(model, *load(noise)["test"][:2]), progress["seconds"], segments=progress["segments"],
            fits=progress["fits"],
        ))
        results[(noise, key)] = record
        figure = panels(noise)
        figure[key] = model.predict_proba([figure_samples[noise]])[0]
        note = " (from the surrogate likelihood fit)" if ROWS[key][1].get("loss") == "smooth_classification" else ""
        print(
            f"  n={noise:g}  {name:<22} train {record['train']:.3f}  test {record['test']:.3f}  "
            f"fit {record['seconds']:7.1f} s  ({record['lbfgs_iterations']} L-BFGS it.){note}",
            flush=True,
        )
    for noise in args.noise:  # the input panels of the levels with no finished cell
        panels(noise)
    return results, figures


def _tables(args, results):
    levels = args.noise
    header = ["Loss"] + [f"{n:g} {part}" for n in levels for part in ("tr", "te")]
    rows, time_rows = [], []
    for key in args.rows:
        values, times = [], []
        for n in levels:
            cell = results[n].get(key)
            values += [cell["train"], cell["test"]] if cell else [None, None]
            times += [f"{cell['seconds']:.1f}", cell["lbfgs_iterations"]] if cell else [None, None]
        rows.append((ROWS[key][0], values))
        time_rows.append((ROWS[key][0], times))
    if args.gradient_mode == "backprop":
        mode = f"TRW, back-propagation to threshold {args.tol:g}"
    else:
        mode = f"TRW, truncated fitting with {args.n_iter} iterations"
    shape = _shape(args)
    reg = f"lambda={args.reg:g}" if args.reg is not None else "lambda=1e-3 (1e-4 for pseudo-likelihood, piecewise, independent)"
    title = (
        "Binary denoising error rates (Domke 2013, Table 'Binary denoising error rates')\n"
        f"{mode}; {args.n_train} training / {args.n_test} test images of {shape[0]}x{shape[1]} "
        f"(portrait transposed); {reg}; at most {args.max_iter} L-BFGS iterations per fit, "
        f"checkpointed every {args.segment}.\n"
        "Columns: noise level n, train (tr) / test (te) error rate.\n"
        "Paper: TRW, back-propagation, threshold 1e-4, 32 / 100 images of 200x300."
    )
    title += _common.partial_run_note(sum(len(level) for level in results.values()), len(_cells(args)))
    paper = {name: PAPER[name] for name, _ in rows if name in PAPER}
    if list(levels) != list(NOISE_LEVELS):
        paper = None  # the paper's columns would not line up
    table = _common.format_table(title, header, rows, paper=paper)

    note = "\nFit times leave out the starting fit: the independent model"
    if any(ROWS[k][1].get("loss") == "smooth_classification" for k in args.rows):
        note += " (for smooth class. rows, the surrogate likelihood fit)"
    timing = _common.format_table(
        _common.timing_title(args) + f"{note}.",
        ["Fit seconds (s), L-BFGS its (it)"] + [f"{n:g} {part}" for n in levels for part in ("s", "it")],
        time_rows,
    )
    return table + "\n\n" + timing


def _figure(args, figures):
    from sklearn_margcrf.plot import plot_marginals

    plt = _common.pyplot()
    levels = args.noise
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
            if key == "input":
                plot_marginals(figures[n][key], None, ax=ax, titles=False)
            elif key in figures[n]:
                plot_marginals(None, figures[n][key], states=[1], ax=ax, titles=False)
            else:
                ax.text(0.5, 0.5, "not run", ha="center", va="center", fontsize=7, transform=ax.transAxes)
                ax.set_xticks([])
                ax.set_yticks([])
            if row == 0:
                ax.set_title(f"n={n:g}", fontsize=9)
            if col == 0:
                ax.set_ylabel(labels[key], fontsize=8, rotation=0, ha="right", va="center")
    fig.suptitle("Predicted marginals p(x_i = 1) for a test image", fontsize=9)
    return _common.save_figure(fig, args.out, "binary_denoising_marginals.png")


def main(argv=None):
    """Run the experiment; return {noise: {row key: results}} (the finished cells)."""
    args = _common.start_run("Binary denoising", __doc__, argv, _arguments, _settings)
    print(
        f"  {args.n_train} train / {args.n_test} test images, scale {args.scale:g}, rows {args.rows}, "
        f"gradient_mode={args.gradient_mode}, at most {args.max_iter} L-BFGS iterations, checkpointed every "
        f"{args.segment}; checkpoints in {args.checkpoints}",
        flush=True,
    )
    with _common.Timer() as total, _common.blas_single_thread():
        cells, figures = run(args)
    results = {noise: {key: cells[noise, key] for key in args.rows if (noise, key) in cells} for noise in args.noise}
    text = _tables(args, results) + f"\n\nTotal wall time: {total.seconds:.1f} s"
    _common.report(text, args.out, "binary_denoising_table.txt")
    (Path(args.out) / "binary_denoising_results.json").write_text(
        json.dumps({f"{n:g}": r for n, r in results.items()}, indent=1) + "\n"
    )
    _figure(args, figures)
    return results


if __name__ == "__main__":
    main()
