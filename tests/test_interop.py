"""Interoperability round trips: FlowKit samples, AnnData, gate --format, gates as GatingML / FlowJo."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import flowkit
import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from gating_core import (
    GatingModel, as_sample, export_flowjo_workspace, export_gatingml, export_sample, from_flowkit, read_fcs,
    read_fcs_with_populations, read_gated_csv, to_flowkit,
)
from gating_core.fcs import Channel, Sample
from gating_core.gates import (
    AxisScale, GateError, GateTree, apply_gatingml, apply_workspace, gate_name_from_xml, polygon_gate,
    rectangle_gate, xml_gate_id,
)
from gating_core.gates.export import workspace_sample_id
from gating_core.io.export import export_keywords
from helpers import REPO, run_cli, sample_cohort, sample_paths


@pytest.fixture(scope="module")
def raw_patient(sample_data_dir):
    """patient_01 as read: float32 events, a 7-channel spillover matrix, not compensated."""
    return read_fcs(sample_data_dir / "patient_01.fcs")


@pytest.fixture(scope="module")
def small_model():
    return GatingModel(select=False, n_features=128, cells_per_patient=500).fit(*sample_cohort(range(1, 5)))


# ------------------------------------------------------------------------------------ FlowKit

def test_to_flowkit_and_back_is_exact_and_carries_the_spillover(raw_patient):
    fk = to_flowkit(raw_patient, include_identifying=True)
    assert isinstance(fk, flowkit.Sample) and fk.id == "patient_01"
    assert np.array_equal(fk.get_events(source="raw"), raw_patient.events)
    assert list(fk.pnn_labels) == raw_patient.pnn
    assert [p or "" for p in fk.pns_labels] == raw_patient.pns

    back = from_flowkit(fk)
    assert back.name == "patient_01"
    assert back.events.dtype == np.float32 and np.array_equal(back.events, raw_patient.events)
    assert back.channels == raw_patient.channels  # $PnN, $PnS and $PnR
    assert back.spillover_channels == raw_patient.spillover_channels == [f"FL{i}-A" for i in range(1, 8)]
    assert np.array_equal(back.spillover, raw_patient.spillover)
    assert not back.compensated
    # Every keyword the export carries comes back under its own name ('$' restored), same value.
    carried = export_keywords(raw_patient, include_identifying=True)
    carried.pop("$SPILLOVER")  # written from the matrix (1 -> 1.0); compared as the matrix above
    assert {k: back.keywords[k] for k in carried} == carried
    assert back.keywords["$CYT"] == raw_patient.keywords["$CYT"]
    assert back.keywords["SIM_CONDITION"] == raw_patient.keywords["SIM_CONDITION"]

    # The spillover is usable by FlowKit's own compensation step, with our result.
    fk.apply_compensation(fk.metadata["spillover"])
    np.testing.assert_allclose(fk.get_events(source="comp"), raw_patient.compensate().events, rtol=1e-5, atol=1e-2)


def test_to_flowkit_keeps_only_the_keywords_needed_to_read_the_data_unless_asked(raw_patient):
    identifying = {"$FIL", "$DATE", "$SRC", "$CYTSN", "$COM", "SIM_CONDITION"}
    assert identifying <= set(raw_patient.keywords)
    shared = from_flowkit(to_flowkit(raw_patient)).keywords
    assert not identifying & set(shared) and shared["$CYT"] == raw_patient.keywords["$CYT"]
    assert int(shared["GATING_DROPPED_KEYWORDS"]) == len(identifying)
    kept = from_flowkit(to_flowkit(raw_patient, keep_keywords=["sim_condition"])).keywords
    assert kept["SIM_CONDITION"] == raw_patient.keywords["SIM_CONDITION"] and "$FIL" not in kept


def test_from_flowkit_reads_a_flowkit_file_sample_like_read_fcs(sample_data_dir, raw_patient):
    fk = flowkit.Sample(str(sample_data_dir / "patient_01.fcs"), subsample=0)
    ours = from_flowkit(fk)
    assert ours.name == "patient_01"
    assert ours.events.dtype == np.float32 and np.array_equal(ours.events, raw_patient.events)
    assert ours.keywords == raw_patient.keywords
    assert np.array_equal(ours.spillover, raw_patient.spillover)
    assert np.array_equal(ours.compensate().events, raw_patient.compensate().events)


def test_from_flowkit_takes_the_compensation_a_flowkit_user_applied(raw_patient):
    fk = to_flowkit(raw_patient)
    matrix = np.eye(7)
    matrix[0, 1] = 0.25
    fk.apply_compensation(flowkit.Matrix(matrix, [f"FL{i}-A" for i in range(1, 8)]))
    back = from_flowkit(fk)
    assert np.array_equal(back.spillover, matrix)
    assert np.array_equal(back.events, raw_patient.events)  # raw events; compensation stays a step


def test_to_flowkit_refuses_an_already_compensated_sample(raw_patient):
    with pytest.raises(ValueError, match="patient_01: the sample is already compensated"):
        to_flowkit(raw_patient.compensate())


def test_as_sample_names_what_it_cannot_convert():
    with pytest.raises(TypeError, match="not ndarray"):
        as_sample(np.zeros((3, 2)))


def test_gate_accepts_a_flowkit_sample_with_the_same_result(small_model, sample_data_dir):
    raw = read_fcs(sample_data_dir / "new" / "new_patient_01.fcs")
    ours = small_model.gate(raw)
    theirs = small_model.gate(to_flowkit(raw))
    from_file = small_model.gate(flowkit.Sample(str(sample_data_dir / "new" / "new_patient_01.fcs"), subsample=0))
    for result in (theirs, from_file):
        assert np.array_equal(result.populations, ours.populations)
        assert np.array_equal(result.confidence, ours.confidence)
        assert result.novelty.score == ours.novelty.score
    assert sum(ours.counts.values()) == 12_000


def test_fit_takes_flowkit_samples_and_anndata_as_it_takes_samples(small_model, sample_data_dir):
    samples, labels = sample_cohort(range(1, 5))
    params = small_model.get_params()
    from_flowkit_files = GatingModel(**params).fit(
        [flowkit.Sample(str(sample_data_dir / f"patient_0{k}.fcs"), subsample=0) for k in range(1, 5)], labels)
    new = read_fcs(sample_data_dir / "new" / "new_patient_01.fcs")
    ours = small_model.gate(new)
    assert np.array_equal(from_flowkit_files.gate(new).populations, ours.populations)
    if importlib.util.find_spec("anndata") is not None:
        from gating_core import to_anndata

        from_anndata = GatingModel(**params).fit([to_anndata(s) for s in samples], labels)
        assert np.array_equal(from_anndata.gate(new).populations, ours.populations)
    with pytest.raises(TypeError, match="not list"):
        GatingModel(**params).fit([[1.0, 2.0]] * 4, labels)


# ------------------------------------------------------------------------------------ AnnData

def test_to_anndata_layout_and_h5ad_round_trip(small_model, raw_patient, tmp_path):
    anndata = pytest.importorskip("anndata")
    from gating_core import from_anndata, to_anndata

    result = small_model.gate(raw_patient)
    adata = to_anndata(raw_patient, result, include_identifying=True)
    # Every keyword but the source file's byte offsets, which point into a file the h5ad is not.
    offsets = {"$BEGINDATA", "$ENDDATA", "$BEGINANALYSIS", "$ENDANALYSIS", "$BEGINSTEXT", "$ENDSTEXT", "$NEXTDATA"}
    assert {"$BEGINDATA", "$ENDDATA"} <= set(raw_patient.keywords)
    carried = {k: v for k, v in raw_patient.keywords.items() if k not in offsets}
    assert adata.shape == (12_000, 9)
    assert np.array_equal(adata.X, raw_patient.events)
    assert list(adata.var_names) == raw_patient.pnn
    assert list(adata.var["pns"]) == raw_patient.pns
    assert list(adata.obs_names[:3]) == ["0", "1", "2"]
    assert np.array_equal(adata.obs["population"].astype(str).to_numpy(), result.populations.astype(str))
    assert np.array_equal(adata.obs["confidence"].to_numpy(), result.confidence)
    assert adata.uns["keywords"] == carried and adata.uns["dropped_keywords"] == 0
    assert adata.uns["gating"]["novelty"]["score"] == result.novelty.score
    # The model's populations are the categories, in its order, a population the patient lacks too.
    assert list(adata.obs["population"].cat.categories) == result.population_names
    missing = to_anndata(raw_patient, result, populations=np.full(12_000, result.population_names[0], dtype=object))
    assert list(missing.obs["population"].cat.categories) == result.population_names
    edited = to_anndata(raw_patient, result, populations=np.full(12_000, "debris", dtype=object))
    assert list(edited.obs["population"].cat.categories) == result.population_names + ["debris"]

    adata.write_h5ad(tmp_path / "p.h5ad")
    read_back = anndata.read_h5ad(tmp_path / "p.h5ad")
    sample = from_anndata(read_back)
    assert sample.name == "patient_01"
    assert sample.events.dtype == np.float32 and np.array_equal(sample.events, raw_patient.events)
    assert sample.channels == raw_patient.channels
    assert sample.keywords == carried
    assert np.array_equal(sample.spillover, raw_patient.spillover)
    assert sample.spillover_channels == raw_patient.spillover_channels
    assert np.array_equal(read_back.obs["population"].astype(str).to_numpy(), result.populations.astype(str))
    # ... and the model gates the AnnData as it gates the file.
    again = small_model.gate(read_back)
    assert np.array_equal(again.populations, result.populations)


def test_h5ad_export_keeps_only_keywords_needed_to_read_the_data(raw_patient, tmp_path):
    anndata = pytest.importorskip("anndata")

    populations = np.where(raw_patient.events[:, 0] > 90_000, "big", "small")
    export_sample(tmp_path / "p.h5ad", raw_patient, populations)
    uns = anndata.read_h5ad(tmp_path / "p.h5ad").uns
    keywords = uns["keywords"]
    assert "$CYT" in keywords and "$SPILLOVER" in keywords
    assert not {"$FIL", "$DATE", "$SRC", "$CYTSN", "$COM", "SIM_CONDITION"} & set(keywords)
    assert not {"$BEGINDATA", "$ENDDATA"} & set(keywords) and "$TOT" in keywords
    assert uns["dropped_keywords"] == 6
    from gating_core import to_anndata

    assert to_anndata(raw_patient).uns["keywords"] == keywords  # the in-memory conversion: the same rule


def test_keyword_names_with_a_slash_survive_h5ad(tmp_path):
    anndata = pytest.importorskip("anndata")
    from gating_core import from_anndata, to_anndata

    sample = Sample("s", np.arange(6, dtype=np.float32).reshape(3, 2), [Channel("A"), Channel("B", "CD4")],
                    {"LASER/1 POWER": "20", "PCT%": "5"})
    to_anndata(sample, include_identifying=True).write_h5ad(tmp_path / "s.h5ad")
    assert from_anndata(anndata.read_h5ad(tmp_path / "s.h5ad")).keywords == sample.keywords


# ------------------------------------------------------------------------------------ Parquet

def test_parquet_export_holds_the_gated_csv_columns_exactly(raw_patient, tmp_path):
    populations = np.where(raw_patient.events[:, 0] > 90_000, "big", "small")
    confidence = np.linspace(0, 1, raw_patient.n_events)
    export_sample(tmp_path / "p.parquet", raw_patient, populations, confidence)
    table = pq.read_table(tmp_path / "p.parquet")
    assert table.column_names == raw_patient.pnn + ["population", "confidence"]
    for i, name in enumerate(raw_patient.pnn):
        column = table.column(name).to_numpy()
        assert column.dtype == np.float32 and np.array_equal(column, raw_patient.events[:, i])
    assert table.column("population").to_pylist() == populations.tolist()
    assert np.array_equal(table.column("confidence").to_numpy(), confidence.astype(np.float32))


# ------------------------------------------------------------------------------------ gate --format, --json

@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    model = tmp_path_factory.mktemp("interop-cli") / "model.npz"
    result = run_cli("train", "--out", model, "--no-selection", "--features", "128", "--cells-per-patient", "500",
                     *sample_paths(range(1, 5)))
    assert result.returncode == 0, result.stderr
    return model


def test_gate_formats_write_the_same_gating(model_file, sample_data_dir, tmp_path):
    fcs = sample_data_dir / "new" / "new_patient_02.fcs"
    formats = ["csv", "parquet", "fcs"]
    try:
        import anndata
    except ImportError:
        anndata = None
    else:
        formats.append("h5ad")
    outputs = {}
    for fmt in formats:
        result = run_cli("gate", "--model", model_file, "--out-dir", tmp_path / fmt, "--format", fmt, "--json", fcs)
        assert result.returncode == 0, result.stderr
        [record] = json.loads(result.stdout)
        outputs[fmt] = Path(record["output"])
        assert outputs[fmt] == tmp_path / fmt / f"new_patient_02.gated.{fmt}"
    sample = read_fcs(fcs, compensate=True)
    _, populations, confidence = read_gated_csv(outputs["csv"])
    table = pq.read_table(outputs["parquet"])
    assert table.column("population").to_pylist() == populations.tolist()
    # every file gated by one model has the model's populations as its categories, in its order,
    # present or not: the tables of several patients concatenate as one categorical column
    other = run_cli("gate", "--model", model_file, "--out-dir", tmp_path / "other", "--format", "parquet",
                    "--json", sample_data_dir / "new" / "new_patient_01.fcs")
    assert other.returncode == 0, other.stderr
    both = pd.concat([pd.read_parquet(outputs["parquet"]),
                      pd.read_parquet(Path(json.loads(other.stdout)[0]["output"]))])
    gated = GatingModel.load(model_file).gated_populations()
    assert both["population"].dtype == "category" and list(both["population"].cat.categories) == gated
    assert np.array_equal(table.column("confidence").to_numpy(), confidence)
    from_fcs, fcs_populations = read_fcs_with_populations(outputs["fcs"])
    assert np.array_equal(fcs_populations, populations)
    assert np.array_equal(from_fcs.events, sample.events)
    if anndata is not None:
        adata = anndata.read_h5ad(outputs["h5ad"])
        assert adata.obs["population"].astype(str).tolist() == populations.tolist()
        assert np.array_equal(adata.X, sample.events)
        # the gating as to_anndata(sample, result) holds it: the model's populations, the novelty
        [record] = json.loads(run_cli("gate", "--model", model_file, "--out-dir", tmp_path / "again", "--json",
                                      fcs).stdout)
        assert list(adata.uns["gating"]["populations"]) == gated
        assert adata.uns["gating"]["novelty"]["score"] == pytest.approx(record["novelty"]["score"])


def test_gate_json_is_one_document_even_with_a_failed_file(model_file, sample_data_dir, tmp_path):
    bad = tmp_path / "broken.fcs"
    bad.write_bytes(b"FCS3.1 not really")
    good = sample_data_dir / "new" / "new_patient_01.fcs"
    result = run_cli("gate", "--model", model_file, "--out-dir", tmp_path / "out", "--json", good, bad)
    assert result.returncode == 1
    records = json.loads(result.stdout)
    assert [r["patient"] for r in records] == ["new_patient_01", "broken"]
    assert records[0]["events"] == 12_000 and sum(records[0]["counts"].values()) == 12_000
    assert "broken.fcs" in records[1]["error"]


def test_gate_h5ad_without_anndata_is_a_clear_error(model_file, sample_data_dir, tmp_path):
    # sys.modules[name] = None makes `import anndata` fail as if it were not installed.
    code = ("import sys; sys.modules['anndata'] = None\n"
            "from gating_core.cli import main\n"
            "sys.exit(main(sys.argv[1:]))")
    result = subprocess.run([sys.executable, "-c", code, "gate", "--model", str(model_file), "--out-dir",
                             str(tmp_path), "--format", "h5ad", str(sample_data_dir / "new" / "new_patient_01.fcs")],
                            capture_output=True, text=True, cwd=REPO, timeout=300)
    assert result.returncode == 2
    assert result.stderr.strip() == ("error: --format h5ad needs the anndata package: "
                                     "pip install 'gating-core[anndata]'")
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------------------------ gates out and back

ASINH = AxisScale("arcsinh", cofactor=150.0)
LOGICLE = AxisScale("logicle", top=262144.0, width=0.5, decades=4.5)


def lymphocyte_tree() -> GateTree:
    """Nested rectangle and polygon gates on linear, arcsinh and logicle axes; channels named by
    $PnN and by marker; names with spaces and '+'."""
    tree = GateTree()
    tree.add(rectangle_gate("Leukocytes", "FSC-A", "SSC-A", (20000, 150000), (5000, 90000)))
    tree.add(polygon_gate("T cells", "CD3", "SSC-A", [(1.5, 5000), (5.6, 5000), (5.6, 60000), (2.0, 70000)],
                          ASINH, None, parent="Leukocytes"))
    tree.add(polygon_gate("CD4+ T cells", "CD4", "CD8", [(0.45, 0.05), (0.75, 0.05), (0.75, 0.35), (0.45, 0.38)],
                          LOGICLE, LOGICLE, parent="T cells"))
    tree.add(rectangle_gate("CD8+ T cells", "CD4", "CD8", (0.05, 0.4), (0.45, 0.8), LOGICLE, LOGICLE,
                            parent="T cells"))
    tree.add(rectangle_gate("B cells", "CD19", "CD3", (2.0, 6.0), (-2.0, 1.2), ASINH, ASINH, parent="Leukocytes"))
    return tree


EXPECTED_GATE_COUNTS = {"Leukocytes": 8298, "T cells": 3880, "CD4+ T cells": 2399, "CD8+ T cells": 1044,
                        "B cells": 550}
EXPECTED_LEAF_COUNTS = {"B cells": 550, "CD4+ T cells": 2399, "CD8+ T cells": 1044, "other": 8007}


@pytest.fixture(scope="module")
def compensated_patient(sample_data_dir):
    return read_fcs(sample_data_dir / "patient_01.fcs", compensate=True)


def leaf_counts(labels) -> dict:
    names, counts = np.unique(np.asarray(labels, dtype=str), return_counts=True)
    return {str(n): int(c) for n, c in zip(names, counts)}


def test_gatingml_export_reimports_with_zero_mismatched_events(compensated_patient, tmp_path):
    tree = lymphocyte_tree()
    assert {k: int(v.sum()) for k, v in tree.memberships(compensated_patient).items()} == EXPECTED_GATE_COUNTS
    expected = tree.labels(compensated_patient)
    path = export_gatingml(tree, tmp_path / "gates.xml", compensated_patient)

    labels = apply_gatingml(path, compensated_patient)  # the product's own GatingML import
    assert int(np.sum(labels != expected)) == 0
    assert leaf_counts(labels) == EXPECTED_LEAF_COUNTS

    # FlowKit alone, gate by gate: the same events in every gate, not only in the leaves.
    strategy = flowkit.parse_gating_xml(str(path))
    fk = flowkit.Sample(compensated_patient.events.astype(np.float64), sample_id="p",
                        channel_labels=compensated_patient.pnn, subsample=0)
    results = strategy.gate_sample(fk)
    masks = tree.memberships(compensated_patient)
    for gate_id, gate_path in strategy.get_gate_ids():
        name = gate_name_from_xml(gate_id)
        membership = results.get_gate_membership(gate_id, gate_path=gate_path)
        assert int(np.sum(membership != masks[name])) == 0, name
        assert int(membership.sum()) == EXPECTED_GATE_COUNTS[name]


def test_flowjo_workspace_export_reimports_with_zero_mismatched_events(compensated_patient, sample_data_dir,
                                                                       tmp_path):
    tree = lymphocyte_tree()
    other = read_fcs(sample_data_dir / "patient_02.fcs", compensate=True)
    path = export_flowjo_workspace(tree, tmp_path / "gates.wsp", [compensated_patient, other])
    samples = {workspace_sample_id(s): s for s in (compensated_patient, other)}
    assert sorted(samples) == ["patient_01.fcs", "patient_02.fcs"]
    labels = apply_workspace(path, samples)  # the product's own FlowJo import
    assert int(np.sum(labels["patient_01.fcs"] != tree.labels(compensated_patient))) == 0
    assert leaf_counts(labels["patient_01.fcs"]) == EXPECTED_LEAF_COUNTS
    assert int(np.sum(labels["patient_02.fcs"] != tree.labels(other))) == 0

    text = path.read_text(encoding="utf-8")
    assert "transforms:fasinh" in text and "transforms:logicle" in text
    assert 'name="CD4+ T cells"' in text  # FlowJo shows the names as drawn
    # The workspace carries each sample's keywords needed to read the data, no others.
    assert "$CYT" in text
    for keyword in ("$FIL", "$DATE", "$SRC", "$CYTSN", "$COM", "SIM_CONDITION"):
        assert f'name="{keyword}"' not in text


def test_exported_gates_count_on_the_fcs_file_what_the_product_counts(compensated_patient, raw_patient,
                                                                      sample_data_dir, tmp_path):
    # Gates drawn on compensated values are written on compensated values: FlowKit (as FlowJo or
    # any GatingML reader would) applied to the file itself, which it compensates by the file's
    # own matrix, and the product's import of either reading of the file, count the same events.
    tree = lymphocyte_tree()
    expected = tree.labels(compensated_patient)
    fcs = flowkit.Sample(str(sample_data_dir / "patient_01.fcs"), subsample=0)

    gatingml = export_gatingml(tree, tmp_path / "gates.xml", compensated_patient)
    assert gatingml.read_text(encoding="utf-8").count('compensation-ref="FCS"') > 0
    assert 'compensation-ref="uncompensated"' not in gatingml.read_text(encoding="utf-8")
    strategy = flowkit.parse_gating_xml(str(gatingml))
    results = strategy.gate_sample(fcs)
    assert {gate_name_from_xml(g): int(results.get_gate_membership(g, gate_path=p).sum())
            for g, p in strategy.get_gate_ids()} == EXPECTED_GATE_COUNTS
    for reading in (raw_patient, compensated_patient):
        assert int(np.sum(apply_gatingml(gatingml, reading) != expected)) == 0

    workspace = export_flowjo_workspace(tree, tmp_path / "gates.wsp", [compensated_patient])
    text = workspace.read_text(encoding="utf-8")
    assert 'name="Acquisition-defined"' in text and 'data-type:name="Comp-FL1-A"' in text
    flowjo = flowkit.Workspace(str(workspace), fcs_samples=[fcs])
    flowjo.analyze_samples(sample_id="patient_01.fcs", use_mp=False)
    assert {g: int(flowjo.get_gate_membership("patient_01.fcs", g, gate_path=p).sum())
            for g, p in flowjo.get_gate_ids("patient_01.fcs")} == EXPECTED_GATE_COUNTS
    for reading in (raw_patient, compensated_patient):
        labels = apply_workspace(workspace, {"patient_01.fcs": reading})["patient_01.fcs"]
        assert int(np.sum(labels != expected)) == 0


def test_gates_drawn_without_compensation_are_written_uncompensated(raw_patient, sample_data_dir, tmp_path):
    tree = lymphocyte_tree()
    expected = tree.labels(raw_patient)
    assert int(np.sum(expected != tree.labels(read_fcs(sample_data_dir / "patient_01.fcs", compensate=True)))) > 100
    gatingml = export_gatingml(tree, tmp_path / "raw.xml", raw_patient)
    assert 'compensation-ref="FCS"' not in gatingml.read_text(encoding="utf-8")
    assert int(np.sum(apply_gatingml(gatingml, raw_patient) != expected)) == 0
    workspace = export_flowjo_workspace(tree, tmp_path / "raw.wsp", [raw_patient])
    assert "Comp-" not in workspace.read_text(encoding="utf-8")
    labels = apply_workspace(workspace, {"patient_01.fcs": raw_patient})["patient_01.fcs"]
    assert int(np.sum(labels != expected)) == 0


def test_each_sample_of_a_workspace_carries_its_own_matrix(compensated_patient, raw_patient, sample_data_dir,
                                                           tmp_path):
    tree = lymphocyte_tree()
    other = read_fcs(sample_data_dir / "patient_02.fcs", compensate=True)
    assert not np.array_equal(other.spillover, compensated_patient.spillover)
    workspace = export_flowjo_workspace(tree, tmp_path / "two.wsp", [compensated_patient, other])
    fcs = [flowkit.Sample(str(sample_data_dir / f"patient_0{k}.fcs"), subsample=0) for k in (1, 2)]
    flowjo = flowkit.Workspace(str(workspace), fcs_samples=fcs)
    for sample in (compensated_patient, other):
        key = workspace_sample_id(sample)
        flowjo.analyze_samples(sample_id=key, use_mp=False)
        np.testing.assert_allclose(flowjo.get_comp_matrix(key).matrix, sample.spillover, rtol=0, atol=0)
        for gate_id, gate_path in flowjo.get_gate_ids(key):
            expected = tree.memberships(sample)[gate_id]
            assert int(np.sum(flowjo.get_gate_membership(key, gate_id, gate_path=gate_path) != expected)) == 0
    mixed = [compensated_patient, raw_patient.__class__(**{**raw_patient.__dict__, "name": "x", "path": None})]
    with pytest.raises(GateError, match="some of the samples are compensated and some are not"):
        export_flowjo_workspace(tree, tmp_path / "mixed.wsp", mixed)
    assert not (tmp_path / "mixed.wsp").exists()


def test_uncompensated_takes_the_spillover_back_out(raw_patient):
    again = raw_patient.compensate().uncompensated()
    assert not again.compensated and again.events.dtype == raw_patient.events.dtype
    np.testing.assert_allclose(again.events, raw_patient.events, rtol=1e-5, atol=1e-2)
    assert raw_patient.uncompensated() is raw_patient


def test_rectangle_edges_stay_inclusive_through_gatingml(tmp_path):
    xs, ys = np.meshgrid(np.arange(10.0), np.arange(10.0))
    # Channel names an XML id could not hold: GatingML refers to them by name, not by id.
    grid = Sample("grid", np.column_stack([xs.ravel(), ys.ravel()]), [Channel("FSC A"), Channel("B", "CD3 (FITC)")])
    tree = GateTree([rectangle_gate("R", "FSC A", "CD3 (FITC)", (2, 4), (0, 1))])  # x in {2,3,4}, y in {0,1}
    path = export_gatingml(tree, tmp_path / "r.xml", grid)
    labels = apply_gatingml(path, grid)
    assert leaf_counts(labels) == {"R": 6, "other": 94}


def test_gate_names_become_xml_ids_and_back():
    for name in ("T cells", "CD4+", "1st gate", "a_x0020_b", "Lymphocytes", "naïve B", "x.y-z_w"):
        gate_id = xml_gate_id(name)
        assert gate_name_from_xml(gate_id) == name
    assert xml_gate_id("T cells") == "T_x0020_cells"
    assert xml_gate_id("Lymphocytes") == "Lymphocytes"


def test_a_workspace_cannot_hold_one_channel_on_two_scales(compensated_patient, tmp_path):
    tree = GateTree([rectangle_gate("a", "CD3", "CD4", (0, 3), (0, 3), ASINH, ASINH),
                     rectangle_gate("b", "CD3", "CD4", (0, 0.5), (0, 0.5), LOGICLE, LOGICLE)])
    with pytest.raises(GateError, match="cannot be written as a FlowJo workspace"):
        export_flowjo_workspace(tree, tmp_path / "x.wsp", [compensated_patient])
    assert not (tmp_path / "x.wsp").exists()


def test_gate_export_names_a_missing_channel(compensated_patient, tmp_path):
    tree = GateTree([rectangle_gate("a", "CD99", "CD4", (0, 3), (0, 3))])
    with pytest.raises(GateError, match="patient_01: the gates need channel 'CD99'"):
        export_gatingml(tree, tmp_path / "x.xml", compensated_patient)


def test_library_export_gates_writes_gatingml_and_flowjo_files(sample_data_dir, tmp_path):
    from gating_core.library import PatientLibrary

    library = PatientLibrary(tmp_path / "lib", create=True)
    library.import_files([sample_data_dir / "patient_01.fcs"])
    library.save_gates("patient_01", lymphocyte_tree().to_dict())
    compensated = library.load_sample("patient_01", compensate=True)
    for suffix in ("xml", "wsp"):
        out = tmp_path / f"gates.{suffix}"
        result = run_cli("library", "--path", tmp_path / "lib", "export-gates", "patient_01", "--out", out)
        assert result.returncode == 0, result.stderr
        written = f"wrote 5 gate(s) of patient_01 to {out}"
        if suffix == "wsp":  # the workspace carries the keywords an FCS export would, and says what it left out
            written += ("\n  dropped 6 keywords not needed to read the data; --include-identifying or "
                        "--keep-keyword NAME to keep them")
        assert result.stdout.strip() == written
        if suffix == "xml":
            labels = apply_gatingml(out, compensated)
        else:
            [labels] = apply_workspace(out, {workspace_sample_id(compensated): compensated}).values()
        assert leaf_counts(labels) == EXPECTED_LEAF_COUNTS

    result = run_cli("library", "--path", tmp_path / "lib", "export-gates", "patient_01", "--out", tmp_path / "g.txt")
    assert result.returncode == 2 and "--out must end in .xml" in result.stderr
    library.import_files([sample_data_dir / "patient_02.fcs"])
    result = run_cli("library", "--path", tmp_path / "lib", "export-gates", "patient_02", "--out", tmp_path / "g.xml")
    assert result.returncode == 1 and result.stderr.strip() == "error: patient_02: no gates drawn on this patient"


def test_from_flowkit_gives_standard_keywords_their_dollar_back_and_only_those(raw_patient):
    fk = to_flowkit(raw_patient)
    fk.metadata.update({"spill": "1,FL1-A,1", "p1display": "LOG", "p3calibration": "1,MESF"})
    keywords = from_flowkit(fk).keywords
    assert keywords["SPILL"] == "1,FL1-A,1" and keywords["P1DISPLAY"] == "LOG"  # BD's own: no '$'
    assert keywords["$P3CALIBRATION"] == "1,MESF" and keywords["$P3S"] == "CD3" and keywords["$CYT"]


def test_a_gating_result_alone_exports_its_populations_in_every_format(small_model, raw_patient, tmp_path):
    from gating_core.io.export import export_sample, read_fcs_with_populations

    result = small_model.gate(raw_patient)
    table = pd.read_csv(export_sample(tmp_path / "p.csv", raw_patient, result=result))
    assert table["population"].tolist() == result.populations.tolist()
    np.testing.assert_allclose(table["confidence"], result.confidence, atol=1e-6)
    assert pq.read_table(export_sample(tmp_path / "p.parquet", raw_patient, result=result)).column(
        "population").to_pylist() == result.populations.tolist()
    _, populations = read_fcs_with_populations(export_sample(tmp_path / "p.fcs", raw_patient, result=result))
    assert np.array_equal(populations, result.populations.astype(str))
    other = raw_patient.__class__(raw_patient.name, raw_patient.events[:100], raw_patient.channels)
    with pytest.raises(ValueError, match="holds 12000 events, the sample 100: it is another patient's"):
        export_sample(tmp_path / "q.csv", other, result=result)
    assert not (tmp_path / "q.csv").exists()
    # A streamed gating keeps no per-event results, only its count: checked all the same.
    compensated = raw_patient.compensate()
    streamed = small_model.gate_chunks(compensated, lambda size: (
        (start, compensated.events[start:start + size]) for start in range(0, compensated.n_events, size)))
    with pytest.raises(ValueError, match="it is another patient's"):
        export_sample(tmp_path / "q.csv", other, result=streamed)
    if importlib.util.find_spec("anndata") is not None:
        import anndata

        path = export_sample(tmp_path / "s.h5ad", raw_patient, result.populations, result=streamed)
        read = anndata.read_h5ad(path)
        assert read.obs["population"].astype(str).tolist() == result.populations.tolist()
        assert read.uns["gating"]["novelty"]["score"] == pytest.approx(result.novelty.score)
