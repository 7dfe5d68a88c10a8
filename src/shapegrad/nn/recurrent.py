"""Recurrent layers with PyTorch's gate math and parameter layout: LSTM and GRU.

Cells (``LSTMCell``, ``GRUCell``) take one step: ``x: [b, d]`` and the state ``[b, h]``.
Their parameters are PyTorch's: ``weight_ih [G*h, d]``, ``weight_hh [G*h, h]``,
``bias_ih``/``bias_hh [G*h]`` with the gates stacked in PyTorch's order (LSTM: input,
forget, cell, output; GRU: reset, update, new), so a ``torch.nn.LSTMCell``'s tensors copy
straight in.

Sequence layers (``LSTM``, ``GRU``) are batch-first (``x: [b, t, d]``, PyTorch's
``batch_first=True``) and run their cell over time with :func:`shapegrad.scan`: the body
is traced and compiled once whatever ``t`` is, and its gradient is a reverse loop. The
input projection of every step is one product before the loop; the loop does only the
recurrent product. They return ``(outputs [b, t, h], final state)``, the final state
being ``(h_n, c_n)`` for an LSTM and ``h_n`` for a GRU, each ``[b, h]`` (one layer, so
PyTorch's leading ``num_layers`` axis is dropped; stack layers by calling one on the
outputs of another).

``init`` draws ``weight_ih`` with std ``1/sqrt(d)`` and ``weight_hh`` with ``1/sqrt(h)``
(LeCun normal, as every shapegrad weight) and zero biases; PyTorch draws every tensor from
``U(-1/sqrt(h), 1/sqrt(h))``. Copy PyTorch's tensors in to start from the same point.

Example:
    >>> lstm = sg.nn.LSTM.init(seed=0, d=8, h=32)
    >>> ys, (h, c) = lstm(x)                 # x: [b, t, 8] -> ys: [b, t, 32]
"""

from __future__ import annotations

from jaxtyping import Float

from shapegrad import functional as F
from shapegrad.control import scan
from shapegrad.nn._module import Module
from shapegrad.ops import prims as p
from shapegrad.shapes import ShapeError, fmt
from shapegrad.tensor import Tensor

__all__ = ["GRU", "LSTM", "GRUCell", "LSTMCell"]

LSTMState = tuple[Tensor, Tensor]


def _check_step(op: str, x: Tensor, weight_ih: Tensor) -> None:
    if x.ndim != 2 or x.shape[1] != weight_ih.shape[1]:
        raise ShapeError(
            op, f"input must be [batch, {weight_ih.shape[1]}], got {fmt(x.shape)}"
        )


def _check_state(op: str, name: str, state: Tensor, batch: int, hidden: int) -> None:
    if state.shape != (batch, hidden):
        raise ShapeError(op, f"{name} must be [{batch}, {hidden}], got {fmt(state.shape)}")


def _zeros(batch: int, hidden: int, like: Tensor) -> Tensor:
    return p.full((batch, hidden), 0.0, like.dtype, like=like)


def _lstm_gates(gates: Tensor, c: Tensor, hidden: int) -> LSTMState:
    """``gates [b, 4h]`` (input, forget, cell, output) and ``c`` -> ``(h', c')``."""
    i = F.sigmoid(gates[:, :hidden])
    f = F.sigmoid(gates[:, hidden : 2 * hidden])
    g = F.tanh(gates[:, 2 * hidden : 3 * hidden])
    o = F.sigmoid(gates[:, 3 * hidden :])
    c_next = f * c + i * g
    return o * F.tanh(c_next), c_next


def _gru_gates(gi: Tensor, gh: Tensor, h: Tensor, hidden: int) -> Tensor:
    """Input and recurrent projections ``[b, 3h]`` (reset, update, new) and ``h`` -> ``h'``."""
    r = F.sigmoid(gi[:, :hidden] + gh[:, :hidden])
    z = F.sigmoid(gi[:, hidden : 2 * hidden] + gh[:, hidden : 2 * hidden])
    n = F.tanh(gi[:, 2 * hidden :] + r * gh[:, 2 * hidden :])
    return (1.0 - z) * n + z * h


class LSTMCell(Module):
    """``torch.nn.LSTMCell(d, h)``: ``h', c' = cell(x, (h, c))``.

    ``i, f, g, o = split(x W_ih^T + b_ih + h W_hh^T + b_hh)``;
    ``c' = sigmoid(f) c + sigmoid(i) tanh(g)``; ``h' = sigmoid(o) tanh(c')``.
    """

    weight_ih: Float[Tensor, "4*h d"]
    weight_hh: Float[Tensor, "4*h h"]
    bias_ih: Float[Tensor, " 4*h"]
    bias_hh: Float[Tensor, " 4*h"]

    @property
    def hidden(self) -> int:
        return int(self.weight_hh.shape[1])

    def __call__(self, x: Tensor, state: LSTMState | None = None) -> LSTMState:
        """One step: ``x [b, d]``, ``state = (h, c)`` each ``[b, h]`` (zeros when None)."""
        hidden = self.hidden
        _check_step("LSTMCell", x, self.weight_ih)
        h, c = state if state is not None else (_zeros(x.shape[0], hidden, x),) * 2
        _check_state("LSTMCell", "h", h, x.shape[0], hidden)
        _check_state("LSTMCell", "c", c, x.shape[0], hidden)
        gates = F.matmul(x, self.weight_ih.T) + self.bias_ih + F.matmul(h, self.weight_hh.T) + self.bias_hh
        return _lstm_gates(gates, c, hidden)


