"""Calls through function transforms: ``sg.value_and_grad(loss)(params, x, y)`` and friends.

The runtime signatures are ``Callable[..., Any]``, which would hide the loss's
annotations exactly where features and labels meet. Here the transforms keep
the wrapped function's signature: ``value_and_grad(f)`` is ``f``'s parameters
returning ``(f's result, d/d argnums)``, ``grad(f)`` returns the gradients,
``compile(f)`` is a :class:`Compiled` instance remembering ``f`` (its ``.graph``
and ``.stats`` still type-check), and ``ScalarTrainer(loss, params)`` remembers
``loss``, so ``trainer.step(x, y)`` is checked against ``loss``'s inputs.
"""

from __future__ import annotations

from mypy.nodes import TupleExpr, TypeInfo
from mypy.plugin import FunctionContext, MethodContext
from mypy.types import (
    AnyType,
    CallableType,
    Instance,
    TupleType,
    Type,
    TypeOfAny,
    get_proper_type,
)

from .calls import check_call, positional
from .carrier import attach_fn, wrapped_fn
from .env import Env
from .literals import bool_of, int_of

VALUE_AND_GRAD = "shapegrad.autodiff.value_and_grad"
GRAD = "shapegrad.autodiff.grad"
COMPILE = "shapegrad.jit.compile"
COMPILED_CALL = "shapegrad.jit.Compiled.__call__"
TRAINER = "shapegrad.train.trainer.ScalarTrainer"
# Trainer methods whose ``*inputs`` are the loss's arguments after ``params``.
TRAINER_METHODS = frozenset(
    f"{TRAINER}.{m}" for m in ("step", "forward", "backward", "adam_step", "adamw_step")
)


def _arg(ctx: FunctionContext, name: str, position: int) -> int | None:
    names = list(ctx.callee_arg_names)
    slot = names.index(name) if name in names else position
    return slot if slot < len(ctx.args) and ctx.args[slot] else None


def _fn_type(ctx: FunctionContext) -> CallableType | None:
    return _fn_type_at(ctx, "fn", 0)


def differentiate(ctx: FunctionContext, with_value: bool) -> Type:
    """``value_and_grad(fn, argnums, has_aux)`` / ``grad(...)``: ``fn``'s signature, new result."""
    fn = _fn_type(ctx)
    if fn is None:
        return ctx.default_return_type
    argnums_slot = _arg(ctx, "argnums", 1)
    expr = ctx.args[argnums_slot][0] if argnums_slot is not None else None
    nums: list[int] | None = [0] if expr is None else None
    if expr is not None and (single := int_of(expr)) is not None:
        nums = [single]
    elif isinstance(expr, TupleExpr):
        values = [int_of(e) for e in expr.items]
        nums = None if any(v is None for v in values) else [v for v in values if v is not None]
    aux_slot = _arg(ctx, "has_aux", 2)
    has_aux = bool_of(ctx.args[aux_slot][0] if aux_slot is not None else None, False)
    anything = AnyType(TypeOfAny.special_form)
    fallback = ctx.api.named_generic_type("builtins.tuple", [anything])
    grads: Type = anything
    if nums is not None and all(-len(fn.arg_types) <= n < len(fn.arg_types) for n in nums):
        picked = [fn.arg_types[n] for n in nums]
        single_num = expr is None or int_of(expr) is not None
        grads = picked[0] if single_num else TupleType(picked, fallback)
    if has_aux is None:
        return ctx.default_return_type
    if has_aux:
        if not with_value:
            aux = _second(fn.ret_type)
            result: Type = TupleType([grads, aux], fallback) if aux is not None else anything
        else:
            result = TupleType([fn.ret_type, grads], fallback)
    else:
        result = TupleType([fn.ret_type, grads], fallback) if with_value else grads
    return fn.copy_modified(ret_type=result)


def _second(typ: Type) -> Type | None:
    proper = get_proper_type(typ)
    return proper.items[1] if isinstance(proper, TupleType) and len(proper.items) == 2 else None


def compile_fn(ctx: FunctionContext) -> Type:
    """``sg.compile(fn, ...)``: a ``Compiled`` that remembers ``fn``."""
    fn = _fn_type(ctx)
    compiled = _instance(ctx, "shapegrad.jit", "Compiled")
    return ctx.default_return_type if fn is None or compiled is None else attach_fn(compiled, fn)


def _instance(ctx: FunctionContext, module: str, name: str) -> Instance | None:
    """An instance of class ``module.name`` if mypy loaded that module."""
    tree = getattr(ctx.api, "modules", {}).get(module)
    node = tree.names.get(name) if tree is not None else None
    info = node.node if node is not None else None
    return Instance(info, []) if isinstance(info, TypeInfo) else None


def make_trainer(ctx: FunctionContext) -> Type:
    """``ScalarTrainer(loss, params, ...)``: check ``params`` against ``loss``; remember ``loss``."""
    fn = _fn_type_at(ctx, "loss_fn", 0)
    if fn is None:
        return ctx.default_return_type
    slot = _arg(ctx, "params", 1)
    if slot is not None and fn.arg_types:
        laid = positional(fn, [ctx.args[slot][0]], [ctx.arg_types[slot][0]], 0)
        if laid is not None:
            name = (fn.name or "loss").split(" of ")[0]
            check_call(Env(ctx.api), ctx.context, fn, *laid, ctx.default_return_type, name)
    return attach_fn(ctx.default_return_type, fn)


def _fn_type_at(ctx: FunctionContext, name: str, position: int) -> CallableType | None:
    slot = _arg(ctx, name, position)
    if slot is None:
        return None
    fn = get_proper_type(ctx.arg_types[slot][0])
    if isinstance(fn, CallableType) and not fn.is_type_obj():
        return fn
    return wrapped_fn(fn)


def call_wrapped(ctx: MethodContext, skip: int) -> Type:
    """``compiled(*args)`` / ``trainer.step(*inputs)``: check against the wrapped function."""
    fn = wrapped_fn(ctx.type)
    # Keyword arguments of a compiled call go to fn (not followed); a trainer's are its own (lr=).
    if fn is None or not ctx.args or (skip == 0 and any(ctx.args[1:])):
        return ctx.default_return_type
    laid = positional(fn, ctx.args[0], ctx.arg_types[0], skip)
    if laid is None:
        return ctx.default_return_type
    name = (fn.name or "call").split(" of ")[0]
    result = check_call(Env(ctx.api), ctx.context, fn, *laid, fn.ret_type, name)
    return result if skip == 0 else ctx.default_return_type
