"""`train` from a patient library and with the files digested on a Dask cluster."""

import numpy as np

from gating_core.model.research import ResearchGatingModel
from gating_core.io.inputs import load_labeled_input
from gating_core.model import GatingModel
from gating_core.model.digest import digest_patient
from helpers import run_cli


def _arrays(path):
    with np.load(path, allow_pickle=False) as data:
        return {k: data[k] for k in data.files if k != "meta"}


def test_train_on_a_library_equals_training_on_the_files(sample_data_dir, tmp_path):
    inputs = sorted(sample_data_dir.glob("patient_0[1-4].fcs"))
    library = tmp_path / "library"
    result = run_cli("library", "--path", library, "import", *inputs)
    assert result.returncode == 0, result.stderr
    from_library = run_cli("train", "--library", library, "--out", tmp_path / "lib.npz")
    from_files = run_cli("train", "--out", tmp_path / "files.npz", *inputs)
    assert from_library.returncode == 0, from_library.stderr
    assert from_files.returncode == 0, from_files.stderr
    assert "Training (marginal) on 4 patients, 48,000 events" in from_library.stdout
    a, b = _arrays(tmp_path / "lib.npz"), _arrays(tmp_path / "files.npz")
    for key in a:
        np.testing.assert_allclose(a[key], b[key], rtol=1e-5, atol=1e-6, err_msg=key)
    missing = run_cli("train", "--library", tmp_path / "nowhere", "--out", tmp_path / "x.npz")
    assert missing.returncode == 1 and "nowhere" in missing.stderr  # a missing input: exit 1


def test_digests_keep_what_training_needs_and_only_that(sample_data_dir):
    sample, labels = load_labeled_input(sample_data_dir / "patient_01.fcs")
    digest = digest_patient(sample, labels, cells_per_patient=1000, embedding_cells=3000, seed=1)
    assert digest.train_events.shape == (1000, 9) and digest.embedding_events.shape == (3000, 9)
    assert digest.n_events == 12000
    rows = {tuple(r): lab for r, lab in zip(sample.events, labels)}
    assert all(rows[tuple(r)] == lab for r, lab in zip(digest.train_events, digest.train_labels))
    model = ResearchGatingModel(method="pooling", select=False, cells_per_patient=1000, embedding_cells=3000)
    other, other_labels = load_labeled_input(sample_data_dir / "patient_02.fcs")
    fitted = ResearchGatingModel(method="pooling", select=False, cells_per_patient=1000, embedding_cells=3000).fit(
        [sample, other], [labels, other_labels])
    digests = [model.digest(s, y, i) for i, (s, y) in enumerate([(sample, labels), (other, other_labels)])]
    model.fit_digests(digests)
    np.testing.assert_array_equal(model.classifier_.coef_, fitted.classifier_.coef_)


def test_train_with_dask_workers_gives_the_same_model_as_serial(sample_data_dir, tmp_path):
    inputs = sorted(sample_data_dir.glob("patient_0[1-4].fcs"))
    broken = tmp_path / "broken.fcs"
    broken.write_bytes(inputs[0].read_bytes()[:3000])
    (tmp_path / "broken.labels.csv").write_text("population\n")
    serial = run_cli("train", "--no-selection", "--out", tmp_path / "serial.npz", *inputs)
    parallel = run_cli("train", "--no-selection", "--workers", "2", "--out", tmp_path / "dask.npz", *inputs)
    assert serial.returncode == 0 and parallel.returncode == 0, parallel.stderr
    a, b = _arrays(tmp_path / "serial.npz"), _arrays(tmp_path / "dask.npz")
    assert a.keys() == b.keys()
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)
    failing = run_cli("train", "--workers", "2", "--out", tmp_path / "bad.npz", broken, *inputs)
    assert failing.returncode == 1  # a damaged input file: exit 1
    assert "broken.fcs" in failing.stderr and "Traceback" not in failing.stderr
    assert not (tmp_path / "bad.npz").exists()
