"""Learning methods (Domke 2013, Sec. "Stanford Backgrounds Data", Fig.
"Comparison of different learning methods on the backgrounds dataset").

Truncated fitting, perturbation and back-propagation compared on 100 images
of the Stanford Background Dataset: TRW, the univariate logistic loss,
lambda = 1e-3, the features and 20% grid of :mod:`backgrounds`. Truncated
fitting uses several numbers of iterations (5, 10, 20, 40), perturbation and
back-propagation several convergence thresholds (1e-2 .. 1e-5). For each, the
training objective and the test error are recorded against wall time; the
paper's conclusion is that with loose thresholds perturbation and
back-propagation stall at poor solutions, while truncated fitting is far more
successful (more iterations: slower, but better at convergence).

Recording against time. All methods start from the same independent model
(univariate logistic regression, its fit time counted), fitted once with
``inference="independent"`` (``--init-max-iter`` L-BFGS iterations at most).

* Objective against time: one uninterrupted fit from the independent model's
  weights (L-BFGS keeps its curvature memory throughout), whose
  ``callback`` records the objective after every L-BFGS iteration and the
  seconds since the start of ``fit``.
* Test error against time: the same callback keeps a copy of the weights
  after L-BFGS iterations k of a geometric sequence (1, 3, 9, 27, ... with
  ``--ratio 3``) and after the last one; their test errors are measured after
  the fit, so the evaluations are not on the time axis. The callback also
  ends the fit at the time budget.

The objective of each method is the one it minimises: the mean univariate
logistic loss per labelled pixel of its own marginals (after ``n_iter``
iterations for truncated fitting, inference to ``tol`` for the others) plus
the ridge penalty. Test errors use each model's own prediction (the same
``n_iter`` or ``tol``), upsampled to image resolution, over labelled pixels.

Run::

    python examples/learning_methods.py [--data PATH] [--quick] [--out DIR] [--n-jobs N]
                                        [--checkpoints DIR] [--report-only]

Default: the paper's 100 training images and 100 other test images (the
paper does not say which images it tested on; here a random, seeded choice
of 200 among the 715), up to 1000 L-BFGS iterations and one hour of fitting
per method (``--time-budget``, on the time axis, the independent model's
fit included). ``--quick``: 8 training and 8 test images, 12 L-BFGS
iterations. Outputs in ``--out``: ``learning_methods_table.txt``,
``learning_methods.png``, ``learning_methods_curves.json``, written again
after every method that finishes (the table of an unfinished run says
``PARTIAL RUN``).

Resuming. The full run (12 methods of up to an hour) outlives a session, so
every method's curves are saved as soon as it finishes, to ``<method
label>.json`` (made filename-safe) in ``--checkpoints`` (default
``OUT/learning_methods_checkpoints/<settings>``, a folder named after every
option that changes the curves, so that other settings never resume them),
and the independent model once, beside them (``independent_model.npz`` and
``.json``: its weights, fit seconds and test error, so that a resumed run
does not refit it and every method's time axis starts from the same fit).
Rerun the same command and it fits only the methods without a record;
``--methods``, ``--trunc-iters`` and ``--tols`` choose among the records of
the same folder. A killed run loses only the method it was fitting, which
the next run fits again from the independent model: its curves are measured
against the time of one uninterrupted fit, which a fit resumed from saved
weights would not be (the time lost between runs, and a fresh L-BFGS without
its curvature memory). ``--report-only`` fits nothing and needs no data: the
table, figure and curves of the methods finished so far. Keep the
checkpoints where the machine's end does not take them (e.g. commit them).
"""

import copy
import io
import json
import re
import time
from pathlib import Path

import numpy as np

import _common
from _common import float_list, int_list
from backgrounds import N_STATES, compute_features

TRUNCATED_ITERS = (5, 10, 20, 40)
THRESHOLDS = (1e-2, 1e-3, 1e-4, 1e-5)
FAMILIES = ("truncated", "perturbation", "backprop")
REG = 1e-3
START = "independent_model"  # the checkpoint of the model every method starts from
WEIGHTS = ("unary_coef", "pairwise_coef")


