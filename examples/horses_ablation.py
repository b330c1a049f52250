"""Horses: where our test errors part from the paper's (an ablation).

Every TRW row of our full-resolution horses table (``docs/results/horses-scale1_table.txt``) tests
0.006-0.013 above the paper's, while the independent model matches it. This
script changes one reading of the paper at a time and fits the same model
each time -- the univariate logistic loss, TRW with 20 truncated iterations,
lambda = 1e-3, from the independent model -- on a fixed subset (by default
the first 100 training images and all 128 test images, at full resolution),
and reports train and test errors beside those of the paper's reading.

The variants (``VARIANTS``; ``--variants`` picks some):

- ``paper``: our reading of the paper, the package's defaults.
- ``train-101-200``: the same model on the next 100 training images: how
  far the test error moves with the training images alone, the yardstick
  for every other difference.
- ``scale-0.5``, ``scale-0.75``: the CRF on a grid at half / three quarters
  of the resolution (features computed at full resolution, then reduced, as
  the paper does for the backgrounds); marginals are upsampled and errors
  counted at full resolution, as for every other variant.
- ``images-0.25``, ``images-0.5``, ``images-0.75``: the images and masks
  at a quarter, half or three quarters resolution before anything else, as if the paper's copies of the
  images had been that size (``horses.py --scale``): HOG cells of 8 pixels
  then cover more of the horse and 20 TRW iterations reach further. Errors
  are counted at the masks' full resolution like every other variant's (the
  marginals upsampled as for ``scale-0.5``), and at the reduced resolution
  too (listed under the table).
- ``images-0.5-trw10``, ``trw40``: the reach of messages apart from the
  grid: 10 TRW iterations at half resolution cover as many full-resolution
  pixels as 20 at full resolution, 40 at full resolution as many as 20 at
  half (fitted and tested with those iterations).
- ``colour-resolution``: the colour images at their own resolution, the
  masks resized to them (``load_horses(resolution="image")``; 3.6 times the
  pixels at the median, errors counted there), instead of the colour images
  resized to the masks.
- ``one-hot``: the thresholded edge features as one-hot bins instead of
  cumulative indicators (the paper's "discretized as above 10 thresholds"
  read the other way).
- ``quantile-thresholds``: thresholds at each image's own quantiles n/11 of
  the RGB difference and the Sobel response (the strategy that a comment in
  Domke's toolbox names "similar ... in practice" to its fixed thresholds).
- ``rgb-x0.5``, ``rgb-x2``, ``sobel-x0.5``, ``sobel-x2``: the fixed
  thresholds halved or doubled.
- ``hog-cell-4``, ``hog-cell-16``: HOG cells of 4 or 16 pixels instead of 8.
- ``fourier-1``: ``sin(c.s)`` as the paper writes it, not ``sin(pi c.s)``.
- ``rho-ust``: the uniform spanning tree's exact edge probabilities
  (``rho="uniform_spanning_tree"``: 0.5 inside an image, up to 0.7 at its
  border) instead of the default's 0.5 everywhere (``rho="auto"`` on grids
  of more than 600 nodes is the forest cover's 0.5).
- ``rho-0.75``, ``rho-0.25``: other edge appearance probabilities.

Fits use float32 (the package's ``dtype``; float32 and float64 fits of the
denoising example test within 7e-5) and the default stopping rule, at most
``--max-iter`` L-BFGS iterations. Each variant's fits are checkpointed and
its record saved as soon as it is evaluated, under
``OUT/horses_ablation_checkpoints/<settings>/<variant>/``: rerun the same
command and it goes on with the variants not yet finished.

Run::

    python examples/horses_ablation.py [--data PATH] [--out DIR] [--variants all|a,b] [--n-train 100] [--n-test 128]

Features are cached under ``--cache`` (default OUT/horses_ablation_features):
about 5 GB of node and 4 GB of edge features per setting at full
resolution; variants that change only one kind share the other's files.
"""

import shutil
from pathlib import Path

import numpy as np

import _common

