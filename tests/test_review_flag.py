"""The review flag: a gated patient on whose cells the transfer model and the patient's own
populations disagree is flagged for review, on the command line, in the app and in reports."""

from __future__ import annotations

import re
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from gating_core import GatingModel, read_fcs
from gating_core.evaluation.protocols import review_split
from gating_core.fcs import stream_fcs_all
from gating_core.io.inputs import load_labeled_input
from gating_core.model.result import DISAGREEMENT_THRESHOLD, Novelty, review_flags
from gating_core.reports.report import _novelty_html
from helpers import SAMPLE_DATA, run_cli, sample_cohort
from ui.app_state import acceptance_acknowledgement, review_notice, review_worklist, worklist_display


def _novelty(disagreement, is_novel=False):
    return Novelty(2.0, 1.5 if is_novel else 3.0, is_novel, "patient_01", "p resembles them.", disagreement)


def test_flags_follow_the_threshold_and_survive_storage():
    assert DISAGREEMENT_THRESHOLD == 0.2
    above, at, unmeasured = _novelty(0.25), _novelty(0.2), _novelty(None)
    assert above.parts_disagree and above.needs_review
    assert not at.parts_disagree and not at.needs_review  # strictly above
    assert not unmeasured.parts_disagree and not unmeasured.needs_review
    assert _novelty(None, is_novel=True).needs_review
    stored = above.to_dict()
    assert stored["disagreement"] == 0.25 and stored["disagreement_threshold"] == 0.2 and stored["parts_disagree"]
    assert review_flags(stored) == (False, True)
    assert review_flags(SimpleNamespace(**stored)) == (False, True)
    assert review_flags(_novelty(0.1, is_novel=True)) == (True, False)
    # a result stored before the disagreement was measured
    assert review_flags({"score": 2.0, "threshold": 1.5, "is_novel": True, "message": "m"}) == (True, False)
    assert review_flags(None) == (False, False)


def test_the_app_warns_of_disagreement_and_asks_to_acknowledge_it():
    kind, text = review_notice("p7", _novelty(0.31))
    assert kind == "warning" and "disagree on p7" in text and "31.0% of its cells" in text and "above 20%" in text
    kind, text = review_notice("p7", _novelty(0.05).to_dict())
    assert kind == "success" and "5.0% of its cells" in text and "novelty score 2.00" in text
    kind, text = review_notice("p7", SimpleNamespace(**_novelty(None, is_novel=True).to_dict()))
    assert text == ("**p7 is unlike the training patients** (novelty score 2.00, threshold 1.50): review its "
                    "populations by hand.") and kind == "warning"
    # unlike the training patients and its parts disagree: both said, each once
    kind, text = review_notice("p7", _novelty(0.31, is_novel=True))
    assert kind == "warning" and text.count("unlike") == 1 and "31.0% of its cells" in text
    assert text.endswith("Compare the model's two parts (below) to start from the one that looks right.")
    assert review_notice("p7", None) is None
    box = acceptance_acknowledgement("p7", False, np.array(["a", "b"]), ["a", "b"], parts_disagree=True)
    assert box is not None and "disagree on many of p7's cells" in box
    assert acceptance_acknowledgement("p7", False, np.array(["a", "b"]), ["a", "b"]) is None


def test_worklist_puts_the_patients_to_review_first():
    table = review_worklist({
        "calm": _novelty(0.03), "split": _novelty(0.35), "new": _novelty(0.1, is_novel=True),
        "split-more": _novelty(0.6).to_dict(), "old result": {"score": 0.5, "threshold": 2.0, "is_novel": False},
        "not gated yet": None})
    assert list(table["patient"]) == ["new", "split-more", "split", "calm", "old result", "not gated yet"]
    assert list(table["review"]) == ["unlike the training patients", "the model's parts disagree",
                                     "the model's parts disagree", "", "", ""]
    shown = worklist_display(table)
    assert shown.loc["split", "parts disagree on"] == "35.0%" and shown.loc["old result", "parts disagree on"] == "—"
    assert shown.loc["old result", "novelty"] == "0.50" and shown.loc["not gated yet", "novelty"] == "—"
    assert list(review_worklist({})["patient"]) == []
    assert list(table["accepted"]) == [False] * 6 and (shown["accepted"] == "").all()
    # a patient reviewed and accepted is no longer to review: it comes last, with no reason
    table = review_worklist({"calm": _novelty(0.03), "split": _novelty(0.35), "split-more": _novelty(0.6)},
                            accepted=["split-more"])
    assert list(table["patient"]) == ["split", "calm", "split-more"]
    assert list(table["review"]) == ["the model's parts disagree", "", ""]
    assert worklist_display(table).loc["split-more", "accepted"] == "yes"