def _arguments(parser):
    parser.add_argument("--n-train", type=int, default=None, help="training images (default 100; --quick: 8)")
    parser.add_argument("--n-test", type=int, default=None, help="test images (default 100; --quick: 8)")
    parser.add_argument("--trunc-iters", type=int_list, default=None, help="truncated fitting iterations (default 5,10,20,40)")
    parser.add_argument("--tols", type=float_list, default=None, help="perturbation / back-propagation thresholds (default 1e-2,1e-3,1e-4,1e-5)")
    parser.add_argument("--methods", default=",".join(FAMILIES), help="comma-separated among truncated,perturbation,backprop")
    parser.add_argument("--max-iter", type=int, default=None, help="L-BFGS iterations per method (default 1000; --quick: 12)")
    parser.add_argument("--init-max-iter", type=int, default=None, help="L-BFGS iterations of the independent model that starts every method (default 1000; --quick: 50)")
    parser.add_argument("--time-budget", type=float, default=None, help="seconds of fitting per method on the time axis, checked after each test-error fit (default 3600; --quick: none)")
    parser.add_argument("--ratio", type=float, default=3.0, help="ratio of the geometric sequence of L-BFGS iterations where the test error is measured (default 3)")
    parser.add_argument("--scale", type=float, default=0.2, help="CRF grid resolution relative to the image (default 0.2)")
    parser.add_argument("--seed", type=int, default=0, help="seeds the choice of the images")
    # not _common.resumable_arguments: its --segment (checkpoints within a fit) has no meaning here, where
    # an interrupted method is fitted again from the start
    parser.add_argument(
        "--checkpoints", default=None,
        help="folder of the finished methods' curves and of the independent model "
             "(default OUT/learning_methods_checkpoints/<settings>); rerunning fits only the methods not in it",
    )
    parser.add_argument(
        "--report-only", action="store_true",
        help="fit nothing (no data needed): the table, figure and curves of the methods finished so far",
    )


QUICK = dict(n_train=8, n_test=8, trunc_iters=list(TRUNCATED_ITERS), tols=list(THRESHOLDS), max_iter=12,
             init_max_iter=50, time_budget=None)
FULL = dict(n_train=100, n_test=100, trunc_iters=list(TRUNCATED_ITERS), tols=list(THRESHOLDS), max_iter=1000,
            init_max_iter=1000, time_budget=3600.0)


def _settings(args):
    _common.fill_defaults(args, QUICK, FULL)
    if args.time_budget is not None and args.time_budget <= 0:
        args.time_budget = None
    args.methods = _common.select(args.methods, FAMILIES, option="--methods", given_order=True)
    if args.ratio <= 1:
        raise SystemExit("--ratio must exceed 1")
    if args.checkpoints is None:
        # every option that changes a method's curves or the independent model; the methods' own
        # parameters are in their records' names
        budget = "none" if args.time_budget is None else f"{args.time_budget:g}"
        settings = (f"train{args.n_train}-test{args.n_test}-seed{args.seed}-scale{args.scale:g}-maxiter{args.max_iter}"
                    f"-initmaxiter{args.init_max_iter}-budget{budget}-ratio{args.ratio:g}")
        args.checkpoints = str(Path(args.out) / "learning_methods_checkpoints" / settings)
    return args


def _threshold_label(tol):
    """``tol`` in a method's label: 1e-02 for the paper's thresholds, every digit of others (the label
    names the method's record, which another threshold must not share)."""
    return np.format_float_scientific(tol, exp_digits=2, trim="-")


def settings_list(args):
    """(label, family, MarginalCRF parameters) of every method."""
    out = []
    for family in args.methods:
        if family == "truncated":
            out += [(f"truncated {n} it.", family, dict(gradient_mode="truncated", n_iter=n)) for n in args.trunc_iters]
        else:
            name = "perturbation" if family == "perturbation" else "back-propagation"
            out += [(f"{name} {_threshold_label(tol)}", family, dict(gradient_mode=family, tol=tol)) for tol in args.tols]
    return out