#: name -> (what changes, HorseFeatures parameters, MarginalCRF parameters, first training image)
VARIANTS = {
    "paper": ("our reading of the paper (the defaults)", {}, {}, 0),
    "train-101-200": ("the next --n-train training images (the yardstick)", {}, {}, 100),
    "scale-0.5": ("CRF grid at half resolution", {"scale": 0.5}, {}, 0),
    "images-0.5": ("images at half resolution before everything", {"image_scale": 0.5}, {}, 0),
    "images-0.75": ("images at 3/4 resolution before everything", {"image_scale": 0.75}, {}, 0),
    "images-0.25": ("images at 1/4 resolution before everything", {"image_scale": 0.25}, {}, 0),
    "colour-resolution": ("the colour images' own resolution (masks resized)", {"resolution": "image"}, {}, 0),
    "one-hot": ("one-hot threshold bins", {"threshold_coding": "one_hot"}, {}, 0),
    "quantile-thresholds": ("thresholds at each image's quantiles n/11",
                            {"rgb_thresholds": "quantiles", "sobel_thresholds": "quantiles"}, {}, 0),
    "hog-cell-16": ("HOG cells of 16 pixels", {"hog_cell_size": 16}, {}, 0),
    "hog-cell-4": ("HOG cells of 4 pixels", {"hog_cell_size": 4}, {}, 0),
    "fourier-1": ("sin(c.s), not sin(pi c.s)", {"fourier_scale": 1.0}, {}, 0),
    "rgb-x2": ("RGB thresholds doubled", {"rgb_thresholds": tuple(round(0.1 * k, 2) for k in range(1, 11))}, {}, 0),
    "rgb-x0.5": ("RGB thresholds halved", {"rgb_thresholds": tuple(round(0.025 * k, 3) for k in range(1, 11))}, {}, 0),
    "sobel-x2": ("Sobel thresholds doubled", {"sobel_thresholds": tuple(round(0.04 * k, 2) for k in range(1, 11))}, {}, 0),
    "sobel-x0.5": ("Sobel thresholds halved", {"sobel_thresholds": tuple(round(0.01 * k, 2) for k in range(1, 11))}, {}, 0),
    "images-0.5-trw10": ("images at half resolution, 10 TRW iterations (the reach of 20 at full resolution)",
                         {"image_scale": 0.5}, {"n_iter": 10}, 0),
    "trw40": ("40 TRW iterations (the reach of 20 at half resolution)", {}, {"n_iter": 40}, 0),
    "rho-ust": ("rho of the uniform spanning tree (exact)", {}, {"rho": "uniform_spanning_tree"}, 0),
    "rho-0.75": ("rho = 0.75 on every edge", {}, {"rho": 0.75}, 0),
    "rho-0.25": ("rho = 0.25 on every edge", {}, {"rho": 0.25}, 0),
    "scale-0.75": ("CRF grid at 3/4 resolution", {"scale": 0.75}, {}, 0),
}

#: HorseFeatures parameters that change the node features; the others (but
#: ``scale``, ``image_scale`` and ``resolution``, which change both) change
#: only the edge features. ``image_scale`` and ``resolution`` are this
#: script's: the images and masks are loaded at ``resolution``
#: (:func:`~sklearn_margcrf.datasets.load_horses`) and downscaled by
#: ``image_scale`` before the features.
UNARY_PARAMETERS = ("scale", "image_scale", "resolution", "hog_orientations", "hog_cell_size", "hog_block_size",
                    "fourier_scale")
LOADING = ("image_scale", "resolution")

QUICK = dict(n_train=2, n_test=2, max_iter=3)
FULL = dict(n_train=100, n_test=128, max_iter=100)


