"""Auto-gate: gate new patients with the model, review, correct, accept and export."""

import numpy as np
import streamlit as st

from gating_core.gates import AxisScale, Gate, GateError, safe_stem
from gating_core.gates.agreement import flat_statistics
from gating_core.model.result import PART_TITLES, review_flags
from gating_core.reports.plotting import population_colors
from ui import autogate_view, cache, charts, exports, parts_view
from gating_core.method.refinement import MAX_MOVED_SHARE
from ui.app_state import (acceptance_acknowledgement, later_twins, missing_model_channels, new_population_name,
                          review_notice, review_worklist, shape_from_selection, unknown_cells_notice,
                          worklist_display)
from ui.common import (channel_label, confirm_action, default_xy, get_store, label_versions, model_offers,
                       model_picker, plot_range, refresh_status, require_patients, scale_select, show_label_change)
from ui.training import is_transductive, refit_caption

LOW = "low confidence"
NEW_POPULATION = "New population…"
#: Corrections that can be undone, last first (each keeps a copy of the patient's populations).
UNDO_STEPS = 10
store = get_store()
state = st.session_state
state.setdefault("ag_chart_version", 0)
st.title("Auto-gate new patients")
st.caption("Gate new patients with the current model, then review: colors show the predicted populations, "
           "the confidence histogram shows where the model hesitates, and a warning appears when a patient "
           "is unlike every training patient or when the model's parts disagree on many of its cells. Correct "
           "cells with the lasso, accept the patient (it joins the historical patients), and export.")
if not require_patients(store):
    st.stop()
model_offers(store, "ag")
if store.model() is None:
    st.info("No model yet: train one on the **Train** page or load a saved model there.")
    st.stop()

m1, m2 = st.columns([2, 3])
model_name = model_picker(m1, store, "ag_model", "Model")
model = store.models[model_name]
# Only patients with every channel the model needs are offered by default; the others are named.
unfit = {n: missing_model_channels(model, store.patients[n].sample.channels) for n in store.unlabeled()}
compatible = [n for n, missing in unfit.items() if not missing]
# A patient whose events an earlier one holds (the same file loaded twice) is not ticked.
twins = later_twins(compatible, list(store.patients), store.same_events(compatible))
# A patient under review keeps its review: gating it again would throw the corrections away.
reviewed = [n for n in compatible if store.patients[n].is_reviewed]
targets = m2.multiselect("Patients to gate", list(store.patients),
                         default=[n for n in compatible if n not in twins and n not in reviewed],
                         key=f"ag_targets_{model_name}")
for name in reviewed:
    if name not in targets:
        st.caption(f"{name} is not selected: it is under review, and gating it again would discard its "
                   "corrections.")
regate = [n for n in targets if store.patients[n].is_reviewed]
discard = not regate or st.checkbox(
    f"Discard the review of {', '.join(regate)} and gate {'it' if len(regate) == 1 else 'them'} again",
    key="ag_discard_review", help="Their corrected cells and adjusted gates are replaced by the model's gating.")
for name, first in twins.items():
    if name not in targets:
        st.caption(f"{name} is not selected: it holds exactly the events of {first} (the same file loaded twice?).")
for name, missing in unfit.items():
    if missing and name in targets:
        st.warning(f"{name} lacks {', '.join(missing)}, which {model_name} needs: it cannot be gated by this model.")
    elif missing:
        st.caption(f"{name} is not selected: it lacks {', '.join(missing)}, which {model_name} needs.")
if st.button("Run auto-gating", type="primary", disabled=not targets or not discard, key="ag_run"):
    bar = st.progress(0.0, text="Starting…")
    for i, name in enumerate(targets):
        bar.progress(i / len(targets), text=f"Gating {name} ({i + 1}/{len(targets)})")
        try:
            store.set_result(name, model.gate(store.patients[name].sample), model_name)
            if is_transductive(model):  # the per-patient refit's cost, shown below
                state.setdefault("ag_refit_seconds", {}).setdefault(model_name, {})[name] = model.last_fit_seconds_
        except Exception as exc:
            st.error(f"Auto-gating failed for {exc}" if str(exc).startswith(name) else
                     f"{name}: auto-gating failed ({exc})")
    bar.progress(1.0, text="Done")
    state.ag_chart_version += 1
    refresh_status(store)
if is_transductive(model):
    st.caption(refit_caption(state.get("ag_refit_seconds", {}).get(model_name, {})))

