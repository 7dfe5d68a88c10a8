"""User-provided names made safe for generated source and file names.

A compiled function's name reaches a C comment (``/* program <name> */``), debug dump
file names and cache package names. A name with ``*/`` would end the comment and inject
code; one with ``/`` or ``..`` would write outside the dump directory.
"""

from __future__ import annotations

import re

_UNSAFE = re.compile(r"[^A-Za-z0-9_.<>-]")
MAX_LENGTH = 80


def safe_name(name: str) -> str:
    """``name`` with every character outside ``[A-Za-z0-9_.<>-]`` replaced by ``_``, no
    ``..`` and no leading dot, at most :data:`MAX_LENGTH` characters (``"fn"`` if empty).

    Example:
        >>> safe_name("loss */ int evil; /*")
        'loss____int_evil____'
    """
    text = _UNSAFE.sub("_", str(name)).replace("..", "__").lstrip(".")
    return text[:MAX_LENGTH] or "fn"