def test_gate_names_the_patients_to_review_first_in_order():
    from gating_core.commands.gate import patients_to_review

    records = [{"patient": name, "novelty": novelty.to_dict()} for name, novelty in (
        ("calm", _novelty(0.05)), ("split", _novelty(0.3)), ("new", _novelty(None, is_novel=True)),
        ("split-more", _novelty(0.5)), ("new and split", _novelty(0.25, is_novel=True)))]
    assert patients_to_review(records) == [
        "new and split (unlike the training patients, parts disagree on 25.0% of its cells)",
        "new (unlike the training patients)",
        "split-more (parts disagree on 50.0% of its cells)", "split (parts disagree on 30.0% of its cells)"]
    assert patients_to_review(records[:1]) == []


def test_report_states_the_disagreement():
    html = _novelty_html(_novelty(0.42).to_dict())
    assert "disagree on 42.0% of its cells" in html and "review the populations by hand" in html
    assert html.count("class='warn'") == 1  # the novelty line is fine, the parts line warns
    assert "disagree" not in _novelty_html({"score": 1.0, "threshold": 2.0, "is_novel": False})


def test_review_split_counts_and_means():
    table = pd.DataFrame({"protocol": ["p"] * 5, "method": ["marginal"] * 4 + ["lda"],
                          "accuracy": [0.9, 0.7, 0.6, 0.95, 0.1],
                          "disagreement": [0.1, 0.3, 0.5, np.nan, np.nan]})
    split = review_split(table).set_index("parts")
    assert split.loc["review", "patients"] == 2 and split.loc["agree", "patients"] == 1
    assert split.loc["review", "mean_accuracy"] == pytest.approx(0.65)
    assert split.loc["review", "worst_accuracy"] == pytest.approx(0.6)
    assert review_split(table.assign(disagreement=np.nan)) is None


@pytest.fixture(scope="module")
def sample_model():
    return GatingModel(select=False, n_features=128, n_embedding_features=32, cells_per_patient=1000,
                       embedding_cells=3000, random_state=3).fit(*sample_cohort(range(1, 5)))


def test_gating_measures_the_same_disagreement_in_memory_and_streamed(sample_model):
    assert 0 < sample_model.adaptive_weight_ < 1
    path = SAMPLE_DATA / "new" / "new_patient_02.fcs"
    result = sample_model.gate(read_fcs(path, compensate=True), chunk_size=2048)
    stream = stream_fcs_all(path, compensate=True)[0]
    streamed = sample_model.gate_chunks(stream.sample, stream.chunks, chunk_size=2048)
    assert 0 <= result.novelty.disagreement < DISAGREEMENT_THRESHOLD
    # the same 3,000 content-chosen cells: a cell at a tie may fall either way under other rounding
    assert abs(streamed.novelty.disagreement - result.novelty.disagreement) <= 2 / 3000
    assert f"different populations for {result.novelty.disagreement:.1%} of its cells (review above 20%)." \
        in result.novelty.message
    assert re.match(r"new_patient_02 resembles the training patients \(novelty \d+\.\d\d <= \d+\.\d\d; nearest: ",
                    result.novelty.message)


@pytest.mark.parametrize("weight", [0.0, 1.0])
def test_no_disagreement_without_both_parts(weight):
    model = GatingModel(select=False, n_features=64, n_embedding_features=16, cells_per_patient=500,
                        embedding_cells=1000, adaptive_weight=weight, random_state=3).fit(*sample_cohort(range(1, 4)))
    result = model.gate(read_fcs(SAMPLE_DATA / "new" / "new_patient_01.fcs", compensate=True))
    assert result.novelty.disagreement is None and not result.novelty.parts_disagree
    assert "own populations" not in result.novelty.message


def _biopsy(folder, number):
    return load_labeled_input(folder / f"dlbcl_{number:02d}.fcs")


@pytest.fixture(scope="module")
def second_batch_model(dlbcl_dir):
    """The default model trained on the second batch of the DLBCL biopsies (dlbcl_19-30)."""
    training = [_biopsy(dlbcl_dir, n) for n in range(19, 31)]
    return GatingModel(random_state=0).fit([s for s, _ in training], [y for _, y in training])