gated = [n for n, r in store.patients.items() if r.result is not None or r.result_loader is not None]
if not gated:
    st.stop()

st.divider()
worklist = review_worklist({n: store.patients[n].result_novelty for n in gated},
                           accepted=[n for n in gated if store.patients[n].is_accepted])
flagged = int((worklist["review"] != "").sum())
with st.expander(f"Gated patients: {flagged} of {len(gated)} to review first" if flagged else
                 f"Gated patients: none flagged for review ({len(gated)})", expanded=bool(flagged)):
    st.table(worklist_display(worklist))
    st.caption("Parts disagree on: the share of the patient's cells that the model's two parts call different "
               "populations, or that the patient's own populations leave undecided between two (the transfer "
               "model, which carries the training patients' boundaries over, and the "
               "patient's own populations, fitted to its clusters; each can gate the patient alone further down "
               "the page). Above 20% the patient is flagged, as patients gated less accurately were. Novelty: how "
               "far the patient's cells lie from the nearest training patient's; above the threshold it is "
               "unlike every training patient.")
to_review = set(worklist.loc[worklist["review"] != "", "patient"])
# The picker starts at the first patient to review, and keeps the reviewer's choice when they
# come back from another page (Streamlit drops a widget's state with its page).
if state.get("ag_patient") not in gated:
    kept = state.get("ag_patient_kept")
    first = next((n for n in worklist["patient"] if n in to_review), gated[0])
    state["ag_patient"] = kept if kept in gated else first
elif state.get("ag_patient_marked") != to_review:
    # The browser keeps showing the choice's old text (" · to review" after an accept) until its
    # value is sent again.
    state["ag_patient"] = state["ag_patient"]
state["ag_patient_marked"] = to_review
patient = st.selectbox("Review patient", gated, key="ag_patient",
                       format_func=lambda n: f"{n} · to review" if n in to_review else n)
state["ag_patient_kept"] = patient
record = store.patients[patient]
# The model that gated this patient (the current one when that model is gone): the populations
# its result names, its corrections refine and its gates are fitted with.
own_model = store.gating_model(patient)
gating_model = model if own_model is None else own_model
pop_names = [str(p) for p in gating_model.populations_]
result = record.load_result()
sample = record.sample
novelty = getattr(result, "novelty", None)
notice = review_notice(patient, novelty)
accepted = record.is_accepted
if accepted:
    # Reviewed and accepted: what the gating flagged is history, not a task.
    st.info(f"{patient} was accepted: it is a historical patient for the next training.")
    if notice is not None:
        st.caption(f"When it was gated: {notice[1]}")
elif notice is not None and notice[0] == "warning":
    st.warning(notice[1], icon=":material/warning:")
elif notice is not None:
    st.success(notice[1], icon=":material/check_circle:")
unknown_notice = unknown_cells_notice(patient, record.populations, pop_names)
if unknown_notice:
    st.warning(unknown_notice, icon=":material/help:")
part = getattr(result, "part", None)
st.caption(f"Auto-gated with the model **{record.result_model or 'not recorded'}**"
           + (f", by {PART_TITLES[part]}" if part else "")
           + ("" if record.result_model == model_name else f" (the current model is {model_name})") + ".")

populations = np.asarray(record.populations).astype(str)
confidence = record.confidence
colors = population_colors(sorted(set(pop_names) | set(np.unique(populations)),
                                  key=lambda p: (p.casefold() in ("other", "ungated"), p)))

channels = sample.pnn
# The first view: scatter, or the channels that set the largest population apart. Chosen once, for
# the first patient shown: the same index on every rerun keeps the reviewer's own choice.
first_view = state.get("ag_first_view")
if first_view is None or max(first_view) >= len(channels):
    first_view = state["ag_first_view"] = default_xy(channels, sample, populations)
xi, yi = first_view
left, right = st.columns([3, 2])
with left:
    a = st.columns(4)
    x_ch = a[0].selectbox("X channel", channels, index=xi, format_func=lambda c: channel_label(sample, c), key="ag_x")
    y_ch = a[1].selectbox("Y channel", channels, index=yi, format_func=lambda c: channel_label(sample, c), key="ag_y")
    x_scale_d = scale_select(a[2], "X transform", x_ch, "ag_xs", store)
    y_scale_d = scale_select(a[3], "Y transform", y_ch, "ag_ys", store)
    x_kind, y_kind = x_scale_d["kind"], y_scale_d["kind"]
