"""Typed backend options: what ``sg.compile(f, backend=..., **options)`` may say to a backend.

Each backend declares one frozen dataclass deriving from :class:`BackendOptions`
(``COptions``, ``CudaOptions``, ``AneOptions``, ``NumpyOptions``) and registers it with
the backend (``register_backend(name, factory, options=...)``). ``sg.compile`` builds it
from its keyword arguments when it is called, so

* an unknown key raises ``TypeError`` naming the valid keys (and the closest one: a
  misspelled option is an error, never silently ignored);
* a value of the wrong type raises ``TypeError``, a value out of range ``ValueError``,
  each naming the backend, the option and what is valid;
* the cache keys (``compiler/graphkey.py``, the C manifest) use :meth:`canonical`, a
  stable text of every field (not the ``repr`` of a dict).

Fields are checked against their annotations: ``bool``, ``int``, ``float``, ``str``,
``Literal[...]``, ``tuple[str, ...]``, a class, and ``X | None``. A subclass adds its
ranges in :meth:`BackendOptions.check` and may accept an old spelling of a field in
:meth:`BackendOptions.renamed`.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from collections.abc import Mapping
from typing import Any, ClassVar, Literal, TypeVar, Union, get_args, get_origin

import numpy as np

from shapegrad.compiler.graphkey import canonical_text

OptionsT = TypeVar("OptionsT", bound="BackendOptions")


@dataclasses.dataclass(frozen=True)
class BackendOptions:
    """Base of every backend's options (a frozen dataclass; subclasses add fields).

    Example:
        >>> COptions.from_kwargs({"denormals": "flush"})   # what sg.compile(..., denormals=...) does
        COptions(..., denormals='flush', ...)
    """

    backend: ClassVar[str] = "?"

    def __post_init__(self) -> None:
        hints = typing.get_type_hints(type(self))
        for f in dataclasses.fields(self):
            value = _conform(self, f.name, hints[f.name], getattr(self, f.name))
            object.__setattr__(self, f.name, value)
        self.check()

    def check(self) -> None:
        """Raise ``ValueError`` for a value outside its range (types are already checked)."""

    @classmethod
    def renamed(cls, kwargs: dict[str, Any]) -> dict[str, Any]:
        """``kwargs`` with old spellings of fields replaced (default: none)."""
        return kwargs

    @classmethod
    def names(cls) -> list[str]:
        """The option names this backend accepts."""
        return [f.name for f in dataclasses.fields(cls) if f.init]

    @classmethod
    def from_kwargs(
        cls: type[OptionsT], kwargs: Mapping[str, Any], backend: str | None = None
    ) -> OptionsT:
        """Validated options from ``sg.compile``'s keyword arguments (``backend``: the
        name the backend is registered under, for messages; default ``cls.backend``).

        Raises:
            TypeError: an unknown key (the message lists the valid ones) or a wrong type.
            ValueError: a value outside its range.
        """
        valid = cls.names()
        for key in kwargs:
            if key not in valid:
                raise TypeError(unknown_option_message(backend or cls.backend, key, valid))
        return cls(**cls.renamed(dict(kwargs)))

    def canonical(self) -> str:
        """A stable text of every field (what cache keys hash)."""
        return canonical_text(self)

    def fail(self, name: str, what: str, exc: type[Exception] = ValueError) -> Exception:
        """The error for option ``name``: ``what`` says what is valid and what was given."""
        return exc(f"sg.compile(backend={self.backend!r}): option {name!r} {what}")


def unknown_option_message(backend: str, key: str, valid: list[str]) -> str:
    """The message for option ``key`` that backend ``backend`` does not have."""
    close = difflib.get_close_matches(key, valid, n=1, cutoff=0.6)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    listed = ", ".join(valid) if valid else "none"
    return (
        f"sg.compile(backend={backend!r}): unknown option {key!r}{hint}; "
        f"the {backend} backend's options are: {listed}"
    )


def _describe(hint: Any) -> str:
    origin = get_origin(hint)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in get_args(hint))
    if origin in (Union, types.UnionType):
        parts = [_describe(a) for a in get_args(hint) if a is not type(None)]
        return " or ".join(parts) + " or None"
    if origin is tuple:
        item = get_args(hint)[0]
        return f"a tuple of {getattr(item, '__name__', item)}"
    if isinstance(hint, type):
        article = "an" if hint.__name__[0].lower() in "aeiou" else "a"
        return f"{article} {hint.__name__}"
    return str(hint)


def _matches(hint: Any, value: Any) -> tuple[bool, Any]:
    """Whether ``value`` fits ``hint``, and the value to store (lists become tuples)."""
    origin = get_origin(hint)
    if origin is Literal:
        return any(value == a and type(value) is type(a) for a in get_args(hint)), value
    if origin in (Union, types.UnionType):
        if value is None:
            return type(None) in get_args(hint), None
        for arm in get_args(hint):
            if arm is not type(None):
                ok, stored = _matches(arm, value)
                if ok:
                    return True, stored
        return False, value
    if origin is tuple:
        item = get_args(hint)[0]
        if not isinstance(value, tuple | list):
            return False, value
        return all(_matches(item, v)[0] for v in value), tuple(value)
    if hint is bool:
        return isinstance(value, bool | np.bool_), bool(value)
    if hint is int:  # not bool, which is an int to Python but never meant as a count
        return isinstance(value, int) and not isinstance(value, bool), value
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool), value
    if isinstance(hint, type):
        return isinstance(value, hint), value
    raise TypeError(f"BackendOptions: unsupported annotation {hint!r}")


def _conform(options: BackendOptions, name: str, hint: Any, value: Any) -> Any:
    ok, stored = _matches(hint, value)
    if not ok:
        kind = ValueError if get_origin(hint) is Literal else TypeError
        shown = repr(value) if len(repr(value)) < 60 else repr(value)[:57] + "..."
        raise options.fail(
            name, f"must be {_describe(hint)}, got {type(value).__name__} {shown}", kind
        )
    return stored


@dataclasses.dataclass(frozen=True)
class NoOptions(BackendOptions):
    """For a backend without options (the NumPy reference); ``sg.compile`` accepts none."""

    backend: ClassVar[str] = "numpy"


__all__ = ["BackendOptions", "NoOptions", "unknown_option_message"]
