"""Warnings attributed to the user's code.

A fixed ``stacklevel`` points at the right line only for one call path: the
kernels' warnings reach the user through ``infer``, ``loss_and_grad``,
scikit-learn's ``fit`` wrapper or directly. :func:`warn_at_caller` walks up to the
first frame outside this package and scikit-learn instead, so a warning
shows the user's line and ``module=`` filters on the user's module apply.
"""

import os
import sys
import warnings

import sklearn

#: Frames in these folders are not the user's.
_LIBRARY_DIRS = tuple(os.path.dirname(os.path.abspath(path)) + os.sep for path in (__file__, sklearn.__file__))


def warn_at_caller(message, category):
    """``warnings.warn(message, category)`` attributed to the first caller
    outside this package and scikit-learn."""
    frame, level = sys._getframe(1), 2
    while frame.f_back is not None and frame.f_code.co_filename.startswith(_LIBRARY_DIRS):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level)
