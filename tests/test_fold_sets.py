"""The patients each protocol's folds hold out, and the offline scoring of bench_blend_parts.py
(the rules that combine the default's parts) on a fold file written by hand."""

import sys
from pathlib import Path

import numpy as np
import pytest

from gating_core.evaluation import group_held_out_sets, one_group_held_out_sets, patient_fold_sets
from gating_core.fcs import Channel, Sample

BENCH = Path(__file__).resolve().parent.parent / "bench"


def test_leaving_one_group_out_holds_out_each_group_in_order_of_appearance():
    assert group_held_out_sets(["b", "a", "b", "c", 1], 5) == [[0, 2], [1], [3], [4]]


def test_training_on_one_group_holds_out_every_other_group():
    assert one_group_held_out_sets(["x", "y", "x", "y", "z", "z"], 6) == [[1, 3, 4, 5], [0, 2, 4, 5], [0, 1, 2, 3]]


@pytest.mark.parametrize("call, message", [
    (lambda: group_held_out_sets(["a", "a", "a"], 3), "at least two groups"),
    (lambda: group_held_out_sets(["a", "b"], 3), "2 group labels for 3 patients"),
    (lambda: one_group_held_out_sets(["a", "b", "a"], 3), "two or more patients in each group: b"),
    (lambda: patient_fold_sets(5, 1), "1 folds over 5 patients"),
    (lambda: patient_fold_sets(3, 4), "4 folds over 3 patients"),
    (lambda: patient_fold_sets(3, 2), "at least two training patients"),
])
def test_a_split_that_cannot_be_made_is_refused_with_its_reason(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_folds_over_patients_split_every_patient_once_the_same_way_for_a_seed():
    folds = patient_fold_sets(30, 2, seed=0)
    assert [len(f) for f in folds] == [15, 15]
    assert sorted(folds[0] + folds[1]) == list(range(30))
    assert all(f == sorted(f) for f in folds)
    assert patient_fold_sets(30, 2, seed=0) == folds
    assert patient_fold_sets(30, 2, seed=1) != folds
    assert [len(f) for f in patient_fold_sets(10, 3, seed=0)] == [4, 3, 3]


def test_few_patients_of_one_batch_train_and_every_patient_of_the_other_is_held_out(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    from bench_unseen import FEW_OF_ONE_BATCH, few_of_one_group, held_out_sets

    groups = ["b1"] * 18 + ["b2"] * 12
    folds = few_of_one_group(groups, seed=0)
    assert [group for group, _ in folds] == ["b1", "b2"]
    for group, held in folds:
        trained = sorted(set(range(30)) - set(held))
        assert len(trained) == FEW_OF_ONE_BATCH == 4 and all(groups[i] == group for i in trained)
        assert all(i in held for i, g in enumerate(groups) if g != group)
    assert few_of_one_group(groups, seed=0) == folds and few_of_one_group(groups, seed=1) != folds
    assert held_out_sets("dlbcl-batch-4", groups, 0) == [held for _, held in folds]


def test_a_thinned_population_keeps_its_share_and_every_other_cell_in_order(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    from bench_unseen import thin_population

    labels = [np.array(["a"] * 300 + ["b"] * 700), np.array(["b", "a"] * 50), np.array(["a"] * 5 + ["b"] * 95)]
    samples = [Sample(f"p{i}", np.arange(len(y) * 2, dtype=np.float32).reshape(-1, 2), [Channel("x"), Channel("y")])
               for i, y in enumerate(labels)]
    thinned, kept = thin_population(samples, labels, "a", [0.01, 0.0, 0.5], seed=0)
    # 1% of 700 others is 7 cells; none of 'a' in the second; the third keeps its 5 (fewer than asked).
    assert [int(np.sum(y == "a")) for y in kept] == [7, 0, 5]
    assert [int(np.sum(y == "b")) for y in kept] == [700, 50, 95]
    for sample, before, y, after in zip(thinned, samples, kept, labels):
        assert len(sample.events) == len(y) and sample.name == before.name
        rows = (sample.events[:, 0] // 2).astype(int)  # each event's row in the sample it came from
        assert np.all(np.diff(rows) > 0) and np.array_equal(after[rows], y)
    again, _ = thin_population(samples, labels, "a", [0.01, 0.0, 0.5], seed=0)
    other, _ = thin_population(samples, labels, "a", [0.01, 0.0, 0.5], seed=1)
    assert np.array_equal(again[0].events, thinned[0].events)
    assert not np.array_equal(other[0].events, thinned[0].events)


@pytest.fixture
def blend_bench(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    import bench_blend_parts
    yield bench_blend_parts
    sys.modules.pop("bench_blend_parts", None)


def test_the_blend_bench_scores_each_rule_from_the_parts_probabilities(tmp_path, blend_bench, capsys):
    # Three cells, populations a and b; the parts disagree so that each rule calls them its own way.
    transfer = np.array([[0.9, 0.1], [0.9, 0.1], [0.2, 0.8]], np.float32)
    shared = np.array([[0.1, 0.9], [0.6, 0.4], [0.001, 0.999]], np.float32)
    own = np.array([[0.1, 0.9], [0.6, 0.4], [0.7, 0.3]], np.float32)
    weight = 2.0 / 3.0
    default = (1 - weight) * transfer + weight * (shared + own) / 2
    arrays = {"populations": np.array(["a", "b"]), "weight": np.float64(weight),
              "0:transfer": transfer, "0:shared": shared, "0:own": own, "0:default": default,
              "0:lda": np.array([[0.0, 1.0]] * 3, np.float32), "0:trees": np.array([[1.0, 0.0]] * 3, np.float32),
              "0:truth": np.array(["a", "a", "b"]), "0:name": np.array("p1"), "0:novelty": np.float64(0.5),
              "0:novelty_threshold": np.float64(1.5)}
    np.savez(tmp_path / "demo__00.npz", **arrays)
    table = blend_bench.score(tmp_path, "accuracy")["demo"]
    # default, the thirds: cell 1 b (0.37 against 0.63: wrong), cell 2 a (0.7), cell 3 b (0.7).
    assert table["default"] == pytest.approx([2 / 3])
    # a quarter of trees (all a) turns cell 1 only; a quarter of LDA (all b) none.
    assert table["plus-trees"] == pytest.approx([1.0]) and table["plus-lda"] == pytest.approx([2 / 3])
    assert table["confidence"] == pytest.approx([2 / 3]) and table["geometric-generative"] == pytest.approx([2 / 3])
    # vote: shared and own call b on cell 1 (wrong), a on cell 2 and disagree on cell 3 where transfer
    # and shared call b.
    assert table["vote"] == pytest.approx([2 / 3])
    # geometric: the shared fit's 0.001 on cell 3 vetoes a, as does own's 0.9 on b for cell 1.
    assert table["geometric"] == pytest.approx([2 / 3])
    assert table["lda"] == pytest.approx([1 / 3]) and table["trees"] == pytest.approx([2 / 3])
    # novelty 0.5 halves the adapted share (1/3): cell 1 goes to the transfer model's a.
    assert table["novelty-faded"] == pytest.approx([1.0])
    assert blend_bench.score(tmp_path, "macro-f1")["demo"]["novelty-faded"] == pytest.approx([1.0])
    # The parts disagree on a third of the cells: no trees for this familiar patient.
    assert table["familiar-trees"] == table["default"]
    # trees (all a) for the transfer model: cell 1 b (0.6), cell 2 a (0.73), cell 3 a (0.57);
    # half trees: b (0.62), a, b (0.57)
    assert table["trees-for-transfer"] == pytest.approx([1 / 3]) and table["half-trees"] == pytest.approx([2 / 3])
    # the adapted populations at a third: the transfer model's a on cells 1 and 2 (0.63, 0.80), b on 3 (0.75)
    assert table["adapted-third"] == pytest.approx([1.0])
    # a fold run without --embedding-trees is not scored by its rules
    assert table["embedding-trees"] == [] and table["embedding-trees-for-transfer"] == []
    assert table["aligned-trees"] == [] and table["half-aligned-trees"] == [] and table["pooled-logistic"] == []
    assert blend_bench.main(["score", str(tmp_path)]) == 0
    (row,) = [line.split() for line in capsys.readouterr().out.splitlines() if line.startswith("demo")]
    # the two embedding rules and the three aligned ones; the rare populations' rules (familiar
    # needs an array this file lacks; rare-columns gives the default's calls, no population
    # being under 5% of the adapted populations' probabilities; plain-mix is the default's mix;
    # rare-shared and rare-disjoint need the training shares this file lacks); then LDA and
    # trees, then pooled logistic
    assert row[-13:-3] == ["-"] * 6 + ["0.667/0.667", "0.667/0.667"] + ["-"] * 2
    assert row[-3:] == ["0.333/0.333", "0.667/0.667", "-"]
    # --rules: those alone, the default first
    assert blend_bench.main(["score", str(tmp_path), "--rules", "trees,vote"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].split() == ["set", "default", "trees", "vote"]
    assert printed[1].split() == ["demo", "0.667/0.667", "0.667/0.667", "0.667/0.667"]
    assert blend_bench.main(["score", str(tmp_path), "--rules", "trees,nonsense"]) == 2
    assert "unknown rules: nonsense" in capsys.readouterr().err
    # with them (all b): alone b, b, b; in the mix b (0.93), b (0.6), b
    np.savez(tmp_path / "demo__01.npz", **arrays, **{"0:embedding_trees": np.array([[0.0, 1.0]] * 3, np.float32)})
    table = blend_bench.score(tmp_path, "accuracy")["demo"]
    assert table["default"] == pytest.approx([2 / 3, 2 / 3])
    assert table["embedding-trees"] == pytest.approx([1 / 3])
    assert table["embedding-trees-for-transfer"] == pytest.approx([1 / 3])
    # aligned trees (all a): alone a, a, a; for the transfer model b (0.6), a (0.73), a (0.57);
    # beside it b (0.62), a, b (0.57)
    np.savez(tmp_path / "demo__02.npz", **arrays, **{"0:aligned_trees": np.array([[1.0, 0.0]] * 3, np.float32)})
    table = blend_bench.score(tmp_path, "accuracy")["demo"]
    assert table["aligned-trees"] == pytest.approx([2 / 3])
    assert table["aligned-trees-for-transfer"] == pytest.approx([1 / 3])
    assert table["half-aligned-trees"] == pytest.approx([2 / 3])
    # pooled logistic (a, b, b): two cells of three
    np.savez(tmp_path / "demo__03.npz", **arrays,
             **{"0:pooled_logistic": np.array([[0.8, 0.2], [0.4, 0.6], [0.3, 0.7]], np.float32)})
    assert blend_bench.score(tmp_path, "accuracy")["demo"]["pooled-logistic"] == pytest.approx([2 / 3])


def test_the_blend_bench_gives_trees_to_a_familiar_patient_the_parts_agree_on(tmp_path, blend_bench):
    # Two cells every part calls a (0.6), trees b, truth b; two patients, one near the training
    # patients (novelty 0.3 of a threshold 1.5: trees' share 0.5 * 0.8 = 0.4, so b at 0.64) and
    # one near the threshold (1.2: share 0.1, a stays at 0.54).
    calls = np.array([[0.6, 0.4], [0.6, 0.4]], np.float32)
    arrays = {"populations": np.array(["a", "b"]), "weight": np.float64(2.0 / 3.0)}
    for p, novelty in enumerate((0.3, 1.2)):
        arrays.update({f"{p}:{part}": calls for part in ("transfer", "shared", "own", "default", "lda")})
        arrays.update({f"{p}:trees": np.array([[0.0, 1.0]] * 2, np.float32), f"{p}:truth": np.array(["b", "b"]),
                       f"{p}:name": np.array(f"p{p}"), f"{p}:novelty": np.float64(novelty),
                       f"{p}:novelty_threshold": np.float64(1.5)})
    np.savez(tmp_path / "demo__00.npz", **arrays)
    table = blend_bench.score(tmp_path, "accuracy")["demo"]
    assert table["default"] == pytest.approx([0.0, 0.0])
    assert table["familiar-trees"] == pytest.approx([1.0, 0.0])


def test_the_blend_bench_reviews_the_parts_disagreement(tmp_path, blend_bench, capsys):
    # Five cells: the transfer model calls a, a, b, b, b; the adapted fits (their mean) b, a, b,
    # a, and a tie on the fifth (each fit sure of another population), which names no population
    # of their own: a disagreement, as gating counts it, whatever the tie's first name.
    transfer = np.array([[0.9, 0.1], [0.8, 0.2], [0.1, 0.9], [0.3, 0.7], [0.2, 0.8]], np.float32)
    shared = np.array([[0.2, 0.8], [0.9, 0.1], [0.1, 0.9], [0.9, 0.1], [1.0, 0.0]], np.float32)
    own = np.array([[0.3, 0.7], [0.7, 0.3], [0.3, 0.7], [0.7, 0.3], [0.0, 1.0]], np.float32)
    default = transfer / 3 + (shared + own) / 3
    arrays = {"populations": np.array(["a", "b"]), "weight": np.float64(2.0 / 3.0),
              "0:transfer": transfer, "0:shared": shared, "0:own": own, "0:default": default,
              "0:truth": np.array(["b", "a", "b", "b", "b"]), "0:name": np.array("p1"),
              "0:novelty": np.float64(2.5), "0:novelty_threshold": np.float64(1.5)}
    np.savez(tmp_path / "demo__00.npz", **arrays)
    table = blend_bench.review_table([tmp_path])
    assert table[["set", "patient", "method"]].values.tolist() == [["demo", "p1", "marginal"]]
    assert table.loc[0, "disagreement"] == pytest.approx(0.6)  # cells 1, 4 and 5
    # the default (a third each) calls b (0.47 against 0.53), a, b, a (0.63), b: all but cell 4 right
    assert table.loc[0, "accuracy"] == pytest.approx(0.8)
    assert (table.loc[0, "novelty"], table.loc[0, "novelty_threshold"]) == (2.5, 1.5)
    assert blend_bench.main(["review", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert "flagged (disagreement > 0.2): 1 patients, mean accuracy 0.800" in printed
    assert "beside it, the novelty warning: 1 patients" in printed


def test_the_blend_bench_scores_each_part_alone_and_the_best(tmp_path, blend_bench, capsys):
    # The transfer model calls a, a, b, b; the adapted fits (their mean) b, a, b, a; the fold's
    # default a everywhere; the truth b, a, b, b.
    transfer = np.array([[0.9, 0.1], [0.8, 0.2], [0.1, 0.9], [0.3, 0.7]], np.float32)
    shared = np.array([[0.2, 0.8], [0.9, 0.1], [0.1, 0.9], [0.9, 0.1]], np.float32)
    own = np.array([[0.3, 0.7], [0.7, 0.3], [0.3, 0.7], [0.7, 0.3]], np.float32)
    arrays = {"populations": np.array(["a", "b"]), "weight": np.float64(2.0 / 3.0),
              "0:transfer": transfer, "0:shared": shared, "0:own": own,
              "0:default": np.array([[0.6, 0.4]] * 4, np.float32), "0:truth": np.array(["b", "a", "b", "b"]),
              "0:name": np.array("p1"), "0:novelty": np.float64(0.5), "0:novelty_threshold": np.float64(1.5)}
    np.savez(tmp_path / "demo__00.npz", **arrays)
    table = blend_bench.parts_table([tmp_path])
    row = table.iloc[0]
    assert bool(row["flagged"])  # they disagree on half the cells
    assert (row["default"], row["transfer"], row["adapted"], row["best"]) == pytest.approx((0.25, 0.75, 0.75, 0.75))
    assert blend_bench.main(["parts", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert "== flagged: 1 patients; mean / worst accuracy" in printed
    assert "default 0.250 / 0.250  transfer 0.750 / 0.750  adapted 0.750 / 0.750  best 0.750 / 0.750" in printed
    assert "transfer alone beats the default by more than a point on 1 (by 0.500 on average)" in printed
    assert "gated below 0.8 by the default: 1; the best part lifts 0 of them" in printed


def test_the_blend_bench_leaves_each_patient_out_of_a_changed_set_too(blend_bench):
    assert blend_bench.source_set("mc-patient") == "mc-batch"
    assert blend_bench.source_set("mc-patient+rare-b") == "mc-batch+rare-b"
    assert blend_bench.source_set("dlbcl-folds+rare-t") == "dlbcl-folds+rare-t"
    groups = ["A", "A", "B"]
    assert blend_bench.fold_sets("dlbcl-patient+partial-t", groups, 0) == [[0], [1], [2]]
    assert blend_bench.fold_sets("mc-batch+rare-b", groups, 0) == [[0, 1], [2]]  # each group out, in order


def test_the_blend_bench_counts_each_parts_calls_of_one_population(tmp_path, blend_bench, capsys):
    # Truth b, a, b, a. The transfer model calls a, a, b, a (precision 1, recall 1/2); the
    # adapted fits b, b, b, b (precision 1/2, recall 1); the default b, a, b, b.
    transfer = np.array([[0.9, 0.1], [0.8, 0.2], [0.1, 0.9], [0.7, 0.3]], np.float32)
    adapted = np.array([[0.2, 0.8]] * 4, np.float32)
    default = np.array([[0.4, 0.6], [0.6, 0.4], [0.1, 0.9], [0.3, 0.7]], np.float32)
    arrays = {"populations": np.array(["a", "b"]), "weight": np.float64(2.0 / 3.0),
              "0:transfer": transfer, "0:shared": adapted, "0:own": adapted, "0:default": default,
              "0:truth": np.array(["b", "a", "b", "a"]), "0:name": np.array("p1"), "0:novelty": np.float64(0.5)}
    np.savez(tmp_path / "demo__00.npz", **arrays)
    # a second fold of the same set, one patient, without population b: counts nothing for b
    np.savez(tmp_path / "demo__01.npz", populations=np.array(["a", "c"]), weight=np.float64(2.0 / 3.0),
             **{"0:transfer": transfer, "0:default": transfer, "0:truth": np.array(["a"] * 4),
                "0:name": np.array("p2"), "0:novelty": np.float64(0.5)})
    table = blend_bench.population_table([tmp_path], "b").set_index("part")
    assert list(table.index) == ["default", "transfer", "shared", "own"]  # no LDA, trees or logistic kept
    assert table.loc["transfer", ["called", "right", "cells"]].tolist() == [1, 1, 2]
    assert table.loc["own", ["called", "right", "cells"]].tolist() == [4, 2, 2]
    assert table.loc["default", ["precision", "recall"]].tolist() == pytest.approx([2 / 3, 1.0])
    assert table.loc["shared", ["precision", "recall"]].tolist() == pytest.approx([0.5, 1.0])
    assert blend_bench.main(["population", "b", str(tmp_path)]) == 0
    assert "demo transfer 1 1 2 1.000 0.500" in " ".join(capsys.readouterr().out.split())
    assert blend_bench.main(["population", "z", str(tmp_path)]) == 1
    assert "no held-out patient with population 'z'" in capsys.readouterr().err


def test_the_blend_bench_scores_the_rules_for_rare_populations(tmp_path, blend_bench):
    # 200 cells, two of them of the rare r (1% of the training cells). Patient 0: the transfer
    # model calls the two (0.9), the adapted populations six (0.99): they swelled. Patient 1: r
    # moved, the transfer model calls none of it, the adapted populations the two.
    n, weight = 200, 2.0 / 3.0
    truth = np.array(["r", "r"] + ["a"] * (n - 2))

    def calls(rare_cells, sure):
        proba = np.tile(np.array([[sure, 1 - sure]], np.float32), (n, 1))
        proba[:rare_cells] = [1 - sure, sure]
        return proba

    arrays = {"populations": np.array(["a", "r"]), "weight": np.float64(weight)}
    for p, (transfer, adapted) in enumerate([(calls(2, 0.9), calls(6, 0.99)), (calls(0, 0.9), calls(2, 0.99))]):
        reach = np.full((n, 2), 0.5, np.float32)
        if p == 1:
            reach[:2, 1] = 5.0  # the moved cells lie beyond r's training reach
        arrays.update({f"{p}:transfer": transfer, f"{p}:shared": adapted, f"{p}:own": adapted,
                       f"{p}:default": (1 - weight) * transfer + weight * adapted, f"{p}:truth": truth,
                       f"{p}:training_reach": reach, f"{p}:name": np.array(f"p{p}"),
                       f"{p}:novelty": np.float64(1.0), f"{p}:novelty_threshold": np.float64(1.5)})
    np.savez(tmp_path / "rare__00.npz", **arrays)
    table = blend_bench.score(tmp_path, "accuracy", ["familiar", "rare-columns", "plain-mix"])["rare"]
    # default (as the fold file has it: the plain mix): patient 0's four swollen cells r (2/3 * 0.99 + 1/3 * 0.1), patient 1 right
    assert table["default"] == pytest.approx([0.98, 1.0])
    # the plain mix: the default's here
    assert table["plain-mix"] == table["default"]
    # rare columns: r (under 5% in both patients' adapted calls) from the transfer model in both,
    # which loses the moved cells of patient 1
    assert table["rare-columns"] == pytest.approx([1.0, 0.99])
    # familiar: the adapted populations at a third on familiar cells (all of patient 0's: a at
    # 0.60 on the swollen ones), not on patient 1's moved cells
    assert table["familiar"] == pytest.approx([1.0, 1.0])
    # a fold file without the training reach is not scored by familiar
    del arrays["0:training_reach"], arrays["1:training_reach"]
    np.savez(tmp_path / "rare__00.npz", **arrays)
    assert blend_bench.score(tmp_path, "accuracy", ["familiar"])["rare"]["familiar"] == []


def test_the_blend_bench_scores_the_shared_fits_column_for_rare_populations(tmp_path, blend_bench):
    # 200 cells, two of them of r, rare in every training patient (1%). Patient 0: the two fits
    # call r on different cells (the shared-covariance fit on the right two, at 0.99; the
    # own-shape fit on two others, at 0.9); patient 1: both call the right two. The transfer
    # model gives r 0.3 everywhere.
    n, weight = 200, 2.0 / 3.0
    truth = np.array(["r", "r"] + ["a"] * (n - 2))

    def calls(cells, sure):
        proba = np.tile(np.array([[1 - 0.01, 0.01]], np.float32), (n, 1))
        proba[cells] = [1 - sure, sure]
        return proba

    transfer = np.tile(np.array([[0.7, 0.3]], np.float32), (n, 1))
    arrays = {"populations": np.array(["a", "r"]), "weight": np.float64(weight),
              "prior": np.array([0.99, 0.01]), "largest_shares": np.array([0.995, 0.01])}
    for p, (shared, own) in enumerate([(calls([0, 1], 0.99), calls([2, 3], 0.9)),
                                       (calls([0, 1], 0.99), calls([0, 1], 0.9))]):
        arrays.update({f"{p}:transfer": transfer, f"{p}:shared": shared, f"{p}:own": own,
                       f"{p}:default": (1 - weight) * transfer + weight * (shared + own) / 2,
                       f"{p}:truth": truth, f"{p}:name": np.array(f"p{p}"),
                       f"{p}:novelty": np.float64(1.0), f"{p}:novelty_threshold": np.float64(1.5)})
    np.savez(tmp_path / "rare__00.npz", **arrays)
    table = blend_bench.score(tmp_path, "accuracy", ["rare-shared", "rare-disjoint"])["rare"]
    # the even mix gives patient 0's r cells 0.1 + 2/3 (0.99 + 0.1) / 2 = 0.46: both called a
    assert table["default"] == pytest.approx([0.99, 1.0])
    # the shared fit's column for r (0.99 / (0.99 + 0.455), normalised) takes them back; where
    # the fits agree (patient 1) the overlap rule leaves the mix as it is
    assert table["rare-shared"] == pytest.approx([1.0, 1.0])
    assert table["rare-disjoint"] == pytest.approx([1.0, 1.0])
    patient_1 = list(blend_bench.patients(tmp_path / "rare__00.npz"))[1]
    np.testing.assert_allclose(blend_bench.RULES["rare-disjoint"](patient_1), patient_1["default"], rtol=1e-6)
    # a fold file without the training shares is scored by neither
    del arrays["largest_shares"]
    np.savez(tmp_path / "rare__00.npz", **arrays)
    assert blend_bench.score(tmp_path, "accuracy", ["rare-shared"])["rare"]["rare-shared"] == []


def test_the_blend_bench_checks_swelling_as_gating_does_where_the_halves_part_ways(blend_bench):
    # 100 cells of a, b and the rare r (1% of every training patient). The transfer model calls
    # r on cells 0-1, a on 2-49, b on 50-99; the adapted populations r on 0-9: r swelled.
    n = 100
    transfer = np.zeros((n, 3), np.float32)
    transfer[:2] = [0.05, 0.05, 0.9]
    transfer[2:50] = [0.9, 0.05, 0.05]
    transfer[50:] = [0.05, 0.9, 0.05]
    adapted = np.where(transfer == 0.9, np.float32(0.99), np.float32(0.005)).astype(np.float32)
    adapted[:10] = [0.005, 0.005, 0.99]
    patient = {"populations": np.array(["a", "b", "r"]), "weight": 2.0 / 3.0, "transfer": transfer,
               "prior": np.array([0.5, 0.49, 0.01]), "largest_shares": np.array([0.6, 0.6, 0.01])}
    # The halves agree beside r: its column is the transfer model's, cells 2-9 stay a.
    assert np.argmax(blend_bench._checked_mix(patient, adapted), axis=1)[2:10].tolist() == [0] * 8
    # They part ways on 30 of the 90 other cells (1/3, beyond PARTING_SHARE): the plain mix,
    # which calls the eight r, as gating does.
    adapted[50:80] = [0.99, 0.005, 0.005]
    assert np.argmax(blend_bench._checked_mix(patient, adapted), axis=1)[2:10].tolist() == [2] * 8


@pytest.mark.parametrize("order", [[0, 1], [1, 0]])
def test_the_blend_bench_finds_a_tied_cell_familiar_only_within_each_tied_populations_reach(blend_bench, order):
    # The adapted fits each sure of another population: they tie. The first population lies
    # within the cell's training reach, the second beyond it: not familiar, whatever the order.
    transfer = np.array([[0.9, 0.1]], np.float32)[:, order]
    patient = {"weight": 2.0 / 3.0, "transfer": transfer, "shared": np.array([[1.0, 0.0]], np.float32)[:, order],
               "own": np.array([[0.0, 1.0]], np.float32)[:, order],
               "training_reach": np.array([[0.5, 5.0]], np.float32)[:, order]}
    # the adapted populations at the fold's weight (2/3), not a third: 0.3 + 1/3 against 0.033 + 1/3
    expected = np.array([[0.3 + 1 / 3, 0.1 / 3 + 1 / 3]])[:, order]
    np.testing.assert_allclose(blend_bench._familiar(patient), expected, rtol=1e-6)


def test_the_blend_bench_keeps_a_split_populations_parts_per_population(blend_bench):
    # 'rest' is two clusters with 'target' between them: the default splits it into two
    # components, whose columns the fold file must sum, as gating does.
    rng = np.random.default_rng(3)
    samples, labels = [], []
    for i in range(5):
        k = rng.choice(3, size=1500, p=(0.4, 0.4, 0.2))
        centres = np.array([[-4.0, 0.0], [4.0, 0.0], [rng.normal(0, 0.3), rng.normal(0, 0.3)]])
        cells = centres[k] + rng.normal(0, 0.6, (1500, 2))
        samples.append(Sample(f"p{i}", (cells * 100 + 1000).astype(np.float32), [Channel("FSC-A"), Channel("SSC-A")]))
        labels.append(np.where(k == 2, "target", "rest"))
    arrays = blend_bench.fit_fold(samples[:4], labels[:4], ["a", "a", "b", "b"], samples[4:], labels[4:], seed=0)
    assert list(arrays["populations"]) == ["rest", "target"]
    shared, own, transfer = arrays["0:shared"], arrays["0:own"], arrays["0:transfer"]
    assert shared.shape == own.shape == transfer.shape == (1500, 2)
    np.testing.assert_allclose(shared.sum(axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(own.sum(axis=1), 1.0, atol=1e-5)
    weight = float(arrays["weight"])
    np.testing.assert_allclose((1 - weight) * transfer + weight * (shared + own) / 2, arrays["0:default"], atol=1e-4)
    # each cell's distance to every population's training mean, in reach units: the target cells
    # within the target's reach
    reach = arrays["0:training_reach"]
    assert reach.shape == (1500, 2) and reach.dtype == np.float32
    assert np.mean(reach[arrays["0:truth"] == "target", 1] <= 1.0) > 0.99
    # the standard methods beside the parts, every event in the populations' order
    for part in ("lda", "trees", "pooled_logistic"):
        assert arrays[f"0:{part}"].shape == (1500, 2)
        np.testing.assert_allclose(arrays[f"0:{part}"].sum(axis=1), 1.0, atol=1e-5)
    called = arrays["populations"][np.argmax(arrays["0:pooled_logistic"], axis=1)]
    assert np.mean(called == arrays["0:truth"]) > 0.9


def test_the_blend_bench_moves_a_cell_back_by_its_populations_shift(blend_bench):
    # Population a moved by (1, 0), b by (0, -2); a cell half a, half b moves back by half of each.
    shift = np.array([[1.0, 0.0], [0.0, -2.0]])
    cells = np.array([[3.0, 3.0], [5.0, 5.0], [0.0, 0.0]], np.float32)
    responsibilities = np.array([[1.0, 0.0], [0.0, 1.0], [0.5, 0.5]])
    moved = blend_bench.aligned_cells(cells, responsibilities, shift)
    assert moved.dtype == np.float32
    np.testing.assert_array_equal(moved, [[2.0, 3.0], [5.0, 7.0], [-0.5, 1.0]])


def test_the_blend_bench_gates_a_shifted_patient_with_trees_on_cells_moved_back(blend_bench):
    # a at x = 0 and b at x = 4 in four training patients; in the fifth both moved 1.8 to the right,
    # so pooled trees (split near x = 2) call many of its a cells b. Moved back by the shift its
    # adapted populations found, they are gated as in training.
    rng = np.random.default_rng(5)
    samples, labels = [], []
    for i in range(5):
        k = rng.choice(2, size=1500, p=(0.5, 0.5))
        cells = np.column_stack([4.0 * k + (1.8 if i == 4 else 0.0), np.zeros(1500)]) + rng.normal(0, 0.6, (1500, 2))
        samples.append(Sample(f"p{i}", (cells * 100 + 1000).astype(np.float32), [Channel("FSC-A"), Channel("SSC-A")]))
        labels.append(np.where(k == 1, "b", "a"))
    arrays = blend_bench.fit_fold(samples[:4], labels[:4], ["g1", "g1", "g2", "g2"], samples[4:], labels[4:],
                                  seed=0, aligned_trees=True)
    truth = arrays["0:truth"]
    called = {part: arrays["populations"][np.argmax(arrays[f"0:{part}"], axis=1)] for part in ("trees", "aligned_trees")}
    assert np.mean(called["trees"] == truth) < 0.9  # 0.83 here
    assert np.mean(called["aligned_trees"] == truth) > 0.98


def test_folds_over_patients_of_known_centers_hold_out_half_of_each_set_whatever_its_groups(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    from bench_unseen import held_out_sets, load_set

    centers = [f"center_{1 + i // 3}" for i in range(12)]
    folds = held_out_sets("simfolds-11", centers, 0)
    assert folds == patient_fold_sets(12, 2, 0) == held_out_sets("mc-folds+rare-b", centers, 0)
    assert held_out_sets("sim-11", centers, 0) == group_held_out_sets(centers, 12)
    # The same simulated cohort as sim-11: only the protocol differs.
    samples, labels, groups = load_set("simfolds-11")
    same = load_set("sim-11")
    assert groups == same[2] == centers
    assert all(np.array_equal(a.events, b.events) for a, b in zip(samples, same[0]))


def test_models_that_find_their_groups_are_given_none_and_hold_out_the_sets_own_folds(monkeypatch):
    """``--groups-found`` runs the set's folds with models fitted as ``train`` without ``--groups``:
    no group reaches them, and each fold is named as the set's own protocol names it (a group left
    out, "trained on" a group, "fold k")."""
    monkeypatch.syspath_prepend(str(BENCH))
    import bench_unseen

    centers = [f"center_{1 + i // 3}" for i in range(12)]
    monkeypatch.setattr(bench_unseen, "load_set", lambda name, seed: (list(range(12)), [None] * 12, centers))
    calls = []

    def evaluation(samples, labels, held, protocol, methods, params, **options):
        calls.append((held, protocol, options))
        return "rows"

    monkeypatch.setattr(bench_unseen, "held_out_evaluation", evaluation)
    assert bench_unseen.run_set("sim-11", ["marginal"], 0, groups_found=True) == "rows"
    [(held, protocol, options)] = calls
    assert held == group_held_out_sets(centers, 12) and protocol == "groups-found"
    assert options == {"names": ["center_1", "center_2", "center_3", "center_4"]}
    bench_unseen.run_set("simfolds-11", ["marginal"], 0, groups_found=True)
    assert calls[1][0] == patient_fold_sets(12, 2, 0) and calls[1][2] == {"names": ["fold 1", "fold 2"]}
    bench_unseen.run_set("dlbcl-batch", ["marginal"], 0, groups_found=True)
    assert calls[2][0] == one_group_held_out_sets(centers, 12)
    assert calls[2][2] == {"names": [f"trained on center_{k}" for k in range(1, 5)]}
    bench_unseen.run_set("sim2x6-11+bnk-rest", ["marginal"], 0, groups_found=True)
    assert calls[3][0] == group_held_out_sets(centers, 12) and calls[3][2] == calls[0][2]
    with pytest.raises(SystemExit, match="dlbcl-batch-4"):
        bench_unseen.run_set("dlbcl-batch-4", ["marginal"], 0, groups_found=True)


def test_a_cohort_of_another_shape_holds_its_centers_patients_and_leaves_each_center_out(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    from bench_unseen import held_out_sets, load_set

    samples, labels, groups = load_set("sim2x3-5")
    assert groups == ["center_1"] * 3 + ["center_2"] * 3
    assert len(samples) == len(labels) == 6 and all(len(y) == s.n_events == 6000 for s, y in zip(samples, labels))
    assert held_out_sets("sim2x3-5", groups, 0) == [[0, 1, 2], [3, 4, 5]]
    with pytest.raises(SystemExit, match="two centers"):
        load_set("sim1x6-5")
