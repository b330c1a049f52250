"""Stanford backgrounds (Domke 2013, Sec. "Stanford Backgrounds Data", Table
"Test errors on the backgrounds dataset", Fig. "Example marginals from the
backgrounds dataset").

The Stanford Background Dataset (iccv09Data): 715 images of about 320 x 240,
eight classes (sky, tree, road, grass, water, building, mountain, foreground
object), unlabelled pixels hidden (-1). Features
(:class:`~sklearn_margcrf.features.BackgroundFeatures`): the 100 unary
features of the horses (sinusoidal expansion of RGB and position, 36-component
HOG) computed at full resolution, the CRF grid reduced to 20% of the image
(about 64 x 48), 22 edge features (constant and thresholded RGB difference,
horizontal / vertical halves). Predicted marginals are upsampled to the
image's own size and errors are counted there, over the labelled pixels.

Protocol of the paper (the default): five-fold cross-validation over all 715
images (the loader's ``folds``, drawn at random with ``--seed``;
``--contiguous-folds`` takes contiguous runs of the sorted ids instead, which
come in ranges by source), TRW, K = 8 states; rows

* surrogate EM (``loss="surrogate_likelihood"``, hidden labels), univariate
  and clique logistic, lambda = 1e-3, truncated fitting with 5, 10 and 20
  iterations (each prediction also runs that many iterations);
* pseudolikelihood and piecewise likelihood (TRW run to a threshold of 1e-5
  at test time, as in the paper's horse experiment) and the independent
  model, lambda = 1e-4;

each fitted with the paper's incremental procedure: a random subset of 32
images with 1000 L-BFGS iterations, then the number of images doubled and the
number of iterations halved until all training images are used
(``MarginalCRF(incremental=32, max_iter=1000)``). Train errors are pooled
over the training images of every fold, test errors over all images (each is
a test image once).

Run::

    python examples/backgrounds.py [--data PATH] [--quick] [--out DIR] [--n-jobs N]

``--quick``: the first 24 images, 2 folds, incremental from 6 images with 8
L-BFGS iterations (6 x 8, then the 12 training images x 4). ``--rows``, ``--iters``, ``--folds``, ``--n-images``,
``--max-iter``, ``--incremental`` select a part of the protocol (e.g. one fold
at a time on a shared machine). Outputs in ``--out``: ``backgrounds_table.txt``,
``backgrounds_marginals.png``, ``backgrounds_results.json``; a run whose folds
or model differ from the paper's (``--contiguous-folds``, ``--dtype``,
``--rho``, ``--objective-tol``) names them after it, e.g.
``backgrounds-float32_table.txt``, so that no variant replaces another's.

Long runs are resumable. Each fold's fit of a row saves its weights every
``--segment`` L-BFGS iterations (the library's
:class:`~sklearn_margcrf.callbacks.Checkpoint`) under ``--checkpoints``
(default ``OUT/backgrounds_checkpoints/<settings>``), and its error counts
are recorded as soon as it is evaluated. Run the same command again after an
interruption: finished fits are read from their records and weights, an
unfinished one resumes in the stage of the incremental schedule where it was
saved, with that stage's remaining iterations (L-BFGS starts afresh there,
as after the paper's re-initialisation). A fit that failed (truncated
surrogate EM diverging) is recorded as failed and not retried.
``--report-only`` writes the table and figure of the finished fits only.
``--cache DIR`` keeps the features (memory-mapped, by image id), so that a
resumed run does not compute them again.
"""

import json
from pathlib import Path

import numpy as np

import _common

N_STATES = 8
N_IMAGES = 715  # the data set's, all in the paper's protocol
ITERATIONS = (5, 10, 20)

