"""State kept once per node and updated in shards (``backends/c/shmshard.py``): which
state buffers qualify, where the barriers go, and the C each update kernel gets, on the
programs of real data-parallel training steps. Lowering and rendering only (a stand-in
communicator that refuses to exchange); the values (ranks bit-equal, equal to a copy of
the state per rank, the fallbacks) are checked under ``mpiexec`` by
``tests/distributed_worker.py`` (``check_sharded_state``)."""

from __future__ import annotations

import re
import types
from typing import Any

import numpy as np
import pytest

import shapegrad as sg
from shapegrad.backends.c import collectives, shm, shmshard
from shapegrad.backends.c.manifest import RuntimeInfo
from shapegrad.backends.c.render import render_c
from shapegrad.compiler import loops as L
from shapegrad.compiler.pipeline import lower_program
from shapegrad.compiler.target import C_TARGET
from shapegrad.train import optim
from shapegrad.train.step import average_over_processes
from test_overlap import SHAPES, _body, _mlp_loss, _TwoOnOneNode, _TwoProcesses


def _program(update: Any, comm: Any = None, extra: bool = False) -> L.Program:
    """The loop program of a data-parallel step of the 3-layer MLP whose parameters and
    optimizer state are donated (the trainer's bound step): ``update(params, grads,
    state) -> (params, state)``; ``extra``: it also returns the sum of the new weights."""
    comm = comm if comm is not None else _TwoOnOneNode()
    plan = types.SimpleNamespace(comm=comm)

    def step(state: Any, x: sg.Tensor, y: sg.Tensor) -> Any:
        params, opt = state
        loss, grads = sg.value_and_grad(_mlp_loss)(params, x, y)
        loss, grads = average_over_processes(plan, loss, grads)  # type: ignore[arg-type]
        params, opt = update(params, grads, opt)
        out = (params, opt), loss
        return (*out, sg.sum(params[0])) if extra else out

    rng = np.random.default_rng(0)
    params = [rng.standard_normal(s).astype(np.float32) for s in SHAPES]
    opt = {"m": [np.zeros_like(p) for p in params], "t": np.zeros((), np.int32)}
    x = rng.standard_normal((32, 64)).astype(np.float32)
    y = rng.integers(0, 10, 32).astype(np.int32)
    graph = sg.compile(step, backend="numpy", donate_argnums=0).graph((params, opt), x, y)
    program, _ = lower_program(graph, C_TARGET, name="p")
    program.communicators = [comm]
    return program


def _sgd(params: Any, grads: Any, opt: Any) -> Any:
    return [w - 0.1 * g for w, g in zip(params, grads, strict=True)], opt


def _momentum_with_counter(params: Any, grads: Any, opt: Any) -> Any:
    """Momentum SGD whose step size reads a step counter (state read at element 0)."""
    t = opt["t"] + 1
    rate = 0.1 / t.astype("float32")
    m = [0.9 * m + g for m, g in zip(opt["m"], grads, strict=True)]
    return [w - rate * v for w, v in zip(params, m, strict=True)], {"m": m, "t": t}


def _state(program: L.Program) -> list[str]:
    return [n for n, b in program.buffers.items() if b.kind == "state"]


def test_parameters_updated_in_shards_between_two_barriers() -> None:
    """SGD: every parameter is kept once per node; each update kernel's loop runs this
    rank's chunk; ``read`` is posted after the last kernel reading a parameter before the
    updates and waited for before the first; ``updated`` is posted and waited for after
    the last. Two flag-only regions follow the reader sums'; the flag sits after the
    arena, which the executable's arena covers."""
    program = _program(_sgd)
    plan = shmshard.shard_plan(program)
    assert plan is not None
    written = set().union(*(L.writes(k.body) for k in program.kernels))
    params = {n for n in _state(program) if n in written}  # the momenta pass through
    assert len(params) == len(SHAPES)
    assert params == set(plan.buffers)
    names = [k.name for k in program.kernels]
    first, last = names.index(plan.first_update), names.index(plan.last_update)
    assert plan.release_after is not None and names.index(plan.release_after) < first <= last
    for n, k in enumerate(program.kernels):
        touched = L.reads(k.body) | L.writes(k.body)
        if k.name in plan.kernels:
            assert first <= n <= last and L.writes(k.body) <= set(plan.buffers)
        elif touched & set(plan.buffers):
            assert n <= names.index(plan.release_after)
    source = render_c(program)
    body = _body(source)
    nreq = collectives.requests(program)
    read, updated = shm.shard_regions(program, nreq)
    offsets, _, _ = shm.shared_layout(program, nreq)
    assert len(offsets) == updated + 1
    assert body.count(f"sg_shm_post(0, {read}, 0)") == 1
    assert body.count(f"sg_shm_wait(0, {read})") == 1
    assert body.count(f"sg_shm_post(0, {updated}, 0)") == 1
    assert body.count(f"sg_shm_wait(0, {updated})") == 1
    assert body.index(f"sg_shm_post(0, {read}, 0)") < body.index(f"sg_shm_wait(0, {read})")
    assert body.index(f"sg_shm_wait(0, {read})") < body.index(f"sg_shm_post(0, {updated}, 0)")
    ranges = re.findall(r"sg_shard_range\(0, sg_shard, (\d+), &sg_lo_(\w+), &sg_hi_\w+\);", body)
    assert ranges and all(f"for (int64_t {v} = sg_lo_{v}; {v} < sg_hi_{v}; ++{v})" in body
                          for _, v in ranges)  # fmt: skip
    assert f"*(const int32_t *)(arena + {program.arena_bytes})" in body
    info = RuntimeInfo.of(program, "key")
    assert info.shard_flag == program.arena_bytes
    assert info.arena_bytes == program.arena_bytes + shmshard.FLAG_BYTES
    slots = {program.buffers[n].slot for n in plan.buffers}
    assert set(info.shared_slots) == slots
    assert RuntimeInfo.from_json(info.to_json()).shared_slots == info.shared_slots


