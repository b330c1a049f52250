"""Shared plumbing of the paper's experiments: command line, tables, figures,
timing, error rates.

Every example is runnable as ``python examples/<name>.py [--data PATH] [--quick]``
and imports this module from its own folder (Python puts the script's folder
first on ``sys.path``). Importing it makes ``sklearn_margcrf`` importable from
the source checkout when the package is not installed.
"""

import argparse
import contextlib
import json
import os
import platform
import signal
import sys
import threading
import time
import warnings
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DATA = REPO.parent / "shared" / "data"

try:
    import sklearn_margcrf  # noqa: F401
except ImportError:  # run from a source checkout without installing the package
    sys.path.insert(0, str(REPO))


def parse_args(description, argv=None, extra=None):
    """``--data`` (default ../shared/data), ``--quick``, ``--out`` (figure/table folder), ``--n-jobs``.

    ``extra`` is a function adding example-specific arguments to the parser.
    """
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--data", default=str(DEFAULT_DATA), help="folder holding the data sets (default: ../shared/data)")
    parser.add_argument("--quick", action="store_true", help="a small subset and few L-BFGS iterations (minutes on 2 cores)")
    parser.add_argument("--out", default=str(Path.cwd() / "results"), help="folder for figures and tables (default: ./results)")
    parser.add_argument("--n-jobs", type=int, default=None, help="joblib workers for fitting (default: all cores)")
    if extra is not None:
        extra(parser)
    args = parser.parse_args(argv)
    if args.n_jobs is None:
        args.n_jobs = os.cpu_count() or 1
    Path(args.out).mkdir(parents=True, exist_ok=True)
    return args


def fill_defaults(args, quick, full):
    """Set every argument still None from ``quick`` or ``full`` (by ``--quick``)."""
    for name, value in (quick if args.quick else full).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    return args


def check_sizes(args):
    """Exit on ``--n-train``/``--n-test`` below 1 or ``--scale`` outside (0, 1]."""
    if args.n_train < 1 or args.n_test < 1:
        raise SystemExit("--n-train and --n-test must be at least 1")
    if not 0 < args.scale <= 1:
        raise SystemExit(f"--scale must lie in (0, 1], got {args.scale}")
    return args


def select(text, known, option="--rows", given_order=False):
    """The names of comma-separated ``text`` ("all": every one) among ``known``,
    in the order of ``known`` (table order) unless ``given_order``; exits
    naming the unknown ones."""
    if text == "all":
        return list(known)
    wanted = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in wanted if name not in known]
    if unknown:
        raise SystemExit(f"{option}: unknown {unknown}; choose among {list(known)}")
    return wanted if given_order else [name for name in known if name in wanted]


def int_list(text):
    return [int(v) for v in text.split(",") if v.strip()]


def float_list(text):
    return [float(v) for v in text.split(",") if v.strip()]


def blas_single_thread():
    """One BLAS thread in this process.

    MarginalCRF limits BLAS itself only in L-BFGS (its per-image products are
    numba loops); the features, the upsampling of marginals and direct
    ``infer``/``loss_and_grad`` calls run here without a limit, and idle
    OpenBLAS threads make thin products 3-1000x slower on a busy 2-core
    machine. joblib's workers limit themselves.
    """
    from threadpoolctl import threadpool_limits

    return threadpool_limits(limits=1, user_api="blas")


def start_run(title, doc, argv, arguments, settings):
    """Parsed and checked arguments (``arguments`` adds the script's options,
    ``settings`` fills and checks them); prints the title, machine and n_jobs."""
    args = settings(parse_args(doc.splitlines()[0], argv, arguments))
    print(f"{title}: machine {run_description(args.n_jobs)}")
    return args


def machine_description():
    """One line naming the machine, for tables saved to docs/."""
    return f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, {platform.system()}"


def run_description(n_jobs):
    """The machine and the number of joblib workers, for timing lines."""
    return f"{machine_description()}, n_jobs={n_jobs}"


def timing_title(args):
    """The first line of a resumable run's timing table. A cell's seconds are
    summed over every run that fitted part of it, which may have been on
    other machines or with other n_jobs; ``--report-only`` fits nothing."""
    who = "this report" if args.report_only else "this run"
    return (
        "Timings: wall clock of each fit, summed over the runs that fitted it "
        f"({who}: {run_description(args.n_jobs)})"
    )


