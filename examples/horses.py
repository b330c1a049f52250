"""Horses (Domke 2013, Sec. "Horses", Table "Training and test errors on the
horses dataset", Fig. "Predicted marginals for a test image from the horses
dataset").

Weizmann horses: 200 training and 128 test images, binary figure/ground
labels. Unary features: the sinusoidal expansion of (R, G, B, vertical and
horizontal position) and a 36-component HOG, 100 features; edge features: a
constant, the RGB difference and the Sobel response thresholded at 10 values
each, doubled into horizontal / vertical halves, 42 features
(:class:`~sklearn_margcrf.features.HorseFeatures`).

Protocol of the paper (the default): truncated fitting with 10, 20 and 40
iterations of TRW or mean field (MNF) for the surrogate likelihood, the
univariate and clique logistic losses and smooth classification (alpha = 5,
15, 50; TRW only), ridge penalty lambda = 1e-3; pseudolikelihood and
piecewise likelihood (no inference in learning, TRW to a threshold of 1e-5 at
test time) and the independent model with lambda = 1e-4. Every model starts
from the independent model, smooth classification from the surrogate
likelihood fit with the same inference and iterations.
L-BFGS runs preconditioned (``MarginalCRF(precondition=True)``, the default:
the same objective and minimum along a shorter path); the full-resolution
table ``docs/results/horses-scale1_table.txt`` was fitted before that
existed, on the raw weights.

Run::

    python examples/horses.py [--data PATH] [--quick] [--out DIR] [--n-jobs N] [--scale S]

Long runs are resumable: the features are computed once, in float32, and
kept on disk (``--cache``, memory-mapped), and every fit is saved every
``--segment`` L-BFGS iterations (``--checkpoints``, default 50). Run the
same command again after an interruption and it goes on where it stopped; a
resumed fit starts L-BFGS afresh from its last checkpoint (as the paper
re-initialises it after a bad search direction).

``--scale S`` downscales every image (and its labels) by S before the
features are computed: the CRF then has S**2 as many pixels. Train errors
are measured at the reduced resolution, test errors against the masks at
their full resolution (the marginals upsampled). The default is the half
grid, ``--scale 0.5``: the paper does not say at which resolution it used
the images, an ablation (``horses_ablation.py``) traced our gap to the
paper to the resolution of the grid, and on the half grid the table comes
within .003 of the paper's test errors in 16 of 30 cells, where the masks' full resolution (``--scale 1``: 12 M training
pixels, features of 9 GB in float32) tests .006-.013 worse in every TRW
row (``docs/results/README.md``, "Horses: the gap to the paper"). ``--quick`` uses 20 training and 20 test images at
scale 0.25 and 10 L-BFGS iterations per fit.

The table, results and figure are named ``horses_table.txt``,
``horses_results.json`` and ``horses_marginals.png`` in ``--out`` for the
default model; a run with another ``--scale``, ``--dtype``, ``--rho`` or
``--objective-tol`` names them after those settings (e.g.
``horses-scale1-float32_table.txt``), so that it never replaces the default
table.
"""

import json
from pathlib import Path

import numpy as np

import _common

ITERATIONS = (10, 20, 40)

