"""``python -m gating_core info``: human and JSON output, bad files reported, others still shown."""

from __future__ import annotations

import json
import re
from pathlib import Path

from helpers import run_cli


def test_info_human_output(fcs_corpus):
    diva = fcs_corpus / "FACS_Diva/facs_diva_test.fcs"
    result = run_cli("info", diva)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "FCS version: 3.0" in out
    assert "data sets: 1" in out
    assert "events: 83411" in out
    assert "channels: 12" in out
    assert re.search(r"^\s+5\s+FITC-A\s+CD20\s+\[range 262144, linear\]$", out, re.M)
    assert re.search(r"^\s+1\s+Time\s+\[range 262144, linear\]$", out, re.M)
    assert "spillover: yes (8 channels: FITC-A, PE-A" in out
    assert result.stderr == ""


def test_info_json_and_bad_files_keep_going(fcs_corpus):
    files = [fcs_corpus / "corrupted/corrupted.fcs",
             fcs_corpus / "GuavaMuse/Guava Muse.fcs",
             fcs_corpus / "cytek-nl-2000/sample_header.fcs",
             fcs_corpus / "MiltenyiBiotec/FCS3.1/SG_2014-09-26_Duplicate_Names.fcs"]
    result = run_cli("info", "--json", *files)
    assert result.returncode == 1
    report = json.loads(result.stdout)
    assert [Path(r["file"]).name for r in report] == [f.name for f in files]
    assert "too short" in report[0]["error"]
    assert report[1]["n_datasets"] == 4
    assert [d["events"] for d in report[1]["datasets"]] == [108, 50081, 111496, 50037]
    assert report[1]["datasets"][0]["name"] == "Guava Muse#1"
    assert "DATA segment" in report[2]["error"]
    sg = report[3]["datasets"][0]
    assert sg["events"] == 8129 and sg["n_channels"] == 9
    assert {"pnn": "FL7-A", "pns": "GFP/FITC-A", "range": 1000.0, "log_decades": 0.0, "gain": 1.0} in sg["channels"]
    assert sg["spillover"] is False
    # the messages name the files, one line each, no traceback
    lines = result.stderr.strip().splitlines()
    assert lines[0].startswith(f"error: {files[0]}: ")  # the path given, not only its name
    assert lines[1].startswith(f"error: {files[2]}: ")
    assert "Traceback" not in result.stderr


def test_info_states_each_channels_range_amplification_and_gain(fcs_corpus):
    # a FACSCalibur's 10-bit channels, log-amplified over 4 decades but for two linear ones
    result = run_cli("info", fcs_corpus / "FACSCaliburHTS/Sample_Well_A02.fcs")
    assert result.returncode == 0, result.stderr
    assert re.search(r"^\s+3\s+FL1-H\s+FL1-Height\s+\[range 1024, log, 4 decades\]$", result.stdout, re.M)
    assert re.search(r"^\s+6\s+FL2-A\s+\[range 1024, linear\]$", result.stdout, re.M)


def test_info_human_output_bad_file_nonzero(fcs_corpus, tmp_path):
    missing = tmp_path / "absent.fcs"
    result = run_cli("info", missing, fcs_corpus / "cyflow_cube_8/cyflow_cube_8.fcs")
    assert result.returncode == 1
    assert f"error: {missing}: file not found" in result.stderr
    assert "events: 725" in result.stdout
    assert "spillover: no" in result.stdout


def test_info_multicenter(multicenter_dir):
    result = run_cli("info", "--json", multicenter_dir / "multicenter_01.fcs")
    assert result.returncode == 0
    ds = json.loads(result.stdout)[0]["datasets"][0]
    assert ds["events"] == 55621
    assert [c["pnn"] for c in ds["channels"]] == ["CCR6", "CD20", "CD45", "CD14", "CD16", "CD8", "CD3", "CD4"]


def test_info_reports_an_unreadable_data_set_and_shows_the_others(tmp_path):
    import numpy as np
    from test_fcs_properties import build_fcs

    good = [np.arange(4, dtype=np.float32)] * 2
    hist = dict(columns=[np.arange(8, dtype=np.uint64)], datatype="I", widths=[2], ranges=[1024],
                extra={"$MODE": "U"})
    path = tmp_path / "fc500.lmd"
    path.write_bytes(build_fcs(hist, dict(columns=good, datatype="F")))
    result = run_cli("info", path)
    assert result.returncode == 0, result.stderr
    assert "data sets: 2" in result.stdout
    assert re.search(r"\[fc500#1\]\n\s+not readable: histogram data \(\$MODE U\)", result.stdout)
    assert re.search(r"\[fc500#2\]\n\s+events: 4", result.stdout)
    report = json.loads(run_cli("info", "--json", path).stdout)[0]
    assert "histogram" in report["datasets"][0]["error"]
    assert report["datasets"][1]["events"] == 4