def format_table(title, header, rows, paper=None):
    """A plain-text table; ``paper`` maps a row name to the paper's numbers, shown beside ours.

    ``rows`` is a list of (name, values) with values formatted as ``.3f`` (None: blank).
    """

    def cell(v):
        return "" if v is None else (f"{v:.3f}" if isinstance(v, (float, np.floating)) else str(v))

    names = [name for name, _ in rows]
    width = max([len(n) for n in names] + [len(header[0])]) + 2
    cols = header[1:]

    def column_widths(value_lists, minimum, gap):
        """Each column as wide as its widest header or entry plus ``gap``, so
        that long headers ("10it train") and status texts stay apart."""
        entries = [[c] + [cell(values[i]) for values in value_lists if i < len(values)] for i, c in enumerate(cols)]
        return [max(minimum, max(len(e) for e in column) + gap) for column in entries]

    widths = column_widths([values for _, values in rows], 10, 2)
    paper_widths = column_widths([paper[name] for name in names if name in paper] if paper is not None else [], 7, 1)
    lines = [title, ""]
    head = header[0].ljust(width) + "".join(f"{c:>{w}}" for c, w in zip(cols, widths))
    if paper is not None:
        head += "   | paper: " + " ".join(f"{c:>{w}}" for c, w in zip(cols, paper_widths))
    lines += [head, "-" * len(head)]
    for name, values in rows:
        line = name.ljust(width) + "".join(f"{cell(v):>{w}}" for v, w in zip(values, widths))
        if paper is not None and name in paper:
            line += "   |        " + " ".join(f"{cell(v):>{w}}" for v, w in zip(paper[name], paper_widths))
        lines.append(line)
    return "\n".join(lines)


def report(text, out, name):
    """Print a table and save it to ``out/name``."""
    print(text)
    sys.stdout.flush()
    path = Path(out) / name
    path.write_text(text + "\n")
    print(f"\n(saved to {path})")
    return path