with right:
    threshold = st.slider("Low-confidence threshold", 0.0, 1.0, 0.6, 0.05, key="ag_threshold",
                          help="Cells below this confidence are highlighted for review.")
    highlight = st.checkbox("Highlight low-confidence cells on the plot", key="ag_highlight")

tokens = (record.token,)
x_range = plot_range(store, tokens, x_ch, x_scale_d, [sample])
y_range = plot_range(store, tokens, y_ch, y_scale_d, [sample])
idx = cache.dots(record.token, sample.n_events)
shown = populations[idx].astype(object)
plot_colors = dict(colors)
if highlight:
    shown = np.where(confidence[idx] < threshold, LOW, shown)
    plot_colors = {**{k: "#D9D9D9" for k in colors}, LOW: "#D55E00"}
panel = {"title": f"{patient}: predicted populations", "x": cache.display_values(record.token, x_ch, x_scale_d, sample)[idx],
         "y": cache.display_values(record.token, y_ch, y_scale_d, sample)[idx], "populations": shown}
fig = charts.scatter_panels([panel], AxisScale.from_dict(x_scale_d), AxisScale.from_dict(y_scale_d), x_range, y_range,
                            channel_label(sample, x_ch), channel_label(sample, y_ch), mode="population",
                            colors=plot_colors, height=520, selectable=True)
chart_col, side_col = st.columns([3, 2])
with chart_col:
    event = st.plotly_chart(fig, width="stretch", on_select="rerun", selection_mode=("lasso", "box"),
                            key=f"ag_chart_{state.ag_chart_version}_{patient}_{x_ch}_{y_ch}_{x_kind}_{y_kind}")
