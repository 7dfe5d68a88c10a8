"""PyTorch versions of examples/llama.py, examples/unet.py and examples/lstm.py, written
as a PyTorch user would, for tests/test_example_parity.py (same architectures, same
optimizers; the test copies our initial weights in, trains both and compares the losses,
and compares the line counts of the model + training code)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

# --- LLaMA ------------------------------------------------------------------------------


def rotate(x: torch.Tensor) -> torch.Tensor:
    t, e = x.shape[-2:]
    inv = 10000.0 ** (-torch.arange(0, e, 2, dtype=torch.float64) / e)
    angles = torch.outer(torch.arange(t, dtype=torch.float64), inv).to(x.dtype)
    x1, x2 = x[..., : e // 2], x[..., e // 2 :]
    return torch.cat(
        [x1 * angles.cos() - x2 * angles.sin(), x2 * angles.cos() + x1 * angles.sin()], dim=-1
    )


class LlamaBlock(nn.Module):
    def __init__(self, d: int, f: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.attn_norm, self.mlp_norm = nn.RMSNorm(d), nn.RMSNorm(d)
        self.wqkv, self.wo = nn.Linear(d, 3 * d, bias=False), nn.Linear(d, d, bias=False)
        self.w_gate, self.w_up = nn.Linear(d, f, bias=False), nn.Linear(d, f, bias=False)
        self.w_down = nn.Linear(f, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.wqkv(self.attn_norm(x)).view(b, t, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        att = F.scaled_dot_product_attention(rotate(q), rotate(k), v, is_causal=True)
        x = x + self.wo(att.transpose(1, 2).reshape(b, t, d))
        h = self.mlp_norm(x)
        return x + self.w_down(F.silu(self.w_gate(h)) * self.w_up(h))


class Llama(nn.Module):
    def __init__(self, v: int, d: int, f: int, layers: int, heads: int = 4) -> None:
        super().__init__()
        self.embed = nn.Embedding(v, d)
        self.blocks = nn.ModuleList(LlamaBlock(d, f, heads) for _ in range(layers))
        self.norm = nn.RMSNorm(d)
        self.head = nn.Linear(d, v, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False)  # remat, as our scan's recompute policy
        return self.head(self.norm(x))


def llama_loss(model: Llama, ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    logits = model(ids)
    return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


def train_llama(model: Llama, batches: list) -> list[float]:
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    losses = []
    for ids, targets in batches:
        loss = llama_loss(model, torch.as_tensor(ids).long(), torch.as_tensor(targets).long())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


# --- U-Net ------------------------------------------------------------------------------


class UNetBlock(nn.Module):
    def __init__(self, c_in: int, c: int) -> None:
        super().__init__()
        self.conv1, self.norm1 = nn.Conv2d(c_in, c, 3, padding=1), nn.GroupNorm(4, c)
        self.conv2, self.norm2 = nn.Conv2d(c, c, 3, padding=1), nn.GroupNorm(4, c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.silu(self.norm1(self.conv1(x)))
        return F.silu(self.norm2(self.conv2(x)))


class UNet(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.enc, self.mid = UNetBlock(1, c), UNetBlock(c, 2 * c)
        self.up = nn.ConvTranspose2d(2 * c, c, 2, stride=2)
        self.dec = UNetBlock(2 * c, c)
        self.out = nn.Conv2d(c, 1, 1)

    def forward(self, noisy: torch.Tensor) -> torch.Tensor:
        skip = self.enc(noisy)
        h = self.up(self.mid(F.avg_pool2d(skip, 2)))
        return noisy - self.out(self.dec(torch.cat([skip, h], dim=1)))


def train_unet(model: UNet, batches: list) -> list[float]:
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for noisy, clean in batches:
        loss = F.mse_loss(model(torch.as_tensor(noisy)), torch.as_tensor(clean))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


# --- LSTM (examples/lstm.py's Recaller; also used by benchmarks/examples_time.py) -------


class Recaller(nn.Module):
    def __init__(self, v: int, d: int, h: int) -> None:
        super().__init__()
        self.embed, self.rnn, self.head = (
            nn.Embedding(v, d),
            nn.LSTM(d, h, batch_first=True),
            nn.Linear(h, v),
        )

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        ys, _ = self.rnn(self.embed(ids))
        return self.head(ys)


def recaller_loss(
    model: Recaller, ids: torch.Tensor, targets: torch.Tensor, delay: int = 3
) -> torch.Tensor:
    scores = model(ids)[:, delay:]
    return F.cross_entropy(scores.reshape(-1, scores.shape[-1]), targets.reshape(-1))


def train_recaller(model: Recaller, batches: list) -> list[float]:
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for ids, targets in batches:
        loss = recaller_loss(model, torch.as_tensor(ids).long(), torch.as_tensor(targets).long())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses
