"""One derivation of einsum letter roles (``ops/einsum_roles.py``), read by the eager plan,
the library-product matcher and the Core ML lowering."""

from __future__ import annotations

import numpy as np
import pytest

from shapegrad.ops.einsum_plan import einsum_macs, plan_einsum
from shapegrad.ops.einsum_roles import EinsumRoles

SPECS = [
    "ij,jk->ik",
    "bij,bjk->bik",
    "bij,bkj->bki",
    "ij,kj->ki",
    "abc,cd->dba",
    "i,i->",
    "ij,k->ikj",
    "ixj,jky->ki",  # x summed inside a, y inside b
    "bhqd,bhkd->bhqk",
]


def _role_of(c: str, a: str, b: str, out: str) -> str:
    """The definition, letter by letter (independent of the grouped derivation)."""
    where = (c in a, c in b, c in out)
    return {
        (True, True, True): "batch",
        (True, True, False): "contracted",
        (True, False, True): "free_a",
        (False, True, True): "free_b",
        (True, False, False): "summed_a",
        (False, True, False): "summed_b",
    }[where]


@pytest.mark.parametrize("spec", SPECS)
def test_every_letter_has_its_one_role_in_the_stated_order(spec: str) -> None:
    r = EinsumRoles.of(spec)
    lhs, out = spec.split("->")
    a, b = lhs.split(",")
    assert (r.a, r.b, r.out) == (a, b, out)
    groups = {
        "batch": (r.batch, out),
        "contracted": (r.contracted, a),
        "free_a": (r.free_a, out),
        "free_b": (r.free_b, out),
        "summed_a": (r.summed_a, a),
        "summed_b": (r.summed_b, b),
    }
    for name, (letters, order) in groups.items():
        want = "".join(c for c in order if _role_of(c, a, b, out) == name)
        assert letters == want, (name, letters, want)
    assert r.plain_product == (not r.summed_a and not r.summed_b)
    s = r.swapped()
    assert (s.a, s.b, s.free_a, s.free_b, s.summed_a) == (b, a, r.free_b, r.free_a, r.summed_b)


@pytest.mark.parametrize("spec", SPECS)
def test_the_plan_built_from_the_roles_matches_numpy(spec: str) -> None:
    rng = np.random.default_rng(0)
    extent = {c: 2 + i for i, c in enumerate(sorted(set(spec) - set(",->")))}
    lhs = spec.split("->")[0]
    a_term, b_term = lhs.split(",")
    a = rng.normal(size=[extent[c] for c in a_term])
    b = rng.normal(size=[extent[c] for c in b_term])
    got = plan_einsum(spec, a.shape, b.shape)(a, b)
    np.testing.assert_allclose(got, np.einsum(spec, a, b), rtol=1e-12, atol=1e-12)
    assert einsum_macs(spec, a.shape, b.shape) == int(np.prod(list(extent.values())))
