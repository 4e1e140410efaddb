"""The weak-lensing simulator (``--data weak-lensing``): seeded, and its parameters move the maps the way
``sopfast.data.weak_lensing`` documents."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sopfast.data.builtin import BUILTIN, LENSING_TEST, LENSING_TRAIN
from sopfast.data.weak_lensing import PRIOR, Simulator, scale_params, unscale_targets

ELL = np.array([50.0, 200.0, 1000.0])


def test_maps_are_seeded_and_drawn_in_blocks():
    sim = Simulator()
    a = sim.simulate(20, seed=3, start=250)  # across a block boundary (256)
    b = sim.simulate(20, seed=3, start=250)
    assert torch.equal(a.x, b.x) and torch.equal(a.params, b.params)
    assert torch.equal(sim.simulate(4, seed=3, start=260).x, a.x[10:14])  # map i is map i, whatever the count
    assert not torch.equal(sim.simulate(20, seed=4, start=250).x, a.x)
    assert a.x.shape == (20, 1, 66, 66) and a.targets.shape == (20, 2)
    for i, name in enumerate(("Omega_m", "sigma_8")):
        low, high = PRIOR[name]
        assert bool(((a.params[:, i] >= low) & (a.params[:, i] <= high)).all())
    assert torch.allclose(unscale_targets(scale_params(a.params)), a.params, atol=1e-6)
    assert bool(((a.targets >= 0) & (a.targets <= 1)).all())


def test_sigma_8_scales_the_power_and_omega_m_its_amplitude_shape_and_shift():
    sim = Simulator()
    fixed_om = sim.power_spectrum(np.full(3, 0.3), np.array([0.5, 1.0, 1.4]), ELL)
    assert np.allclose(fixed_om / fixed_om[0], (np.array([0.5, 1.0, 1.4]) / 0.5)[:, None] ** 2)  # C_ℓ ∝ σ_8²
    om = np.array([0.1, 0.2, 0.3, 0.4, 0.5])
    power = sim.power_spectrum(om, np.full(5, 0.8), ELL)
    assert (np.diff(power, axis=0) > 0).all()  # more matter, more lensing at every scale
    assert (np.diff(power[:, 2] / power[:, 0]) > 0).all()  # Γ = Ω_m h: more small-scale power relative
    assert (np.diff(sim.shift(om)) > 0).all()  # the empty-beam shift grows with Ω_m


def test_the_maps_follow_the_power_spectrum_and_the_lognormal_skewness():
    sim = Simulator()
    rng = np.random.default_rng(0)
    low, high = (
        sim.convergence(np.full(64, 0.3), np.full(64, 0.6), rng),
        sim.convergence(np.full(64, 0.3), np.full(64, 1.2), rng),
    )
    ratio = high.var(axis=(1, 2)).mean() / low.var(axis=(1, 2)).mean()
    assert ratio == pytest.approx(4.0, rel=0.15)  # the variance follows C_ℓ ∝ σ_8²

    def skewness(maps: np.ndarray) -> float:
        centred = maps - maps.mean(axis=(1, 2), keepdims=True)
        return float(((centred**3).mean(axis=(1, 2)) / maps.std(axis=(1, 2)) ** 3).mean())

    # at about the same variance (σ_8² Ω_m^1.5 alike), a smaller shift (low Ω_m) skews the map more
    lean, dense = (
        sim.convergence(np.full(64, 0.15), np.full(64, 1.2), rng),
        sim.convergence(np.full(64, 0.45), np.full(64, 0.55), rng),
    )
    assert lean.var(axis=(1, 2)).mean() / dense.var(axis=(1, 2)).mean() == pytest.approx(1.0, abs=0.1)
    assert skewness(lean) > skewness(dense) + 0.1
    assert (lean >= -sim.shift(np.array([0.15]))[0]).all()  # κ never below −λ (no shape noise)


def test_shape_noise_adds_white_noise_of_the_stated_level():
    quiet, noisy = Simulator(), Simulator(galaxies=10.0)
    assert quiet.noise_sigma == 0.0
    assert noisy.noise_sigma == pytest.approx(0.26 / np.sqrt(2 * 10.0 * 10.0**2))
    a = quiet.convergence(np.full(8, 0.3), np.full(8, 0.8), np.random.default_rng(1))
    b = noisy.convergence(np.full(8, 0.3), np.full(8, 0.8), np.random.default_rng(1))
    assert (b - a).std() == pytest.approx(noisy.noise_sigma, rel=0.05)


def test_the_builtin_reads_disjoint_roles():
    read = BUILTIN["weak-lensing"].read
    train, text = read("train", 6, None, None, 0.1)
    val, val_text = read("val", 6, None, None, 0.1)
    assert "validation part of the train split (1000 of 10000), the first 6" in val_text
    test, test_text = read("test", 6, None, None, None)
    assert len(train) == len(val) == len(test) == 6
    x, y = train[0]
    assert x.shape == (1, 66, 66) and y.shape == (2,) and y.dtype == torch.float32
    assert f"({LENSING_TRAIN - round(0.1 * LENSING_TRAIN)} of {LENSING_TRAIN})" in text and "seed 0" in text
    assert torch.equal(val[0][0], Simulator().simulate(1, 0, start=LENSING_TRAIN - round(0.1 * LENSING_TRAIN)).x[0])
    assert "test split" in test_text and "seed 1" in test_text and LENSING_TEST == 2000
    with pytest.raises(ValueError, match="object-masks"):
        from sopfast.data.object_masks import ObjectMasks

        read("train", 2, None, ObjectMasks(), 0.1)


@pytest.mark.parametrize(
    "kwargs, name", [({"pixels": 2}, "pixels"), ({"pixel_arcmin": 0}, "pixel_arcmin"), ({"galaxies": -1}, "galaxies")]
)
def test_bad_settings_name_themselves(kwargs, name):
    with pytest.raises(ValueError, match=name):
        Simulator(**kwargs)