def pyplot():
    """matplotlib.pyplot on the file-only Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, out, name):
    """Lay out, save to ``out/name`` and close (if pyplot holds it) ``fig``."""
    fig.tight_layout()
    path = Path(out) / name
    fig.savefig(path, dpi=110, bbox_inches="tight")
    print(f"figure saved to {path}")
    if "matplotlib.pyplot" in sys.modules:
        sys.modules["matplotlib.pyplot"].close(fig)
    return path


class Timer:
    """``with Timer() as t: ...; t.seconds``"""

    def __enter__(self):
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.seconds = time.perf_counter() - self.start


@contextlib.contextmanager
def ignore_convergence_warnings():
    """L-BFGS stopping at ``max_iter`` is expected here; the tables report the iterations."""
    from sklearn.exceptions import ConvergenceWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        yield


def timed_fit(model, X, y, **fit_params):
    """Fit without convergence warnings; return the wall-clock seconds."""
    with ignore_convergence_warnings(), Timer() as timer:
        model.fit(X, y, **fit_params)
    return timer.seconds


def parallel_map(function, tasks, n_jobs):
    """``[function(*task) for task in tasks]`` on joblib workers, and its wall time."""
    from joblib import Parallel, delayed

    with Timer() as timer:
        results = Parallel(n_jobs=min(n_jobs, len(tasks)))(delayed(function)(*task) for task in tasks)
    return results, timer.seconds


def fit_record(model, name, train_error, test_error, seconds, **extra):
    """The JSON-ready record of one fitted table cell (``extra`` after the name)."""
    return {
        "name": name,
        **extra,
        "train": float(train_error),
        "test": float(test_error),
        "seconds": float(seconds),
        "lbfgs_iterations": int(model.n_iter_),
        "restarts": int(model.n_restarts_),
        "reg": float(model.reg),
    }


def per_image_error_counts(model, X, labels, batch_size=16):
    """(wrong, labelled) pixel counts of the MPM prediction, one pair of
    int64 arrays over the images, at each image's own resolution:
    ``predict_proba`` upsamples the grid marginals to the image size when the
    sample carries one; hidden pixels (-1) are not counted. Batched to bound
    the memory of the marginals."""
    wrong, total = [], []
    for start in range(0, len(X), batch_size):
        probs = model.predict_proba(X[start : start + batch_size])
        for p, y in zip(probs, labels[start : start + batch_size]):
            y = np.asarray(y)
            if p.shape[:-1] != y.shape:
                raise ValueError(f"marginals of shape {p.shape} do not fit labels of shape {y.shape}")
            observed = y >= 0
            wrong.append(np.count_nonzero(np.argmax(p, axis=-1)[observed] != y[observed]))
            total.append(np.count_nonzero(observed))
    return np.array(wrong, dtype=np.int64), np.array(total, dtype=np.int64)


def error_counts(model, X, labels, batch_size=16):
    """(wrong, labelled) pixel counts summed over the images (:func:`per_image_error_counts`)."""
    wrong, total = per_image_error_counts(model, X, labels, batch_size)
    return int(wrong.sum()), int(total.sum())


def bootstrap_sd(statistic, n_images, draws=2000, seed=0):
    """Standard deviation of ``statistic(indices)`` over ``draws`` resamples
    of ``n_images`` images with replacement (seeded): how much a figure
    pooled over a test set moves with the choice of its images."""
    rng = np.random.default_rng(seed)
    return float(np.std([statistic(rng.integers(0, n_images, n_images)) for _ in range(draws)]))


def error_rate(model, X, labels, batch_size=16):
    """Hamming error over the labelled pixels of all images (see :func:`error_counts`)."""
    wrong, total = error_counts(model, X, labels, batch_size)
    return wrong / total


def require_data(path, name):
    """Exit with a clear message when a data set is missing."""
    folder = Path(path) / name
    if not folder.exists():
        sys.exit(f"data set {name!r} not found under {path}: pass --data PATH (see ../shared/data/README.md)")
    return folder


# ---------------------------------------------------------------------------
# Long runs: features cached on disk, fits checkpointed and resumable


def cached_features(transformer, images, keys, folder, edge_folder=None, chunk=32):
    """``transformer.transform(images)``, saved image by image under
    ``folder`` and returned as read-only memory maps.

    The samples then live in the page cache, not in this process: the full
    horses training set (12 M pixels, 142 float32 features per pixel and
    edge) would otherwise be held twice, here and in MarginalCRF's batches.
    ``keys`` name the images' files; a file already there is reused, so a
    resumed run skips the features (the folder name must encode every
    setting that changes them). ``edge_folder`` (default ``folder``) keeps
    the edge features apart, so that settings which change only one kind
    share the other's files (full-resolution horses take 5 GB of node and
    4 GB of edge features per 13 M pixels). Missing images are transformed
    ``chunk`` at a time (in parallel if the transformer has ``n_jobs``).
    """
    from sklearn_margcrf import CRFSample, grid_edges

    folder = Path(folder)
    edge_folder = folder if edge_folder is None else Path(edge_folder)
    for place in (folder, edge_folder):
        place.mkdir(parents=True, exist_ok=True)

    def paths(key):
        return {"node": folder / f"{key}.node.npy", "edge": edge_folder / f"{key}.edge.npy",
                "shape": folder / f"{key}.shape.npy"}

    missing = [i for i, key in enumerate(keys) if not all(p.exists() for p in paths(key).values())]
    # a chunk at a time through transform (the transformer's own n_jobs), saved as it goes
    for start in range(0, len(missing), chunk):
        part = missing[start : start + chunk]
        for i, sample in zip(part, transformer.transform([images[i] for i in part])):
            where = paths(keys[i])
            for name, array in (("node", sample.node_features), ("edge", sample.edge_features)):
                if where[name].exists():
                    continue
                np.save(where[name].with_suffix(".tmp.npy"), array)
                where[name].with_suffix(".tmp.npy").replace(where[name])
            np.save(where["shape"], np.array([*sample.grid_shape, *sample.image_shape]))
    samples = []
    for key in keys:
        where = paths(key)
        height, width, image_h, image_w = (int(v) for v in np.load(where["shape"]))
        samples.append(
            CRFSample(
                np.load(where["node"], mmap_mode="r"),
                grid_edges(height, width),
                np.load(where["edge"], mmap_mode="r"),
                grid_shape=(height, width),
                image_shape=(image_h, image_w),
            )
        )
    return samples


def downscale(image, labels, scale):
    """The image (anti-aliased) and its binary labels (:func:`downscale_labels`) at ``scale``."""
    from skimage.transform import resize

    from sklearn_margcrf.features import reduced_shape

    if scale == 1:
        return image, labels
    shape = reduced_shape(image.shape, scale)
    small = resize(image, shape + image.shape[2:], order=1, anti_aliasing=True, preserve_range=True)
    return small.astype(image.dtype), downscale_labels(labels, shape)


def with_image_shapes(samples, shapes):
    """The samples with their ``image_shape`` set to ``shapes``: their
    marginals (``predict_proba``) are then upsampled to those shapes, where
    errors can be counted against labels at that resolution."""
    from sklearn_margcrf.sample import CRFSample

    return [CRFSample(*s, grid_shape=s.grid_shape, image_shape=tuple(shape)) for s, shape in zip(samples, shapes)]


def downscale_labels(labels, shape):
    """Binary ``labels`` at the smaller ``shape``: 1 where the label-1 area
    fraction (anti-aliased bilinear resize) exceeds 1/2."""
    from skimage.transform import resize

    fraction = resize(np.asarray(labels, dtype=np.float64), tuple(shape), order=1, anti_aliasing=True)
    return (fraction > 0.5).astype(np.int64)


def restore(model, weights):
    """Give ``model`` the fitted state of saved ``weights`` (no fit)."""
    model.unary_coef_ = np.array(weights["unary_coef"], dtype=np.float64)
    model.pairwise_coef_ = np.array(weights["pairwise_coef"], dtype=np.float64)
    model.n_states_ = model.unary_coef_.shape[0]
    model.classes_ = np.arange(model.n_states_)
    model.n_node_features_ = model.unary_coef_.shape[1]
    model.n_edge_features_ = model.pairwise_coef_.shape[2]
    return model


def rho_value(text):
    """``--rho``: a number in (0, 1] or one of MarginalCRF's rules ("auto",
    "uniform_spanning_tree", "forest_cover")."""
    from sklearn_margcrf.edge_appearance import RHO_RULES

    if text in RHO_RULES:
        return text
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1] or one of {', '.join(RHO_RULES)}, got {text!r}")
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"a number rho must lie in (0, 1], got {text}")
    return value


def rho_argument(parser):
    """``--rho``: the TRW edge appearance probabilities of every TRW fit
    (default: MarginalCRF's "auto", which on the grids of the paper's
    images, of more than 600 nodes, is the forest cover's 0.5 on every
    edge, as in the paper)."""
    parser.add_argument(
        "--rho", type=rho_value, default=None,
        help="TRW edge appearance probabilities: a number in (0, 1] or auto, uniform_spanning_tree, forest_cover "
             "(default: MarginalCRF's auto: 0.5 on the paper's image grids, the uniform spanning tree's on grids "
             "of up to 600 nodes)",
    )


def rho_suffix(rho):
    """The part of a checkpoint folder's settings that names ``--rho`` ("" for the default)."""
    return "" if rho is None else f"-rho{rho:g}" if isinstance(rho, float) else f"-rho-{rho}"