#: key -> (table name, MarginalCRF parameters). Rows with "inference" trw or
#: mean_field and a marginal or surrogate loss are fitted once per iteration
#: count; the others (``single``) once.
ROWS = {
    "surrogate-trw": ("surrogate likelihood TRW", dict(loss="surrogate_likelihood", inference="trw")),
    "ulogistic-trw": ("univariate logistic TRW", dict(loss="univariate_logistic", inference="trw")),
    "clogistic-trw": ("clique logistic TRW", dict(loss="clique_logistic", inference="trw")),
    "smooth5": ("sm. class. a=5 TRW", dict(loss="smooth_classification", alpha=5.0, inference="trw")),
    "smooth15": ("sm. class. a=15 TRW", dict(loss="smooth_classification", alpha=15.0, inference="trw")),
    "smooth50": ("sm. class. a=50 TRW", dict(loss="smooth_classification", alpha=50.0, inference="trw")),
    "surrogate-mnf": ("surrogate likelihood MNF", dict(loss="surrogate_likelihood", inference="mean_field")),
    "ulogistic-mnf": ("univariate logistic MNF", dict(loss="univariate_logistic", inference="mean_field")),
    "clogistic-mnf": ("clique logistic MNF", dict(loss="clique_logistic", inference="mean_field")),
    "pseudo": ("pseudolikelihood TRW", dict(loss="pseudolikelihood", inference="trw")),
    "piecewise": ("piecewise TRW", dict(loss="piecewise", inference="trw")),
    "independent": ("independent", dict(inference="independent")),
}
SINGLE = ("pseudo", "piecewise", "independent")
REG = {key: (1e-4 if key in SINGLE else 1e-3) for key in ROWS}

#: Table "Training and test errors on the horses dataset": lambda, then
#: train/test at 10, 20 and 40 iterations (None: blank in the paper).
PAPER = {
    "surrogate likelihood TRW": ("1e-3", 0.421, 0.416, 0.088, 0.109, 0.088, 0.109),
    "univariate logistic TRW": ("1e-3", 0.065, 0.094, 0.064, 0.093, 0.064, 0.093),
    "clique logistic TRW": ("1e-3", 0.064, 0.094, 0.062, 0.093, 0.062, 0.092),
    "sm. class. a=5 TRW": ("1e-3", 0.068, 0.097, 0.067, 0.097, 0.067, 0.096),
    "sm. class. a=15 TRW": ("1e-3", 0.065, 0.097, 0.064, 0.096, 0.063, 0.096),
    "sm. class. a=50 TRW": ("1e-3", 0.064, 0.096, 0.063, 0.095, 0.062, 0.095),
    "surrogate likelihood MNF": ("1e-3", 0.405, 0.383, 0.236, 0.226, 0.199, 0.200),
    "univariate logistic MNF": ("1e-3", 0.078, 0.108, 0.077, 0.106, 0.078, 0.106),
    "clique logistic MNF": ("1e-3", 0.073, 0.101, 0.075, 0.105, 0.079, 0.107),
    "pseudolikelihood TRW": ("1e-4", None, None, None, None, 0.222, 0.249),
    "piecewise TRW": ("1e-4", None, None, None, None, 0.202, 0.236),
    "independent": ("1e-4", None, None, None, None, 0.095, 0.125),
}

#: Panels of the paper's figure (None: an empty slot), three per line.
FIGURE = [
    ("input", "(a) Input"), ("truth", "(b) True labels"), None,
    ("surrogate-trw", "(c) Surr. like. TRW"), ("ulogistic-trw", "(d) U. logistic TRW"), ("smooth50", "(e) Sm. class a=50 TRW"),
    ("surrogate-mnf", "(f) Surr. like. MNF"), ("ulogistic-mnf", "(g) U. logistic MNF"), ("independent", "(h) Independent"),
]

QUICK = dict(n_train=20, n_test=20, scale=0.25, max_iter=10)
FULL = dict(n_train=200, n_test=128, scale=0.5, max_iter=200)


