"""Mutation testing helpers, outside CI (docs/testing.rst).

``named``: applies, one at a time, the six wrong results that issue 34 found
the suite letting through, to a copy of the repository, and runs the given
tests (``-x``) against each; a mutant is killed when they fail::

    python benchmarks/mutation.py named [pytest arguments, default tests/]

``sample SEED N``: a seeded random sample of N of the mutants that
``mutmut run`` generated (read from mutants/), one name a line, to pass to
``mutmut run`` when the whole set takes too long; the same seed over the same
source gives the same sample, so that two test suites can be compared::

    mutmut run $(python benchmarks/mutation.py sample 0 150)

``summary [NAME ...]``: killed / survived counts per module of the given
mutants (default: all) from mutmut's results, and the survivors.
"""

import json
import random
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: (file, exact text, replacement, what it does): the mutations of issue 34
NAMED = [
    ("sklearn_margcrf/entropy.py",
     "    rho = np.asarray(rho, dtype=mu.dtype)  # in the marginals' precision\n",
     "    rho = np.asarray(rho, dtype=mu.dtype) ** 2\n",
     "TRW entropy weighs each edge's mutual information by rho**2 (value and gradient)"),
    ("sklearn_margcrf/gradients.py",
     "alpha=settings.alpha, node_weight=node_weight)",
     "alpha=15.0, node_weight=node_weight)",
     "loss_and_grad does not pass alpha on to the smoothed classification loss"),
    ("sklearn_margcrf/gradients.py",
     "        if self.sides == 2:\n",
     "        if self.sides in (2, 4):\n",
     "the 4-sided perturbation is computed as 2-sided"),
    ("sklearn_margcrf/estimator.py",
     'rho=self.rho if inference == "trw" else None,',
     "rho=None,",
     "MarginalCRF trains TRW with the default rho instead of its rho"),
    ("sklearn_margcrf/estimator.py",
     "n_restarts < self.max_restarts",
     "n_restarts < 5",
     "max_restarts is ignored (the default, 5, always)"),
    ("sklearn_margcrf/sample.py",
     "    zoomed /= zoomed.sum(axis=-1, keepdims=True)\n    return zoomed\n",
     "    zoomed /= zoomed.sum(axis=-1, keepdims=True)\n    return zoomed[::-1, ::-1]\n",
     "marginals upsampled to the image size come out rotated by 180 degrees"),
]


def named(pytest_args):
    """Run ``pytest_args`` against each named mutant; return the number that survive."""
    survivors = 0
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "repo"
        # copy2 keeps the modification times, so numba's caches in __pycache__ stay valid
        shutil.copytree(ROOT, copy, copy_function=shutil.copy2, ignore=shutil.ignore_patterns(".git", "mutants"))
        for path, old, new, what in NAMED:
            target = copy / path
            original = target.read_text()
            assert original.count(old) == 1, f"{path}: the text to mutate is not there once: {old!r}"
            target.write_text(original.replace(old, new))
            try:
                run = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *pytest_args],
                                     cwd=copy, capture_output=True, text=True)
            finally:
                target.write_text(original)
            verdict = "killed" if run.returncode == 1 else "SURVIVED" if run.returncode == 0 else f"error {run.returncode}"
            survivors += run.returncode == 0
            failed = [line for line in run.stdout.splitlines() if line.startswith("FAILED")][:1]
            print(f"{verdict:9s} {what}" + (f"\n          {failed[0]}" if failed else ""), flush=True)
    return survivors


def _results():
    """{mutant name: exit code or None} of every mutant in mutants/ (mutmut's .meta files)."""
    out = {}
    for meta in sorted((ROOT / "mutants").rglob("*.py.meta")):
        out.update(json.loads(meta.read_text())["exit_code_by_key"])
    return out


def sample(seed, n):
    names = sorted(_results())
    return sorted(random.Random(seed).sample(names, min(n, len(names))))


def summary(names):
    from mutmut.stats import status_by_exit_code

    results = _results()
    names = names or sorted(results)
    counts = Counter()
    for name in names:
        module = re.match(r"(.*?)\.x[_\u01c1]", name).group(1)  # mutmut names mutants module.x_function__mutmut_N
        counts[module, status_by_exit_code[results[name]]] += 1
    for module in sorted({m for m, _ in counts}):
        print(module, {status: c for (m, status), c in sorted(counts.items()) if m == module})
    print("all", dict(sum((Counter({status: c}) for (_, status), c in counts.items()), Counter())), "of", len(names))
    print("survivors:", *(n for n in names if status_by_exit_code[results[n]] == "survived"), sep="\n    ")


if __name__ == "__main__":
    command, *rest = sys.argv[1:] or ["named"]
    if command == "named":
        sys.exit(named(rest or ["tests/"]))
    elif command == "sample":
        print(*sample(int(rest[0]), int(rest[1])), sep="\n")
    elif command == "summary":
        summary(rest)
    else:
        sys.exit(__doc__)
