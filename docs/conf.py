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
numpydoc_show_class_members = False
numpydoc_validation_checks = set()
exclude_patterns = ["_build", "architecture.md", "results/*.md"]
html_theme = "alabaster"
master_doc = "index"
suppress_warnings = ["autosummary.import_cycle"]