def test_state_read_off_its_own_element_stays_private() -> None:
    """A step counter the update reads at element 0 stays a copy per rank (another rank
    may be incrementing it); the momenta and parameters it scales are still shared."""
    program = _program(_momentum_with_counter)
    plan = shmshard.shard_plan(program)
    assert plan is not None
    sizes = {n: program.buffers[n].size for n in _state(program)}
    assert {n for n, size in sizes.items() if size > 1} <= set(plan.buffers)
    assert any(size == 1 and n not in plan.buffers for n, size in sizes.items()), plan


def test_state_read_after_the_updates_stays_private() -> None:
    """A kernel after the first update that reads a parameter (here the sum of the new
    first weight, returned) would see other ranks' chunks half-written: that parameter
    stays a copy per rank; the others are still shared."""
    program = _program(_sgd, extra=True)
    plain = _program(_sgd)
    plan, full = shmshard.shard_plan(program), shmshard.shard_plan(plain)
    assert plan is not None and full is not None
    assert len(plan.buffers) == len(full.buffers) - 1


def test_sharding_off_and_other_transports(monkeypatch: pytest.MonkeyPatch) -> None:
    """SHAPEGRAD_SHM_SHARD=0 renders the copy per rank; MPI's transport and a program
    without exchanges have nothing to shard; a bad value is refused with the choices."""
    program = _program(_sgd)
    monkeypatch.setenv("SHAPEGRAD_SHM_SHARD", "0")
    assert shmshard.shard_plan(program) is None
    assert "sg_shard" not in _body(render_c(program))
    monkeypatch.setenv("SHAPEGRAD_SHM_SHARD", "yes")
    with pytest.raises(ValueError, match=r"SHAPEGRAD_SHM_SHARD must be '1'.* or '0'.*'yes'"):
        shmshard.shard_plan(program)
    monkeypatch.delenv("SHAPEGRAD_SHM_SHARD")
    assert shmshard.shard_plan(_program(_sgd, comm=_TwoProcesses())) is None


def test_adam_shares_moments_and_keeps_its_counter() -> None:
    """The library's Adam: first and second moments and parameters are shared, the step
    counter (read by the bias correction at element 0) is not."""
    adam = optim.Adam(lr=1e-3)

    def update(params: Any, grads: Any, opt: Any) -> Any:
        return adam.update(params, grads, opt, 1e-3)

    comm = _TwoOnOneNode()
    plan_ns = types.SimpleNamespace(comm=comm)
    rng = np.random.default_rng(0)
    params = [rng.standard_normal(s).astype(np.float32) for s in SHAPES]

    def step(state: Any, x: sg.Tensor, y: sg.Tensor) -> Any:
        ps, st = state
        loss, grads = sg.value_and_grad(_mlp_loss)(ps, x, y)
        loss, grads = average_over_processes(plan_ns, loss, grads)  # type: ignore[arg-type]
        return update(ps, grads, st), loss

    state = adam.init([sg.tensor(p) for p in params])
    x = rng.standard_normal((32, 64)).astype(np.float32)
    y = rng.integers(0, 10, 32).astype(np.int32)
    graph = sg.compile(step, backend="numpy", donate_argnums=0).graph((params, state), x, y)
    program, _ = lower_program(graph, C_TARGET, name="adam")
    program.communicators = [comm]
    plan = shmshard.shard_plan(program)
    assert plan is not None
    sizes = {n: program.buffers[n].size for n in _state(program)}
    assert {n for n, size in sizes.items() if size > 1} <= set(plan.buffers)
    assert [n for n, size in sizes.items() if size == 1 and n not in plan.buffers], plan
