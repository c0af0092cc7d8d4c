"""Default transforms: flow vs mass cytometry decided from the file, exact values, inverses."""

import numpy as np
import pytest

from gating_core.fcs.transforms import (ChannelTransform, default_transform, is_scatter, is_time_like,
                                        looks_like_mass_cytometry, transform_for_display)
from gating_core.synthetic import simulate_patient


def test_channel_kinds_are_recognised():
    assert all(is_scatter(n) for n in ("FSC-A", "SSC-H", "FSC", "SSC-W", "FS Lin", "BSC-A"))
    assert not any(is_scatter(n) for n in ("FL1-A", "CD45", "Ir191Di", "FSCAN"))
    assert all(is_time_like(n) for n in ("Time", "TIME", "Event_count", "EventNumber", "index"))
    assert not is_time_like("CD3")


def test_flow_sample_gets_linear_scatter_and_arcsinh_150():
    sample, _ = simulate_patient(1, n_events=3000)
    compensated = sample.compensate()
    transform = default_transform(compensated.pnn, compensated.events, compensated.keywords)
    assert transform.kinds == ["linear", "linear"] + ["arcsinh"] * 7
    assert transform.params[2] == {"cofactor": 150.0}
    out = transform.apply(compensated.events)
    np.testing.assert_allclose(out[:, 2], np.arcsinh(compensated.events[:, 2] / 150.0), rtol=1e-5)


def test_mass_cytometry_is_recognised_by_keyword_names_or_data(multicenter_dir):
    from gating_core.fcs import read_fcs

    sample = read_fcs(multicenter_dir / "multicenter_01.fcs")
    assert looks_like_mass_cytometry(sample.pnn, sample.keywords, sample.events)
    # Without the $CYT keyword the zero-inflated, non-negative data still say "mass".
    assert looks_like_mass_cytometry(sample.pnn, {}, sample.events)
    transform = default_transform(sample.pnn, sample.events, {})
    assert transform.kinds == ["arcsinh"] * 8 and transform.params[0] == {"cofactor": 5.0}


def test_randomised_zero_cytof_and_metal_names():
    rng = np.random.default_rng(0)
    counts = rng.poisson(3.0, size=(5000, 6)).astype(float) * rng.lognormal(2, 1, size=(5000, 6))
    counts[counts == 0] = -rng.uniform(0, 1, size=int((counts == 0).sum()))
    names = ["CD3", "CD4", "CD8", "CD19", "CD14", "CD45"]
    assert looks_like_mass_cytometry(names, {}, counts)
    assert looks_like_mass_cytometry(["Nd142Di", "Sm149Di", "(Yb174)Dd", "Ir191Di"], {}, None)
    assert looks_like_mass_cytometry(["x"], {"$CYT": "Helios"}, None)
    flow = rng.normal(0, 200, size=(5000, 6))
    assert not looks_like_mass_cytometry(names, {}, flow)


def test_inverse_transforms_give_back_raw_values():
    values = np.array([-500.0, 0.0, 10.0, 1000.0, 100000.0])
    for kind in ("linear", "arcsinh", "logicle"):
        t = transform_for_display(kind)
        forward = t.apply(values.reshape(-1, 1), out_dtype=np.float64)[:, 0]
        np.testing.assert_allclose(t.inverse(forward, 0), values, rtol=1e-6, atol=1e-6)
    restored = ChannelTransform.from_dict(transform_for_display("logicle").to_dict())
    assert restored.kinds == ["logicle"]
    with pytest.raises(ValueError, match="unknown transform"):
        ChannelTransform(["log"])
