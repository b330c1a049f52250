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
(univariate logistic regression, its fit time counted), fitted with
``inference="independent"`` (``--init-max-iter`` L-BFGS iterations at most).

* Objective against time: one uninterrupted ``warm_start=True`` fit from the
  independent model (L-BFGS keeps its curvature memory throughout), whose
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

Default: the paper's 100 training images and 100 other test images (the
paper does not say which images it tested on; here a random, seeded choice
of 200 among the 715), up to 1000 L-BFGS iterations and one hour of fitting
per method (``--time-budget``, on the time axis, the independent model's
fit included). ``--quick``: 8 training and 8 test images, 12 L-BFGS
iterations. Outputs in ``--out``: ``learning_methods_table.txt``,
``learning_methods.png``, ``learning_methods_curves.json``.
"""

import copy
import json
from pathlib import Path

import numpy as np

import _common
from _common import float_list, int_list
from backgrounds import N_STATES, compute_features

TRUNCATED_ITERS = (5, 10, 20, 40)
THRESHOLDS = (1e-2, 1e-3, 1e-4, 1e-5)
FAMILIES = ("truncated", "perturbation", "backprop")
REG = 1e-3


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
    return args


def settings_list(args):
    """(label, family, MarginalCRF parameters) of every method."""
    out = []
    for family in args.methods:
        if family == "truncated":
            out += [(f"truncated {n} it.", family, dict(gradient_mode="truncated", n_iter=n)) for n in args.trunc_iters]
        else:
            name = "perturbation" if family == "perturbation" else "back-propagation"
            out += [(f"{name} {tol:.0e}", family, dict(gradient_mode=family, tol=tol)) for tol in args.tols]
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


def run_method(params, X_train, y_train, X_test, y_test, args):
    """Fit one method from the independent model; return its curves.

    ``time``/``objective``/``iteration``: every L-BFGS iteration of the fit;
    ``snap_*``/``test_error``: the test error after 0 iterations (the
    independent model), after each of :func:`snapshots` iterations and after
    the last one (see the module docstring). Times count from the start of
    the independent model's fit.
    """
    from sklearn_margcrf import MarginalCRF

    # objective_tol=0: the paper's protocol, L-BFGS to its own end or max_iter, no stopping rule
    common = dict(loss="univariate_logistic", reg=REG, n_states=N_STATES, n_jobs=args.n_jobs, warm_start=True,
                  objective_tol=0.0)
    # compile the numba kernels of this method outside the clock (one image, one iteration)
    with _common.ignore_convergence_warnings():
        warm_up = MarginalCRF(**{**common, "n_jobs": 1, "warm_start": False}, **params, max_iter=1)
        warm_up.fit(X_train[:1], y_train[:1]).predict_proba(X_test[:1])
    start = MarginalCRF(inference="independent", max_iter=args.init_max_iter, **common)
    with _common.ignore_convergence_warnings():
        start.fit(X_train, y_train)
    init_seconds = start.fit_time_
    wrong, total = _common.error_counts(start, X_test, y_test)
    curve = dict(time=[], objective=[], iteration=[], snap_time=[init_seconds], snap_iteration=[0],
                 test_error=[wrong / total], init_seconds=init_seconds, stop="max_iter")
    wanted = set(snapshots(args.max_iter, args.ratio))
    saved = {}  # weights by L-BFGS iteration

    def record(progress):
        curve["time"].append(init_seconds + progress.elapsed)
        curve["objective"].append(float(progress.objective))
        weights = dict(unary_coef=progress.unary_coef, pairwise_coef=progress.pairwise_coef)
        if progress.n_iter in wanted:
            saved[progress.n_iter] = weights
        if args.time_budget is not None and init_seconds + progress.elapsed >= args.time_budget:
            saved[progress.n_iter] = weights
            curve["stop"] = "time budget"
            return True
        return False

    model = copy.deepcopy(start).set_params(inference="trw", max_iter=args.max_iter, callback=record, **params)
    try:
        with _common.ignore_convergence_warnings():
            model.fit(X_train, y_train)
        saved[model.n_iter_] = dict(unary_coef=model.unary_coef_, pairwise_coef=model.pairwise_coef_)
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
    rows = []
    for label, _, _ in settings_list(args):
        c = curves[label]
        rows.append((label, [c["n_iter"], c["seconds"], c["objective"][-1] if c["objective"] else None,
                             c["test_error"][-1], c["stop"]]))
    return _common.format_table(
        f"Final state of each method ({args.n_train} training / {args.n_test} test images, TRW, univariate "
        f"logistic, lambda = {REG:g}, at most {args.max_iter} L-BFGS it."
        + (f" and {args.time_budget:.0f} s" if args.time_budget else "") + ")",
        ["method", "L-BFGS it", "seconds", "objective", "test err", "stop"],
        rows,
    )


def conclusion(curves, args):
    """Compare with the paper's conclusion, in words, from the final values."""
    lines = ["Paper: with loose thresholds, perturbation and back-propagation stall at sub-optimal solutions; "
             "truncated fitting is far more successful, more iterations slower but better at convergence."]
    truncated = [(lab, curves[lab]) for lab, fam, _ in settings_list(args) if fam == "truncated" and curves[lab]["objective"]]
    best_trunc = min((c["test_error"][-1] for _, c in truncated), default=None)
    for family, name in (("perturbation", "perturbation"), ("backprop", "back-propagation")):
        items = [(lab, curves[lab]) for lab, fam, _ in settings_list(args) if fam == family and curves[lab]["objective"]]
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
        others = [(lab, curves[lab]["test_error"][-1]) for lab, fam, _ in settings_list(args) if fam != "truncated"]
        if others:
            worse = [lab for lab, e in others if e > best_trunc + 1e-3]
            lines.append(f"Methods ending worse than the best truncated fit: {', '.join(worse) if worse else 'none'}.")
    return "\n".join(lines)