with side_col:
    low = int((confidence < threshold).sum())
    st.markdown(f"**Confidence** · {low:,} cells ({100 * low / max(sample.n_events, 1):.1f}%) below {threshold:.2f}")
    st.plotly_chart(charts.confidence_histogram(confidence, threshold), width="stretch", key="ag_conf")

    # Correction: the latest lasso/box selects cells (all events inside the shape, not just dots).
    # It is kept in the session until used, so that a rerun (or a test) finds it again.
    picked = shape_from_selection(getattr(event, "selection", None) if event is not None else None)
    if picked is not None:
        state["ag_pending_shape"] = {**picked, "patient": patient, "x": x_ch, "y": y_ch,
                                     "x_scale": x_scale_d, "y_scale": y_scale_d, "from_chart": True}
    elif state.get("ag_pending_shape", {}).get("from_chart"):
        state.pop("ag_pending_shape")  # the reviewer cleared the selection on the chart
    pending = state.get("ag_pending_shape")
    shape = None
    if pending is not None and (pending.get("patient"), pending.get("x"), pending.get("y")) == (patient, x_ch, y_ch):
        xs_, ys_ = AxisScale.from_dict(pending["x_scale"]), AxisScale.from_dict(pending["y_scale"])
        try:
            # a selection is stored like a gate of its kind: polygon vertices, or a box's two corners
            shape = Gate.from_dict({"name": "selection", "kind": pending["kind"], "x_channel": x_ch, "y_channel": y_ch,
                                    "vertices": pending["vertices"], "x_scale": xs_, "y_scale": ys_})
        except GateError:
            shape = None  # a click or a zero-area drag selects nothing
    st.markdown("**Correct cells**")
    if state.get("ag_correct_message"):
        st.success(state.pop("ag_correct_message"))
    if state.get("ag_held_back_message"):
        st.warning(state.pop("ag_held_back_message"))
    # The cells circled so far on this gating, with the label given: what the refinement fits.
    # Kept with the gating they correct: a new gating (run again, another part, another session's)
    # starts with none.
    kept_circled = state.setdefault("ag_circled", {}).get(patient)
    circled = kept_circled[1] if kept_circled is not None and kept_circled[0] == id(result) else None
    if circled is None and record.corrected is not None:
        # corrected in an earlier session: the cells that differ from the model's gating stand in
        differs = np.flatnonzero(np.asarray(record.corrected).astype(str) != np.asarray(result.populations).astype(str))
        circled = {int(i): str(record.corrected[i]) for i in differs}
    circled = dict(circled or {})
    # Each correction can be taken back, last first: the review as it stood before it (kept with
    # the gating it corrects, as the circled cells are).
    undo = [step for step in state.setdefault("ag_undo", {}).get(patient, []) if step[0] == id(result)]
    if undo and st.button(f"Undo the last correction ({len(undo)} to undo)", key="ag_undo_last",
                          help="Put the populations, confidence and gates back as they were before it."):
        _, snapshot, circled_before = undo.pop()
        store.undo_correction(patient, snapshot)
        state["ag_undo"][patient] = undo
        state["ag_circled"][patient] = (id(record.result), circled_before)
        state["ag_correct_message"] = "The last correction was undone."
        state.ag_chart_version += 1
        st.rerun()
    def keep_correction(corrected, new_confidence, circled_before) -> str:
        """The patient's populations corrected, the review as it stood kept for an undo; what
        became of the gates (:func:`autogate_view.after_correction`)."""
        undo.append((id(record.result), record.snapshot(), circled_before))
        state["ag_undo"][patient] = undo[-UNDO_STEPS:]
        autogate_view.before_correction(record)
        store.correct(patient, corrected, new_confidence)
        return autogate_view.after_correction(store, patient)

    # Cells the refinement held back (it would have emptied their population), moved on request.
    # Offered while they are where the refinement held them: gone once moved, back after an undo.
    offer = state.get("ag_held_back_offer")
    if (offer is not None and (offer["patient"], offer["result"], offer["circled"]) == (patient, id(result), circled)
            and np.array_equal(np.asarray(record.populations)[offer["cells"]].astype(str), offer["populations"])):
        if st.button(f"Move the {offer['count']:,} held-back cells too", key="ag_release_held",
                     help="The refinement in full: the populations it would have emptied lose those cells."):
            try:
                corrected, new_confidence, _, _ = autogate_view.refined_review(
                    gating_model, sample, circled, pop_names, part, None)
            except ValueError as exc:
                st.error(f"The refinement failed ({exc}): nothing was changed.")
            else:
                moved = int((np.asarray(corrected).astype(str) != np.asarray(record.populations).astype(str)).sum())
                gates_note = keep_correction(corrected, new_confidence, dict(circled))
                state["ag_correct_message"] = f"Moved {moved:,} held-back cells, as the refinement would." + gates_note
                state.ag_chart_version += 1
                st.rerun()
    # The refinement refits the kernel model's own features; the IW model has none to refit. A
    # gating read back after a review holds the reviewed cells only: the refinement starts from
    # the model's gating, made again by the model that gated the patient, with the review over it.
    reviewed_before = record.reviewed_earlier
    refinable = not is_transductive(gating_model) and (own_model is not None or not reviewed_before)
    refine = st.checkbox("Apply corrections to similar cells", key="ag_refine", disabled=not refinable,
                         help="Refit this patient's gating to every cell corrected so far (JMLR 2021, section 9): "
                              "cells like the circled ones move with them, not only those circled. "
                              "Off: only the circled cells change.") and refinable
    if is_transductive(gating_model):
        st.caption("The importance-weighted Nystroem model does not offer refinement from corrections: "
                   "only the circled cells change.")
    elif reviewed_before and own_model is None:
        st.caption(f"Corrected in an earlier session by the model {record.result_model or 'not recorded'}, which is "
                   "not loaded: only the circled cells change (load it to refine).")
    elif reviewed_before and refine:
        with st.spinner(f"Gating {patient} again with its model, to refine from its gating with the earlier "
                        "corrections standing…"):
            base = own_model.gate(sample, part=part if part in own_model.gating_parts() else None)
        store.reopen_review(patient, base)
        st.rerun()
    elif reviewed_before:
        st.caption("Corrected in an earlier session: applying corrections to similar cells gates the patient "
                   "again with its model and refines from that gating, the earlier corrections standing.")
    if shape is None:
        st.caption("Draw a lasso or box around cells on the plot to reassign them.")
    else:
        inside = shape.contains(sample)
        from_pops = st.multiselect("Only cells now in", sorted(set(populations[inside])), key="ag_from",
                                   help="Leave empty to take every cell inside the shape.")
        if from_pops:
            inside &= np.isin(populations, from_pops)
        to_pop = st.selectbox("Reassign to", pop_names + [NEW_POPULATION], index=None,
                              placeholder="Choose a population", key="ag_to",
                              help="New population…: cells the model has no population for (a tumour cluster, "
                                   "cells gated 'unknown'), under a name you give.")
        if to_pop == NEW_POPULATION:
            typed = st.text_input("Name of the new population", key="ag_new_population", placeholder="e.g. blasts")
            to_pop, problem = new_population_name(
                typed, pop_names + sorted(set(populations) - set(pop_names)))
            if problem:
                st.caption(problem)
        # the model cannot spread a population it was not trained on to similar cells
        new_name = to_pop is not None and to_pop not in pop_names
        if new_name and refine:
            st.caption(f"{to_pop} is no population of the model: only the circled cells change.")
        refine = refine and not new_name
        if st.button(f"Reassign {int(inside.sum()):,} cells" + (f" to {to_pop}" if to_pop else ""),
                     key="ag_reassign", disabled=to_pop is None):
            already = int((populations[inside] == to_pop).sum())
            circled_before = dict(circled)
            circled.update({int(i): to_pop for i in np.flatnonzero(inside)})
            corrected = None
            if refine:
                try:
                    corrected, new_confidence, held_back, held_cells = autogate_view.refined_review(
                        gating_model, sample, circled, pop_names, part, MAX_MOVED_SHARE)
                except ValueError as exc:
                    st.error(f"The refinement failed ({exc}): nothing was changed.")
                else:
                    if held_back:
                        state["ag_held_back_message"] = autogate_view.held_back_message(held_back)
                        state["ag_held_back_offer"] = {"patient": patient, "result": id(record.result),
                                                       "circled": dict(circled), "count": sum(held_back.values()),
                                                       "cells": held_cells,
                                                       "populations": np.asarray(corrected)[held_cells].astype(str)}
            else:
                corrected = populations.astype(object).copy()
                corrected[inside] = to_pop
                new_confidence = confidence.copy()
                new_confidence[inside] = 1.0
            if corrected is not None:
                beyond = int(((np.asarray(corrected).astype(str) != populations) & ~inside).sum())
                gates_note = keep_correction(corrected, new_confidence, circled_before)
                state["ag_circled"][patient] = (id(record.result), circled)
                state.pop("ag_pending_shape", None)
                state["ag_correct_message"] = (
                    f"Reassigned {int(inside.sum()):,} circled cells to {to_pop}"
                    + (f" ({already:,} of them were {to_pop} already)" if already else "")
                    + (f"; the refinement moved {beyond:,} further similar cells." if refine else ".") + gates_note)
                state.ag_chart_version += 1
                st.rerun()