def test_real_biopsies_the_parts_disagree_on_are_the_poorly_gated_ones(dlbcl_dir, second_batch_model):
    """Gating four biopsies of the first batch: dlbcl_12 and dlbcl_17, gated worst, are flagged
    though neither is novel; dlbcl_02 and dlbcl_06 are not."""
    gated = {}
    for number in (2, 6, 12, 17):
        sample, truth = _biopsy(dlbcl_dir, number)
        result = second_batch_model.gate(sample)
        accuracy = float(np.mean(result.populations.astype(str) == np.asarray(truth).astype(str)))
        gated[number] = (accuracy, result.novelty)
    flagged = {n for n, (_, novelty) in gated.items() if novelty.parts_disagree}
    assert flagged == {12, 17}
    assert not any(novelty.is_novel for _, novelty in gated.values())
    assert max(gated[n][0] for n in flagged) + 0.05 < min(gated[n][0] for n in (2, 6))
    assert min(gated[n][1].disagreement for n in flagged) > 0.4
    assert max(gated[n][1].disagreement for n in (2, 6)) < 0.18
    assert "review its populations by hand" in gated[17][1].message


def test_gate_on_the_command_line_ends_with_the_biopsies_to_review(dlbcl_dir, second_batch_model, tmp_path):
    model = tmp_path / "model.npz"
    second_batch_model.save(model)
    files = [str(dlbcl_dir / f"dlbcl_{n:02d}.fcs") for n in (6, 12, 17)]
    done = run_cli("gate", "--model", str(model), "--out-dir", str(tmp_path / "out"), *files)
    assert done.returncode == 0, done.stderr
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith("Review first (2 of 3 gated): dlbcl_12 (parts disagree on ")
    assert "; dlbcl_17 (parts disagree on " in last and "dlbcl_06" not in last
    assert sum(line.startswith("  WARNING: ") for line in done.stdout.splitlines()) == 2


def test_the_auto_gate_page_puts_the_flagged_biopsy_first(library, dlbcl_dir, second_batch_model):
    """The app with that model and two new biopsies: the list of gated patients puts dlbcl_17 on
    top, and its page warns that the parts disagree though it resembles the training patients."""
    from apptest_helpers import goto, start, store_of

    at = start()
    store = store_of(at)
    store.add_model("second batch", second_batch_model, [f"dlbcl_{n}" for n in range(19, 31)])
    for number in (6, 17):
        store.add_patient(f"dlbcl_{number:02d}", _biopsy(dlbcl_dir, number)[0])
    at = goto(at, "pages/5_autogate.py")
    at.button(key="ag_run").click()
    at.run()
    assert not at.exception and not at.error
    worklist = at.table[0].value
    assert list(worklist.index) == ["dlbcl_17", "dlbcl_06"]
    assert list(worklist["review"]) == ["the model's parts disagree", ""]
    novelty = store.patients["dlbcl_17"].result.novelty
    assert worklist.loc["dlbcl_17", "parts disagree on"] == f"{novelty.disagreement:.1%}"
    # the warning leads with its reason, then says the biopsy is otherwise like the training ones
    assert novelty.message.startswith("The transfer model and dlbcl_17's own populations name different populations "
                                      f"for {novelty.disagreement:.1%} of its cells (review above 20%): review its "
                                      "populations by hand. dlbcl_17 resembles the training patients (novelty ")
    assert at.selectbox(key="ag_patient").format_func("dlbcl_17") == "dlbcl_17 · to review"
    assert at.selectbox(key="ag_patient").format_func("dlbcl_06") == "dlbcl_06"
    at.selectbox(key="ag_patient").set_value("dlbcl_17")
    at.run()
    assert any(w.value.startswith("**The model's parts disagree on dlbcl_17.**") for w in at.warning)
    assert not any("unlike the training patients" in w.value for w in at.warning)


# -- the model's parts, each alone: the reviewer's alternatives ----------------------------------

