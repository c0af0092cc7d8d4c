"""Channels already on a channel scale (10-bit log-amplified channel numbers) are found and
used as they are, not put through a second log-like transform."""

import numpy as np
import pytest

from gating_core import read_fcs
from gating_core.fcs.transforms import (CHANNEL_SCALE_TOP, channel_scale_channels, channel_scale_reason,
                                        default_transform)


def _channel_numbers(rng, n=5000):
    # Log-amplified data: a few populations spread over the 0-1023 channel range, whole numbers.
    centres = rng.choice([180.0, 420.0, 690.0], size=n)
    return np.clip(np.round(centres + rng.normal(0, 45, n)), 0, 1023)


def test_channel_numbers_are_found_and_used_linearly():
    rng = np.random.default_rng(0)
    data = np.column_stack([rng.uniform(0, 262144, 5000), _channel_numbers(rng), _channel_numbers(rng)])
    pnn = ["FSC-A", "FL1.LOG", "FL2.LOG"]
    found = channel_scale_channels(pnn, data, [262144.0] * 3)
    assert sorted(found) == ["FL1.LOG", "FL2.LOG"]  # scatter is linear whatever its scale
    assert "$PnR 262144 says nothing" in found["FL1.LOG"]
    transform = default_transform(pnn, data, {}, [262144.0] * 3)
    assert transform.kinds == ["linear", "linear", "linear"]
    assert transform.params[1] == {"scale": CHANNEL_SCALE_TOP}
    np.testing.assert_allclose(transform.apply(data)[:, 1], data[:, 1] / 1024.0, rtol=1e-6)


@pytest.mark.parametrize("values, declared", [
    ("linear", 262144.0),   # intensities of a modern instrument: fractions, and far above 1024
    ("levels", 262144.0),   # a flag or a count: too few levels
    ("negative", 262144.0), # compensated data go negative; channel numbers never do
    ("numbers", 176.0),     # a declared range below 1023 is no 10-bit scale
])
def test_other_channels_are_not_channel_scale(values, declared):
    rng = np.random.default_rng(1)
    column = {
        "linear": rng.lognormal(6, 1.5, 5000),
        "levels": rng.integers(0, 20, 5000).astype(float) * 40,
        "negative": _channel_numbers(rng) - 300,
        "numbers": np.clip(_channel_numbers(rng), 0, 176),
    }[values]
    assert channel_scale_reason(column, declared) is None
    assert default_transform(["CD4"], column[:, None], {}, [declared]).kinds == ["arcsinh"]


def test_mass_cytometry_keeps_its_arcsinh_even_with_small_whole_counts():
    rng = np.random.default_rng(2)
    counts = np.round(rng.gamma(0.6, 60, (5000, 3)))  # ion counts: whole, many zeros
    transform = default_transform(["CD3", "CD4", "CD8"], counts, {"$CYT": "Helios"})
    assert transform.kinds == ["arcsinh"] * 3 and transform.params[0] == {"cofactor": 5.0}


def test_the_shared_flowcap_files_are_found_on_their_channel_scale(dlbcl_dir):
    sample = read_fcs(dlbcl_dir / "dlbcl_01.fcs")
    ranges = [c.range for c in sample.channels]
    found = channel_scale_channels(sample.pnn, sample.events, ranges)
    assert sorted(found) == ["FL1.LOG", "FL2.LOG", "FL4.LOG"]
    assert default_transform(sample.pnn, sample.events, sample.keywords, ranges).kinds == ["linear"] * 3


def test_a_user_changes_some_channels_and_keeps_the_rest(sample_data_dir, tmp_path):
    from gating_core.fcs.transforms import describe_transform, parse_transform_spec
    from gating_core.io.inputs import load_labeled_input
    from gating_core.model import GatingModel

    assert parse_transform_spec("arcsinh:5") == ("arcsinh", {"cofactor": 5.0})
    assert parse_transform_spec("channel-scale") == ("linear", {"scale": CHANNEL_SCALE_TOP})
    for bad in ("arcsinh:-1", "arcsinh:x", "square", "channel-scale:3"):
        with pytest.raises(ValueError, match="transform"):
            parse_transform_spec(bad)
    data = [load_labeled_input(p) for p in sorted(sample_data_dir.glob("patient_0[1-3].fcs"))]
    settings = dict(select=False, n_features=64, cells_per_patient=300, adaptive_weight=0.0)
    auto = GatingModel(**settings).fit([s for s, _ in data], [y for _, y in data])
    changed = GatingModel(transform={"CD3": "arcsinh:40", "FL2-A": "linear:1000"}, **settings).fit(
        [s for s, _ in data], [y for _, y in data])
    from gating_core.model.preprocessing import found_transform

    # What the Train page shows before training is what training finds.
    assert found_transform([s for s, _ in data], auto.channels_)[0].to_dict() == auto.transform_.to_dict()
    by_channel = dict(zip(changed.channels_, zip(changed.transform_.kinds, changed.transform_.params)))
    cd3 = changed.channels_[changed.channel_markers_.index("CD3")]
    assert by_channel[cd3] == ("arcsinh", {"cofactor": 40.0})
    assert by_channel["FL2-A"] == ("linear", {"scale": 1000.0})
    untouched = [j for j, c in enumerate(changed.channels_) if c not in (cd3, "FL2-A")]
    assert [changed.transform_.kinds[j] for j in untouched] == [auto.transform_.kinds[j] for j in untouched]
    assert "FL2-A: linear (x / 1000)" in describe_transform(changed.transform_, changed.channels_)
    path = tmp_path / "m.npz"
    changed.save(path)
    assert GatingModel.load(path).transform_.to_dict() == changed.transform_.to_dict()
    with pytest.raises(ValueError, match="none of the model's channels"):
        GatingModel(transform={"CD99": "linear"}, **settings).fit([s for s, _ in data], [y for _, y in data])


