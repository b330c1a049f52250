"""Every Python snippet of README.md and docs/*.rst runs, so that a broken
snippet fails the suite and not a reader.

Snippets are the ```python blocks of README.md and the ``.. code-block::
python`` and literal (``::``, highlighted as Python by Sphinx) blocks of the
pages; shell commands are ``.. code-block:: bash`` / ```bash blocks. The
snippets of a page run in order, in one namespace, in a fresh temporary
folder, as a reader would run them. A snippet that cannot run here (a
cluster, a data set, an hour of fitting) is preceded by a marker with its
reason, ``.. skip-snippet: <reason>`` in a page or ``<!-- skip-snippet:
<reason> -->`` in the README; it is still compiled, and every marker must
give a reason and stand before a snippet.
"""

import re
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.rst"))
SKIP = re.compile(r"^\s*(?:\.\. skip-snippet:|<!-- skip-snippet:)\s*(.*?)\s*(?:-->)?\s*$")


def _indent(line):
    return len(line) - len(line.lstrip())


def snippets(path):
    """(first line number, code, skip reason or None) of every Python snippet of a page."""
    lines = path.read_text().splitlines()
    found, pending, i = [], None, 0
    while i < len(lines):
        line = lines[i]
        marker = SKIP.match(line)
        if marker:
            if pending is not None:
                raise AssertionError(f"{path.name}:{pending[0] + 1}: a skip-snippet marker stands before no snippet")
            pending = (i, marker.group(1))
            i += 1
            continue
        code, start = None, i
        if path.suffix == ".md" and line.strip().startswith("```"):
            end = next(j for j in range(i + 1, len(lines)) if lines[j].strip().startswith("```"))
            if line.strip() == "```python":
                code = "\n".join(lines[i + 1:end])
            i = end + 1
        elif path.suffix == ".rst" and (line.strip().startswith(".. code-block::") or (
                line.rstrip().endswith("::") and not line.lstrip().startswith(".."))):
            base = _indent(line)
            j = i + 1
            while j < len(lines) and (not lines[j].strip() or _indent(lines[j]) > base):
                j += 1
            body = [ln for ln in lines[i + 1:j] if not ln.strip().startswith(":")] if ".. code-block::" in line else lines[i + 1:j]
            if line.strip() in (".. code-block:: python", ".. code-block:: python3") or not line.strip().startswith(".."):
                text = "\n".join(body).strip("\n")
                width = min((_indent(ln) for ln in text.splitlines() if ln.strip()), default=0)
                code = "\n".join(ln[width:] for ln in text.splitlines())
            i = j
        else:
            if line.strip() and pending is not None and not line.lstrip().startswith(".."):
                raise AssertionError(f"{path.name}:{pending[0] + 1}: a skip-snippet marker stands before no snippet")
            i += 1
            continue
        if code is not None:
            found.append((start + 1, code, pending[1] if pending else None))
        elif pending is not None:
            raise AssertionError(f"{path.name}:{pending[0] + 1}: a skip-snippet marker stands before a non-Python block")
        pending = None
    if pending is not None:
        raise AssertionError(f"{path.name}:{pending[0] + 1}: a skip-snippet marker stands before no snippet")
    return found


@pytest.mark.parametrize("path", PAGES, ids=lambda p: p.name)
def test_skipped_snippets_compile_and_give_a_reason(path):
    for line, code, reason in snippets(path):
        compile(code, f"{path.name}:{line}", "exec")
        if reason is not None:
            assert len(reason) > 5, f"{path.name}:{line}: a skipped snippet needs its reason"


@pytest.mark.parametrize("path", [p for p in PAGES if any(r is None for _, _, r in snippets(p))], ids=lambda p: p.name)
def test_snippets_run(path, tmp_path, monkeypatch):
    pytest.importorskip("skimage", reason="the snippets need the images extra")
    matplotlib = pytest.importorskip("matplotlib", reason="the snippets need the plot extra")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "__snippet__"}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # short fits warn; the snippets are checked for running
            for line, code, reason in snippets(path):
                if reason is None:
                    exec(compile(code, f"{path.name}:{line}", "exec"), namespace)
    finally:
        plt.close("all")


def test_the_runner_finds_the_snippets_and_the_markers(tmp_path):
    page = tmp_path / "page.rst"
    page.write_text(
        "Title\n=====\n\nText::\n\n    x = 1\n\n.. code-block:: bash\n\n    pip install .\n\n"
        ".. skip-snippet: needs a cluster\n\n.. code-block:: python\n\n    y = x + 1\n"
    )
    assert snippets(page) == [(4, "x = 1", None), (14, "y = x + 1", "needs a cluster")]
    page.write_text("Text\n\n.. skip-snippet: needs data\n\nA paragraph.\n")
    with pytest.raises(AssertionError, match="stands before no snippet"):
        snippets(page)
