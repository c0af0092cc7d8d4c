"""A channel that holds one value on every event (a detector off, a channel not recorded) is said
and flags the patient for review; a patient whose every model channel is constant is refused."""

import numpy as np
import pandas as pd
import pytest

from gating_core.batch.files import gate_file
from gating_core.commands.gate import patients_to_review
from gating_core.fcs import read_fcs, write_fcs
from gating_core.model import GatingModel
from gating_core.fcs import Channel, Sample
from gating_core.model.preprocessing import CONSTANT_HEAD_EVENTS, constant_channels
from gating_core.model.result import review_order, review_reasons
from helpers import SAMPLE_DATA, quick_model_file, run_cli, sample_cohort

NEW_PATIENT = SAMPLE_DATA / "new" / "new_patient_01.fcs"


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return quick_model_file(tmp_path_factory.mktemp("constant"))


def _written(folder, name, events, sample):
    path = folder / f"{name}.fcs"
    write_fcs(path, events, sample.pnn, sample.pns)  # no spillover: the values are those gated
    return path


def test_a_dead_detector_is_named_with_its_value_and_flags_the_patient(model_path, tmp_path):
    model = GatingModel.load(model_path)
    sample = read_fcs(NEW_PATIENT, compensate=False)
    events = sample.events.copy()
    events[:, sample.pnn.index("FL2-A")] = 0.0
    events[:, sample.pnn.index("FL5-A")] = 17.5
    dead = read_fcs(_written(tmp_path, "dead", events, sample))
    result = model.gate(dead)
    assert result.novelty.constant_channels == {"FL2-A": 0.0, "FL5-A": 17.5}
    assert result.novelty.needs_review
    assert result.novelty.message.startswith("Channels FL2-A (0), FL5-A (17.5) hold one value on every event of dead")
    assert review_reasons(result.novelty)[-1] == "FL2-A, FL5-A hold one value"
    assert result.novelty.to_dict()["constant_channels"] == {"FL2-A": 0.0, "FL5-A": 17.5}

    # streamed, in small chunks: the same finding as the whole file
    (tmp_path / "out").mkdir()
    [record] = gate_file(model, dead.path, tmp_path / "out", chunk_size=1000)
    assert record["novelty"]["constant_channels"] == {"FL2-A": 0.0, "FL5-A": 17.5}
    assert record["novelty"]["message"] == result.novelty.message
    assert patients_to_review([record])[0].endswith("FL2-A, FL5-A hold one value)")


def test_a_channel_constant_but_for_one_late_event_is_not_flagged(model_path, tmp_path):
    model = GatingModel.load(model_path)
    sample = read_fcs(NEW_PATIENT, compensate=False)
    events = sample.events.copy()
    events[:, sample.pnn.index("FL2-A")] = 0.0
    # beyond the first events, where the channel holds one value: only the check of every event sees it
    events[CONSTANT_HEAD_EVENTS + 100, sample.pnn.index("FL2-A")] = 1.0
    almost = read_fcs(_written(tmp_path, "almost", events, sample))
    assert model.gate(almost).novelty.constant_channels == {}
    (tmp_path / "out").mkdir()
    [record] = gate_file(model, almost.path, tmp_path / "out", chunk_size=1000)
    assert record["novelty"]["constant_channels"] == {}
    plain = model.gate(read_fcs(NEW_PATIENT))
    assert plain.novelty.constant_channels == {} and "one value" not in plain.novelty.message


def test_a_dead_detector_of_a_compensated_file_is_found_before_compensation(model_path, tmp_path):
    """Compensation mixes the other detectors into a dead one's values: it is found, with the
    value it recorded, in the values the file holds."""
    model = GatingModel.load(model_path)
    sample = read_fcs(NEW_PATIENT, compensate=False)
    assert sample.has_spillover and "FL2-A" in sample.spillover_channels
    events = sample.events.copy()
    events[:, sample.pnn.index("FL2-A")] = 1234.567
    path = tmp_path / "dead_compensated.fcs"
    write_fcs(path, events, sample.pnn, sample.pns,
              keywords={k: v for k, v in sample.keywords.items() if k.upper().startswith(("$SPILL", "SPILL"))})
    compensated = read_fcs(path, compensate=True)
    assert np.ptp(compensated.events[:, sample.pnn.index("FL2-A")]) > 1  # not constant once compensated
    expected = {"FL2-A": pytest.approx(float(np.float32(1234.567)), rel=1e-5)}
    assert model.gate(compensated).novelty.constant_channels == expected
    assert model.gate(read_fcs(path, compensate=False)).novelty.constant_channels == expected
    (tmp_path / "out").mkdir()
    [record] = gate_file(model, path, tmp_path / "out", chunk_size=1000)
    assert record["novelty"]["constant_channels"] == expected
    # the same file, alive: nothing said
    assert model.gate(read_fcs(NEW_PATIENT)).novelty.constant_channels == {}