def _arguments(parser):
    parser.add_argument("--n-train", type=int, default=None, help="training images: the first of the training split (default 200; --quick 20)")
    parser.add_argument("--n-test", type=int, default=None, help="test images: the first of the test split (default 128; --quick 20)")
    parser.add_argument("--split", type=int, default=200, help="the first SPLIT ids in sorted order train, the rest test (default 200, as the paper)")
    parser.add_argument(
        "--scale", type=float, default=None,
        help="downscale images and labels by this factor before the features (default 0.5, the half grid, where the test "
             "errors come close to the paper's; 1: the masks' full resolution; --quick 0.25)",
    )
    parser.add_argument("--max-iter", type=int, default=None, help="L-BFGS iterations per fit (default 200; --quick 10)")
    parser.add_argument("--iters", type=int, nargs="+", default=list(ITERATIONS), help="truncated fitting iterations (default: 10 20 40)")
    parser.add_argument("--rows", default="all", help="comma-separated rows to run: " + ", ".join(ROWS) + " (default: all)")
    parser.add_argument("--test-tol", type=float, default=1e-5, help="TRW threshold at test time for pseudolikelihood and piecewise (default 1e-5)")
    parser.add_argument("--figure-image", type=int, default=0, help="index of the test image in the figure (default 0)")
    parser.add_argument("--batch", type=int, default=16, help="images per batch when computing error rates (bounds memory; default 16)")
    parser.add_argument("--cache", default=None, help="folder of the cached features (default OUT/horses_features)")
    parser.add_argument("--dtype", choices=("float64", "float32"), default="float64",
                        help="precision of inference and its gradients (MarginalCRF dtype; default float64, the paper's)")
    _common.rho_argument(parser)
    _common.objective_tol_argument(parser)
    _common.resumable_arguments(parser, "horses")


def _settings(args):
    _common.check_sizes(_common.fill_defaults(args, QUICK, FULL))
    args.rows = _common.select(args.rows, ROWS)
    args.iters = sorted(set(args.iters))
    variant = _common.fit_variant_suffix(args)
    settings = f"scale{args.scale:g}-split{args.split}-train{args.n_train}-maxiter{args.max_iter}-segment{args.segment}" + variant
    _common.checkpoint_folder(args, "horses", settings)
    if args.cache is None:
        args.cache = str(Path(args.out) / "horses_features")
    # the name of the table, results and figure: "horses" and the settings that make the model differ from the
    # default run's, so that a variant never replaces the default table (the sizes only select part of a run,
    # and the table's title states them)
    default_scale = (QUICK if args.quick else FULL)["scale"]
    args.stem = "horses" + ("" if args.scale == default_scale else f"-scale{args.scale:g}") + variant
    return args


def _load(args, subset, count):
    """Samples (float32 features cached under ``--cache``, memory-mapped),
    labels and images, at ``--scale``, and the full-resolution labels."""
    from sklearn_margcrf.datasets import load_horses
    from sklearn_margcrf.features import HorseFeatures

    try:
        data = load_horses(args.data, subset=subset, max_images=count, n_train=args.split)
    except FileNotFoundError as exc:
        raise SystemExit(f"{exc}\n(pass --data PATH; see ../shared/data/README.md)") from None
    images, labels, full_labels = [], [], []
    for image, mask in zip(data.images, data.labels):
        full_labels.append(mask)
        image, mask = _common.downscale(image, mask, args.scale)
        images.append(image)
        labels.append(mask)
    # features depend on the image and the scale only
    folder = Path(args.cache) / f"scale{args.scale:g}"
    X = _common.cached_features(HorseFeatures(dtype=np.float32), images, data.ids, folder)
    return X, labels, images, full_labels


def _nbytes(X):
    return sum(s.node_features.nbytes + s.edges.nbytes + s.edge_features.nbytes for s in X)


def _model(args, key, n_iter):
    from sklearn_margcrf import MarginalCRF

    params = dict(
        gradient_mode="truncated",
        n_iter=n_iter if n_iter is not None else 20,
        tol=args.test_tol,
        reg=REG[key],
        max_iter=args.max_iter,
        init="independent",
        n_jobs=args.n_jobs,
        verbose=args.verbose,
        dtype=args.dtype,
        objective_tol=args.objective_tol,  # 0, the paper's protocol: L-BFGS to its own end or max_iter
        rho=args.rho,
    )
    params.update(ROWS[key][1])
    return MarginalCRF(**params)