def objective_tol_argument(parser):
    """``--objective-tol``: MarginalCRF's stopping rule for the fits of a
    paper's protocol, which runs L-BFGS to its own end or ``--max-iter``
    (0, the default)."""
    parser.add_argument(
        "--objective-tol", type=float, default=0.0,
        help="stop a fit once its objective fell by less than this fraction over 10 L-BFGS iterations "
             "(MarginalCRF's objective_tol; default 0: no stopping rule, as the paper; the package's default is 3e-3)",
    )


def fit_variant_suffix(args):
    """The part of a checkpoint folder's settings that names ``--dtype``,
    ``--rho`` and ``--objective-tol`` where they differ from the paper's."""
    if args.objective_tol < 0:
        raise SystemExit(f"--objective-tol must be at least 0, got {args.objective_tol}")
    return ("" if args.dtype == "float64" else f"-{args.dtype}") + rho_suffix(args.rho) + (
        f"-objtol{args.objective_tol:g}" if args.objective_tol else "")


def resumable_arguments(parser, example):
    """``--segment``, ``--checkpoints``, ``--report-only`` and ``--verbose``:
    the options of a run made of :class:`Checkpoints` fits."""
    parser.add_argument(
        "--segment", type=int, default=50,
        help="L-BFGS iterations between checkpoints (default 50); a resumed fit restarts L-BFGS from the last one",
    )
    parser.add_argument(
        "--checkpoints", default=None,
        help=f"folder of the resumable fits (default OUT/{example}_checkpoints/<settings>); rerunning resumes",
    )
    parser.add_argument(
        "--report-only", action="store_true",
        help="fit nothing: the table and figure of the cells finished so far (e.g. while a long run goes on)",
    )
    parser.add_argument("--verbose", type=int, default=0, help="MarginalCRF verbose level (1: one line per L-BFGS iteration)")