def test_a_dica_model_checks_the_channels_not_its_projection(tmp_path):
    from gating_core.model.research import ResearchGatingModel

    samples, labels = sample_cohort(range(1, 4))
    model = ResearchGatingModel(dica="unsupervised", dica_components=5, select=False, n_features=64,
                                n_embedding_features=16, cells_per_patient=300, embedding_cells=1000)
    model.fit(samples, labels)
    sample = read_fcs(NEW_PATIENT, compensate=False)
    events = sample.events.copy()
    events[:, sample.pnn.index("FL7-A")] = 3.0
    assert model.gate(read_fcs(_written(tmp_path, "dead", events, sample))).novelty.constant_channels == {"FL7-A": 3.0}
    with pytest.raises(ValueError, match="nothing was measured to gate"):
        model.gate(read_fcs(_written(tmp_path, "zeros", np.zeros_like(sample.events), sample)))


def test_a_patient_of_one_value_everywhere_is_refused_in_every_path(model_path, tmp_path):
    model = GatingModel.load(model_path)
    sample = read_fcs(NEW_PATIENT, compensate=False)
    path = _written(tmp_path, "zeros", np.zeros_like(sample.events), sample)
    with pytest.raises(ValueError, match=r"^zeros: all 12000 events hold the same values on every channel the "
                                         r"model uses \(FSC-A 0, SSC-A 0, .*FL7-A 0\): nothing was measured"):
        model.gate(read_fcs(path))
    for format in ("csv", "fcs"):
        gate = run_cli("gate", "--model", model_path, "--out-dir", tmp_path / format, "--format", format, path)
        assert gate.returncode == 1 and "Traceback" not in gate.stderr
        assert gate.stderr.startswith(f"error: {path}: zeros: all 12000 events hold the same values")
    # a single event is no evidence of a dead instrument: it is gated
    one = read_fcs(_written(tmp_path, "one", sample.events[:1], sample))
    assert len(model.gate(one).populations) == 1


def test_only_the_channels_of_one_value_in_the_first_events_are_checked_on_every_event():
    sample = Sample("p", np.zeros((0, 4)), [Channel(c) for c in "abcd"])
    events = np.array([[1.0, 2.0, 3.0, 9.0], [1.0, 5.0, 3.0, 9.0], [1.0, 2.0, 4.0, 9.0]])
    # model channels are columns 0, 1, 2, 3; c holds one value in the first two events only
    assert constant_channels(sample, [events[:2], events[2:]], [0, 1, 2, 3], events[:2]) == {"a": 1.0, "d": 9.0}
    assert constant_channels(sample, [events], [1, 3], events[:2]) == {"d": 9.0}
    assert constant_channels(sample, [events], [0, 3], events[:1]) == {}  # one event says nothing

    def never():
        raise AssertionError("no channel of one value in the first events: no pass over the file")
        yield

    assert constant_channels(sample, never(), [1], events[:2]) == {}


def test_the_review_order_and_the_app_put_a_dead_channel_among_the_flagged():
    from ui.app_state import review_notice, review_worklist

    plain = {"score": 1.0, "threshold": 1.5, "is_novel": False, "disagreement": 0.3, "disagreement_threshold": 0.5,
             "message": "p resembles them.", "constant_channels": {}}
    dead = dict(plain, disagreement=0.01, constant_channels={"FL2-A": 0.0})
    assert review_order({"plain": plain, "dead": dead}) == ["dead", "plain"]
    kind, text = review_notice("dead", dead)
    assert kind == "warning" and text.startswith("**FL2-A holds one value on every event of dead**")
    worklist = review_worklist({"plain": plain, "dead": dead})
    assert isinstance(worklist, pd.DataFrame)
    assert worklist.set_index("patient").loc["dead", "review"] == "FL2-A: one value on every event"
    assert worklist.set_index("patient").loc["plain", "review"] == ""
    assert review_notice("plain", plain)[0] == "success"


def test_a_stored_result_keeps_its_constant_channels(model_path, tmp_path):
    """The app stores a result's novelty (the session, the patient library): the flag survives."""
    from ui.app_state import review_notice, review_worklist
    from ui.patient_record import _novelty_details

    model = GatingModel.load(model_path)
    sample = read_fcs(NEW_PATIENT, compensate=False)
    events = sample.events.copy()
    events[:, sample.pnn.index("FSC-A")] = 500.0
    result = model.gate(read_fcs(_written(tmp_path, "dead", events, sample)))
    stored = _novelty_details(result)["novelty"]
    assert stored["constant_channels"] == {"FSC-A": 500.0}
    assert review_notice("dead", stored)[0] == "warning"
    assert review_worklist({"dead": stored}).loc[0, "review"].endswith("FSC-A: one value on every event")
    plain = _novelty_details(model.gate(read_fcs(NEW_PATIENT)))["novelty"]
    assert "constant_channels" not in plain  # stored as before for a patient without one