#: Run order within a column: the rows behind the paper's main findings first
#: (surrogate likelihood failing at 10 iterations, TRW against mean field,
#: marginal losses against the likelihood), so that a partial run shows them.
RUN_ORDER = ("surrogate-trw", "ulogistic-trw", "ulogistic-mnf", "surrogate-mnf", "clogistic-trw",
             "clogistic-mnf", "smooth50", "smooth15", "smooth5")


def _cells(args):
    """(row key, iterations or None) in run order: the single fits first, then
    every row at the fewest iterations (in ``RUN_ORDER``), and so on (a
    partial run gives whole columns); smooth classification after the
    surrogate likelihood row it starts from."""
    cells = [(key, None) for key in args.rows if key in SINGLE]
    column = [key for key in RUN_ORDER if key in args.rows]
    return cells + [(key, n) for n in args.iters for key in column]


def _surrogate_row(key):
    """The surrogate likelihood row a smooth classification row starts from."""
    return "surrogate-trw" if ROWS[key][1]["inference"] == "trw" else "surrogate-mnf"


def _cell_name(key, n_iter):
    return key if n_iter is None else f"{key}-{n_iter}"


def run(args, X_train, y_train, X_test, y_test):
    """Fit every (row, iterations) cell, resuming from the checkpoints under
    ``--checkpoints``; return {cell: record} and {cell: fitted model}.

    Every model starts from the independent model with its own lambda, as
    ``init="independent"`` would; that fit is made once per lambda (the
    "independent-<lambda>" checkpoint; the "independent" row is the one at
    1e-4) and shared. Smooth classification starts from the surrogate
    likelihood fit with the same inference and iterations, as its ``init``
    would.

    A cell whose error record is in the folder but whose weights are not
    (kept from a run whose checkpoints were lost) is reported from its record
    and not refitted, unless a smooth classification cell to be fitted needs
    it as its start: then it is refitted and its record evaluated afresh.
    Such a cell has no panel in the figure.
    """
    store = _common.Checkpoints(args.checkpoints)
    n_node_features, n_edge_features = X_train[0].node_features.shape[1], X_train[0].edge_features.shape[1]
    zeros = {"unary_coef": np.zeros((2, n_node_features)), "pairwise_coef": np.zeros((2, 2, n_edge_features))}
    fits = {}

    def fitted(checkpoint, model, start):
        """(model, progress) of a checkpoint: fitted from ``start()`` once, or only loaded when finished."""
        if checkpoint not in fits:
            weights = None if store.finished(checkpoint) else start()
            fits[checkpoint] = store.fit(checkpoint, model, X_train, y_train, weights, args.max_iter, args.segment)
        return fits[checkpoint]

    def independent(reg):
        model = _model(args, "independent", None).set_params(reg=reg)
        return fitted(f"independent-{reg:.0e}", model, lambda: zeros)

    def start(key, n_iter):
        if ROWS[key][1].get("loss") == "smooth_classification":
            surrogate = _surrogate_row(key)
            if (surrogate, n_iter) not in models:
                raise SystemExit(f"row {key} starts from the {surrogate} fit: add {surrogate} to --rows")
            source = models[(surrogate, n_iter)]
        else:
            source, _ = independent(REG[key])
        return {"unary_coef": source.unary_coef_, "pairwise_coef": source.pairwise_coef_}

    def record_name(key, n_iter):
        # (at --scale < 1 the test errors were counted at that scale before they were at full resolution)
        return f"{_cell_name(key, n_iter)}.errors-test{args.n_test}-tol{args.test_tol:g}" + (
            "" if args.scale == 1 else "-full-resolution")

    def checkpoint_name(key, n_iter):
        return f"independent-{REG[key]:.0e}" if key == "independent" else _cell_name(key, n_iter)

    def record_only(key, n_iter):
        return store.has_record(record_name(key, n_iter)) and not store.has_weights(checkpoint_name(key, n_iter))

    cells = _cells(args)
    sources = {
        (_surrogate_row(key), n_iter) for key, n_iter in cells
        if ROWS[key][1].get("loss") == "smooth_classification" and not record_only(key, n_iter)
    }
    results, models = {}, {}
    for key, n_iter in cells:
        name, params = ROWS[key]
        cell = _cell_name(key, n_iter)
        checkpoint = checkpoint_name(key, n_iter)
        if record_only(key, n_iter):
            if (key, n_iter) not in sources or args.report_only:
                results[(key, n_iter)] = store.record(record_name(key, n_iter), None)
                _print_cell(key, n_iter, results[(key, n_iter)], " (from its record; weights not kept)")
                continue
            store.drop_record(record_name(key, n_iter))  # it describes the lost weights, not the refit
        if args.report_only and not store.finished(checkpoint):
            continue
        if key == "independent":
            model, state = independent(REG[key])
        else:
            model, state = fitted(cell, _model(args, key, n_iter), lambda: start(key, n_iter))
        note = " (from the surrogate likelihood fit)" if params.get("loss") == "smooth_classification" else ""
        models[(key, n_iter)] = model
        record = store.record(record_name(key, n_iter), lambda: _common.fit_record(
            model, name, _common.error_rate(model, X_train, y_train, args.batch),
            _common.error_rate(model, X_test, y_test, args.batch), state["seconds"], n_iter=n_iter,
            segments=state["segments"], fits=state["fits"],
        ))
        results[(key, n_iter)] = record
        _print_cell(key, n_iter, record, note)
    return results, models


