"""The warning an old name gives when it is imported."""

import warnings


def warn_moved(old: str, new: str) -> None:
    warnings.warn(f"{old} is deprecated; use {new}", DeprecationWarning, stacklevel=3)
