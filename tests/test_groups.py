"""Groups of patients (centers, batches, twins): reading, inferring, folding, evaluating."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from gating_core.method.groups import GroupsError, group_folds, groups_from_csv, groups_from_keyword, infer_groups
from gating_core.synthetic import draw_center, simulate_centers, simulate_patient, write_centers
from helpers import run_cli


def test_group_folds_never_split_a_group():
    groups = ["a", "a", "b", "b", "c", "c", "d", "e"]
    folds = group_folds(groups, n_folds=3, n_repeats=2, random_state=0)
    assert len(folds) == 6
    for fold in folds:
        held = {groups[i] for i in fold}
        assert all(groups[i] in held for i in range(len(groups)) if groups[i] in held)
        assert set(fold) == {i for i, g in enumerate(groups) if g in held}
    # every repeat is a partition of all patients
    for start in (0, 3):
        assert sorted(i for f in folds[start:start + 3] for i in f) == list(range(8))


def test_group_folds_one_group_per_fold_is_not_repeated():
    assert group_folds(["x", "y", "x"], n_folds=5, n_repeats=3) in ([[0, 2], [1]], [[1], [0, 2]])


def test_group_folds_with_a_single_group_fall_back_to_patients():
    folds = group_folds(["same"] * 4, n_folds=2, n_repeats=1)
    assert sorted(len(f) for f in folds) == [2, 2]


def test_infer_groups_links_near_duplicates_only():
    rng = np.random.default_rng(0)
    centres = rng.normal(0, 1, (4, 6))
    # two near-identical twins per centre, centres far apart
    embeddings = np.vstack([c + rng.normal(0, 0.01, (2, 6)) for c in centres])
    names = [f"p{i}" for i in range(8)]
    groups = infer_groups(embeddings, names)
    assert groups == ["auto:p0", "auto:p0", "auto:p2", "auto:p2", "auto:p4", "auto:p4", "auto:p6", "auto:p6"]


def test_infer_groups_keeps_evenly_spread_patients_apart():
    rng = np.random.default_rng(1)
    embeddings = rng.normal(0, 1, (6, 20))
    assert len(set(infer_groups(embeddings))) == 6


def test_groups_from_csv_matches_stems_and_prefers_the_group_column(tmp_path):
    table = tmp_path / "groups.csv"
    table.write_text("patient,pair,batch\nP1.fcs,x,A\nP2,y,B\n", encoding="utf-8")
    assert groups_from_csv(table, ["p1", "P2"]) == ["A", "B"]  # batch before pair
    with pytest.raises(GroupsError, match="groups.csv: no group for patient P3"):
        groups_from_csv(table, ["P1", "P3"])
    bad = tmp_path / "bad.csv"
    bad.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(GroupsError, match="bad.csv"):
        groups_from_csv(bad, ["P1"])


def test_groups_from_keyword_names_the_sample_without_it():
    a, _ = simulate_patient(1, n_events=50, name="a")
    b, _ = simulate_patient(2, n_events=50, name="b")
    assert groups_from_keyword([a, b], "$cytsn") == ["SIM-0001", "SIM-0001"]
    del b.keywords["$CYTSN"]
    with pytest.raises(GroupsError, match="b: no keyword '\\$CYTSN'"):
        groups_from_keyword([a, b], "$CYTSN")


def test_simulated_centers_share_their_shift():
    cohort, groups = simulate_centers(n_centers=2, patients_per_center=2, seed=3, n_events=4000)
    assert list(groups.values()) == ["center_1", "center_1", "center_2", "center_2"]
    medians = [np.median(np.arcsinh(s.compensate().events[:, 2:] / 150), axis=0) for s, _ in cohort]
    within = np.abs(medians[0] - medians[1]).mean() + np.abs(medians[2] - medians[3]).mean()
    between = np.abs(medians[0] - medians[2]).mean() + np.abs(medians[1] - medians[3]).mean()
    assert between > 2 * within
    # A center's recorded spillover differs from the nominal one (compensation error).
    center = draw_center(0, strength=1.0)
    assert not np.allclose(center.spillover_error, 1.0)


def test_a_center_leaves_the_plain_simulation_unchanged():
    a, la = simulate_patient((5, 1), n_events=300)
    b, lb = simulate_patient((5, 1), n_events=300, center=None)
    assert np.array_equal(a.events, b.events) and np.array_equal(la, lb)


def test_evaluate_leaves_whole_groups_out_and_prints_valid_json(tmp_path):
    paths = write_centers(tmp_path, n_centers=3, patients_per_center=2, seed=4, n_events=1500, strength=1.0)
    fcs = [str(p) for p in paths if p.suffix == ".fcs"]
    out = run_cli("evaluate", "--groups", tmp_path / "groups.csv", "--method", "marginal", "lda", "--no-selection",
                  "--features", "128", "--cells-per-patient", "500", "--json", *fcs)
    assert out.returncode == 0, out.stderr
    document = json.loads(out.stdout)  # NaN would make this fail: it must print null
    assert document["groups_origin"] == "from groups.csv, column center"
    rows = document["patients"]
    logo = [r for r in rows if r["protocol"] == "leave-one-group-out"]
    lopo = [r for r in rows if r["protocol"] == "leave-one-patient-out"]
    assert len(logo) == len(lopo) == 6 * 2
    assert {r["held_out"] for r in logo} == {"center_1", "center_2", "center_3"}
    assert all(r["patient"].startswith(f"c{r['held_out'][-1]}_") for r in logo)
    assert all(r["novelty"] is None for r in rows if r["method"] == "lda")
    assert all(r["accuracy"] > 0.8 for r in rows)
    summary = {(s["protocol"], s["method"]) for s in document["summary"]}
    assert ("leave-one-group-out", "marginal") in summary and ("leave-one-patient-out", "lda") in summary
    assert document["novelty_curve"]


def test_one_group_for_every_training_patient_keeps_replicate_twins_together():
    """Given one group for all patients (a single center or batch), selection folds are drawn
    from near-duplicate clusters found within it, not patient by patient: replicate twins never
    validate each other. Several given groups are kept as they are."""
    import dataclasses

    from gating_core.model import GatingModel

    twins, labels = [], []
    for seed in (3, 8, 21):  # three patients, each measured twice (two halves of its events)
        sample, truth = simulate_patient(seed, n_events=4000, name=f"patient_{seed}")
        for half, cut in (("a", slice(0, 2000)), ("b", slice(2000, 4000))):
            twins.append(dataclasses.replace(sample, name=f"patient_{seed}{half}", events=sample.events[cut]))
            labels.append(np.asarray(truth)[cut])
    settings = dict(select=False, n_features=64, cells_per_patient=500, embedding_cells=2000)
    model = GatingModel(**settings).fit(twins, labels, groups=["center_A"] * 6)
    assert model.groups_inferred_
    assert model.groups_[0::2] == model.groups_[1::2]  # each twin beside its pair
    assert len(set(model.groups_)) == 3 and all(g.startswith("center_A/") for g in model.groups_)
    given = ["center_A"] * 4 + ["center_B"] * 2
    model = GatingModel(**settings).fit(twins, labels, groups=given)
    assert model.groups_ == given and not model.groups_inferred_


def test_a_groups_table_of_several_columns_reads_the_one_named(tmp_path):
    from gating_core.errors import GroupsError
    from gating_core.method.groups import groups_csv_column, groups_from_csv

    table = tmp_path / "groups.csv"
    table.write_text("patient,pair,batch\na,p1,b1\nb,p1,b2\nc,p2,b1\n")
    assert groups_csv_column(table) == "batch" and groups_from_csv(table, ["a", "b", "c"]) == ["b1", "b2", "b1"]
    assert groups_csv_column(table, "PAIR") == "pair"
    assert groups_from_csv(table, ["c", "a"], column="pair") == ["p2", "p1"]
    with pytest.raises(GroupsError, match="no column 'site' .its columns: patient, pair, batch."):
        groups_from_csv(table, ["a"], column="site")
    done = run_cli("evaluate", "--group-column", "pair", "x.fcs")
    assert done.returncode == 2 and "--group-column names a column of the --groups CSV file" in done.stderr
    # a mistyped groups file is named as missing before any input is read (x.fcs does not exist),
    # not looked up as a keyword of every patient; a folder is named as one
    done = run_cli("evaluate", "--groups", str(tmp_path / "groups.cvs"), "x.fcs")
    assert done.returncode == 1
    assert done.stderr.strip() == (f"error: {tmp_path / 'groups.cvs'}: no such file (--groups takes a CSV file, "
                                   "or the name of an FCS keyword)")
    done = run_cli("evaluate", "--groups", str(tmp_path), "x.fcs")
    assert done.returncode == 1 and f"{tmp_path}: is a folder, not a CSV file" in done.stderr

    # so is a --csv file that cannot be written, before the evaluation that would fill it runs
    missing = tmp_path / "no" / "table.csv"
    done = run_cli("evaluate", "--csv", str(missing), "x.fcs")
    assert done.returncode == 1
    assert done.stderr.strip() == f"error: {missing}: the folder {missing.parent} does not exist (--csv)"


def test_counts_and_sizes_below_one_are_refused():
    for argv, option in ((["train", "--cells-per-patient", "0", "--out", "m.npz", "x.fcs"], "--cells-per-patient"),
                         (["train", "--features", "-3", "--out", "m.npz", "x.fcs"], "--features"),
                         (["gate", "--model", "m.npz", "--out-dir", ".", "--chunk-size", "0", "x.fcs"], "--chunk-size"),
                         (["gate", "--model", "m.npz", "--out-dir", ".", "--chunk-size", "1k", "x.fcs"], "--chunk-size")):
        done = run_cli(*argv)
        assert done.returncode == 2, argv
        assert f"argument {option}: must be" in done.stderr


def test_evaluate_trained_on_one_group_names_the_group_each_model_learned_from(tmp_path):
    paths = write_centers(tmp_path, n_centers=2, patients_per_center=2, seed=4, n_events=1500, strength=1.0)
    fcs = [str(p) for p in paths if p.suffix == ".fcs"]
    csv = tmp_path / "rows.csv"
    out = run_cli("evaluate", "--groups", tmp_path / "groups.csv", "--protocol", "one-group", "--method", "lda",
                  "--csv", csv, *fcs)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    header = lines[lines.index("train-on-one-group, per patient") + 1].split()
    assert header[:4] == ["trained", "on", "patient", "method"]
    rows = [line.split() for line in lines[lines.index("train-on-one-group, per patient") + 2:][:4]]
    # each center's patients are gated by the model of the other center
    assert sorted((row[0], row[1][:2]) for row in rows) == [("center_1", "c2"), ("center_1", "c2"),
                                                          ("center_2", "c1"), ("center_2", "c1")]
    table = pd.read_csv(csv)  # the file keeps its column as every protocol names it
    assert set(table["held_out"]) == {"trained on center_1", "trained on center_2"}