def _print_cell(key, n_iter, record, note):
    where = " " * 7 if n_iter is None else f"{n_iter:2d} it. "
    print(
        f"  {where}{ROWS[key][0]:<26} train {record['train']:.3f}  test {record['test']:.3f}  "
        f"fit {record['seconds']:7.1f} s  ({record['lbfgs_iterations']} L-BFGS it.){note}",
        flush=True,
    )


def _tables(args, results, pixels):
    header = ["Loss", "lambda"] + [f"{n} {part}" for n in args.iters for part in ("tr", "te")]
    rows, time_rows = [], []
    for key in args.rows:
        values, times = [f"{REG[key]:.0e}".replace("e-0", "e-")], []
        for n in args.iters:
            if key in SINGLE:  # fitted once, shown in the last column as in the paper
                cell = results.get((key, None)) if n == args.iters[-1] else None
            else:
                cell = results.get((key, n))
            values += [cell["train"], cell["test"]] if cell else [None, None]
            times += [f"{cell['seconds']:.1f}", cell["lbfgs_iterations"]] if cell else [None, None]
        rows.append((ROWS[key][0], values))
        time_rows.append((ROWS[key][0], times))
    title = (
        "Training and test errors on the horses dataset (Domke 2013, Table 'Training and test errors "
        "on the horses dataset')\n"
        f"Truncated fitting, columns: iterations, train (tr) / test (te) error; pseudolikelihood, piecewise "
        f"(TRW to {args.test_tol:g} at test) and independent in the last column.\n"
        f"{args.n_train} training / {args.n_test} test images at scale {args.scale:g} "
        f"({pixels['train'] / 1e6:.2f} M / {pixels['test'] / 1e6:.2f} M pixels, the test errors' at full resolution); at most {args.max_iter} "
        f"L-BFGS iterations per fit, checkpointed every {args.segment}.\nPaper: 200 / 128 images, at a resolution it does not state."
    )
    title += _common.partial_run_note(len(results), len(_cells(args)))
    paper = PAPER if list(args.iters) == list(ITERATIONS) else None
    table = _common.format_table(title, header, rows, paper=paper)
    note = ""
    if any(k.startswith("smooth") for k in args.rows) and "surrogate-trw" in args.rows:
        note = "\nsm. class. rows start from the surrogate likelihood TRW fit; its time is not included."
    timing = _common.format_table(
        _common.timing_title(args) + f"{note}",
        ["Fit seconds (s), L-BFGS its (it)"] + [f"{n} {part}" for n in args.iters for part in ("s", "it")],
        time_rows,
    )
    return table + "\n\n" + timing


