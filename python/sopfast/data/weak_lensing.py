"""Simulated weak-lensing convergence maps for the cosmology demo (``--data weak-lensing``).

This is a fast, offline *simulation*, not CosmoGrid: the paper's data (CosmoGridV1, Kacprzak et al.
2023) are N-body light cones, which cannot ship with a library.  Each map is a lognormal convergence
field κ whose two-point statistics and skewness follow from the cosmological parameters (Ω_m, σ_8):

1. **Matter power.** Linear ``P(k, z) = A kⁿˢ T²(k) D²(z)`` with the BBKS transfer function
   (Bardeen et al. 1986) of shape ``Γ = Ω_m h``, the growth factor ``D`` of Carroll, Press & Turner
   (1992) in flat ΛCDM, and ``A`` fixed by σ_8 (top hat of 8 Mpc/h).  No non-linear correction.
2. **Convergence power.** Limber's projection onto one source plane at ``z_s``:
   ``C_ℓ = (9/4) Ω_m² (H₀/c)⁴ ∫₀^χs dχ (1+z)² ((χs − χ)/χs)² P(ℓ/χ, z)`` — it grows as σ_8²
   and with Ω_m, more at small scales than at large ones (the shape changes with Γ).
3. **Lognormal field.** ``κ = λ (exp(G − σ_G²/2) − 1)`` with ``G`` Gaussian, whose correlation
   ``ξ_G = ln(1 + ξ_κ/λ²)`` makes κ's correlation ``ξ_κ`` that of ``C_ℓ`` (Hilbert, Hartlap &
   Schneider 2011; Xavier, Abdalla & Joachimi 2016).  The shift ``λ`` is the magnitude of the
   empty-beam convergence ``κ_empty = −(3/2) Ω_m (H₀/c)² ∫ dχ (1+z) χ (χs − χ)/χs`` (the least κ a
   line of sight can have), which grows with Ω_m: at a fixed variance a map of low Ω_m is more
   skewed — a longer bright tail, and a floor at −λ nearer the mean (shallower voids relative to its
   spread).  So beside the spectrum's shape, the skewness depends on Ω_m at a fixed amplitude.
4. **Shape noise (optional).** White Gaussian noise of ``σ_e / sqrt(2 n_gal A_pix)`` per pixel.

Maps are drawn on a periodic box at least twice the map's width and cropped (no wrap-around at the edges).
Parameters are drawn uniformly from :data:`PRIOR`, a box like CosmoGridV1's (whose own sampling of
its grid is not reproduced).  Maps are seeded in
blocks of :data:`BLOCK`: map ``i`` of a seed is the same whatever the number drawn.

Pixels are ``κ / KAPPA_UNIT`` (no offset: the sign of a pixel, which defines a void, is kept);
targets are the parameters scaled to [0, 1] over the prior box (``targets``); ``params`` keeps them raw.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..checks import check_int, check_number

PARAMETERS = ("Omega_m", "sigma_8")
#: The prior box: uniform in each parameter.
PRIOR = {"Omega_m": (0.1, 0.5), "sigma_8": (0.4, 1.4)}
#: Maps per seeded block: map ``i`` comes from block ``i // BLOCK`` whatever the count asked.
BLOCK = 256
#: Pixel values are κ in these units (κ's standard deviation is of this order on the demo's maps).
KAPPA_UNIT = 0.01
C_OVER_H0 = 2997.92458  # Mpc/h
#: The lensing shift is this multiple of the empty-beam convergence |κ_empty| (1: the empty beam).
SHIFT_FACTOR = 1.0


@dataclass(frozen=True)
class LensingMaps:
    """Simulated maps: pixels ``x [N, 1, H, W]`` (κ / :data:`KAPPA_UNIT`), ``targets [N, 2]`` (the
    parameters scaled to [0, 1] over :data:`PRIOR`), ``params [N, 2]`` (Ω_m, σ_8 raw)."""

    x: torch.Tensor
    targets: torch.Tensor
    params: torch.Tensor
    name: str = "weak-lensing"

    def __len__(self) -> int:
        return int(self.x.shape[0])

    def select(self, rows: slice | torch.Tensor) -> LensingMaps:
        return LensingMaps(self.x[rows], self.targets[rows], self.params[rows], self.name)

    def dataset(self) -> torch.utils.data.TensorDataset:
        """``(x, y)`` items with ``y`` the scaled targets ``[2]``."""
        return torch.utils.data.TensorDataset(self.x, self.targets)


def scale_params(params: torch.Tensor) -> torch.Tensor:
    """``[N, 2]`` (Ω_m, σ_8) → the same scaled to [0, 1] over :data:`PRIOR`."""
    low = torch.tensor([PRIOR[p][0] for p in PARAMETERS], dtype=params.dtype)
    high = torch.tensor([PRIOR[p][1] for p in PARAMETERS], dtype=params.dtype)
    return (params - low) / (high - low)


def unscale_targets(targets: torch.Tensor) -> torch.Tensor:
    """The inverse of :func:`scale_params`."""
    low = torch.tensor([PRIOR[p][0] for p in PARAMETERS], dtype=targets.dtype)
    high = torch.tensor([PRIOR[p][1] for p in PARAMETERS], dtype=targets.dtype)
    return low + targets * (high - low)


@dataclass(frozen=True)
class Simulator:
    """The lognormal simulator (module docstring): ``pixels`` per side, ``pixel_arcmin`` per pixel, one
    source plane at ``source_redshift``, flat ΛCDM with ``hubble`` = h and spectral index ``n_s``;
    ``galaxies`` per arcmin² with intrinsic ellipticity ``sigma_e`` set the shape noise (``0``: none)."""

    pixels: int = 66
    pixel_arcmin: float = 10.0
    source_redshift: float = 1.0
    hubble: float = 0.7
    n_s: float = 0.96
    galaxies: float = 0.0
    sigma_e: float = 0.26

    def __post_init__(self) -> None:
        check_int("pixels", self.pixels, 4)
        check_number("pixel_arcmin", self.pixel_arcmin, 0.0, above=True)
        check_number("source_redshift", self.source_redshift, 0.0, above=True)
        check_number("hubble", self.hubble, 0.0, above=True)
        check_number("n_s", self.n_s)
        check_number("galaxies", self.galaxies, 0.0)
        check_number("sigma_e", self.sigma_e, 0.0)

    @property
    def pixel_radians(self) -> float:
        return float(np.deg2rad(self.pixel_arcmin / 60.0))

    @property
    def noise_sigma(self) -> float:
        """κ's shape-noise standard deviation per pixel (0 without galaxies)."""
        if self.galaxies == 0:
            return 0.0
        return self.sigma_e / float(np.sqrt(2.0 * self.galaxies * self.pixel_arcmin**2))

    # -- cosmology ----------------------------------------------------------------------------------
    def _distances(self, omega_m: np.ndarray, steps: int = 96) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``z [Z]``, comoving distance ``χ [N, Z]`` (Mpc/h) and ``χ_s [N]`` up to the source plane."""
        z = np.linspace(0.0, self.source_redshift, steps + 1)
        om = omega_m[:, None]
        inv_e = 1.0 / np.sqrt(om * (1 + z) ** 3 + 1 - om)
        dz = z[1] - z[0]
        chi = C_OVER_H0 * np.concatenate(
            [np.zeros((len(om), 1)), np.cumsum((inv_e[:, 1:] + inv_e[:, :-1]) / 2 * dz, 1)], 1
        )
        return z, chi, chi[:, -1]

    @staticmethod
    def growth(omega_m: np.ndarray, z: np.ndarray) -> np.ndarray:
        """Linear growth ``D(z) [N, Z]``, ``D(0) = 1`` (Carroll, Press & Turner 1992, flat ΛCDM)."""
        om = omega_m[:, None]
        e2 = om * (1 + z) ** 3 + 1 - om
        om_z, ol_z = om * (1 + z) ** 3 / e2, (1 - om) / e2

        def g(m: np.ndarray, lam: np.ndarray) -> np.ndarray:
            return 2.5 * m / (m ** (4 / 7) - lam + (1 + m / 2) * (1 + lam / 70))

        return g(om_z, ol_z) / (1 + z) / g(om, 1 - om)

    def _transfer(self, k: np.ndarray, omega_m: np.ndarray) -> np.ndarray:
        """BBKS ``T(k)``; ``k`` (h/Mpc) broadcast against ``Γ = Ω_m h``."""
        q = k / (omega_m * self.hubble)
        return (
            np.log1p(2.34 * q)
            / (2.34 * q)
            * (1 + 3.89 * q + (16.1 * q) ** 2 + (5.46 * q) ** 3 + (6.71 * q) ** 4) ** -0.25
        )

    def _amplitude(self, omega_m: np.ndarray, sigma_8: np.ndarray) -> np.ndarray:
        """``A [N]`` such that the linear power at z = 0 has ``σ_8``."""
        k = np.logspace(-4, 2, 600)
        x = k * 8.0
        window = 3 * (np.sin(x) - x * np.cos(x)) / x**3
        shape = k ** (3 + self.n_s) * self._transfer(k[None], omega_m[:, None]) ** 2 * window**2
        integral = np.trapezoid(shape, np.log(k), axis=1) / (2 * np.pi**2)
        return sigma_8**2 / integral

    def power_spectrum(self, omega_m: np.ndarray, sigma_8: np.ndarray, ell: np.ndarray) -> np.ndarray:
        """The convergence power ``C_ℓ [N, L]`` at multipoles ``ell [L]`` (Limber, one source plane)."""
        omega_m, sigma_8 = np.atleast_1d(omega_m).astype(float), np.atleast_1d(sigma_8).astype(float)
        z, chi, chi_s = self._distances(omega_m)
        z, chi = z[1:], chi[:, 1:]  # χ = 0 contributes nothing (k → ∞)
        d = self.growth(omega_m, z)
        k = ell[None, :, None] / chi[:, None, :]  # [N, L, Z]
        power = (
            self._amplitude(omega_m, sigma_8)[:, None, None]
            * k**self.n_s
            * self._transfer(k, omega_m[:, None, None]) ** 2
            * (d**2)[:, None, :]
        )
        kernel = (1 + z) ** 2 * ((chi_s[:, None] - chi) / chi_s[:, None]) ** 2  # [N, Z]
        integrand = kernel[:, None, :] * power
        prefactor = 9 / 4 * omega_m**2 / C_OVER_H0**4
        return prefactor[:, None] * np.trapezoid(integrand, chi[:, None, :], axis=2)

    def shift(self, omega_m: np.ndarray) -> np.ndarray:
        """The lognormal shift ``λ [N]``: :data:`SHIFT_FACTOR` × ``|κ_empty|`` (module docstring)."""
        omega_m = np.atleast_1d(omega_m).astype(float)
        z, chi, chi_s = self._distances(omega_m)
        integrand = (1 + z) * chi * (chi_s[:, None] - chi) / chi_s[:, None]
        return SHIFT_FACTOR * 1.5 * omega_m / C_OVER_H0**2 * np.trapezoid(integrand, chi, axis=1)

    # -- maps -----------------------------------------------------------------------------------------
    @property
    def box(self) -> int:
        """Side of the periodic box the maps are cut from: the least ``2^a 3^b ≥ 2 × pixels`` (fast FFTs)."""
        sizes = sorted(2**a * 3**b for a in range(16) for b in range(10))
        return next(s for s in sizes if s >= 2 * self.pixels)

    def _grid_ell(self) -> np.ndarray:
        """``|ℓ|`` of every mode of the periodic box, as ``rfft2`` lays them out."""
        fy = np.fft.fftfreq(self.box)[:, None]
        fx = np.fft.rfftfreq(self.box)[None, :]
        return 2 * np.pi * np.sqrt(fx**2 + fy**2) / self.pixel_radians

    def convergence(self, omega_m: np.ndarray, sigma_8: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """κ maps ``[N, pixels, pixels]`` (float64; the Gaussian field is filtered in float32) for the
        parameters ``[N]`` each, noise included."""
        omega_m, sigma_8 = np.atleast_1d(omega_m).astype(float), np.atleast_1d(sigma_8).astype(float)
        side, n = self.box, len(omega_m)
        ell_grid = self._grid_ell()
        table = np.logspace(np.log10(ell_grid[ell_grid > 0].min()) - 0.01, np.log10(ell_grid.max()) + 0.01, 64)
        log_cl = np.log(self.power_spectrum(omega_m, sigma_8, table))
        where = np.log(np.maximum(ell_grid, table[0]))
        cl = np.exp(np.stack([np.interp(where, np.log(table), row) for row in log_cl]))
        cl[:, 0, 0] = 0.0  # no mean mode: the box's mean κ is 0
        fft = torch.fft
        xi_kappa = fft.irfft2(torch.from_numpy(cl), s=(side, side)) / self.pixel_radians**2  # [N, side, side]
        lam = torch.from_numpy(self.shift(omega_m)).view(-1, 1, 1)
        xi_gauss = torch.log1p(xi_kappa / lam**2)
        amplitude = fft.rfft2(xi_gauss).real.clamp_min(0.0).sqrt().float()
        white = torch.from_numpy(rng.standard_normal((n, side, side), dtype=np.float32))
        gauss = fft.irfft2(fft.rfft2(white) * amplitude, s=(side, side))[:, : self.pixels, : self.pixels]
        kappa = (lam * torch.expm1(gauss.double() - xi_gauss[:, :1, :1] / 2)).numpy()
        if self.noise_sigma > 0:
            kappa = kappa + self.noise_sigma * rng.standard_normal(kappa.shape)
        return kappa

    def simulate(self, count: int, seed: int = 0, start: int = 0) -> LensingMaps:
        """Maps ``start … start + count − 1`` of ``seed``: parameters uniform over :data:`PRIOR`, seeded in
        blocks of :data:`BLOCK` (map ``i`` is the same whatever ``count``)."""
        check_int("count", count, 0)
        check_int("seed", seed, 0)
        check_int("start", start, 0)
        parts = []
        for block in range(start // BLOCK, (start + count + BLOCK - 1) // BLOCK):
            rng = np.random.default_rng([seed, block])
            params = np.stack([rng.uniform(*PRIOR[p], size=BLOCK) for p in PARAMETERS], axis=1)
            first, last = (
                max(start, block * BLOCK) - block * BLOCK,
                min(start + count, (block + 1) * BLOCK) - block * BLOCK,
            )
            kappa = self.convergence(params[:, 0], params[:, 1], rng)
            parts.append((kappa[first:last], params[first:last]))
        if not parts:
            return _empty(self.pixels)
        x = torch.from_numpy(np.concatenate([p[0] for p in parts]) / KAPPA_UNIT).float().unsqueeze(1)
        drawn = torch.from_numpy(np.concatenate([p[1] for p in parts])).float()
        return LensingMaps(x, scale_params(drawn), drawn)


def _empty(pixels: int) -> LensingMaps:
    return LensingMaps(torch.zeros(0, 1, pixels, pixels), torch.zeros(0, 2), torch.zeros(0, 2))
