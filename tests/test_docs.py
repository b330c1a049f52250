"""The documentation builds with warnings as errors (``sphinx-build -W``), as
the issue that asked for it requires: a broken cross-reference, a malformed
docstring or a bad indentation in a page fails the suite, not only the docs."""

import inspect
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import sklearn_margcrf.callbacks
import sklearn_margcrf.datasets
import sklearn_margcrf.exceptions
import sklearn_margcrf.features
import sklearn_margcrf.metrics
import sklearn_margcrf.plot

pytest.importorskip("sphinx", reason="building the docs needs sphinx (the test extra installs it)")
pytest.importorskip("numpydoc", reason="building the docs needs numpydoc (the test extra installs it)")

DOCS = Path(__file__).resolve().parents[1] / "docs"


def test_docs_build_without_warnings(tmp_path):
    if not (DOCS / "conf.py").exists():
        pytest.skip("no docs/ beside tests/")
    # build a copy, so that autosummary's generated pages stay out of the source tree
    source = tmp_path / "docs"
    shutil.copytree(DOCS, source, ignore=shutil.ignore_patterns("_build", "generated"))
    out = subprocess.run(
        [sys.executable, "-m", "sphinx", "-q", "-E", "-W", str(source), str(tmp_path / "html")],
        capture_output=True, text=True, timeout=600,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    assert (tmp_path / "html" / "user_guide.html").exists()
    # the user guide's pictures, drawn by sklearn_margcrf.plot (docs/make_figures.py)
    for picture in ("marginals.png", "loss_curve.png"):
        assert (tmp_path / "html" / "_images" / picture).exists()
    # every exported class and function of the public modules has a page of
    # its own (with its parameters), not only a line in its module's table
    generated = tmp_path / "html" / "generated"
    modules = (sklearn_margcrf.datasets, sklearn_margcrf.features, sklearn_margcrf.metrics, sklearn_margcrf.exceptions,
               sklearn_margcrf.plot, sklearn_margcrf.callbacks)
    for module in modules:
        for name in module.__all__:
            if inspect.isfunction(getattr(module, name)) or inspect.isclass(getattr(module, name)):
                assert (generated / f"{module.__name__}.{name}.html").exists(), f"no API page for {module.__name__}.{name}"
    estimator_page = (generated / "sklearn_margcrf.MarginalCRF.html").read_text()
    assert "MarginalCRF.predict_proba" in estimator_page  # the methods are documented on it
