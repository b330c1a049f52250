"""Sphinx configuration for sklearn_margcrf."""

import os
import sys

sys.path.insert(0, os.path.abspath(".."))

project = "sklearn_margcrf"
author = "sklearn_margcrf developers"
copyright = "2026, sklearn_margcrf developers"
release = "0.1.0"

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.mathjax",
    "sphinx.ext.viewcode",
    "numpydoc",
]
autosummary_generate = True
# Module pages list, and link to pages of, the members each module exports
# (its __all__); the templates give every class and function a page of its own.
autosummary_ignore_module_all = False
templates_path = ["_templates"]
# Every cross-reference must resolve (so a renamed function breaks the build);
# other projects' objects are not linked, since the build has no network for
# intersphinx.
nitpicky = True
nitpick_ignore_regex = [(r"py:.*", r"(numpy|scipy|skimage|sklearn|joblib|dask|distributed)(\..*)?")]
numpydoc_show_class_members = False
numpydoc_validation_checks = set()
exclude_patterns = ["_build", "architecture.md", "results/*.md"]
html_theme = "alabaster"
master_doc = "index"
suppress_warnings = ["autosummary.import_cycle"]


def _skip_metadata_request_methods(app, what, name, obj, skip, options):
    # scikit-learn generates set_fit_request & co. from fit's keyword
    # arguments; their docstrings refer to scikit-learn's own glossary, which
    # this build cannot link (no intersphinx), and scikit-learn documents them.
    if name.startswith("set_") and name.endswith("_request"):
        return True
    return None


def setup(app):
    app.connect("autodoc-skip-member", _skip_metadata_request_methods)