def snapshots(max_iter, ratio):
    """L-BFGS iteration counts at which the test error is measured."""
    points, value = [], 1.0
    while int(round(value)) < max_iter:
        if not points or int(round(value)) > points[-1]:
            points.append(int(round(value)))
        value *= ratio
    return points + [int(max_iter)]


def _select_images(path, n_train, n_test, seed):
    from sklearn_margcrf.datasets import load_stanford_background

    folder = Path(path) / "stanford_background"
    all_ids = sorted(p.stem for p in (folder / "images").glob("*.jpg"))
    if n_train + n_test > len(all_ids):
        raise SystemExit(f"asked for {n_train} + {n_test} images but {folder} has {len(all_ids)}")
    chosen = np.random.default_rng(seed).permutation(len(all_ids))[: n_train + n_test]
    train_ids = {all_ids[i] for i in chosen[:n_train]}
    data = load_stanford_background(folder, ids=[all_ids[i] for i in chosen], n_folds=1)
    is_train = np.array([i in train_ids for i in data.ids])
    return data, np.flatnonzero(is_train), np.flatnonzero(~is_train)


def load_data(args):
    """The training and test images' features, labels and ids, and the seconds it took."""
    with _common.Timer() as timer:
        data, train, test = _select_images(args.data, args.n_train, args.n_test, args.seed)
        X = compute_features(data.images, args.scale, args.n_jobs)
    print(f"{len(train)} training, {len(test)} test images; loading and features {timer.seconds:.1f} s; "
          f"test error at L-BFGS it. {snapshots(args.max_iter, args.ratio)}")
    return dict(
        X_train=[X[i] for i in train], y_train=[data.labels[i] for i in train],
        X_test=[X[i] for i in test], y_test=[data.labels[i] for i in test],
        train_ids=[data.ids[i] for i in train], test_ids=[data.ids[i] for i in test], seconds=timer.seconds,
    )


def _model(args, **params):
    from sklearn_margcrf import MarginalCRF

    # objective_tol=0: the paper's protocol, L-BFGS to its own end or max_iter, no stopping rule
    common = dict(loss="univariate_logistic", reg=REG, n_states=N_STATES, n_jobs=args.n_jobs, objective_tol=0.0)
    return MarginalCRF(**{**common, **params})


def _warm_up(args, params, data):
    """Compile the numba kernels of a model outside the clock (one image, one iteration)."""
    with _common.ignore_convergence_warnings():
        model = _model(args, **params, n_jobs=1, max_iter=1)
        model.fit(data["X_train"][:1], data["y_train"][:1]).predict_proba(data["X_test"][:1])


def fit_start(args, data):
    """The independent model every method starts from: its weights, fit seconds (the start of every
    method's time axis), L-BFGS iterations and test error, and the images it was fitted on."""
    _warm_up(args, dict(inference="independent"), data)
    model = _model(args, inference="independent", max_iter=args.init_max_iter)
    with _common.ignore_convergence_warnings():
        model.fit(data["X_train"], data["y_train"])
    wrong, total = _common.error_counts(model, data["X_test"], data["y_test"])
    return dict(
        unary_coef=model.unary_coef_, pairwise_coef=model.pairwise_coef_, seconds=float(model.fit_time_),
        n_iter=int(model.n_iter_), test_error=wrong / total, train_ids=data["train_ids"],
        test_ids=data["test_ids"], machine=_common.run_description(args.n_jobs),
    )


def save_start(folder, start):
    """The independent model: weights in ``START.npz``, the rest in ``START.json``, written last (its
    presence says that the weights are complete)."""
    weights = io.BytesIO()
    np.savez(weights, **{name: start[name] for name in WEIGHTS})
    _common.write_atomically(Path(folder) / f"{START}.npz", weights.getvalue())
    _common.write_json(Path(folder) / f"{START}.json", {k: v for k, v in start.items() if k not in WEIGHTS})


