"""Streamed gating (chunked FCS reads, two passes, chunked writes) equals gating the whole
file in memory, byte for byte, and a bad file leaves nothing behind."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from gating_core import GatingModel, read_fcs
from gating_core.batch.files import _gate_file_whole, gate_file
from gating_core.fcs import FCSError, read_fcs_all, stream_fcs_all, write_fcs
from gating_core.io.export import GatedTableWriter, export_sample
from gating_core.method.features import content_subsample
from gating_core.model.research import build_model
from helpers import SAMPLE_DATA, sample_cohort


def _small_model(samples, labels, **params):
    base = dict(select=False, n_features=128, n_embedding_features=32, cells_per_patient=1000,
                bandwidth_x=1.0, bandwidth_p=1.0, alpha=1e-3, random_state=3)
    base.update(params)
    return build_model(base).fit(samples, labels)  # a ResearchGatingModel for prior_shift="em"


@pytest.fixture(scope="module")
def sample_model():
    return _small_model(*sample_cohort(range(1, 5)), embedding_cells=5000)


def _outputs(model, path, tmp_path, chunk_size, format="csv"):
    streamed, whole = tmp_path / f"s{chunk_size}", tmp_path / f"w{chunk_size}"
    streamed.mkdir(exist_ok=True)
    whole.mkdir(exist_ok=True)
    a = gate_file(model, path, streamed, chunk_size=chunk_size, format=format)
    b = _gate_file_whole(model, path, whole, chunk_size=chunk_size, format=format)
    return a, b


@pytest.mark.parametrize("chunk_size", [1, 2048, 5000, 50_000])
def test_streamed_gated_csv_is_byte_identical_on_sample_data(sample_model, tmp_path, chunk_size):
    # 12,000 events: chunk 1 rounds to one scoring block (2048), so 6 chunks; 5,000 rounds to 6,144.
    for path in sorted((SAMPLE_DATA / "new").glob("*.fcs")):
        streamed, whole = _outputs(sample_model, path, tmp_path, chunk_size)
        assert len(streamed) == len(whole) == 1
        s, w = streamed[0], whole[0]
        assert "error" not in s, s
        assert Path(s["output"]).read_bytes() == Path(w["output"]).read_bytes()
        assert s["counts"] == w["counts"] and s["events"] == w["events"] == 12000
        assert s["novelty"] == w["novelty"]
        assert s["mean_confidence"] == pytest.approx(w["mean_confidence"], rel=1e-6)
    assert not [p for p in tmp_path.rglob(".*.part")]


def test_streamed_gating_equals_model_gate_with_embedding_cut_inside_the_file(tmp_path):
    """embedding_cells below the event count: the first pass must keep exactly the rows
    content_subsample picks (else the embedding and every score would differ)."""
    model = _small_model(*sample_cohort(range(5, 9)), embedding_cells=3000, prior_shift="em", align="quantile")
    path = SAMPLE_DATA / "new" / "new_patient_02.fcs"
    sample = read_fcs(path, compensate=True)
    result = model.gate(sample, chunk_size=2048)
    stream = stream_fcs_all(path, compensate=True)[0]
    codes, confidence = [], []
    model.gate_chunks(stream.sample, stream.chunks, chunk_size=2048,
                      sink=lambda start, events, c, p: (codes.append(c), confidence.append(p)))
    populations = np.asarray(model.gated_populations(), dtype=object)[np.concatenate(codes)]
    assert np.array_equal(populations, result.populations)
    assert np.array_equal(np.concatenate(confidence), result.confidence)
    indices = model._channel_indices(sample)
    raw = sample.events[:, indices]
    chosen, n = model._content_chosen_rows(stream.chunks, indices, 2048)
    assert n == 12000 and np.array_equal(chosen, raw[content_subsample(raw, 3000)])


def test_first_pass_reproduces_argpartition_when_identical_rows_straddle_the_cut():
    """Integer data with many identical rows: ties at the hash cut, resolved as content_subsample does."""
    model = GatingModel(embedding_cells=100)
    rng = np.random.default_rng(0)
    events = rng.integers(0, 4, size=(5000, 3)).astype(np.float32)  # 64 distinct rows only

    def chunks(size):
        for start in range(0, len(events), size):
            yield start, events[start:start + size]

    chosen, n = model._content_chosen_rows(chunks, [0, 1, 2], 512)
    assert n == 5000
    assert np.array_equal(chosen, events[content_subsample(events, 100)])


def test_streamed_parquet_holds_the_same_table(sample_model, tmp_path):
    import pyarrow.parquet as pq

    path = SAMPLE_DATA / "new" / "new_patient_01.fcs"
    streamed, whole = _outputs(sample_model, path, tmp_path, 2048, format="parquet")
    a = pq.read_table(streamed[0]["output"])
    b = pq.read_table(whole[0]["output"])
    assert a.schema.names == b.schema.names and a.num_rows == b.num_rows == 12000
    for name in a.schema.names:
        assert a.column(name).to_pylist() == b.column(name).to_pylist(), name


def test_event_stream_chunks_equal_read_fcs_on_real_instrument_files(fcs_corpus):
    files = sorted(p for p in fcs_corpus.rglob("*") if p.suffix.lower() in (".fcs", ".lmd")
                   and "corrupted" not in p.parts and "fake" not in str(p))
    checked = 0
    for path in files:
        for compensate in (False, True):
            try:
                whole = read_fcs_all(path, compensate=compensate)
            except FCSError:
                with pytest.raises(FCSError):
                    for stream in stream_fcs_all(path, compensate=compensate):
                        list(stream.chunks(64))
                continue
            streams = stream_fcs_all(path, compensate=compensate)
            assert [s.sample.name for s in streams] == [s.name for s in whole]
            for stream, sample in zip(streams, whole):
                assert stream.sample.pnn == sample.pnn and stream.sample.compensated == sample.compensated
                for size in (8, 1000, 10 ** 7):
                    parts = [events for _, events in stream.chunks(size)]
                    events = np.concatenate(parts) if parts else stream.sample.events
                    assert events.dtype == sample.events.dtype == stream.sample.events.dtype, path
                    assert np.array_equal(events, sample.events, equal_nan=True), (path, size)
                checked += 1
    assert checked >= 20


def test_streamed_gating_on_a_real_instrument_file_with_spillover(fcs_corpus, tmp_path):
    """A Fortessa file (spillover, compensation on): labels from a threshold, a model trained on
    its two halves, then the whole file gated streamed and in memory."""
    path = next(p for p in sorted(fcs_corpus.rglob("*.fcs")) if read_fcs(p).has_spillover
                and read_fcs(p).n_events > 5000)
    sample = read_fcs(path, compensate=True)
    channel = next(i for i, c in enumerate(sample.channels) if c.pnn.upper().startswith("FSC"))
    labels = np.where(sample.events[:, channel] > np.median(sample.events[:, channel]), "big", "small")
    half = sample.n_events // 2
    parts = []
    for lo, hi in ((0, half), (half, sample.n_events)):
        parts.append(type(sample)(f"part{lo}", sample.events[lo:hi], sample.channels, sample.keywords,
                                  sample.spillover, sample.spillover_channels, sample.version, None, True))
    model = _small_model(parts, [labels[:half], labels[half:]], embedding_cells=1000)
    streamed, whole = _outputs(model, path, tmp_path, 2048)
    assert "error" not in streamed[0], streamed
    assert Path(streamed[0]["output"]).read_bytes() == Path(whole[0]["output"]).read_bytes()


def test_truncated_file_gives_a_clear_error_and_no_output(sample_model, tmp_path):
    source = (SAMPLE_DATA / "new" / "new_patient_01.fcs").read_bytes()
    bad = tmp_path / "cut.fcs"
    bad.write_bytes(source[: len(source) - 5000])
    out = tmp_path / "out"
    records = gate_file(sample_model, bad, out)
    assert len(records) == 1 and "cut.fcs" in records[0]["error"] and "truncated" in records[0]["error"]
    assert not out.exists() or list(out.iterdir()) == []


def test_damage_inside_data_leaves_no_partial_file(sample_model, tmp_path):
    """NaN in the middle of DATA is found by the first pass, before anything is written."""
    sample = read_fcs(SAMPLE_DATA / "new" / "new_patient_01.fcs")
    events = sample.events.copy()
    bad = tmp_path / "damaged.fcs"
    write_fcs(bad, events, sample.pnn, sample.pns, ranges=[c.range for c in sample.channels])
    data = bytearray(bad.read_bytes())
    nan = np.array([np.nan], dtype="<f4").tobytes()
    position = len(data) - 4 * events.size // 2  # a value half way through the events
    data[position:position + 4] = nan
    bad.write_bytes(bytes(data))
    out = tmp_path / "out"
    out.mkdir()
    records = gate_file(sample_model, bad, out, chunk_size=2048)
    assert "damaged.fcs" in records[0]["error"] and "NaN" in records[0]["error"]
    assert list(out.iterdir()) == []


def test_failure_while_writing_removes_the_partial_file(sample_model, tmp_path, monkeypatch):
    calls = {"n": 0}
    original = GatingModel._assign  # once per scored chunk, whatever the model's parts

    def failing(self, proba, cells, adjust):
        calls["n"] += 1
        if calls["n"] == 4:  # after some chunks were written
            raise OSError("disk full")
        return original(self, proba, cells, adjust)

    monkeypatch.setattr(GatingModel, "_assign", failing)
    out = tmp_path / "out"
    out.mkdir()
    records = gate_file(sample_model, SAMPLE_DATA / "new" / "new_patient_01.fcs", out, chunk_size=2048)
    assert "disk full" in records[0]["error"] and "new_patient_01.fcs" in records[0]["error"]
    assert calls["n"] >= 4 and list(out.iterdir()) == []


def test_gated_table_writer_chunking_does_not_change_the_csv(tmp_path):
    sample = read_fcs(SAMPLE_DATA / "patient_01.fcs")
    populations = np.array(["a", "b,c", 'say "x"'] * 4000, dtype=object)
    confidence = np.linspace(0, 1, 12000).astype(np.float32)
    export_sample(tmp_path / "whole.csv", sample, populations, confidence)
    with GatedTableWriter(tmp_path / "parts.csv", sample) as writer:
        for lo in range(0, 12000, 777):
            writer.write(sample.events[lo:lo + 777], populations[lo:lo + 777], confidence[lo:lo + 777])
    assert (tmp_path / "parts.csv").read_bytes() == (tmp_path / "whole.csv").read_bytes()
    with pytest.raises(ValueError, match="confidence"):
        with GatedTableWriter(tmp_path / "bad.csv", sample) as writer:
            writer.write(sample.events[:10], populations[:10], confidence[:10])
            writer.write(sample.events[:10], populations[:10], confidence[:10] + 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["parts.csv", "whole.csv"]


def test_copied_file_gates_under_its_own_name(sample_model, tmp_path):
    copy = tmp_path / "Guava Muse#2.fcs"
    shutil.copy(SAMPLE_DATA / "new" / "new_patient_03.fcs", copy)
    (tmp_path / "out").mkdir()
    records = gate_file(sample_model, copy, tmp_path / "out")
    assert Path(records[0]["output"]).name == "Guava_Muse_2.gated.csv"


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_fast_csv_text_equals_arrows_csv_writer(tmp_path, dtype):
    """The gated CSV's rows are formatted by Arrow kernels in parallel blocks; the bytes must be
    those Arrow's own CSV writer gave before (shortest round-trip floats, quoted names)."""
    import io

    import pyarrow as pa
    import pyarrow.csv as pacsv

    from gating_core.fcs import Channel, Sample

    rng = np.random.default_rng(5)
    n = 40_000
    events = (rng.lognormal(5, 3, size=(n, 6)) * rng.choice([-1, 1], size=(n, 6))).astype(dtype)
    events[:20, 0] = [0, -0.0, 1e-45, 3.4e38, 1e7, 1e16, 123456789, 0.1, 1 / 3, 2 ** 24, 2 ** 24 + 2, 1e-5,
                      1e-4, 1e21, 1e20, 1e-30, 100, 1000, 10000, 0.001]
    events[20:2000] = rng.integers(-1000, 100000, size=(1980, 6))
    populations = np.asarray(["CD4 T", "a,b", 'q"x', "NK", "", "tab\there"], dtype=object)[rng.integers(0, 6, n)]
    confidence = rng.random(n).astype(np.float32)
    confidence[:3] = [0, 1, 1e-9]
    names = ["FSC-A", "a,\"b\"", "c", "d", "e", "f"]
    sample = Sample("x", events, [Channel(c) for c in names])
    export_sample(tmp_path / "fast.csv", sample, populations, confidence)
    arrays = [pa.array(np.ascontiguousarray(events[:, i])) for i in range(6)]
    arrays += [pa.array(populations, type=pa.string()), pa.array(confidence)]
    reference = io.BytesIO()
    pacsv.write_csv(pa.Table.from_arrays(arrays, names=names + ["population", "confidence"]), reference,
                    write_options=pacsv.WriteOptions(quoting_style="needed"))
    assert (tmp_path / "fast.csv").read_bytes() == reference.getvalue()