def _figure(args, image, labels, marginals, recorded=()):
    """The paper's figure; ``recorded``: rows reported from a record only
    (their panel says that its weights were not kept)."""
    from sklearn_margcrf.plot import plot_marginals

    plt = _common.pyplot()
    panels = {"input": (image, None), "truth": (labels, None), **marginals}
    aspect = image.shape[0] / image.shape[1]
    fig, axes = plt.subplots(3, 3, figsize=(7.5, 0.6 + 3 * 2.5 * aspect), squeeze=False)
    for ax, slot in zip(axes.ravel(), FIGURE):
        ax.set_xticks([])
        ax.set_yticks([])
        if slot is None:
            ax.axis("off")
            continue
        key, title = slot
        if key not in panels:
            ax.set_title(f"{title}\n({'weights not kept' if key in recorded else 'not run'})", fontsize=8)
            continue
        panel, n_iter = panels[key]
        if key == "input":
            plot_marginals(image, None, ax=ax, titles=False)
        elif key == "truth":
            plot_marginals(None, None, truth=labels, ax=ax, titles=False, legend=False)
        else:
            plot_marginals(None, panel, states=[1], ax=ax, titles=False)
        fewer = n_iter is not None and n_iter != args.iters[-1]
        ax.set_title(f"{title}\n({n_iter} iterations)" if fewer else title, fontsize=8)
    fig.suptitle(f"Predicted marginals p(horse), truncated learning with {args.iters[-1]} iterations", fontsize=9)
    return _common.save_figure(fig, args.out, f"{args.stem}_marginals.png")


def main(argv=None):
    """Run the experiment; return {(row key, iterations or None): results}."""
    args = _common.start_run("Horses", __doc__, argv, _arguments, _settings)
    with _common.Timer() as total, _common.blas_single_thread():
        with _common.Timer() as features:
            X_train, y_train, _, _ = _load(args, "train", args.n_train)
            X_test, _, test_images, y_test = _load(args, "test", args.n_test)
            # test errors against the full-resolution masks whatever --scale is
            X_test = _common.with_image_shapes(X_test, [np.shape(m) for m in y_test])
        pixels = {"train": sum(lab.size for lab in y_train), "test": sum(lab.size for lab in y_test)}
        print(
            f"  {len(X_train)} train / {len(X_test)} test images at scale {args.scale:g}: "
            f"{pixels['train'] / 1e6:.2f} M / {pixels['test'] / 1e6:.2f} M pixels, features "
            f"{(_nbytes(X_train) + _nbytes(X_test)) / 1e9:.2f} GB, computed in {features.seconds:.1f} s; "
            f"rows {args.rows}, iterations {args.iters}, at most {args.max_iter} L-BFGS iterations",
            flush=True,
        )
        results, models = run(args, X_train, y_train, X_test, y_test)
        k = min(max(args.figure_image, 0), len(X_test) - 1)
        # each row's panel from its fit with the most iterations run so far
        # (the paper's figure: 40; fewer in a partial run, and said so)
        marginals = {}
        for (key, n_iter), model in sorted(models.items(), key=lambda item: item[0][1] or 0):
            marginals[key] = (model.predict_proba([X_test[k]])[0], n_iter)
    text = _tables(args, results, pixels)
    text += f"\n\nFeatures: {features.seconds:.1f} s. Total wall time: {total.seconds:.1f} s"
    _common.report(text, args.out, f"{args.stem}_table.txt")
    (Path(args.out) / f"{args.stem}_results.json").write_text(
        json.dumps([{"row": key, **value} for (key, _), value in results.items()], indent=1) + "\n"
    )
    _figure(args, test_images[k], y_test[k], marginals, recorded={key for key, _ in results})
    return results


if __name__ == "__main__":
    main()