def _arguments(parser):
    parser.add_argument("--variants", default="all", help="comma-separated variants to run: " + ", ".join(VARIANTS))
    parser.add_argument("--n-train", type=int, default=None, help="training images per variant (default 100; --quick 2)")
    parser.add_argument("--n-test", type=int, default=None, help="test images: the first of the test split (default 128)")
    parser.add_argument("--split", type=int, default=200, help="the first SPLIT ids in sorted order train, the rest test (default 200, as the paper)")
    parser.add_argument("--max-iter", type=int, default=None, help="L-BFGS iterations per fit at most (default 100)")
    parser.add_argument("--dtype", choices=("float64", "float32"), default="float32",
                        help="precision of inference and its gradients (default float32)")
    parser.add_argument("--cache", default=None, help="folder of the cached features (default OUT/horses_ablation_features)")
    parser.add_argument("--batch", type=int, default=16, help="images per batch when computing error rates (default 16)")
    parser.add_argument(
        "--drop-features", action="store_true",
        help="delete a variant's own cached features once its record is saved (the paper reading's are kept): "
             "the full list needs about 100 GB otherwise",
    )
    parser.add_argument(
        "--table-spread", default=None, metavar="CHECKPOINTS",
        help="fit nothing: the bootstrap spread over the test images of the horses table's cells whose weights "
             "are in this horses.py checkpoint folder (40-iteration rows and the independent model)",
    )
    _common.resumable_arguments(parser, "horses_ablation")


def _settings(args):
    _common.fill_defaults(args, QUICK, FULL)
    if args.n_train < 1 or args.n_test < 1 or args.max_iter < 1:
        raise SystemExit("--n-train, --n-test and --max-iter must be at least 1")
    args.variants = _common.select(args.variants, VARIANTS, option="--variants", given_order=True)
    split = "" if args.split == 200 else f"split{args.split}-"
    settings = f"{split}train{args.n_train}-test{args.n_test}-maxiter{args.max_iter}-{args.dtype}"
    _common.checkpoint_folder(args, "horses_ablation", settings)
    if args.cache is None:
        args.cache = str(Path(args.out) / "horses_ablation_features")
    return args


def _folder_name(params, names):
    """A folder name for the features that ``params`` (of ``names``) set; "default" when none."""
    parts = []
    for name in sorted(set(params) & set(names)):
        value = params[name]
        if isinstance(value, (tuple, list)):
            value = f"{value[0]:g}..{value[-1]:g}"
        parts.append(f"{name}={value:g}" if isinstance(value, float) else f"{name}={value}")
    return "-".join(parts) or "default"


def _feature_folders(args, feature_params):
    """The cache folders of the node and of the edge features that ``feature_params`` give."""
    edge_names = set(feature_params) - set(UNARY_PARAMETERS) | {"scale", *LOADING}
    root = Path(args.cache)
    return (root / ("node-" + _folder_name(feature_params, UNARY_PARAMETERS)),
            root / ("edge-" + _folder_name(feature_params, edge_names)))


def _samples(args, feature_params, images, ids):
    from sklearn_margcrf.features import HorseFeatures

    params = {k: v for k, v in feature_params.items() if k not in LOADING}
    transformer = HorseFeatures(dtype=np.float32, **params)
    return _common.cached_features(transformer, images, ids, *_feature_folders(args, feature_params))


def _grid_labels(samples, masks):
    """Each mask at its sample's CRF grid (for fitting)."""
    return [mask if tuple(s.grid_shape) == mask.shape else _common.downscale_labels(mask, s.grid_shape)
            for s, mask in zip(samples, masks)]


def _model(args, **params):
    from sklearn_margcrf import MarginalCRF

    return MarginalCRF(
        loss="univariate_logistic", inference="trw", gradient_mode="truncated", n_iter=20, reg=1e-3,
        max_iter=args.max_iter, n_jobs=args.n_jobs, verbose=args.verbose, dtype=args.dtype,
    ).set_params(**params)


