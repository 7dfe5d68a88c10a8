"""jaxtyping spec strings -> static shapes (:class:`spec.TShape`).

Example:
    >>> parse_spec("b 784", "float", "m.f").dims
    (Sym(name='b', scope='m.f'), 784)
    >>> show(parse_spec("*batch c", None, "m.f").dims)
    '[*batch, c]'
"""

from __future__ import annotations

from functools import lru_cache

from .sizes import parse
from .spec import Item, Sym, TShape, Var, show

__all__ = ["parse_spec", "show"]


def _parse_token(token: str, scope: str) -> Item:
    """One whitespace-separated piece of a jaxtyping spec."""
    if token == "...":
        return Var(None, scope)
    if token.startswith("*"):
        rest = token[1:]
        named = rest.isidentifier() and not rest.startswith("_")
        return Var(rest if named else None, scope)
    if token.lstrip("-").isdigit():
        return int(token)
    if token.isidentifier() and not token.startswith("_"):
        return Sym(token, scope)
    if token[0].isalnum() or token[0] == "(":
        return parse(token, scope)  # `3*c`, `h+1`, `c//4`: a size expression
    # `_`, `_name` (unchecked), `#name` (broadcastable), `?b`, `name=...`: unknown size.
    return None


@lru_cache(maxsize=4096)
def parse_spec(spec: str, dtype: str | None, scope: str) -> TShape | None:
    """The static shape of a jaxtyping spec string, or None when it cannot be read.

    Example:
        >>> parse_spec("", "float", "m.f")
        TShape(dims=(), dtype='float')
    """
    items = tuple(_parse_token(tok, scope) for tok in spec.split())
    if sum(isinstance(i, Var) for i in items) > 1:
        return None  # jaxtyping allows one variadic per spec; anything else is not ours to judge
    return TShape(items, dtype)