#: key -> (table name, MarginalCRF parameters, truncated?). Truncated rows are
#: fitted once per iteration count, the others once.
ROWS = {
    "surrogate_em": ("surrogate EM", dict(loss="surrogate_likelihood", reg=1e-3), True),
    "univariate_logistic": ("univariate logistic", dict(loss="univariate_logistic", reg=1e-3), True),
    "clique_logistic": ("clique logistic", dict(loss="clique_logistic", reg=1e-3), True),
    "pseudolikelihood": ("pseudolikelihood", dict(loss="pseudolikelihood", reg=1e-4, tol=1e-5), False),
    "piecewise": ("piecewise", dict(loss="piecewise", reg=1e-4, tol=1e-5), False),
    "independent": ("independent", dict(loss="univariate_logistic", inference="independent", reg=1e-4), False),
}

#: Table "Test errors on the backgrounds dataset": train / test at 5, 10 and
#: 20 iterations; the inference-free rows and the independent model only have
#: the 20-iteration column.
PAPER = {
    "surrogate EM": {5: (0.876, 0.877), 10: (0.239, 0.249), 20: (0.238, 0.248)},
    "univariate logistic": {5: (0.210, 0.228), 10: (0.202, 0.224), 20: (0.201, 0.223)},
    "clique logistic": {5: (0.206, 0.226), 10: (0.198, 0.223), 20: (0.195, 0.221)},
    "pseudolikelihood": {20: (0.516, 0.519)},
    "piecewise": {20: (0.335, 0.341)},
    "independent": {20: (0.293, 0.299)},
}

#: Colours of the eight classes (sky, tree, road, grass, water, building,
#: mountain, foreground object); hidden pixels are black.
CLASS_COLOURS = np.array(
    [
        [0.55, 0.75, 1.00],  # sky
        [0.00, 0.40, 0.00],  # tree
        [0.50, 0.50, 0.50],  # road
        [0.55, 0.90, 0.35],  # grass
        [0.00, 0.20, 0.80],  # water
        [0.70, 0.25, 0.15],  # building
        [0.55, 0.40, 0.65],  # mountain
        [1.00, 0.75, 0.00],  # foreground object
    ]
)


# ---------------------------------------------------------------------------
# Helpers shared with learning_methods.py


def compute_features(images, scale, n_jobs, cache=None, ids=None):
    """BackgroundFeatures samples (grid at ``scale``, image_shape kept);
    with ``cache``, saved under ``cache/scale<scale>`` by image id and read
    back as memory maps (:func:`_common.cached_features`), so that a resumed
    run skips them."""
    from sklearn_margcrf.features import BackgroundFeatures

    transformer = BackgroundFeatures(scale=scale, n_jobs=n_jobs)
    if cache is None:
        return transformer.transform(images)
    return _common.cached_features(transformer, images, ids, Path(cache) / f"scale{scale:g}")


def schedule_work(n_images, incremental, max_iter):
    """Sum over the stages of (images x L-BFGS iterations) of MarginalCRF's
    incremental schedule (the same rule as ``MarginalCRF._stages``)."""
    if incremental is None or incremental >= n_images:
        return n_images * max_iter
    work, size, iterations = 0, int(incremental), int(max_iter)
    while True:
        size = min(size, n_images)
        work += size * max(iterations, 1 if max_iter else 0)
        if size == n_images:
            return work
        size *= 2
        iterations //= 2


# ---------------------------------------------------------------------------
# The experiment


def _arguments(parser):
    parser.add_argument("--n-images", type=int, default=None, help="first N images in sorted id order (default: all 715; --quick: 24)")
    parser.add_argument("--n-folds", type=int, default=None, help="cross-validation folds (default 5; --quick: 2)")
    parser.add_argument("--folds", type=_common.int_list, default=None, help="evaluate only these folds, e.g. 0,1 (default: all)")
    parser.add_argument("--iters", type=_common.int_list, default=None, help="truncated fitting iterations (default 5,10,20)")
    parser.add_argument("--max-iter", type=int, default=None, help="L-BFGS iterations of the first stage (default 1000; --quick: 8)")
    parser.add_argument("--incremental", type=int, default=None, help="images of the first stage, 0 = all at once (default 32; --quick: 6)")
    parser.add_argument("--rows", default=",".join(ROWS), help=f"comma-separated rows among {','.join(ROWS)} (or all)")
    parser.add_argument("--scale", type=float, default=0.2, help="CRF grid resolution relative to the image (default 0.2)")
    parser.add_argument("--seed", type=int, default=0, help="seeds the folds and the incremental subsets")
    parser.add_argument("--contiguous-folds", action="store_true",
                        help="folds in contiguous runs of the sorted ids (the loader's shuffle=False; the ids come "
                             "in ranges by source) instead of drawn at random (the default; the paper does not say)")
    parser.add_argument("--figure-image", default=None, help="id of the image shown in the figure (default: the first test image)")
    parser.add_argument("--dtype", choices=("float64", "float32"), default="float64",
                        help="precision of inference and its gradients (MarginalCRF dtype; default float64, the paper's)")
    parser.add_argument("--cache", default=None,
                        help="folder where the features are kept between runs (memory-mapped; about 2 GB for the "
                             "715 images at scale 0.2); default: computed afresh each run (about 4 min)")
    _common.rho_argument(parser)
    _common.objective_tol_argument(parser)
    _common.resumable_arguments(parser, "backgrounds")