def figure(curves, args):
    from sklearn.utils import Bunch

    from sklearn_margcrf.plot import plot_loss_curve

    plt = _common.pyplot()

    colour_maps = {"truncated": plt.cm.Blues, "perturbation": plt.cm.Reds, "backprop": plt.cm.Greens}
    styles = {"truncated": "-", "perturbation": "--", "backprop": ":"}
    methods = settings_list(args)
    fig, (ax_obj, ax_err) = plt.subplots(1, 2, figsize=(11, 4.2))
    for family in args.methods:
        members = [(lab, p) for lab, fam, p in methods if fam == family]
        for k, (label, _) in enumerate(members):
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
    ax_err.legend(fontsize=7, loc="upper right", ncol=1)
    fig.suptitle(
        f"Learning methods, {args.n_train} background images (TRW, univariate logistic); "
        f"{_common.run_description(args.n_jobs)}", fontsize=9,
    )
    return _common.save_figure(fig, args.out, "learning_methods.png")


def main(argv=None):
    args = _common.start_run("Learning methods", __doc__, argv, _arguments, _settings)
    _common.require_data(args.data, "stanford_background")
    curves = {}
    with _common.Timer() as total, _common.blas_single_thread():
        with _common.Timer() as t_load:
            data, train, test = _select_images(args.data, args.n_train, args.n_test, args.seed)
            X = compute_features(data.images, args.scale, args.n_jobs)
        X_train, y_train = [X[i] for i in train], [data.labels[i] for i in train]
        X_test, y_test = [X[i] for i in test], [data.labels[i] for i in test]
        print(f"{len(train)} training, {len(test)} test images; loading and features {t_load.seconds:.1f} s; "
              f"test error at L-BFGS it. {snapshots(args.max_iter, args.ratio)}")
        for label, family, params in settings_list(args):
            with _common.Timer() as t_method:
                curves[label] = run_method(params, X_train, y_train, X_test, y_test, args)
            c = curves[label]
            print(f"  {label:26s} {c['n_iter']:5d} it. {c['seconds']:9.1f} s fit (init {c['init_seconds']:.1f} s), "
                  f"objective {c['objective'][-1] if c['objective'] else float('nan'):.5f}, test error "
                  f"{c['test_error'][-1]:.3f} [{c['stop']}]; with the test-error evaluations "
                  f"{t_method.seconds:.1f} s", flush=True)
        figure_path = figure(curves, args)
    text = "\n\n".join([
        summary(curves, args),
        conclusion(curves, args),
        f"Wall time {total.seconds:.1f} s (loading and features {t_load.seconds:.1f} s) on "
        f"{_common.run_description(args.n_jobs)}.",
    ])
    _common.report(text, args.out, "learning_methods_table.txt")
    raw = {"settings": vars(args), "machine": _common.machine_description(), "wall_seconds": total.seconds,
           "train_ids": [data.ids[i] for i in train], "test_ids": [data.ids[i] for i in test], "curves": curves}
    (Path(args.out) / "learning_methods_curves.json").write_text(json.dumps(raw, indent=1, default=str) + "\n")
    return dict(curves=curves, figure=figure_path, table=text, wall_seconds=total.seconds)


if __name__ == "__main__":
    main()
