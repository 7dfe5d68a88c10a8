"""A VAE with the reparameterisation trick on explicit keys: sg.random.normal(key, shape)."""

import shapegrad as sg
from shapegrad import Float, Tensor


class VAE(
    sg.ParamList[
        Float[Tensor, "h x"], Float[Tensor, "z2 h"], Float[Tensor, "h z"], Float[Tensor, "x h"]
    ]
):
    names = ("enc", "stats", "dec1", "dec2")


@sg.typechecked
def elbo(p: VAE, x: Float[Tensor, "b x"], key: Tensor) -> Float[Tensor, ""]:
    h = sg.relu(x @ p.enc.T)
    stats = h @ p.stats.T
    Z = stats.shape[1] // 2
    mu, logvar = stats[:, :Z], stats[:, Z:]
    eps = sg.random.normal(key, (x.shape[0], Z))
    z = mu + sg.exp(0.5 * logvar) * eps
    recon = sg.sigmoid(sg.relu(z @ p.dec1.T) @ p.dec2.T)
    rec = ((recon - x) ** 2).sum(axis=1).mean()
    kl = (-0.5 * (1.0 + logvar - mu * mu - sg.exp(logvar)).sum(axis=1)).mean()
    return rec + kl


def run() -> float:
    p = VAE.init(sg.nn.init.normal(0.2), seed=0, x=10, h=6, z2=4, z=2)
    value, grads = sg.value_and_grad(elbo)(p, sg.rand((3, 10)), sg.random.key(7))
    return float(value.item()) + float(grads.dec2.sum().item())