QUICK = dict(n_images=24, n_folds=2, iters=list(ITERATIONS), max_iter=8, incremental=6)
FULL = dict(n_images=None, n_folds=5, iters=list(ITERATIONS), max_iter=1000, incremental=32)


def _settings(args):
    _common.fill_defaults(args, QUICK, FULL)
    if args.incremental == 0:
        args.incremental = None
    args.rows = _common.select(args.rows, ROWS, given_order=True)
    args.iters = sorted(set(args.iters))
    variant = ("-contiguous" if args.contiguous_folds else "") + _common.fit_variant_suffix(args)
    settings = (f"images{args.n_images or 'all'}-folds{args.n_folds}-seed{args.seed}-scale{args.scale:g}"
                f"-maxiter{args.max_iter}-incremental{args.incremental or 0}" + variant)
    _common.checkpoint_folder(args, "backgrounds", settings)
    # the name of the table, results and figure: a run of other folds or another model than the paper's
    # never replaces the default table (the sizes only select part of a run, and the title states them)
    args.stem = "backgrounds" + variant
    return args


def _fits(args):
    """(row key, n_iter or None) of every fit, in table order."""
    out = []
    for key in args.rows:
        if ROWS[key][2]:
            out += [(key, n_iter) for n_iter in args.iters]
        else:
            out.append((key, None))
    return out


def _model(key, n_iter, args, fold):
    from sklearn_margcrf import MarginalCRF

    params = dict(ROWS[key][1])
    params.setdefault("inference", "trw")
    return MarginalCRF(
        n_iter=n_iter if n_iter is not None else max(args.iters),
        n_states=N_STATES,
        max_iter=args.max_iter,
        incremental=args.incremental,
        random_state=args.seed + fold,
        n_jobs=args.n_jobs,
        verbose=args.verbose,
        dtype=args.dtype,
        objective_tol=args.objective_tol,  # 0, the paper's protocol: L-BFGS to its own end or max_iter
        rho=args.rho,
        **params,
    )


def run(args):
    from sklearn_margcrf.datasets import STANFORD_BACKGROUND_CLASSES, load_stanford_background

    _common.require_data(args.data, "stanford_background")
    with _common.Timer() as t_load:
        data = load_stanford_background(
            Path(args.data) / "stanford_background", max_images=args.n_images,
            n_folds=args.n_folds, shuffle=not args.contiguous_folds, random_state=args.seed,
        )
    folds = np.asarray(data.folds)
    fold_ids = sorted(set(folds.tolist())) if args.folds is None else args.folds
    missing = [f for f in fold_ids if not np.any(folds == f)]
    if missing:
        raise SystemExit(f"folds {missing} hold none of the {len(folds)} selected images")
    print(f"{len(data.images)} images, {args.n_folds} folds (sizes {np.bincount(folds, minlength=args.n_folds).tolist()}), "
          f"evaluating folds {fold_ids}; loaded in {t_load.seconds:.1f} s")

    with _common.Timer() as t_feat:
        X = compute_features(data.images, args.scale, args.n_jobs, args.cache, data.ids)
    labels = data.labels
    print(f"features: {X[0].node_features.shape[1]} unary, {X[0].edge_features.shape[1]} edge, "
          f"grid {X[0].grid_shape} for image {X[0].image_shape}; {t_feat.seconds:.1f} s")

    if args.figure_image is not None:
        if args.figure_image not in data.ids:
            raise SystemExit(f"--figure-image {args.figure_image} is not among the selected images")
        figure_index = data.ids.index(args.figure_image)
        if folds[figure_index] not in fold_ids:
            raise SystemExit(f"--figure-image {args.figure_image} is in fold {folds[figure_index]}, not evaluated")
    else:
        figure_index = int(np.flatnonzero(folds == fold_ids[0])[0])
    figure_n_iter = max(args.iters)
    figure_marginals = {}

    fits = _fits(args)
    counts = {fit: np.zeros(4, dtype=np.int64) for fit in fits}  # train wrong, train total, test wrong, test total
    times = {fit: 0.0 for fit in fits}
    work = {fit: 0 for fit in fits}
    status = {fit: [] for fit in fits}
    failed, finished = set(), 0
    start_times = {}  # lambda -> (seconds, images x L-BFGS iterations) of the shared independent starts, over the folds
    store = _common.ResumableFits(args.checkpoints, every=args.segment)
    for fold in fold_ids:
        train = np.flatnonzero(folds != fold)
        test = np.flatnonzero(folds == fold)
        X_train, y_train = [X[i] for i in train], [labels[i] for i in train]
        X_test, y_test = [X[i] for i in test], [labels[i] for i in test]
        starts = {}

        def start(reg):
            """The independent model at ``reg``, fitted once per fold for every row that starts from it."""
            if reg not in starts:
                model, state = store.fit(_start_cell(fold, reg), _start_model(args, fold, reg), X_train, y_train)
                print(f"  fold {fold} independent start, lambda {reg:.0e}: fit {state['seconds']:8.1f} s "
                      f"({state['lbfgs_iterations']} L-BFGS it.)", flush=True)
                starts[reg] = (model.unary_coef_, model.pairwise_coef_)
            return starts[reg]

        for key, n_iter in fits:
            record, model = _fold_fit(store, args, fold, key, n_iter, X_train, y_train, X_test, y_test, start)
            if record is None:  # --report-only: not finished yet
                continue
            finished += 1
            if "failed" in record:
                status[(key, n_iter)].append(f"fold {fold}: {record['failed'].split(':')[0]}")
                failed.add((key, n_iter))
                continue
            times[(key, n_iter)] += record["seconds"]
            work[(key, n_iter)] += record["work"]
            counts[(key, n_iter)] += np.array(record["counts"], dtype=np.int64)
            if figure_index in test and (n_iter is None or n_iter == figure_n_iter) and model is not None:
                position = int(np.flatnonzero(test == figure_index)[0])
                figure_marginals[key] = model.predict_proba([X_test[position]])[0]
        for reg in sorted({ROWS[key][1]["reg"] for key, _ in fits if key != "independent"}, reverse=True):
            state = store.state(_start_cell(fold, reg))
            if state is not None:
                seconds, images_iterations = start_times.get(reg, (0.0, 0))
                start_times[reg] = (seconds + state["seconds"],
                                    images_iterations + len(train) * state["lbfgs_iterations"])

    errors = {}
    for fit, c in counts.items():
        if fit in failed or c[1] <= 0 or c[3] <= 0:
            errors[fit] = (float("nan"), float("nan"))
        else:
            errors[fit] = (c[0] / c[1], c[2] / c[3])
    return dict(
        data=data, labels=labels, folds=fold_ids, fits=fits, errors=errors, times=times, work=work,
        finished=finished, n_cells=len(fits) * len(fold_ids), start_times=start_times,
        status=status, figure_index=figure_index, figure_n_iter=figure_n_iter,
        figure_marginals=figure_marginals, class_names=STANFORD_BACKGROUND_CLASSES,
        load_seconds=t_load.seconds, feature_seconds=t_feat.seconds,
    )