def load_start(folder):
    """The independent model saved by :func:`save_start`, or None."""
    info, weights = Path(folder) / f"{START}.json", Path(folder) / f"{START}.npz"
    if not (info.exists() and weights.exists()):
        return None
    with np.load(weights, allow_pickle=False) as saved:
        return {**json.loads(info.read_text()), **{name: saved[name] for name in WEIGHTS}}


def record_path(folder, label):
    """Where the curves of the method ``label`` are saved: ``folder/<label, filename-safe>.json``."""
    return Path(folder) / (re.sub(r"[^A-Za-z0-9.+-]+", "_", label).strip("._") + ".json")


def run_method(params, start, data, args):
    """Fit one method from the independent model ``start`` (:func:`fit_start`); return its curves.

    ``time``/``objective``/``iteration``: every L-BFGS iteration of the fit;
    ``snap_*``/``test_error``: the test error after 0 iterations (the
    independent model), after each of :func:`snapshots` iterations and after
    the last one (see the module docstring). Times count from the start of
    the independent model's fit.
    """
    X_train, y_train, X_test, y_test = data["X_train"], data["y_train"], data["X_test"], data["y_test"]
    _warm_up(args, params, data)
    init_seconds = start["seconds"]
    curve = dict(time=[], objective=[], iteration=[], snap_time=[init_seconds], snap_iteration=[0],
                 test_error=[start["test_error"]], init_seconds=init_seconds, stop="max_iter")
    wanted = set(snapshots(args.max_iter, args.ratio))
    saved = {}  # weights by L-BFGS iteration

    def record(progress):
        curve["time"].append(init_seconds + float(progress.elapsed))
        curve["objective"].append(float(progress.objective))
        weights = dict(unary_coef=progress.unary_coef, pairwise_coef=progress.pairwise_coef)
        if progress.n_iter in wanted:
            saved[int(progress.n_iter)] = weights
        if args.time_budget is not None and init_seconds + progress.elapsed >= args.time_budget:
            saved[int(progress.n_iter)] = weights
            curve["stop"] = "time budget"
            return True
        return False

    model = _model(args, inference="trw", max_iter=args.max_iter, callback=record, **params)
    try:
        with _common.ignore_convergence_warnings():
            model.fit(X_train, y_train, unary_coef_init=start["unary_coef"], pairwise_coef_init=start["pairwise_coef"])
        saved[int(model.n_iter_)] = dict(unary_coef=model.unary_coef_, pairwise_coef=model.pairwise_coef_)
        if model.n_iter_ < args.max_iter and curve["stop"] == "max_iter":
            # L-BFGS ended before its cap: converged, or stuck after its restarts
            curve["stop"] = "L-BFGS stopped (converged or no descent)"
    except (FloatingPointError, ValueError) as exc:  # the snapshots saved before it still count
        curve["stop"] = f"failed: {type(exc).__name__}"
    curve["iteration"] = list(range(1, len(curve["objective"]) + 1))
    for k in sorted(saved):
        if not all(np.all(np.isfinite(w)) for w in saved[k].values()):
            continue
        wrong, total = _common.error_counts(_common.restore(copy.deepcopy(model), saved[k]), X_test, y_test)
        curve["snap_time"].append(curve["time"][k - 1])
        curve["snap_iteration"].append(k)
        curve["test_error"].append(wrong / total)
    curve["seconds"] = curve["time"][-1] if curve["time"] else init_seconds
    curve["n_iter"] = len(curve["objective"])
    return curve


def summary(curves, args):
    """The final state of every method; blank for those not run yet (``curves`` has no entry)."""
    rows = []
    methods = settings_list(args)
    for label, _, _ in methods:
        c = curves.get(label)
        rows.append((label, [None] * 5 if c is None else [
            c["n_iter"], c["seconds"], c["objective"][-1] if c["objective"] else None, c["test_error"][-1], c["stop"],
        ]))
    return _common.format_table(
        f"Final state of each method ({args.n_train} training / {args.n_test} test images, TRW, univariate "
        f"logistic, lambda = {REG:g}, at most {args.max_iter} L-BFGS it."
        + (f" and {args.time_budget:.0f} s" if args.time_budget else "") + ")"
        + _common.partial_run_note(len(curves), len(methods)),
        ["method", "L-BFGS it", "seconds", "objective", "test err", "stop"],
        rows,
    )