def test_each_part_alone_is_what_the_model_mixes(sample_model):
    """gate(part=...) gives the transfer model's and the adapted populations' gating; the model's
    own probabilities are their mix at its weight; in memory and streamed alike."""
    assert sample_model.gating_parts() == ("transfer", "adapted")
    path = SAMPLE_DATA / "new" / "new_patient_02.fcs"
    sample = read_fcs(path, compensate=True)
    transfer, adapted = (sample_model.predict_proba(sample, part=p) for p in ("transfer", "adapted"))
    w = sample_model.adaptive_weight_
    np.testing.assert_allclose(sample_model.predict_proba(sample), (1 - w) * transfer + w * adapted, atol=1e-5)
    names = np.asarray(sample_model.populations_)
    for part, proba in (("transfer", transfer), ("adapted", adapted)):
        result = sample_model.gate(sample, chunk_size=2048, part=part)
        assert result.part == part
        called = np.asarray(result.populations).astype(str)
        known = called != "unknown"
        # the cells within reach of a population take the part's most probable one
        assert (called[known] == names[np.argmax(proba[known], axis=1)]).mean() > 0.999
        stream = stream_fcs_all(path, compensate=True)[0]
        codes = []
        streamed = sample_model.gate_chunks(stream.sample, stream.chunks, chunk_size=2048, part=part,
                                            sink=lambda start, events, c, confidence: codes.append(c))
        assert streamed.part == part and streamed.counts == result.counts
        np.testing.assert_array_equal(np.asarray(sample_model.gated_populations())[np.concatenate(codes)], called)
    assert sample_model.gate(sample).part is None
    # the novelty and the disagreement are the patient's whichever part gates
    disagreement = sample_model.gate(sample).novelty.disagreement
    assert sample_model.gate(sample, part="transfer").novelty.disagreement == disagreement
    with pytest.raises(ValueError, match="part='lda': one of transfer, adapted"):
        sample_model.gate(sample, part="lda")


@pytest.mark.parametrize("weight", [0.0, 1.0])
def test_a_model_of_one_part_has_none_to_give_alone(weight):
    model = GatingModel(select=False, n_features=64, n_embedding_features=16, cells_per_patient=500,
                        embedding_cells=1000, adaptive_weight=weight, random_state=3).fit(*sample_cohort(range(1, 3)))
    assert model.gating_parts() == ()
    with pytest.raises(ValueError, match="gates with one part"):
        model.gate(read_fcs(SAMPLE_DATA / "new" / "new_patient_01.fcs", compensate=True), part="transfer")


def test_refinement_starts_from_the_part_under_review(sample_model):
    from gating_core.method.refinement import refine_gating

    sample = read_fcs(SAMPLE_DATA / "new" / "new_patient_02.fcs", compensate=True)
    base = sample_model.gate(sample, part="transfer")
    unrefined = refine_gating(sample_model, sample, [], [], base=base)
    np.testing.assert_allclose(unrefined.probabilities, sample_model.predict_proba(sample, part="transfer"), atol=1e-6)
    refined = refine_gating(sample_model, sample, [0, 1], [base.populations[0], base.populations[1]], base=base)
    assert refined.n_changed == 0  # confirming two cells of a calm patient moves nothing


def test_gate_on_the_command_line_with_one_part(sample_model, tmp_path):
    model = tmp_path / "model.npz"
    sample_model.save(model)
    path = str(SAMPLE_DATA / "new" / "new_patient_02.fcs")
    done = run_cli("gate", "--model", str(model), "--out-dir", str(tmp_path / "out"), "--part", "transfer", path)
    assert done.returncode == 0, done.stderr
    assert "new_patient_02.transfer.gated.csv (gated by the transfer model alone)" in done.stdout
    table = pd.read_csv(tmp_path / "out" / "new_patient_02.transfer.gated.csv")
    expected = sample_model.gate(read_fcs(path, compensate=True), part="transfer")
    np.testing.assert_array_equal(table["population"].to_numpy().astype(str), expected.populations.astype(str))
    # the model's own gating beside it is not replaced by a part's
    mixed = run_cli("gate", "--model", str(model), "--out-dir", str(tmp_path / "out"), path)
    assert mixed.returncode == 0, mixed.stderr
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["new_patient_02.gated.csv",
                                                                    "new_patient_02.transfer.gated.csv"]
    json_run = run_cli("gate", "--model", str(model), "--out-dir", str(tmp_path / "json"), "--part", "adapted",
                       "--json", path)
    assert json_run.returncode == 0, json_run.stderr
    assert '"part": "adapted"' in json_run.stdout