def _start_cell(fold, reg):
    return f"fold{fold}-independent-start-{reg:.0e}"


def _start_model(args, fold, reg):
    """The independent model that ``init="independent"`` fits first (every
    training image at once, ``max_iter``, the fit's stopping rule), made
    once per fold and lambda: the independent row's model at ``reg``,
    without the incremental schedule (and without ``--rho``, which it
    would ignore)."""
    return _model("independent", None, args, fold).set_params(reg=reg, incremental=None, rho=None)


def _fold_fit(store, args, fold, key, n_iter, X_train, y_train, X_test, y_test, start):
    """(record, model) of one fold's fit of a row: read from its record when
    there, otherwise fitted (resumed from its checkpoint if a previous run
    saved one), evaluated and recorded; (None, None) with ``--report-only``
    while it is not finished. The model is None when its weights are not
    there (a failed fit). A fresh fit starts from ``start(lambda)``, the
    fold's independent model (what ``init="independent"`` would fit for
    each row again), but the independent row itself."""
    name = ROWS[key][0] + (f" {n_iter} it." if n_iter is not None else "")
    cell = f"fold{fold}-{key}" + (f"-{n_iter}it" if n_iter is not None else "")
    record_path = Path(args.checkpoints) / f"{cell}.record.json"
    model = _model(key, n_iter, args, fold)
    if record_path.exists():
        record = json.loads(record_path.read_text())
        model = store.load(cell, model)[0] if store.finished(cell) else None
        note = "from its record"
    elif args.report_only:
        return None, None
    else:
        try:
            shared = None if key == "independent" else (lambda: start(ROWS[key][1]["reg"]))
            model, state = store.fit(cell, model, X_train, y_train, start=shared)
        except (FloatingPointError, ValueError, np.linalg.LinAlgError) as exc:
            # e.g. truncated surrogate EM diverging to non-finite weights: recorded, not retried
            record, model = {"failed": f"{type(exc).__name__}: {exc}"}, None
        else:
            with _common.Timer() as t_eval:
                c_train = _common.error_counts(model, X_train, y_train)
                c_test = _common.error_counts(model, X_test, y_test)
            record = dict(state, counts=list(c_train + c_test), evaluation_seconds=t_eval.seconds,
                          work=schedule_work(len(X_train), args.incremental, args.max_iter))
        _common.write_json(record_path, record)
        note = f"{record.get('runs', 1)} run(s)"
    if "failed" in record:
        print(f"  fold {fold} {name}: fit failed ({record['failed']})", flush=True)
    else:
        c = record["counts"]
        print(f"  fold {fold} {name:32s} fit {record['seconds']:8.1f} s ({record['lbfgs_iterations']} L-BFGS it., "
              f"{record['restarts']} restarts, {note})  train {c[0] / c[1]:.3f}  test {c[2] / c[3]:.3f}", flush=True)
    return record, model


def _cell(value):
    return None if value is None or not np.isfinite(value) else float(value)


