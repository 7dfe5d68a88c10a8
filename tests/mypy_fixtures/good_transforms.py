"""Correct: the function transforms keep the wrapped function's shapes.

``sg.vmap(f)`` has ``f``'s signature with a batch dim (``vmap_batch``) in front of
each batched argument and of the result (or where ``out_axes`` puts it);
``sg.jvp(f, primals, tangents)`` is ``(f(*primals), its tangent)``, two values of
``f``'s result shape; ``sg.custom_vjp(f)`` / ``sg.custom_jvp(f)`` keep ``f``'s signature.
``sg.jacrev(f)`` / ``sg.jacfwd(f)`` of ``f: [a] -> [b]`` give ``[b a]`` (per argnum) and
``sg.hessian(f)`` ``[.. a a]``; argnums that are not literals are not followed.
"""

import shapegrad as sg
from shapegrad import Float, Tensor


@sg.typechecked
def affine(w: Float[Tensor, "o i"], x: Float[Tensor, " i"]) -> Float[Tensor, " o"]:
    return w @ x


@sg.typechecked
def energy(x: Float[Tensor, " i"]) -> Float[Tensor, ""]:
    return (x * x).sum()


@sg.typechecked
def pair(x: Float[Tensor, " i"]) -> tuple[Float[Tensor, " i"], Float[Tensor, ""]]:
    return x, x.sum()


@sg.custom_vjp
def clip_grad(x: Float[Tensor, "n d"]) -> Float[Tensor, "n d"]:
    return x


clip_grad.defvjp(lambda x: (clip_grad(x), None), lambda res, g: (sg.clip(g, -1.0, 1.0),))


@sg.custom_jvp
def softplus(x: Float[Tensor, " n"]) -> Float[Tensor, " n"]:
    return sg.log(1.0 + sg.exp(x))


softplus.defjvp(lambda p, t: (softplus(p[0]), sg.sigmoid(p[0]) * t[0]))


@sg.typechecked
def transforms(
    w: Float[Tensor, "5 3"], xs: Float[Tensor, "8 3"], v: Float[Tensor, "3"]
) -> Float[Tensor, ""]:
    per_example = sg.vmap(affine, in_axes=(None, 0))
    # N: Revealed shape is "float[8, 5]"
    ys = sg.reveal_shape(per_example(w, xs))
    # N: Revealed shape is "float[5, 8]"
    sg.reveal_shape(sg.vmap(affine, in_axes=(None, 0), out_axes=1)(w, xs))
    # N: Revealed shape is "float[8]"
    sg.reveal_shape(sg.vmap(energy)(xs))
    # N: Revealed shape is "float[3]"
    sg.reveal_shape(sg.vmap(energy, in_axes=1)(xs))
    value, tangent = sg.jvp(affine, (w, v), (w, v))
    # N: Revealed shape is "float[5]"
    sg.reveal_shape(value)
    # N: Revealed shape is "float[5]"
    sg.reveal_shape(tangent)
    # N: Revealed shape is "float[8, 3]"
    sg.reveal_shape(clip_grad(xs))
    # N: Revealed shape is "float[3]"
    sg.reveal_shape(softplus(v))
    # N: Revealed shape is "float[3]"
    sg.reveal_shape(sg.jvp(softplus, (v,), (v,))[1])
    out, f_jvp = sg.linearize(affine, w, v)
    # N: Revealed shape is "float[5]"
    sg.reveal_shape(out)
    # N: Revealed shape is "not a Tensor"
    sg.reveal_shape(f_jvp(w, v))  # the tangent function is not followed
    axes = (None, 0)
    # N: Revealed shape is "not a Tensor"
    sg.reveal_shape(sg.vmap(affine, in_axes=axes)(w, xs))  # axes not literal: not followed
    # N: Revealed shape is "(float[8, 3], float[8])"
    sg.reveal_shape(sg.vmap(pair)(xs))
    # N: Revealed shape is "float[3, 3]"
    hess = sg.reveal_shape(sg.hessian(energy)(v))
    # N: Revealed shape is "float[5, 3]"
    jac = sg.reveal_shape(sg.jacrev(affine, argnums=1)(w, v))
    # N: Revealed shape is "float[5, 5, 3]"
    sg.reveal_shape(sg.jacfwd(affine)(w, v))
    # N: Revealed shape is "(float[5, 5, 3], float[5, 3])"
    sg.reveal_shape(sg.jacrev(affine, argnums=(0, -1))(w, v))
    # N: Revealed shape is "float[5, 3, 3]"
    sg.reveal_shape(sg.hessian(affine, argnums=1)(w, v))
    # N: Revealed shape is "((float[5, 5, 3, 5, 3], float[5, 5, 3, 3]), (float[5, 3, 5, 3], float[5, 3, 3]))"
    sg.reveal_shape(sg.hessian(affine, argnums=(0, 1))(w, v))
    nums = 1
    # N: Revealed shape is "not a Tensor"
    sg.reveal_shape(sg.jacrev(affine, argnums=nums)(w, v))  # argnums not literal: not followed
    # N: Revealed shape is "not a Tensor"
    sg.reveal_shape(sg.jacrev(pair)(v))  # a tuple output: not followed
    return out.sum() + ys.sum() + tangent.sum() + hess.sum() + jac.sum() + softplus(v).sum()


def run() -> float:
    return float(transforms(sg.randn((5, 3)), sg.randn((8, 3)), sg.randn((3,))).item())