def run_variant(args, name, train, test):
    """Fit the independent model, then the TRW model from it; return the record."""
    description, feature_params, model_params, first = VARIANTS[name]
    store = _common.Checkpoints(Path(args.checkpoints) / name)
    record_name = f"errors-test{args.n_test}"
    image_scale = feature_params.get("image_scale", 1.0)

    def complete(record):
        return "test_wrong" in record and (image_scale == 1 or "full_test_wrong" in record)

    if store.has_record(record_name):
        record = store.record(record_name, None)
        if complete(record) or args.report_only:  # finished: no features needed
            return record
    elif args.report_only:
        return None
    if feature_params.get("resolution", "mask") != "mask":
        train, test = _load(args, first + args.n_train, feature_params["resolution"])
    train_images, train_masks, train_ids = (part[first : first + args.n_train] for part in train)
    test_images, test_masks, test_ids = test
    full_test_masks = test_masks
    if image_scale != 1:
        train_images, train_masks = zip(*(_common.downscale(i, m, image_scale) for i, m in zip(train_images, train_masks)))
        test_images, test_masks = zip(*(_common.downscale(i, m, image_scale) for i, m in zip(test_images, test_masks)))
    with _common.Timer() as features:
        X_train = _samples(args, feature_params, train_images, train_ids)
        X_test = _samples(args, feature_params, test_images, test_ids)
    y_train = _grid_labels(X_train, train_masks)
    n_node, n_edge = X_train[0].node_features.shape[1], X_train[0].edge_features.shape[1]
    zeros = {"unary_coef": np.zeros((2, n_node)), "pairwise_coef": np.zeros((2, 2, n_edge))}
    independent, independent_state = store.fit(
        "independent", _model(args, inference="independent"), X_train, y_train, zeros, args.max_iter, args.segment)
    start = {"unary_coef": independent.unary_coef_, "pairwise_coef": independent.pairwise_coef_}
    model, state = store.fit("trw20", _model(args, **model_params), X_train, y_train, start, args.max_iter, args.segment)

    def per_image_test_errors():
        """Per test image: wrong pixels of both models and labelled pixels (for
        the bootstrap); for reduced images also against the full-resolution
        masks (``full_*``), as every other variant: the grid's marginals
        upsampled to them (predict_proba, as for scale-0.5)."""
        counted = [("", X_test, test_masks)]
        if image_scale != 1:
            full_samples = _common.with_image_shapes(X_test, [m.shape for m in full_test_masks])
            counted.append(("full_", full_samples, full_test_masks))
        counts = {}
        for prefix, samples, masks in counted:
            wrong, labelled = _common.per_image_error_counts(model, samples, masks, args.batch)
            independent_wrong, _ = _common.per_image_error_counts(independent, samples, masks, args.batch)
            counts.update({f"{prefix}test_wrong": wrong.tolist(), f"{prefix}independent_test_wrong": independent_wrong.tolist(),
                           f"{prefix}test_labelled": labelled.tolist()})
        return counts

    def evaluate():
        per_image = per_image_test_errors()
        labelled = sum(per_image["test_labelled"])
        return {
            "variant": name, "changes": description, "features": {k: str(v) for k, v in feature_params.items()},
            "model": {k: str(v) for k, v in model_params.items()}, "train_images": [first + 1, first + args.n_train],
            "independent_test": sum(per_image["independent_test_wrong"]) / labelled,
            "independent_seconds": independent_state["seconds"],
            "independent_lbfgs_iterations": independent_state["lbfgs_iterations"],
            **_common.fit_record(
                model, name, _common.error_rate(model, X_train, train_masks, args.batch),
                sum(per_image["test_wrong"]) / labelled, state["seconds"],
            ),
            "feature_seconds": features.seconds,
            **per_image,
        }

    record = store.record(record_name, evaluate)
    if not complete(record):  # a record made before the per-image (or full-resolution) counts were kept
        record.update(per_image_test_errors())
        _common.write_json(Path(args.checkpoints) / name / f"{record_name}.json", record)
    shown = at_full_resolution(record)
    print(f"  {name:<20} independent test {shown['independent_test']:.4f}   TRW 20: train {record['train']:.4f} "
          f"test {shown['test']:.4f}   fit {record['seconds']:.0f} s ({record['lbfgs_iterations']} L-BFGS it.)",
          flush=True)
    if args.drop_features:
        for folder in _feature_folders(args, feature_params):
            if not folder.name.endswith("-default"):
                shutil.rmtree(folder, ignore_errors=True)
    return record


def at_full_resolution(record):
    """The record's test errors and counts against the full-resolution masks:
    the ``full_*`` ones of the variants that reduce the images first."""
    if "full_test_wrong" not in record:
        return record
    full = {key: record["full_" + key] for key in ("test_wrong", "independent_test_wrong", "test_labelled")}
    labelled = sum(full["test_labelled"])
    full["test"] = sum(full["test_wrong"]) / labelled
    full["independent_test"] = sum(full["independent_test_wrong"]) / labelled
    return {**record, **full, **{key + "_own": record[key] for key in full}}