def tables(result, args):
    iters = args.iters
    header = ["loss", "lambda"] + [f"{n}it {part}" for n in iters for part in ("train", "test")]
    rows, paper = [], {}
    for key in args.rows:
        name, params, truncated = ROWS[key]
        values = [f"{params['reg']:.0e}".replace("e-0", "e-")]
        paper_values = [values[0]]
        for n in iters:
            if truncated:
                train, test = result["errors"][(key, n)]
                values += [_cell(train), _cell(test)]
            elif n == max(iters):
                train, test = result["errors"][(key, None)]
                values += [_cell(train), _cell(test)]
            else:
                values += [None, None]
            reference = PAPER[name].get(n if truncated else 20) if (truncated or n == max(iters)) else None
            paper_values += list(reference) if reference is not None else [None, None]
        rows.append((name, values))
        paper[name] = paper_values
    folds = ",".join(str(f) for f in result["folds"])
    title = (
        f"Test errors on the backgrounds dataset (TRW, {len(result['data'].images)} images, "
        f"folds {folds} of {args.n_folds}{' (contiguous in id order)' if args.contiguous_folds else ''}, incremental={args.incremental}, max_iter={args.max_iter}; "
        "errors over labelled pixels at image resolution; non-truncated rows in the last column)"
    )
    title += _common.partial_run_note(result["finished"], result["n_cells"])
    table = _common.format_table(title, header, rows, paper=paper)

    time_rows = []
    for key, n_iter in result["fits"]:
        name = ROWS[key][0] + (f" {n_iter} it." if n_iter is not None else "")
        seconds = result["times"][(key, n_iter)]
        per_unit = seconds / result["work"][(key, n_iter)] if result["work"][(key, n_iter)] else float("nan")
        time_rows.append((name, [seconds, per_unit * 1e3, "; ".join(result["status"][(key, n_iter)]) or "ok"]))
    for reg, (seconds, work) in result["start_times"].items():
        time_rows.append((f"independent start {reg:.0e}".replace("e-0", "e-"),
                          [seconds, seconds / work * 1e3 if work else float("nan"), "shared by the rows at this lambda"]))
    timing = _common.format_table(
        f"Fit times summed over the folds on {_common.run_description(args.n_jobs)} "
        "(ms per image x L-BFGS iteration of the incremental schedule; of the fit itself for the independent starts,\n"
        "fitted once per fold and lambda on all training images, from which every row but the independent one starts)",
        ["fit", "seconds", "ms/img.it", "status"], time_rows,
    )
    return table, timing


def full_protocol_estimate(result, args, n_images=N_IMAGES, n_folds=5, incremental=32, max_iter=1000, iters=ITERATIONS):
    """Seconds of the paper's protocol, from this run's cost per image x
    L-BFGS iteration (truncated rows: a line a + b n_iter through the measured
    costs, proportional to n_iter with a single measurement). Small runs
    overestimate it: fixed costs per fit weigh more."""
    n_train = n_images - n_images // n_folds
    full_work = schedule_work(n_train, incremental, max_iter) * n_folds
    total, lines = 0.0, []
    for key in ROWS:
        truncated = ROWS[key][2]
        measured = [(n, result["times"][(key, n)] / result["work"][(key, n)])
                    for (k, n) in result["fits"] if k == key and result["work"][(k, n)]]
        if not measured:
            continue
        if truncated and len(measured) > 1:
            slope, intercept = np.polyfit([n for n, _ in measured], [c for _, c in measured], 1)
            slope, intercept = max(slope, 0.0), max(intercept, 0.0)
            seconds = sum((intercept + slope * n) * full_work for n in iters)
        elif truncated:
            n, cost = measured[0]
            seconds = sum(cost / n * m * full_work for m in iters)
        else:
            seconds = measured[0][1] * full_work
        total += seconds
        lines.append(f"  {ROWS[key][0]:22s} {seconds / 3600:8.1f} h")
    for reg, (seconds, work) in result.get("start_times", {}).items():
        if work:  # at most max_iter L-BFGS iterations on every training image, once per fold
            seconds = seconds / work * n_train * max_iter * n_folds
            total += seconds
            lines.append(f"  {'independent start ' + f'{reg:.0e}':22s} {seconds / 3600:8.1f} h at most")
    return total, lines


def remaining_estimate(result, args, estimate):
    """The line saying what the paper's protocol still costs at this run's
    cost: the estimate less the fits (and independent starts) done, when
    this run is that protocol (all images and rows, 5 folds, incremental 32 /
    1000 iterations, 5/10/20 it.); empty otherwise or when it is complete."""
    protocol = (len(result["data"].images) == N_IMAGES and set(args.rows) == set(ROWS)
                and all(getattr(args, name) == FULL[name] for name in ("n_folds", "incremental", "max_iter", "iters")))
    n_protocol_fits = len(result["fits"]) * args.n_folds
    if not protocol or result["finished"] >= n_protocol_fits:
        return ""
    done = sum(result["times"].values()) + sum(seconds for seconds, _ in result["start_times"].values())
    unmeasured = [ROWS[key][0] for key in ROWS
                  if not any(result["work"][fit] for fit in result["fits"] if fit[0] == key)]
    line = (f"Done: {result['finished']} of the protocol's {n_protocol_fits} fits, {done / 3600:.1f} h of fitting; "
            f"remaining at this cost: {max(estimate - done, 0.0) / 3600:.1f} h")
    if unmeasured:
        line += f" and the rows with no finished fit yet ({', '.join(unmeasured)}; see backgrounds_cost_probe.txt)"
    return line