parts_view.parts_section(store, patient, record, expanded=review_flags(novelty)[1], axes={
    "x": panel["x"], "y": panel["y"], "idx": idx, "x_scale": AxisScale.from_dict(x_scale_d),
    "y_scale": AxisScale.from_dict(y_scale_d), "x_range": x_range, "y_range": y_range,
    "x_title": channel_label(sample, x_ch), "y_title": channel_label(sample, y_ch), "colors": colors})

st.subheader("Populations")
stats = exports.statistics(record.populations_token, record)
st.dataframe(stats.drop(columns=["patient"]), hide_index=True, width="stretch",
             column_config={c: st.column_config.NumberColumn(format="%.1f") for c in stats.columns
                            if c.startswith(("%", "median", "geometric mean", "CV"))} | {
                 "count": st.column_config.NumberColumn(format="localized"),
                 "mean confidence": st.column_config.NumberColumn(format="%.3f")})

st.subheader("Gates", anchor="gates")
# The result in the training patients' gate hierarchy: each gate fitted to this patient's
# predicted cells on its parent's plot (gating_core.gates.autogates), editable like drawn gates.
if autogate_view.gates_section(store, patient, record) is None:
    st.caption("The training patients carry labels but no gate tree, so the populations are shown as "
               "children of all events (% of parent is % of total). Draw a gate tree on a training patient "
               "(**Gate** page, gates named like the populations) to get the result back as gates.")
    st.dataframe(flat_statistics(record.populations), hide_index=True, width="stretch",
                 column_config={"% of parent": st.column_config.NumberColumn(format="%.2f"),
                                "% of total": st.column_config.NumberColumn(format="%.2f")})

if record.corrected is not None:
    earlier = record.earlier_corrected_count()
    st.caption(f"{record.cells_corrected():,} cells corrected by hand"
               + (f" ({earlier:,} of them in an earlier session)." if earlier else "."))
elif record.reviewed_earlier:
    earlier = (getattr(result, "details", None) or {}).get("cells corrected")
    st.caption("Corrected by hand in an earlier session" + (f" ({int(earlier):,} cells)" if earlier is not None else "")
               + ": the populations shown are the reviewed ones.")