def _pooled(wrong, labelled):
    return lambda images: wrong[images].sum() / labelled[images].sum()


def spreads(record, base=None):
    """Bootstrap standard deviations over the test images (:func:`_common.bootstrap_sd`)
    of the TRW model's test error, of its gain over the independent model
    and of its difference to ``base`` (the paper's reading), or None where
    the per-image counts are missing."""
    if "test_wrong" not in record:
        return None, None, None
    wrong, independent = np.array(record["test_wrong"]), np.array(record["independent_test_wrong"])
    labelled = np.array(record["test_labelled"])
    trw, indep = _pooled(wrong, labelled), _pooled(independent, labelled)
    n = len(wrong)
    sd_test = _common.bootstrap_sd(trw, n)
    sd_gain = _common.bootstrap_sd(lambda i: indep(i) - trw(i), n)
    sd_base = None
    if base is not None and "test_wrong" in base and len(base["test_wrong"]) == n and base is not record:
        other = _pooled(np.array(base["test_wrong"]), np.array(base["test_labelled"]))
        sd_base = _common.bootstrap_sd(lambda i: trw(i) - other(i), n)
    return sd_test, sd_gain, sd_base


def _sd(value):
    return None if value is None else f"{value:.4f}"


def table(args, records):
    records = {name: at_full_resolution(record) for name, record in records.items() if record is not None}
    base = records.get("paper")
    header = ["Variant", "indep. te", "TRW20 tr", "TRW20 te", "sd", "gain", "sd", "te-paper", "sd", "fit s", "its"]
    rows = []
    for name in args.variants:
        record = records.get(name)
        if record is None:
            rows.append((name, [None] * 10))
            continue
        sd_test, sd_gain, sd_base = spreads(record, base)
        delta = None if base is None else f"{record['test'] - base['test']:+.4f}"
        rows.append((name, [
            f"{record['independent_test']:.4f}", f"{record['train']:.4f}", f"{record['test']:.4f}", _sd(sd_test),
            f"{record['independent_test'] - record['test']:.4f}", _sd(sd_gain), delta, _sd(sd_base),
            f"{record['seconds']:.0f}", record["lbfgs_iterations"],
        ]))
    title = (
        "Horses ablation: univariate logistic, TRW with 20 truncated iterations (10 or 40 where the variant says so), lambda 1e-3, from the "
        f"independent model;\n{args.n_train} training images per variant, the first {args.n_test} test images, test errors "
        f"at the masks' resolution (the colour images' for colour-resolution; train errors at the fitted resolution); "
        f"{args.dtype}, at most {args.max_iter} L-BFGS "
        "iterations, default stopping rule.\n"
        "Paper (200 training images): univariate logistic TRW 20 test .093, independent test .125."
    )
    title += (
        "\ngain: independent test error minus TRW's; sd: bootstrap standard deviation over the test images "
        "(2000 resamples; te-paper's is paired, image by image, with the paper's reading)."
    )
    title += _common.partial_run_note(sum(r is not None for r in records.values()), len(args.variants))
    legend = "\n".join(f"  {name:<20} {VARIANTS[name][0]}" for name in args.variants)
    reduced = "".join(
        f"\n  {name:<20} independent {record['independent_test_own']:.4f}, TRW 20 {record['test_own']:.4f}"
        for name, record in ((n, _own_resolution(records.get(n))) for n in args.variants) if record is not None)
    if reduced:
        reduced = "\n\nTest errors at the reduced resolution (masks reduced like the images):" + reduced
    timing = f"\n\nVariants:\n{legend}{reduced}\n\nFit seconds: {_common.run_description(args.n_jobs)}"
    return _common.format_table(title, header, rows) + timing


def _own_resolution(record):
    """The record (turned by :func:`at_full_resolution`) if it has errors at a reduced resolution, else None."""
    if record is None or "test_own" not in record:
        return None
    return record