def checkpoint_folder(args, example, settings):
    """Check ``--segment`` and default ``--checkpoints`` to
    ``OUT/<example>_checkpoints/<settings>``; ``settings`` must name every
    option that changes the fits, so that other settings never resume them."""
    if args.segment < 1:
        raise SystemExit("--segment must be at least 1")
    if args.checkpoints is None:
        args.checkpoints = str(Path(args.out) / f"{example}_checkpoints" / settings)
    return args


def partial_run_note(n_finished, n_cells):
    """The line a table title gets when some of its cells are not run yet."""
    if n_finished >= n_cells:
        return ""
    return f"\nPARTIAL RUN: {n_finished} of {n_cells} cells finished; blank cells are not run yet."


@contextlib.contextmanager
def checkpoint_requests():
    """While inside, SIGUSR1 appends to the list this yields instead of
    ending the process: a fit's callback that finds the list non-empty writes
    a checkpoint after the current L-BFGS iteration, clears it and goes on
    (``kill -USR1 <pid>`` before a planned stop keeps the iterations since
    the last periodic save). The previous handler is put back on leaving.
    Where there is no SIGUSR1, or off the main thread, nothing is installed
    and the list stays empty."""
    requested = []
    if not hasattr(signal, "SIGUSR1") or threading.current_thread() is not threading.main_thread():
        yield requested
        return
    previous = signal.signal(signal.SIGUSR1, lambda signum, frame: requested.append(signum))
    try:
        yield requested
    finally:
        signal.signal(signal.SIGUSR1, signal.SIG_DFL if previous is None else previous)  # None: not set from Python


def log_served_request(requested, log, name, lbfgs_iterations):
    """After a checkpoint: if SIGUSR1 asked for it (``requested``, from
    :func:`checkpoint_requests`), clear the request and say so in ``log``."""
    if requested:
        requested.clear()
        log(f"    checkpoint of {name} written after {lbfgs_iterations} L-BFGS iterations, as asked by SIGUSR1")


