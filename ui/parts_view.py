"""The Auto-gate page's comparison of the model's parts: a patient gated by the transfer model
alone and by its own populations alone, beside the gating under review, and the review started
again from whichever the reviewer judges right."""

from __future__ import annotations

import numpy as np
import pandas as pd
import streamlit as st

from gating_core.model.result import PART_TITLES
from ui import charts
from ui.common import confirm_action

#: Session key of the parts' gatings of the patient last compared (one patient at a time: each
#: holds a population per event).
PARTS_KEY = "ag_part_gatings"


def part_counts(current, gatings: dict) -> pd.DataFrame:
    """Cells per population under the gating under review (``current``, (n,) str) and under each
    part's (``gatings``: part -> (n,) str), with each one's share of cells that differ from
    ``current`` in the last row. Columns: the gating under review, then each part's title;
    rows: every population any of them names, in name order."""
    columns = {"under review": np.asarray(current).astype(str)}
    columns.update({PART_TITLES[part]: np.asarray(populations).astype(str) for part, populations in gatings.items()})
    names = sorted(set().union(*(np.unique(v) for v in columns.values())))
    table = pd.DataFrame({title: [int((values == name).sum()) for name in names] for title, values in columns.items()},
                         index=pd.Index(names, name="population"))
    n = max(len(columns["under review"]), 1)
    differ = {title: int((values != columns["under review"]).sum()) for title, values in columns.items()}
    table.loc["cells unlike the gating under review"] = [differ[t] for t in table.columns]
    table.attrs["share_differing"] = {t: differ[t] / n for t in table.columns}
    return table


def parts_section(store, patient: str, record, expanded: bool, axes: dict) -> None:
    """The expander comparing the model's parts on ``patient``: gate it with each part alone
    (on request: a full gating each), show them beside the gating under review on the page's
    axes (``axes``: x, y, idx, the scales, ranges, titles and colours of the main chart), count
    each one's populations, and start the review from the chosen one (corrections so far are
    dropped, after a confirmation). The parts are those of the model that gated the patient."""
    result = record.load_result()
    gater = store.models.get(record.result_model)
    current_part = getattr(result, "part", None)
    with st.expander("Compare the model's parts", expanded=expanded):
        if gater is None:
            st.caption(f"The model that gated {patient} ({record.result_model or 'not recorded'}) is not loaded: "
                       "gate it again with a loaded model to compare that model's parts.")
            return
        parts = tuple(gater.gating_parts())
        if not parts:
            st.caption("This model gates with one part: there is nothing to compare.")
            return
        st.caption("The model mixes two parts: the transfer model, which extends the training patients' "
                   "boundaries to this patient, and the patient's own populations, which follow its clusters "
                   "wherever they moved. Where they disagree on many cells, either can be the right one: gate "
                   "with each alone, compare them on the plot, and start the review from the one that is right.")
        state = st.session_state
        # the model object, not only its label: a model loaded again under the same label is another
        key = (patient, record.result_model, id(gater), record.token)
        stored = state.get(PARTS_KEY)
        gatings = stored["gatings"] if stored is not None and stored["key"] == key else None
        if gatings is None:
            if st.button("Gate with each part alone", key="ag_parts_run"):
                try:
                    with st.spinner(f"Gating {patient} with each part…"):
                        gatings = {part: gater.gate(record.sample, part=part) for part in parts}
                except Exception as exc:  # noqa: BLE001 - shown on the page, as auto-gating's failures are
                    st.error(f"{patient}: gating with each part failed ({exc})")
                    return
                state[PARTS_KEY] = {"key": key, "gatings": gatings}
                st.rerun()  # drawn without the button, which has done its work
            else:
                return
        current = np.asarray(record.populations).astype(str)
        table = part_counts(current, {part: g.populations for part, g in gatings.items()})
        idx = axes["idx"]
        panels = [{"title": "under review", "x": axes["x"], "y": axes["y"], "populations": current[idx].astype(object)}]
        panels += [{"title": PART_TITLES[part], "x": axes["x"], "y": axes["y"],
                    "populations": np.asarray(g.populations)[idx].astype(object)} for part, g in gatings.items()]
        colors = dict(axes["colors"])
        for name in table.index[:-1]:
            colors.setdefault(str(name), "#7F7F7F")
        fig = charts.scatter_panels(panels, axes["x_scale"], axes["y_scale"], axes["x_range"], axes["y_range"],
                                    axes["x_title"], axes["y_title"], mode="population", colors=colors, height=420)
        st.plotly_chart(fig, width="stretch", key=f"ag_parts_chart_{patient}")
        st.dataframe(table, width="stretch", key="ag_parts_table",
                     column_config={c: st.column_config.NumberColumn(format="localized") for c in table.columns})
        # "" for the model's own gating: a radio's options are its labels' keys
        options = ["", *gatings]
        chosen = st.radio("Start the review from", options, index=options.index(current_part or ""),
                          format_func=lambda p: PART_TITLES[p or None], key=f"ag_parts_choice_{patient}_{record.result_token}",
                          horizontal=True)
        choice = chosen or None
        if choice == current_part and record.corrected is None:
            st.caption(f"The review starts from {PART_TITLES[choice]}.")
            return
        corrected = record.corrected is not None
        # keyed by the result too: a choice or an armed confirmation does not outlive the gating it was
        # made on (a new auto-gating, a correction, another part)
        if confirm_action(f"ag_parts_apply_{patient}_{record.result_token}", f"Review from {PART_TITLES[choice]}…",
                          "Replace the gating under review",
                          lambda: st.markdown(
                              f"**{patient}** will be gated by {PART_TITLES[choice]}"
                              + (": the cells corrected by hand so far go back to it." if corrected else ".")
                              + " Accept the patient afterwards to make it its labels."),
                          help="Replaces the populations under review; nothing is accepted yet."):
            try:
                replacement = gatings[choice] if choice is not None else gater.gate(record.sample)
            except Exception as exc:  # noqa: BLE001
                st.error(f"{patient}: gating failed ({exc})")
                return
            store.set_result(patient, replacement, record.result_model)
            state.get("ag_circled", {}).pop(patient, None)
            state["ag_chart_version"] = state.get("ag_chart_version", 0) + 1
            st.rerun()