#: horses.py cells whose spread --table-spread reports: (checkpoint, table row, MarginalCRF parameters)
TABLE_CELLS = (
    ("independent-1e-04", "independent", dict(inference="independent")),
    ("ulogistic-trw-40", "univariate logistic TRW", dict(inference="trw", n_iter=40)),
    ("clogistic-trw-40", "clique logistic TRW", dict(inference="trw", n_iter=40)),
    ("smooth50-40", "sm. class. a=50 TRW", dict(inference="trw", n_iter=40)),
    ("surrogate-trw-40", "surrogate likelihood TRW", dict(inference="trw", n_iter=40)),
    ("ulogistic-mnf-40", "univariate logistic MNF", dict(inference="mean_field", n_iter=40)),
)


def table_spread(args, test):
    """The horses table's test errors with their bootstrap spread over the
    test images, and each model's gain over the independent model (paired),
    beside the paper's; the weights from ``args.table_spread``."""
    from sklearn_margcrf import MarginalCRF

    from horses import PAPER

    folder = Path(args.table_spread)
    test_images, test_masks, test_ids = test
    X_test = _samples(args, {}, test_images, test_ids)
    counts = {}
    for checkpoint, row, params in TABLE_CELLS:
        path = folder / f"{checkpoint}.npz"
        if not path.exists():
            print(f"  {checkpoint}: no weights in {folder}, left out")
            continue
        with np.load(path) as saved:
            model = _common.restore(MarginalCRF(n_jobs=args.n_jobs, **params), saved)
        counts[row] = _common.per_image_error_counts(model, X_test, test_masks, args.batch)
    if "independent" not in counts:
        raise SystemExit(f"the independent model's weights (independent-1e-04.npz) are not in {folder}")
    independent, labelled = _pooled(counts["independent"][0], counts["independent"][1]), counts["independent"][1]
    n = len(labelled)
    rows = []
    for row, (wrong, _) in counts.items():
        error = _pooled(wrong, labelled)
        every = np.arange(n)
        paper_test = PAPER[row][-1]
        paper_gain = None if row == "independent" else f"{PAPER['independent'][-1] - paper_test:.4f}"
        gain = None if row == "independent" else f"{independent(every) - error(every):.4f}"
        sd_gain = None if row == "independent" else _sd(_common.bootstrap_sd(lambda i: independent(i) - error(i), n))
        rows.append((row, [f"{error(every):.4f}", _sd(_common.bootstrap_sd(error, n)), f"{paper_test:.3f}",
                           gain, sd_gain, paper_gain]))
    title = (
        f"Horses table, test errors over the first {n} test images with their bootstrap spread (sd: 2000 resamples "
        f"of the test images), weights from {folder};\n40 iterations for the inference rows; gain: the independent "
        "model's test error minus the row's (paired, image by image); the paper's at the right."
    )
    header = ["Cell", "test", "sd", "paper", "gain", "sd", "gain pap."]
    return _common.report(_common.format_table(title, header, rows), args.out, "horses_test_spread.txt")


def _load(args, n_train, resolution="mask"):
    """(images, int64 masks, ids) of the first ``n_train`` training images and of the test images."""
    from sklearn_margcrf.datasets import load_horses

    parts = []
    for subset, count in (("train", n_train), ("test", args.n_test)):
        try:
            data = load_horses(args.data, subset=subset, max_images=count, n_train=args.split, resolution=resolution)
        except FileNotFoundError as exc:
            raise SystemExit(f"{exc}\n(pass --data PATH; see ../shared/data/README.md)") from None
        if len(data.images) < count and subset == "train":
            raise SystemExit(f"the variants need {count} training images, the data set has {len(data.images)}")
        parts.append((data.images, [np.asarray(m, np.int64) for m in data.labels], data.ids))
    return parts


def main(argv=None):
    """Run the variants; return {variant: record} (finished ones only)."""
    args = _common.start_run("Horses ablation", __doc__, argv, _arguments, _settings)
    if args.table_spread is not None:
        _, test = _load(args, 0)
        with _common.blas_single_thread():
            table_spread(args, test)
        return {}
    train, test = _load(args, max(VARIANTS[name][3] for name in args.variants) + args.n_train)
    records = {}
    with _common.blas_single_thread():
        for name in args.variants:
            record = run_variant(args, name, train, test)
            if record is not None:
                records[name] = record
            _common.report(table(args, records), args.out, "horses_ablation_table.txt")
    return records


if __name__ == "__main__":
    main()