reviewed = np.asarray(record.populations).astype(str)
already_labels = record.is_labeled and np.array_equal(np.asarray(record.labels).astype(str), reviewed)
is_novel, parts_disagree = review_flags(novelty)
if already_labels:
    st.button("Accepted", key=f"ag_accept_{patient}", disabled=True,
              help="These populations are this patient's labels; correct cells to accept again.")
elif confirm_action(
        f"ag_accept_{patient}", "Accept this patient…", "Accept: make these its labels",
        lambda: (st.markdown(f"**{patient}**: its labels now and after accepting, cells per population:"),
                 show_label_change(record.labels if record.is_labeled else None, reviewed)),
        acknowledge=acceptance_acknowledgement(patient, is_novel, reviewed, pop_names, parts_disagree),
        help="Its (corrected) populations become labels: it joins the historical patients."):
    try:
        store.accept(patient)
    except ValueError as exc:  # another session accepted it first
        st.error(str(exc))
    else:
        st.rerun()
label_versions(store, patient, f"ag_versions_{patient}")

st.subheader("Export")
e = st.columns(4)
e[0].download_button("Gated CSV", data=lambda: exports.gated_csv(record.populations_token, record, store.work_dir),
                     file_name=f"{patient}.gated.csv", mime="text/csv", key="dl_csv",
                     help="One row per event in file order: every channel, then population and confidence.")
e[1].download_button("FCS with population channel",
                     data=lambda: exports.gated_fcs(record.populations_token, record, store.work_dir),
                     file_name=f"{patient}.gated.fcs", mime="application/octet-stream", key="dl_fcs",
                     help="The events exactly as read, plus a population channel. Only the keywords needed to "
                          "read the data are kept (channels and their settings, time step, spillover, "
                          "cytometer model, volume); names, ids, dates, serial numbers and any other keyword "
                          "are left out.")
gated_records = [store.patients[n] for n in gated]
e[2].download_button("Statistics (CSV, all gated patients)", data=lambda: exports.statistics_csv(gated_records),
                     file_name="population_statistics.csv", mime="text/csv", key="dl_stats")
e[3].download_button(f"All {len(gated)} patients (zip)", data=lambda: exports.all_as_zip(gated_records, store.work_dir),
                     file_name="gated_patients.zip", mime="application/zip", key="dl_zip")
keyword_note = exports.fcs_keyword_note(record)
if keyword_note:
    st.caption(keyword_note)

st.subheader("Reports", anchor="reports")
st.caption("The batch table: every patient x population with its parent, count, % of parent and % of total "
           "(the gates depth-first under their parent gate when the patient has gates, then the populations no "
           "gate names, under all events), then each marker's median, geometric mean and CV (%) over the cells "
           "counted. Every count comes from the reviewed cells, as in the gated CSV and "
           "the statistics. The report: one self-contained HTML page per patient (plots with gates, the table, "
           "novelty, confidence, compensation and QC flags), to print or archive.")
with_labeled = st.checkbox("Include the labeled (historical) patients in the batch table", key="rp_labeled")
batch_records = gated_records + ([store.patients[n] for n in store.labeled() if n not in gated] if with_labeled else [])
r = st.columns(2)
r[0].download_button(f"Batch table (CSV, {len(batch_records)} patients)", data=lambda: exports.batch_csv(batch_records),
                     file_name="batch_populations.csv", mime="text/csv", key="dl_batch")
# Built here, not when clicked: a download whose file fails says only "Failed to generate file".
report, report_failure = exports.patient_report_or_reason(record)
r[1].download_button(f"Report of {patient} (HTML)", data=report or b"", disabled=report is None,
                     file_name=f"{safe_stem(patient, 'patient')}.report.html", mime="text/html", key="dl_report",
                     help="One page: plots with gates, populations, novelty, confidence, compensation, QC flags.")
if report_failure:
    st.error(f"The report of {patient} cannot be written: {report_failure}")
with st.expander("Batch table"):
    batch = exports.batch_frame(batch_records)
    st.dataframe(batch, hide_index=True, width="stretch", key="rp_batch_table",
                 column_config={c: st.column_config.NumberColumn(format="%.1f") for c in batch.columns
                                if c.startswith(("median", "geometric mean", "CV"))} | {
                                "% of parent": st.column_config.NumberColumn(format="%.2f"),
                                "% of total": st.column_config.NumberColumn(format="%.2f"),
                                "mean confidence": st.column_config.NumberColumn(format="%.3f"),
                                "count": st.column_config.NumberColumn(format="localized")})
