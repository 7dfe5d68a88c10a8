"""The op table and a training run through real Core ML prediction (CPU + Neural Engine).

Runs only on macOS 13+ with coremltools; elsewhere every test is skipped with
the reason (the Linux suites check the same programs with the MIL evaluator).
"""

from __future__ import annotations

import numpy as np
import pytest

from ane_support import require_coremltools
from shapegrad.backends.ane import can_execute

require_coremltools()

_OK, _REASON = can_execute()
pytestmark = pytest.mark.skipif(not _OK, reason=f"not macOS 13+: {_REASON}")

import shapegrad as sg  # noqa: E402
from harness import Case, _cast_floats  # noqa: E402
from op_table import CASES  # noqa: E402
from shapegrad.train.ane import AneTrainer  # noqa: E402
from shapegrad.train.optim import Adam  # noqa: E402
from test_ane_lowering import FP16_TOL, _assert_close, _has_zero_size, _reference  # noqa: E402
from test_ane_training import eager_training, mlp_loss, mlp_params, moons  # noqa: E402


@pytest.mark.parametrize("case", [c for c in CASES if not _has_zero_size(c)], ids=lambda c: c.name)
def test_op_table_through_core_ml(case: Case) -> None:
    arrays = _cast_floats(case.arrays(), np.float32)
    fast = sg.compile(case.fn, backend="ane")
    got = fast(*[sg.tensor(a) for a in arrays])
    _assert_close(np.asarray(got.numpy()), _reference(case, arrays), FP16_TOL, case.name)


@pytest.mark.parametrize("device_optimizer", [False, True], ids=["host_opt", "device_opt"])
def test_moons_training_on_the_engine(device_optimizer: bool) -> None:
    batch = moons(64)
    params = mlp_params([2, 16, 2])
    want, _ = eager_training(params, batch, Adam(lr=0.05), 25)
    trainer = AneTrainer(mlp_loss, params, batch, Adam(lr=0.05), device_optimizer=device_optimizer)
    losses = [trainer.step(*batch) for _ in range(25)]
    np.testing.assert_allclose(losses, want, rtol=3e-2, atol=1e-2)
