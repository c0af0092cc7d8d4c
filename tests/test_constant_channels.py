"""A channel that holds one value on every event (a detector off, a channel not recorded) is said
and flags the patient for review; a patient whose every model channel is constant is refused."""

import numpy as np
import pandas as pd
import pytest

from gating_core.batch.files import gate_file
from gating_core.commands.gate import patients_to_review
from gating_core.fcs import read_fcs, write_fcs
from gating_core.method.features import content_subsample
from gating_core.model import GatingModel
from gating_core.model.preprocessing import constant_candidates, constant_channels
from gating_core.model.result import review_order, review_reasons
from helpers import SAMPLE_DATA, quick_model_file, run_cli

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
    # one event outside the cells gating chooses for the embedding: only the check of every event sees it
    indices = model._channel_indices(sample)
    chosen = set(content_subsample(events[:, indices], model.embedding_cells).tolist())
    outside = max(set(range(len(events))) - chosen)
    events[outside, sample.pnn.index("FL2-A")] = 1.0
    assert constant_candidates(events[sorted(chosen)][:, indices])[indices.index(sample.pnn.index("FL2-A"))]
    almost = read_fcs(_written(tmp_path, "almost", events, sample))
    assert model.gate(almost).novelty.constant_channels == {}
    (tmp_path / "out").mkdir()
    [record] = gate_file(model, almost.path, tmp_path / "out", chunk_size=1000)
    assert record["novelty"]["constant_channels"] == {}
    plain = model.gate(read_fcs(NEW_PATIENT))
    assert plain.novelty.constant_channels == {} and "one value" not in plain.novelty.message


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


def test_only_the_candidates_from_the_chosen_cells_are_checked():
    chosen = np.array([[1.0, 2.0, 3.0], [1.0, 5.0, 3.0]])
    assert constant_candidates(chosen).tolist() == [True, False, True]
    assert constant_candidates(chosen[:1]).tolist() == [False, False, False]
    events = np.array([[1.0, 2.0, 3.0, 9.0], [1.0, 5.0, 4.0, 9.0]])
    # model channels are columns 0, 1, 3 of the file; candidates in that order
    assert constant_channels([events[:1], events[1:]], [0, 1, 3], [True, False, True], ["a", "b", "c", "d"]) == \
        {"a": 1.0, "d": 9.0}
    assert constant_channels([events], [0, 2], [False, True], ["a", "b", "c", "d"]) == {}


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
