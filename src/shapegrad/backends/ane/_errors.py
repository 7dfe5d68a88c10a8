"""The ANE backend's lowering error (below ``lowering.py`` and ``_decompose.py``, which raise it)."""

from __future__ import annotations


class AneLoweringError(NotImplementedError):
    """A graph construct the Core ML lowering does not support; names the op and the fix."""

    def __init__(self, what: str, detail: str) -> None:
        super().__init__(
            f"ane backend: cannot lower {what}: {detail}; "
            "compile this function with backend='c' (or 'numpy') instead"
        )