def write_atomically(path, content):
    """Write ``content`` (bytes) to ``path`` through a temporary file, flushed
    to disk and renamed: a run killed meanwhile leaves the previous file or
    none, never half of one, which a resumed run would take for a record."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp")
    with open(temporary, "wb") as file:
        file.write(content)
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, path)


def write_json(path, value):
    """Write ``value`` as indented JSON to ``path`` atomically (:func:`write_atomically`)."""
    write_atomically(path, (json.dumps(value, indent=1, default=str) + "\n").encode())


class ResumableFits:
    """Fits of any schedule (``incremental`` stages included) that survive
    being killed, through the library's
    :class:`~sklearn_margcrf.callbacks.Checkpoint`: ``folder/<name>.fit.npz``
    is saved every ``every`` L-BFGS iterations and a rerun resumes from it in
    the stage where it was made (``Checkpoint.fit_params``); a finished
    fit's weights go to ``folder/<name>.weights.npz`` and are only loaded
    afterwards.

    The seconds and L-BFGS iterations of a fit are summed over the runs
    that made it: ``folder/<name>.progress.json`` is written after each
    save with the totals up to that save (work after a run's last save is
    lost and not counted; so are the L-BFGS restarts of an interrupted
    run).
    """

    def __init__(self, folder, every=50, log=print):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.every = int(every)
        self.log = log

    def _path(self, name, part):
        return self.folder / f"{name}.{part}"

    def finished(self, name):
        return self._path(name, "weights.npz").exists()

    def load(self, name, model):
        """``model`` restored to the finished fit ``name``, and its progress record."""
        with np.load(self._path(name, "weights.npz"), allow_pickle=False) as data:
            restore(model, {key: data[key] for key in ("unary_coef", "pairwise_coef")})
        state = json.loads(self._path(name, "weights.json").read_text())
        model.n_iter_, model.n_restarts_ = state["lbfgs_iterations"], state["restarts"]
        return model, state

    def state(self, name):
        """The progress record of the finished fit ``name``, or None."""
        path = self._path(name, "weights.json")
        return json.loads(path.read_text()) if self.finished(name) and path.exists() else None

    def fit(self, name, model, X, y, start=None):
        """Fit ``model`` (resuming ``name`` where a previous run saved it, or
        loading it when finished); return the model and its progress record
        (``seconds``, ``lbfgs_iterations``, ``restarts``, ``runs``).
        ``start``: a callable giving the (unary, pairwise) weights a fresh
        fit starts from (called only then), instead of the model's ``init``."""
        from sklearn_margcrf.callbacks import Checkpoint

        if self.finished(name):
            return self.load(name, model)
        checkpoint = Checkpoint(self._path(name, "fit.npz"), every=self.every)
        progress_path = self._path(name, "progress.json")
        before = {"seconds": 0.0, "lbfgs_iterations": 0, "restarts": 0, "runs": 0}
        resume = checkpoint.fit_params()
        if resume and progress_path.exists():
            before = json.loads(progress_path.read_text())
            self.log(f"    resuming {name} at stage {resume.get('stage_init')} after {before['lbfgs_iterations']} "
                     f"L-BFGS iterations ({before['seconds']:.0f} s)")
        counted = {"iterations": 0}

        def save_and_count(progress):
            # the iterations of the schedule's stages, as n_iter_ counts them (not the initialising fits')
            counted["iterations"] += progress.stage_index is not None
            if progress.n_iter % self.every == 0 or requested:
                checkpoint.save(progress)
                iterations = before["lbfgs_iterations"] + counted["iterations"]
                write_json(progress_path, {
                    "seconds": before["seconds"] + progress.elapsed, "lbfgs_iterations": iterations,
                    "restarts": before["restarts"], "runs": before["runs"] + 1,
                })
                log_served_request(requested, self.log, name, iterations)
            return False

        if not resume and start is not None:
            unary_coef, pairwise_coef = start()
            resume = {"unary_coef_init": unary_coef, "pairwise_coef_init": pairwise_coef}
        try:
            with checkpoint_requests() as requested:
                seconds = timed_fit(model.set_params(callback=save_and_count), X, y, **resume)
        finally:
            model.set_params(callback=None)
        state = {
            "seconds": before["seconds"] + seconds, "lbfgs_iterations": before["lbfgs_iterations"] + model.n_iter_,
            "restarts": before["restarts"] + model.n_restarts_, "runs": before["runs"] + 1,
        }
        np.savez(self._path(name, "weights.tmp.npz"), unary_coef=model.unary_coef_, pairwise_coef=model.pairwise_coef_)
        write_json(self._path(name, "weights.json"), state)
        os.replace(self._path(name, "weights.tmp.npz"), self._path(name, "weights.npz"))
        for part in ("fit.npz", "progress.json"):
            self._path(name, part).unlink(missing_ok=True)
        model.n_iter_, model.n_restarts_ = state["lbfgs_iterations"], state["restarts"]
        return model, state