def conclusion(curves, args):
    """Compare with the paper's conclusion, in words, from the final values of the finished methods."""
    lines = ["Paper: with loose thresholds, perturbation and back-propagation stall at sub-optimal solutions; "
             "truncated fitting is far more successful, more iterations slower but better at convergence."]
    finished = [(lab, fam, curves[lab]) for lab, fam, _ in settings_list(args) if lab in curves]
    truncated = [c for _, fam, c in finished if fam == "truncated" and c["objective"]]
    best_trunc = min((c["test_error"][-1] for c in truncated), default=None)
    for family, name in (("perturbation", "perturbation"), ("backprop", "back-propagation")):
        items = [(lab, c) for lab, fam, c in finished if fam == family and c["objective"]]
        if not items:
            continue
        loose, tight = items[0], items[-1]
        lines.append(
            f"Here, {name}: loosest threshold ({loose[0]}) objective {loose[1]['objective'][-1]:.4f}, test error "
            f"{loose[1]['test_error'][-1]:.3f}, {loose[1]['n_iter']} it. ({loose[1]['stop']}); tightest ({tight[0]}) "
            f"objective {tight[1]['objective'][-1]:.4f}, test error {tight[1]['test_error'][-1]:.3f}, {tight[1]['n_iter']} it."
        )
    if best_trunc is not None:
        lines.append(f"Best final test error of truncated fitting: {best_trunc:.3f}.")
        others = [(lab, c["test_error"][-1]) for lab, fam, c in finished if fam != "truncated"]
        if others:
            worse = [lab for lab, e in others if e > best_trunc + 1e-3]
            lines.append(f"Methods ending worse than the best truncated fit: {', '.join(worse) if worse else 'none'}.")
    return "\n".join(lines)


def figure(curves, args):
    """Objective and test error against time of the finished methods (a method keeps its colour when
    others are not run yet)."""
    from sklearn.utils import Bunch

    from sklearn_margcrf.plot import plot_loss_curve

    plt = _common.pyplot()

    colour_maps = {"truncated": plt.cm.Blues, "perturbation": plt.cm.Reds, "backprop": plt.cm.Greens}
    styles = {"truncated": "-", "perturbation": "--", "backprop": ":"}
    methods = settings_list(args)
    fig, (ax_obj, ax_err) = plt.subplots(1, 2, figsize=(11, 4.2))
    for family in args.methods:
        members = [lab for lab, fam, _ in methods if fam == family]
        for k, label in enumerate(members):
            if label not in curves:
                continue
            colour = colour_maps[family](0.45 + 0.55 * (k + 1) / len(members))
            c = curves[label]
            if c["time"]:  # the callback's records, timed from the start of the independent fit
                records = [Bunch(stage="fit", n_iter=k, objective=f, elapsed=t)
                           for k, (t, f) in enumerate(zip(c["time"], c["objective"]), start=1)]
                plot_loss_curve(records, x="time", ax=ax_obj, label=label, color=colour, linestyle=styles[family], lw=1.5)
            ax_err.plot(c["snap_time"], c["test_error"], styles[family], color=colour, label=label, lw=1.5, marker=".")
    from matplotlib.ticker import LogLocator, NullFormatter

    for ax, ylabel in ((ax_obj, "training objective"), (ax_err, "test error")):
        ax.set_xscale("log")
        ax.xaxis.set_major_locator(LogLocator(base=10.0))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("wall time (s)")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
    if curves:
        ax_err.legend(fontsize=7, loc="upper right", ncol=1)
    partial = "" if len(curves) == len(methods) else f" (partial run: {len(curves)} of {len(methods)} methods)"
    fig.suptitle(
        f"Learning methods, {args.n_train} background images (TRW, univariate logistic){partial}; "
        f"{_common.run_description(args.n_jobs)}", fontsize=9,
    )
    return _common.save_figure(fig, args.out, "learning_methods.png")