def figure(result, args):
    from sklearn_margcrf.plot import plot_marginals

    plt = _common.pyplot()

    data, index = result["data"], result["figure_index"]
    labels = np.asarray(result["labels"][index])
    methods = []
    for key in args.rows:
        if key in result["figure_marginals"]:
            mu = result["figure_marginals"][key]
            observed = labels >= 0
            error = np.mean(np.argmax(mu, axis=-1)[observed] != labels[observed]) if observed.any() else float("nan")
            label = ROWS[key][0] + (f" ({result['figure_n_iter']} it.)" if ROWS[key][2] else "")
            methods.append((f"{label}\nerror {error:.3f}", mu))
    n_cols = 3
    n_rows = 1 + -(-len(methods) // n_cols)
    fig, axes = plt.subplots(n_rows, n_cols, figsize=(3.2 * n_cols, 2.7 * n_rows), squeeze=False)
    for ax in axes.ravel():
        ax.axis("off")
    # class colours mixed by the marginals; the legend in the empty third slot
    colours = dict(colors=CLASS_COLOURS, class_names=result["class_names"], unlabelled_color="black")
    plot_marginals(data.images[index], None, truth=labels, ax=axes[0, :2], titles=["Input image", "True labels"],
                   legend=axes[0, 2], **colours)
    for ax, (title, mu) in zip(axes[1:].ravel(), methods):
        plot_marginals(None, mu, kind="map", ax=ax, titles=[title], legend=False, **colours)
    fig.suptitle(
        f"Example marginals, image {data.ids[index]} (class colours mixed by the marginals, "
        f"upsampled from the {int(args.scale * 100)}% grid)", fontsize=9,
    )
    return _common.save_figure(fig, args.out, f"{args.stem}_marginals.png")


def main(argv=None):
    args = _common.start_run("Stanford backgrounds", __doc__, argv, _arguments, _settings)
    with _common.Timer() as total, _common.blas_single_thread():
        result = run(args)
        table, timing = tables(result, args)
        figure_path = figure(result, args)
    estimate, lines = full_protocol_estimate(result, args)
    text = "\n\n".join([
        table,
        timing,
        f"Wall time {total.seconds:.1f} s (loading {result['load_seconds']:.1f} s, features "
        f"{result['feature_seconds']:.1f} s) on {_common.run_description(args.n_jobs)}.",
        "Estimated fit time of the paper's protocol (715 images, 5 folds, incremental 32 / 1000 iterations, "
        f"5/10/20 it.) at this run's cost per image x iteration: {estimate / 3600:.1f} h\n" + "\n".join(lines),
    ] + [line for line in [remaining_estimate(result, args, estimate)] if line])
    _common.report(text, args.out, f"{args.stem}_table.txt")
    raw = {
        "settings": {k: v for k, v in vars(args).items()},
        "machine": _common.machine_description(),
        "wall_seconds": total.seconds,
        "fits": [
            {"row": key, "name": ROWS[key][0], "n_iter": n_iter,
             "train_error": _cell(result["errors"][(key, n_iter)][0]),
             "test_error": _cell(result["errors"][(key, n_iter)][1]),
             "fit_seconds": result["times"][(key, n_iter)], "status": result["status"][(key, n_iter)]}
            for key, n_iter in result["fits"]
        ],
        "figure": {"path": str(figure_path), "image": result["data"].ids[result["figure_index"]]},
    }
    (Path(args.out) / f"{args.stem}_results.json").write_text(json.dumps(raw, indent=1, default=str) + "\n")
    return dict(errors=result["errors"], table=table, figure=figure_path, wall_seconds=total.seconds)


if __name__ == "__main__":
    main()
