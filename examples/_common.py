"""Shared plumbing of the paper's experiments: command line, tables, figures.

Every example is runnable as ``python examples/<name>.py [--data PATH] [--quick]``
and imports this module from its own folder.
"""

import argparse
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DATA = REPO.parent / "shared" / "data"


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


def machine_description():
    """One line naming the machine, for tables saved to docs/."""
    return f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, {platform.system()}"


def format_table(title, header, rows, paper=None):
    """A plain-text table; ``paper`` maps a row name to the paper's numbers, shown beside ours.

    ``rows`` is a list of (name, values) with values formatted as ``.3f`` (None: blank).
    """

    def cell(v):
        return "" if v is None else (f"{v:.3f}" if isinstance(v, (float, np.floating)) else str(v))

    names = [name for name, _ in rows]
    width = max([len(n) for n in names] + [len(header[0])]) + 2
    cols = header[1:]
    lines = [title, ""]
    head = header[0].ljust(width) + "".join(f"{c:>10}" for c in cols)
    if paper is not None:
        head += "   | paper: " + " ".join(f"{c:>7}" for c in cols)
    lines += [head, "-" * len(head)]
    for name, values in rows:
        line = name.ljust(width) + "".join(f"{cell(v):>10}" for v in values)
        if paper is not None and name in paper:
            line += "   |        " + " ".join(f"{cell(v):>7}" for v in paper[name])
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


def save_figure(fig, out, name):
    path = Path(out) / name
    fig.savefig(path, dpi=110, bbox_inches="tight")
    print(f"figure saved to {path}")
    return path


class Timer:
    """``with Timer() as t: ...; t.seconds``"""

    def __enter__(self):
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.seconds = time.perf_counter() - self.start


def hamming_error(estimator, X, y):
    """Error rate over labelled pixels (1 - MarginalCRF.score)."""
    return 1.0 - estimator.score(X, y)


def require_data(path, name):
    """Exit with a clear message when a data set is missing."""
    folder = Path(path) / name
    if not folder.exists():
        sys.exit(f"data set {name!r} not found under {path}: pass --data PATH (see ../shared/data/README.md)")
    return folder