def _print_method(label, c, note):
    print(f"  {label:26s} {c['n_iter']:5d} it. {c['seconds']:9.1f} s fit (init {c['init_seconds']:.1f} s), "
          f"objective {c['objective'][-1] if c['objective'] else float('nan'):.5f}, test error "
          f"{c['test_error'][-1]:.3f} [{c['stop']}]; {note}", flush=True)


def write_outputs(args, curves, start, fitted, data, wall_seconds):
    """The table, figure and ``learning_methods_curves.json`` of the finished methods ``curves``;
    ``fitted``: those fitted by this run, ``data``: this run's data (empty when it loaded none)."""
    if args.report_only:
        run = f"Report only, nothing fitted; methods read from their records in {args.checkpoints}: {len(curves)}."
    else:
        run = (f"Wall time of this run {wall_seconds:.1f} s (loading and features {data.get('seconds', 0.0):.1f} s; "
               f"methods fitted: {len(fitted)}, read from their records in {args.checkpoints}: "
               f"{len(curves) - len(fitted)}) on {_common.run_description(args.n_jobs)}.")
    if start is not None:
        run += (f"\nEvery time axis starts with the independent model's fit: {start['seconds']:.1f} s, "
                f"{start['n_iter']} L-BFGS it., test error {start['test_error']:.3f} ({start['machine']}).")
    text = "\n\n".join([summary(curves, args), conclusion(curves, args), run])
    _common.report(text, args.out, "learning_methods_table.txt")
    figure_path = figure(curves, args)
    raw = {"settings": vars(args), "machine": _common.machine_description(), "wall_seconds": wall_seconds,
           "train_ids": None if start is None else start["train_ids"],
           "test_ids": None if start is None else start["test_ids"],
           "not_run_yet": [label for label, _, _ in settings_list(args) if label not in curves], "curves": curves}
    _common.write_json(Path(args.out) / "learning_methods_curves.json", raw)
    return dict(curves=dict(curves), figure=figure_path, table=text, wall_seconds=wall_seconds)


def main(argv=None):
    args = _common.start_run("Learning methods", __doc__, argv, _arguments, _settings)
    if not args.report_only:
        _common.require_data(args.data, "stanford_background")
    started = time.perf_counter()
    start = load_start(args.checkpoints)
    curves, fitted, data = {}, [], {}
    outputs = None  # written after every fitted method, and at the end unless the last method was fitted
    with _common.blas_single_thread():
        for label, _, params in settings_list(args):
            outputs = None
            path = record_path(args.checkpoints, label)
            if path.exists():
                curves[label] = json.loads(path.read_text())
                _print_method(label, curves[label], f"read from {path}")
                continue
            if args.report_only:
                continue
            if not data:
                data.update(load_data(args))
                if start is not None and (start["train_ids"], start["test_ids"]) != (data["train_ids"], data["test_ids"]):
                    # another copy of the data set (e.g. on a new machine) chose other images
                    raise SystemExit(f"the images chosen differ from those of the records in {args.checkpoints}")
            if start is None:
                save_start(args.checkpoints, fit_start(args, data))
                start = load_start(args.checkpoints)  # as a resumed run will read it
                print(f"  independent model (the start of every method): {start['seconds']:.1f} s, "
                      f"{start['n_iter']} L-BFGS it., test error {start['test_error']:.3f}", flush=True)
            with _common.Timer() as t_method:
                curve = run_method(params, start, data, args)
            _common.write_json(path, curve)
            curves[label] = json.loads(path.read_text())  # as a resumed run will read it
            fitted.append(label)
            _print_method(label, curves[label], f"with the test-error evaluations {t_method.seconds:.1f} s")
            outputs = write_outputs(args, curves, start, fitted, data, time.perf_counter() - started)
        if outputs is None:
            outputs = write_outputs(args, curves, start, fitted, data, time.perf_counter() - started)
    return outputs


if __name__ == "__main__":
    main()