class Checkpoints:
    """Fits of a long run, each saved to ``folder/<name>.npz`` (weights and
    progress) as it goes, so that a run killed at any point resumes where it
    stopped: finished cells are loaded, an unfinished one continues from its
    last checkpoint.

    Single-stage fits only. It predates the library's
    :class:`~sklearn_margcrf.callbacks.Checkpoint`, which
    :class:`ResumableFits` builds on (and which resumes inside an
    incremental schedule); it stays for the runs whose records it wrote
    (``horses.py``, ``binary_denoising.py``, ``horses_ablation.py``: their
    committed checkpoints are in its format)."""

    def __init__(self, folder):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)

    def load(self, name):
        path = self.folder / f"{name}.npz"
        if not path.exists():
            return None
        with np.load(path, allow_pickle=False) as data:
            state = {key: data[key] for key in data.files}
        state["loss_curve"] = list(state["loss_curve"])
        # "fits": MarginalCRF.fit calls, each a fresh L-BFGS; checkpoints written
        # before 2026-11-26 made one fit per segment
        state.setdefault("fits", state["segments"])
        for key in ("lbfgs_iterations", "restarts", "segments", "fits"):
            state[key] = int(state[key])
        state["seconds"] = float(state["seconds"])
        state["done"] = bool(state["done"])
        return state

    def finished(self, name):
        """Whether the fit ``name`` ran to its end."""
        state = self.load(name)
        return state is not None and state["done"]

    def has_weights(self, name):
        """Whether ``folder/<name>.npz`` is there (finished or not)."""
        return (self.folder / f"{name}.npz").exists()

    def has_record(self, name):
        """Whether the JSON record ``folder/<name>.json`` is there."""
        return (self.folder / f"{name}.json").exists()

    def drop_record(self, name):
        """Remove the record ``folder/<name>.json``, so that it is evaluated afresh."""
        (self.folder / f"{name}.json").unlink(missing_ok=True)

    def record(self, name, evaluate):
        """The JSON record ``folder/<name>.json``: read when there, otherwise
        ``evaluate()`` (a JSON-ready dict), timed into its
        ``evaluation_seconds`` and saved."""
        path = self.folder / f"{name}.json"
        if path.exists():
            return json.loads(path.read_text())
        with Timer() as timer:
            record = evaluate()
        record["evaluation_seconds"] = timer.seconds
        write_json(path, record)
        return record

    def save(self, name, state):
        path = self.folder / f"{name}.npz"
        tmp = self.folder / f"{name}.tmp.npz"
        np.savez(tmp, **{key: np.asarray(value) for key, value in state.items()})
        tmp.replace(path)

    def fit(self, name, model, X, y, start, max_iter, segment, log=print):
        """Fit ``model`` from ``start`` weights ({"unary_coef", "pairwise_coef"})
        for at most ``max_iter`` L-BFGS iterations, saving the weights every
        ``segment`` iterations; return the model, restored to the final
        weights, and the progress record.

        The fit is one ``MarginalCRF.fit`` (from ``start`` or the last
        checkpoint, given as ``unary_coef_init`` / ``pairwise_coef_init``) whose
        ``callback`` writes the checkpoints, so the batches are packed once
        and L-BFGS keeps its curvature memory. A fit killed in between resumes
        from its last checkpoint with a fresh L-BFGS, as after the paper's
        re-initialisation. A finished fit is only loaded: ``X``, ``y`` and
        ``start`` are not used and may be None.

        ``kill -USR1 <pid>`` writes a checkpoint after the current L-BFGS
        iteration and lets the fit go on: before a planned stop, it saves
        the iterations since the last ``segment``. (Outside a fit, SIGUSR1
        keeps its default effect.)
        """
        if model.get_params().get("incremental") is not None:
            raise ValueError("Checkpoints.fit counts the iterations of one stage: incremental must be None")
        state = self.load(name)
        if state is None:
            state = dict(
                unary_coef=np.asarray(start["unary_coef"], dtype=np.float64),
                pairwise_coef=np.asarray(start["pairwise_coef"], dtype=np.float64),
                lbfgs_iterations=0, restarts=0, segments=0, fits=0, seconds=0.0, loss_curve=[], done=max_iter == 0,
            )
        elif not state["done"]:
            log(f"    resuming {name} after {state['lbfgs_iterations']} L-BFGS iterations ({state['seconds']:.0f} s)")
        if not state["done"]:
            before = dict(state)
            curve = []

            def progress_state(unary_coef, pairwise_coef, n_iter, n_restarts, seconds, done):
                return dict(
                    before, unary_coef=unary_coef, pairwise_coef=pairwise_coef,
                    lbfgs_iterations=before["lbfgs_iterations"] + n_iter, restarts=before["restarts"] + n_restarts,
                    segments=before["segments"] + -(-n_iter // segment), fits=before["fits"] + 1,
                    seconds=before["seconds"] + seconds,
                    loss_curve=before["loss_curve"] + curve[:n_iter], done=done,
                )

            def checkpoint(progress):
                curve.append(progress.objective)
                if progress.n_iter % segment == 0 or requested:
                    self.save(name, progress_state(
                        progress.unary_coef, progress.pairwise_coef, progress.n_iter, progress.n_restarts,
                        progress.elapsed, False,
                    ))
                    log_served_request(requested, log, name, before["lbfgs_iterations"] + progress.n_iter)

            remaining = max_iter - state["lbfgs_iterations"]
            part = model.set_params(max_iter=remaining, callback=checkpoint)
            try:
                with checkpoint_requests() as requested:
                    seconds = timed_fit(
                        part, X, y, unary_coef_init=state["unary_coef"], pairwise_coef_init=state["pairwise_coef"]
                    )
            finally:
                model.set_params(callback=None)
            state = progress_state(part.unary_coef_, part.pairwise_coef_, part.n_iter_, part.n_restarts_, seconds, True)
            self.save(name, state)
        model = restore(model.set_params(max_iter=max_iter), state)
        model.n_iter_, model.n_restarts_ = state["lbfgs_iterations"], state["restarts"]
        model.loss_curve_ = state["loss_curve"]
        return model, state
