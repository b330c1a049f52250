"""Test error against L-BFGS iterations: the measured curves behind
``MarginalCRF``'s stopping rule (``n_iter_no_change``, ``objective_tol``).

One fit per data set runs with the stopping rule off for ``--max-iter``
L-BFGS iterations and records, at every iteration, the objective, the wall
time and the weights; afterwards the test error of the weights is measured
at a grid of iterations. The stopping rule can then be replayed on the
recorded objective curve for any setting (``stop_iteration`` below), which is
how the default was chosen.

* ``horses``: univariate logistic, TRW with 20 truncated iterations,
  lambda = 1e-3, from the independent model, as the horses table's cell
  (``examples/horses.py``; ``--scale`` as there, here default 1, the masks' full resolution,
  where its records were made; ``horses.py``'s default is 0.5).
* ``denoising``: univariate logistic, TRW with 20 truncated iterations, the
  binary denoising data at noise level ``--noise`` (``examples/binary_denoising.py``'s images).

L-BFGS is preconditioned (``MarginalCRF(precondition=True)``, the default;
the independent start too) unless ``--no-precondition``; ``--dtype float32``
and ``--no-precondition`` record under names of their own.

Run::

    python examples/fit_curves.py horses [--data PATH] [--scale 1] [--max-iter 100] [--out DIR]
    python examples/fit_curves.py denoising [--noise 1.25] [--max-iter 200] [--out DIR]

The records (``OUT/fit_curve_<name>.json``) are written at every iteration
and read back on a rerun: a run stopped midway resumes its fit from the last
recorded weights (L-BFGS restarts its curvature memory there) and only
evaluates the test errors it has not measured yet.
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

import _common

#: Iterations at which the test error is measured (those <= the recorded
#: ones), besides where each candidate rule stops.
EVALUATE_AT = (0, 1, 2, 3, 5, 7, 10, 13, 16, 20, 25, 30, 35, 40, 45, 50, 60, 70, 80, 90, 100,
               120, 140, 160, 180, 200, 250, 300)
#: Candidate stopping rules (n_iter_no_change, objective_tol) replayed on the curves.
CANDIDATES = [(m, t) for m in (5, 10, 20) for t in (1e-2, 3e-3, 1e-3, 3e-4, 1e-4)]


def stop_iteration(objective, n_iter_no_change, objective_tol):
    """The first iteration k (counted from 1) at which the rule stops: the
    objective fell by less than ``objective_tol * |f_k|`` over the last
    ``n_iter_no_change`` iterations; None when it never stops. ``objective``
    holds f_0 (the start) to f_n."""
    from sklearn_margcrf.estimator import objective_stalled

    for k in range(n_iter_no_change, len(objective)):
        # a record's start has no objective: no window reaches back to it
        if objective[k - n_iter_no_change] is not None and objective_stalled(
                objective[: k + 1], n_iter_no_change, objective_tol):
            return k
    return None


def _write(path, record):
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as stream:
        json.dump(record, stream)
        stream.flush()
        os.fsync(stream.fileno())
    tmp.replace(path)


def _horses(args):
    import horses

    hargs = argparse.Namespace(
        data=args.data, scale=args.scale, split=200, cache=args.cache or str(Path(args.out) / "horses_features"),
        test_tol=1e-5, max_iter=args.max_iter, n_jobs=args.n_jobs, verbose=args.verbose, dtype=args.dtype,
    )
    X_train, y_train, _, _ = horses._load(hargs, "train", args.n_train)
    X_test, y_test, _, _ = horses._load(hargs, "test", args.n_test)
    model = horses._model(hargs, "ulogistic-trw", 20)
    return _named(f"horses-scale{args.scale:g}-train{len(X_train)}", model, args), X_train, y_train, X_test, y_test


def _denoising(args):
    import binary_denoising

    dargs = argparse.Namespace(
        data=args.data, n_train=args.n_train or 32, n_test=args.n_test or 100, scale=args.scale, seed=0,
        gradient_mode="truncated", n_iter=20, tol=1e-4, reg=None, max_iter=args.max_iter, n_jobs=args.n_jobs,
        verbose=args.verbose, dtype=args.dtype,
    )
    split = binary_denoising._load(dargs, args.noise)
    (X_train, y_train, _), (X_test, y_test, _) = split["train"], split["test"]
    model = binary_denoising._model(dargs, "ulogistic")
    return _named(f"denoising-noise{args.noise:g}-train{len(X_train)}", model, args), X_train, y_train, X_test, y_test


def _named(name, model, args):
    """(record name, model): L-BFGS preconditioned unless ``--no-precondition``;
    a float32 or unpreconditioned fit is recorded under a name of its own."""
    model.set_params(precondition=not args.no_precondition)
    name += "" if args.dtype == "float64" else f"-{args.dtype}"
    return name + ("-noprecondition" if args.no_precondition else ""), model


def _start(model, X, y):
    """The independent model's weights (with the model's lambda), fitted to
    convergence as ``init="independent"`` does."""
    independent = model.__class__(**{**model.get_params(), "inference": "independent"})
    with _common.ignore_convergence_warnings():
        independent.fit(X, y)
    return {"unary_coef": independent.unary_coef_, "pairwise_coef": independent.pairwise_coef_}


def run(args):
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (name, model), X_train, y_train, X_test, y_test = (_horses if args.dataset == "horses" else _denoising)(args)
    path = out / f"fit_curve_{name}.json"
    record = json.loads(path.read_text()) if path.exists() else None
    if record is None:
        t0 = time.perf_counter()
        start = np.load(args.start) if args.start else _start(model, X_train, y_train)
        record = {
            "name": name, "command": "python " + " ".join(sys.argv), "machine": _common.machine_description(),
            "params": {k: v for k, v in model.get_params().items() if isinstance(v, (int, float, str, type(None)))},
            "start_seconds": time.perf_counter() - t0, "iterations": [], "test_error": {},
        }
        record["iterations"].append({"n_iter": 0, "objective": None, "seconds": 0.0,
                                     "unary_coef": start["unary_coef"].tolist(),
                                     "pairwise_coef": start["pairwise_coef"].tolist()})
        _write(path, record)
    done = record["iterations"][-1]
    if done["n_iter"] < args.max_iter:
        offset_n, offset_s = done["n_iter"], done["seconds"]

        def callback(report):
            record["iterations"].append({
                "n_iter": offset_n + report.n_iter, "objective": report.objective,
                "seconds": offset_s + report.elapsed,
                "unary_coef": report.unary_coef.tolist(), "pairwise_coef": report.pairwise_coef.tolist(),
            })
            _write(path, record)
            print(f"{name}: iteration {offset_n + report.n_iter}  objective {report.objective:.8g}  "
                  f"{offset_s + report.elapsed:.1f} s", flush=True)

        # the stopping rule off here, whatever the example's model says: the
        # curve must go on past where any candidate rule would stop
        model.set_params(init="zeros", callback=callback, max_iter=args.max_iter - offset_n,
                         lbfgs_tol=0.0, max_restarts=10, objective_tol=0.0)
        with _common.ignore_convergence_warnings():
            model.fit(X_train, y_train, unary_coef_init=np.array(done["unary_coef"]),
                      pairwise_coef_init=np.array(done["pairwise_coef"]))
    model.set_params(callback=None)
    by_iter = {it["n_iter"]: it for it in record["iterations"]}
    objective = [it["objective"] for it in record["iterations"]]
    stops = {stop_iteration(objective, m, t) for m, t in CANDIDATES} - {None}
    for k in sorted(set(EVALUATE_AT) | stops):
        if k in by_iter and str(k) not in record["test_error"]:
            _common.restore(model, by_iter[k])
            t0 = time.perf_counter()
            record["test_error"][str(k)] = _common.error_rate(model, X_test, y_test)
            print(f"{name}: test error after {k} iterations {record['test_error'][str(k)]:.4f} "
                  f"({time.perf_counter() - t0:.1f} s)", flush=True)
            _write(path, record)
    return record


def report(out):
    """The table of candidate rules and the figure, from every record in ``out``."""
    records = [json.loads(p.read_text()) for p in sorted(Path(out).glob("fit_curve_*.json"))]
    # a run still fitting has measured no test error yet
    records = [r for r in records if r["test_error"]]
    lines = []
    for record in records:
        its = record["iterations"]
        errors = {int(k): v for k, v in record["test_error"].items()}
        last = max(errors)
        objective = [it["objective"] for it in its]
        seconds = {it["n_iter"]: it["seconds"] for it in its}
        lines.append(f"{record['name']}: {len(its) - 1} L-BFGS iterations recorded; test error "
                     f"{errors[last]:.4f} after {last} ({seconds[last]:.0f} s of fit after the start)")
        lines.append(f"  command: {record['command']}")
        lines.append("  test error by iteration: " + ", ".join(f"{k}: {errors[k]:.4f}" for k in sorted(errors)))
        lines.append(f"  {'n_iter_no_change':>16} {'objective_tol':>13} {'stops at':>8} {'seconds':>8} "
                     f"{'test error':>10} {'- last':>7}")
        for m, t in CANDIDATES:
            k = stop_iteration(objective, m, t)
            if k is None:
                lines.append(f"  {m:16d} {t:13.0e} {'never':>8}")
            else:
                err = errors.get(k)
                shown = f"{err:10.4f} {err - errors[last]:+7.4f}" if err is not None else f"{'?':>10}"
                lines.append(f"  {m:16d} {t:13.0e} {k:8d} {seconds[k]:8.0f} {shown}")
        lines.append("")
    text = "\n".join(lines)
    (Path(out) / "fit_curves.txt").write_text(text + "\n")
    print(text)
    plt = _common.pyplot()
    if not records:
        return
    n_cols = min(4, len(records))
    n_rows = -(-len(records) // n_cols)
    fig, axes = plt.subplots(n_rows, n_cols, figsize=(5 * n_cols, 3.6 * n_rows), squeeze=False)
    for ax in axes.ravel()[len(records):]:
        ax.set_visible(False)
    for ax, record in zip(axes.ravel(), records):
        errors = {int(k): v for k, v in record["test_error"].items()}
        ks = sorted(errors)
        ax.plot(ks, [errors[k] for k in ks], "o-", ms=3, label="test error")
        objective = [it["objective"] for it in record["iterations"]]
        from sklearn_margcrf.estimator import N_ITER_NO_CHANGE, OBJECTIVE_TOL

        k = stop_iteration(objective, N_ITER_NO_CHANGE, OBJECTIVE_TOL)
        if k is not None:
            ax.axvline(k, color="C3", ls="--", label=f"default rule stops ({k})")
        ax.set_xlabel("L-BFGS iterations")
        ax.set_ylabel("test error")
        ax.set_title(record["name"], fontsize=9)
        ax.legend(fontsize=8)
        twin = ax.twinx()
        valid = [(it["n_iter"], it["objective"]) for it in record["iterations"] if it["objective"] is not None]
        twin.plot([n for n, _ in valid], [f for _, f in valid], color="0.6", lw=1)
        twin.set_ylabel("objective", color="0.5")
    fig.tight_layout()
    _common.save_figure(fig, out, "fit_curves.png")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dataset", choices=("horses", "denoising", "report"),
                        help="report: the table and figure of the records in --out")
    parser.add_argument("--data", default=str(_common.DEFAULT_DATA))
    parser.add_argument("--out", default="results")
    parser.add_argument("--cache", default=None, help="horses: folder of the cached features (default OUT/horses_features)")
    parser.add_argument("--start", default=None, help="npz of the starting weights (unary_coef, pairwise_coef; "
                        "default: fit the independent model with the same lambda)")
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--noise", type=float, default=1.25)
    parser.add_argument("--n-train", type=int, default=None)
    parser.add_argument("--n-test", type=int, default=None)
    parser.add_argument("--max-iter", type=int, default=100)
    parser.add_argument("--n-jobs", type=int, default=-1)
    parser.add_argument("--verbose", type=int, default=0)
    parser.add_argument("--dtype", choices=("float64", "float32"), default="float64",
                        help="precision of inference and its gradients (MarginalCRF dtype)")
    parser.add_argument("--no-precondition", action="store_true",
                        help="L-BFGS on the weights themselves (MarginalCRF precondition=False), as the paper")
    args = parser.parse_args(argv)
    if args.dataset == "report":
        return report(args.out)
    if args.dataset == "horses":
        args.n_train = 200 if args.n_train is None else args.n_train
        args.n_test = 128 if args.n_test is None else args.n_test
    _common.blas_single_thread()
    run(args)


if __name__ == "__main__":
    main()