def test_why_each_channel_gets_its_transform_and_the_text_that_sets_it_again():
    from gating_core.fcs.transforms import default_transform_reasons, parse_transform_spec, transform_spec

    rng = np.random.default_rng(0)
    data = np.column_stack([rng.uniform(0, 262144, 5000), _channel_numbers(rng),
                            rng.normal(0, 300, 5000) + rng.choice([0.0, 4000.0], 5000)])
    pnn = ["FSC-A", "FL1.LOG", "FL2-A"]
    transform = default_transform(pnn, data, {}, [262144.0] * 3)
    reasons = default_transform_reasons(pnn, data, {}, [262144.0] * 3)
    assert reasons["FSC-A"].startswith("scatter")
    assert reasons["FL1.LOG"].startswith("whole numbers from") and "channel scale" in reasons["FL1.LOG"]
    assert reasons["FL2-A"].startswith("flow fluorescence: arcsinh with cofactor 150")
    specs = [transform_spec(k, p) for k, p in zip(transform.kinds, transform.params)]
    assert specs == ["linear:262144", "channel-scale", "arcsinh:150"]
    assert [parse_transform_spec(s) for s in specs] == list(zip(transform.kinds, transform.params))
    mass = default_transform_reasons(["CD3(152Sm)Dd", "CD4(145Nd)Dd"], None, {"$CYT": "Helios"})
    assert all(r.startswith("mass cytometry") for r in mass.values())
    assert transform_spec("logicle", {"T": 1e5, "W": 0.5, "M": 4.5, "A": 0.0}) == "logicle:100000"


def test_the_train_page_table_shows_the_flowcap_channels_on_their_channel_scale(dlbcl_dir):
    from ui.model_transforms import found_table, transform_table

    samples = [read_fcs(dlbcl_dir / f"dlbcl_0{i}.fcs") for i in (1, 2)]
    table = transform_table(found_table(samples, ["FL1.LOG", "FL2.LOG", "FL4.LOG"]), {"FL4.LOG": "arcsinh:150"})
    assert table["found"].tolist() == ["channel-scale"] * 3
    assert table["used"].tolist() == ["channel-scale", "channel-scale", "arcsinh:150"]
    assert table["why"].iloc[0].startswith("whole numbers from") and table["why"].iloc[2] == "set by you"


def test_transforms_set_for_some_channels_are_kept_in_the_model_file(sample_data_dir, tmp_path):
    import json

    from gating_core.io.inputs import load_labeled_input
    from gating_core.model import GatingModel
    from gating_core.model.file_checks import ModelFileError

    data = [load_labeled_input(p) for p in sorted(sample_data_dir.glob("patient_0[1-2].fcs"))]
    model = GatingModel(transform={"FL1-A": "arcsinh:40"}, select=False, n_features=64, cells_per_patient=300,
                        adaptive_weight=0.0).fit([s for s, _ in data], [y for _, y in data])
    path = tmp_path / "m.npz"
    model.save(path)
    loaded = GatingModel.load(path)
    assert loaded.transform == {"FL1-A": "arcsinh:40"}  # get_params() as trained: a check can tell it apart
    assert loaded.transform_.to_dict() == model.transform_.to_dict()
    from gating_core.model.iw_model import IWNystroemGatingModel

    iw = IWNystroemGatingModel(transform={"FL1-A": "arcsinh:40"}, cells_per_patient=300, n_landmarks=50).fit(
        [s for s, _ in data], [y for _, y in data])
    iw.save(tmp_path / "iw.npz")
    assert IWNystroemGatingModel.load(tmp_path / "iw.npz").transform == {"FL1-A": "arcsinh:40"}
    assert iw.transform_.params[iw.channels_.index("FL1-A")] == {"cofactor": 40.0}
    # A file whose set transform is no transform is refused, naming the channel.
    with np.load(path) as archive:
        arrays = {k: archive[k] for k in archive.files}
    meta = json.loads(str(arrays["meta"]))
    meta["params"]["transform"] = {"FL1-A": "square"}
    arrays["meta"] = np.array(json.dumps(meta))
    bad = tmp_path / "bad.npz"
    np.savez(bad, **arrays)
    with pytest.raises(ModelFileError, match=r"params.transform\['FL1-A'\]"):
        GatingModel.load(bad)