def test_gate_refuses_a_part_the_model_does_not_mix(tmp_path):
    model = GatingModel(select=False, n_features=64, n_embedding_features=16, cells_per_patient=500,
                        embedding_cells=1000, adaptive_weight=0.0, random_state=3).fit(*sample_cohort(range(1, 3)))
    model.save(tmp_path / "model.npz")
    done = run_cli("gate", "--model", str(tmp_path / "model.npz"), "--out-dir", str(tmp_path / "out"),
                   "--part", "adapted", str(SAMPLE_DATA / "new" / "new_patient_01.fcs"))
    assert done.returncode != 0
    assert "model.npz: this model does not mix a transfer model with the patients' own populations" in done.stderr
    assert not (tmp_path / "out" / "new_patient_01.gated.csv").exists()


def test_part_counts_table():
    from ui.parts_view import part_counts

    table = part_counts(np.array(["a", "a", "b", "b"]), {"transfer": np.array(["a", "b", "b", "c"]),
                                                         "adapted": np.array(["a", "a", "b", "b"])})
    assert list(table.columns) == ["under review", "the transfer model alone", "the patient's own populations alone"]
    assert table.loc["a"].tolist() == [2, 1, 2] and table.loc["c"].tolist() == [0, 1, 0]
    assert table.loc["cells unlike the gating under review"].tolist() == [0, 2, 0]
    assert table.attrs["share_differing"]["the transfer model alone"] == 0.5


def test_the_review_starts_again_from_the_patients_own_populations(library, dlbcl_dir, second_batch_model):
    """dlbcl_16, trained on the other batch: the transfer model alone gates it far worse than the
    mix, its own populations alone better. On the Auto-gate page the comparison is open (the
    parts disagree); the reviewer gates with each part, starts the review from its own
    populations, and the library keeps which part gated it."""
    from apptest_helpers import goto, reload, start, store_of

    sample, truth = _biopsy(dlbcl_dir, 16)
    truth = np.asarray(truth).astype(str)
    at = start()
    store = store_of(at)
    store.add_model("second batch", second_batch_model, [f"dlbcl_{n}" for n in range(19, 31)])
    store.add_patient("dlbcl_16", sample)
    at = goto(at, "pages/5_autogate.py")
    at.button(key="ag_run").click()
    at.run()
    assert not at.exception and not at.error
    mixed = float(np.mean(store.patients["dlbcl_16"].populations.astype(str) == truth))
    (comparison,) = [e for e in at.expander if e.label == "Compare the model's parts"]
    assert comparison.proto.expanded
    at.button(key="ag_parts_run").click()
    at.run()
    assert not at.exception and not at.error
    gatings = at.session_state["ag_part_gatings"]["gatings"]
    accuracy = {part: float(np.mean(g.populations.astype(str) == truth)) for part, g in gatings.items()}
    # measured 0.18 / 0.83 against 0.78 for the mix
    assert accuracy["transfer"] + 0.3 < mixed < accuracy["adapted"] - 0.02
    (table,) = [d.value for d in at.dataframe if "under review" in d.value.columns]
    assert table.loc["cells unlike the gating under review", "under review"] == 0
    assert table.loc["cells unlike the gating under review", "the transfer model alone"] > 0.3 * sample.n_events
    token = store.patients["dlbcl_16"].result_token
    at.radio(key=f"ag_parts_choice_dlbcl_16_{token}").set_value("adapted")
    at.run()
    at.button(key=f"ag_parts_apply_dlbcl_16_{token}").click()
    at.run()
    at.button(key=f"ag_parts_apply_dlbcl_16_{token}_confirm").click()
    at.run()
    assert not at.exception and not at.error
    record = store.patients["dlbcl_16"]
    assert record.result.part == "adapted"
    assert float(np.mean(record.populations.astype(str) == truth)) == pytest.approx(accuracy["adapted"])
    assert any("by the patient's own populations alone" in c.value for c in at.caption)
    # a new session reads the result back from the library, with its part
    again = reload(at, "pages/5_autogate.py")
    stored = store_of(again).patients["dlbcl_16"]
    assert stored.load_result().part == "adapted"
    np.testing.assert_array_equal(stored.populations.astype(str), record.populations.astype(str))


def test_gating_files_with_a_part_the_model_lacks_is_one_error_not_one_per_file(sample_model, tmp_path):
    from gating_core.batch.files import gate_file

    with pytest.raises(ValueError, match="part='shared'"):
        gate_file(sample_model, SAMPLE_DATA / "new" / "new_patient_01.fcs", tmp_path, part="shared")
    assert not list(tmp_path.iterdir())