class GRUCell(Module):
    """``torch.nn.GRUCell(d, h)``: ``h' = cell(x, h)``.

    ``r = sigmoid(W_ir x + b_ir + W_hr h + b_hr)``, ``z`` likewise,
    ``n = tanh(W_in x + b_in + r (W_hn h + b_hn))``, ``h' = (1 - z) n + z h``.
    """

    weight_ih: Float[Tensor, "3*h d"]
    weight_hh: Float[Tensor, "3*h h"]
    bias_ih: Float[Tensor, " 3*h"]
    bias_hh: Float[Tensor, " 3*h"]

    @property
    def hidden(self) -> int:
        return int(self.weight_hh.shape[1])

    def __call__(self, x: Tensor, h: Tensor | None = None) -> Tensor:
        """One step: ``x [b, d]``, ``h [b, h]`` (zeros when None)."""
        hidden = self.hidden
        _check_step("GRUCell", x, self.weight_ih)
        h = h if h is not None else _zeros(x.shape[0], hidden, x)
        _check_state("GRUCell", "h", h, x.shape[0], hidden)
        gi = F.matmul(x, self.weight_ih.T) + self.bias_ih
        gh = F.matmul(h, self.weight_hh.T) + self.bias_hh
        return _gru_gates(gi, gh, h, hidden)


def _time_major_projection(op: str, x: Tensor, weight_ih: Tensor, bias: Tensor) -> Tensor:
    """``x [b, t, d]`` -> every step's input projection, time-major ``[t, b, G*h]``."""
    if x.ndim != 3 or x.shape[2] != weight_ih.shape[1]:
        raise ShapeError(
            op, f"input must be batch-first [batch, time, {weight_ih.shape[1]}], got {fmt(x.shape)}"
        )
    if x.shape[1] < 1:
        raise ShapeError(op, f"the sequence needs at least one step, got {fmt(x.shape)}")
    return F.transpose(F.matmul(x, weight_ih.T) + bias, (1, 0, 2))


def _batch_first(ys: Tensor) -> Tensor:
    return F.transpose(ys, (1, 0, 2))


class LSTM(Module):
    """``torch.nn.LSTM(d, h, batch_first=True)`` (one layer): ``ys, (h_n, c_n) = lstm(x)``.

    The cell's parameters are ``cell.weight_ih`` etc. (PyTorch's ``weight_ih_l0``).
    """

    cell: LSTMCell

    def __call__(self, x: Tensor, state: LSTMState | None = None) -> tuple[Tensor, LSTMState]:
        """``x [b, t, d]``, optional ``(h0, c0)`` each ``[b, h]`` -> ``(ys [b, t, h], (h_n, c_n))``."""
        cell, hidden = self.cell, self.cell.hidden
        xs = _time_major_projection("LSTM", x, cell.weight_ih, cell.bias_ih + cell.bias_hh)
        h, c = state if state is not None else (_zeros(x.shape[0], hidden, x),) * 2
        _check_state("LSTM", "h0", h, x.shape[0], hidden)
        _check_state("LSTM", "c0", c, x.shape[0], hidden)
        w_hh = cell.weight_hh

        def step(carry: LSTMState, x_proj: Tensor) -> tuple[LSTMState, Tensor]:
            h_t, c_t = _lstm_gates(x_proj + F.matmul(carry[0], w_hh.T), carry[1], hidden)
            return (h_t, c_t), h_t

        final, ys = scan(step, (h, c), xs)
        return _batch_first(ys), final


class GRU(Module):
    """``torch.nn.GRU(d, h, batch_first=True)`` (one layer): ``ys, h_n = gru(x)``."""

    cell: GRUCell

    def __call__(self, x: Tensor, h0: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """``x [b, t, d]``, optional ``h0 [b, h]`` -> ``(ys [b, t, h], h_n [b, h])``."""
        cell, hidden = self.cell, self.cell.hidden
        xs = _time_major_projection("GRU", x, cell.weight_ih, cell.bias_ih)
        h = h0 if h0 is not None else _zeros(x.shape[0], hidden, x)
        _check_state("GRU", "h0", h, x.shape[0], hidden)
        w_hh, b_hh = cell.weight_hh, cell.bias_hh

        def step(h_t: Tensor, x_proj: Tensor) -> tuple[Tensor, Tensor]:
            h_next = _gru_gates(x_proj, F.matmul(h_t, w_hh.T) + b_hh, h_t, hidden)
            return h_next, h_next

        final, ys = scan(step, h, xs)
        return _batch_first(ys), final
