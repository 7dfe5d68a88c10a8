"""A variational autoencoder: reparameterised sampling, Bernoulli decoder, KL term."""

import shapegrad as sg
from shapegrad import Float, ParamList, Tensor


class VAE(
    ParamList[
        Float[Tensor, "h 16"], Float[Tensor, "z h"], Float[Tensor, "z h"], Float[Tensor, "16 z"]
    ]
):
    names = ("enc", "mu", "logvar", "dec")


@sg.typechecked
def elbo_loss(p: VAE, x: Float[Tensor, "b 16"], eps: Float[Tensor, "b z"]) -> Float[Tensor, ""]:
    enc, w_mu, w_logvar, dec = p
    h = sg.relu(x @ enc.T)
    mu, logvar = h @ w_mu.T, h @ w_logvar.T
    z = mu + sg.exp(0.5 * logvar) * eps
    recon = sg.sigmoid(z @ dec.T)
    bce = -(x * sg.log(recon + 1e-6) + (1.0 - x) * sg.log(1.0 - recon + 1e-6)).sum(axis=1)
    kl = -0.5 * (1.0 + logvar - mu**2 - sg.exp(logvar)).sum(axis=1)
    return (bce + kl).mean()


def run() -> float:
    p = VAE.init(sg.nn.init.normal(0.1), seed=0, h=8, z=2)
    return float(elbo_loss(p, sg.rand((3, 16)), sg.randn((3, 2), seed=5)).item())
