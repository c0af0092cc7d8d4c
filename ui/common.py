"""Helpers every page uses: the session store, the sidebar, channel and scale pickers."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import streamlit as st

from ui.store import Store

REPO = Path(__file__).resolve().parent.parent
SAMPLE_DATA = REPO / "sample_data"
SCALE_KINDS = ("arcsinh", "logicle", "linear")
SCALE_HELP = ("How values are spread along the axis. arcsinh and logicle show dim and bright cells "
              "together (ticks stay in raw instrument units); linear suits scatter channels.")


_SESSION_PARAM, _NAME_PARAM = "session", "name"


def get_store() -> Store:
    """This browser session's store, brought up to date with what others changed in the library
    and with this session's finished jobs (:meth:`Store.sync`: one catalog read when nothing
    changed). Its id (and the name typed, if any) are kept in the page's address, so a reload
    of the tab is the same person to the jobs it started."""
    if "store" not in st.session_state:
        session_id = str(st.query_params.get(_SESSION_PARAM, ""))
        name = str(st.query_params.get(_NAME_PARAM, ""))[:40]
        st.session_state["store"] = Store(session_id=session_id if re.fullmatch(r"[0-9a-f]{8}", session_id) else None,
                                          session_name=name if name.isprintable() else "")
    store = st.session_state["store"]
    if st.query_params.get(_SESSION_PARAM) != store.session_id:
        st.query_params[_SESSION_PARAM] = store.session_id
    if store.session_name and st.query_params.get(_NAME_PARAM) != store.session_name:
        st.query_params[_NAME_PARAM] = store.session_name
    store.sync()
    return store


_STATUS_SLOT = "_sidebar_status_slot"


def _draw_status(store: Store) -> None:
    st.markdown("### Session")
    st.caption(f"You are **{store.session_label}** to others on this library.")
    n_lab, n_new = len(store.labeled()), len(store.unlabeled())
    st.markdown(f"**{len(store.patients)}** patients loaded  \n"
                f"{n_lab} labeled (historical) · {n_new} new")
    if store.model() is not None:
        st.markdown(f"Model: **{store.current_model}**")
    else:
        st.caption("No model trained or loaded yet.")
    evaluated = sum(p.result is not None or p.result_loader is not None for p in store.patients.values())
    if evaluated:
        st.markdown(f"Auto-gated: **{evaluated}** patient" + ("" if evaluated == 1 else "s"))


def refresh_status(store: Store) -> None:
    """Redraw the sidebar's counts after a page changed them in this run (the sidebar is drawn
    before the page, so without this it would show the state from before the change)."""
    slot = st.session_state.get(_STATUS_SLOT)
    if slot is not None:
        with slot.container():
            _draw_status(store)


def _watch_jobs(store: Store) -> None:
    """While a background job runs, every page says so in the sidebar and, when it ends, reruns
    so that the session takes up its result (the model, the check) wherever the user is."""
    from ui import jobs

    running = [j for j in jobs.jobs_for(store.library_path) if j.running]
    if not running:
        return

    @st.fragment(run_every=2.0)
    def watch():
        if any(not j.running for j in running):  # one ended: this session may take up its result
            st.rerun()
        for job in running:
            whose = "yours; Train page to cancel" if job.owner == store.session_id else f"started by {job.started_by}"
            state = "waiting for the one ahead" if job.waiting else f"{100 * job.fraction:.0f}%"
            st.caption(f"{job.title}: {state} (in the background, {whose})")

    watch()


def model_offers(store: Store, key: str) -> None:
    """Models others trained meanwhile, each offered with who trained it and how, and a button
    to make it current: never switched to under someone's review (Train and Auto-gate pages)."""
    for offer in list(store.model_offers):
        st.info(f"A new model was trained by **{offer['by']}**: **{offer['label']}**"
                + (f" ({offer['settings']})" if offer["settings"] and offer["settings"] != offer["label"] else "")
                + f". Your current model stays {store.current_model} until you choose.")
        use, later, _ = st.columns([1, 1, 3])
        if use.button("Use it", key=f"{key}_offer_use_{offer['model_id']}", type="primary"):
            store.take_offer(offer["model_id"])
            st.rerun()
        if later.button("Not now", key=f"{key}_offer_dismiss_{offer['model_id']}",
                        help="It stays in the model list (Train page)."):
            store.dismiss_offer(offer["model_id"])
            st.rerun()


def session_name_input(store: Store) -> None:
    """Where a person types the name others on the library see beside the jobs they start."""
    name = st.text_input("Your name, shown to others on this library", value=store.session_name, max_chars=40,
                         key="session_name_input", placeholder=store.session_label,
                         help="Others working on this library see it beside the trainings and checks you start "
                              "(until you type one: a short id of this browser tab).")
    if name.strip() != store.session_name and name.isprintable():
        store.session_name = name.strip()
        st.query_params[_NAME_PARAM] = store.session_name
        refresh_status(store)


def sidebar_status(store: Store) -> None:
    with st.sidebar:
        slot = st.empty()
        st.session_state[_STATUS_SLOT] = slot
        with slot.container():
            _draw_status(store)
        if store.model_offers:
            st.caption(f"{len(store.model_offers)} new model(s) trained by others: see the Train or Auto-gate page.")
        _watch_jobs(store)
        st.divider()
        st.markdown("### Patient library")
        if store.library is None:
            st.warning(f"Library unavailable: {store.library_error}. Work is kept for this session only.")
        else:
            st.caption(f"Saved in `{store.library_path}`: patients, gates, models and results survive a reload.")
        with st.popover("Change library folder"):
            path = st.text_input("Folder", value=store.library_path, key="library_path_input",
                                 help="Default `./workspace`, or the GATING_LIBRARY environment variable.")
            if st.button("Open library", key="open_library"):
                store.open_library(path.strip() or "workspace")
                st.rerun()
        for message in store.warnings[-3:]:
            st.warning(message)
    while store.changes_seen:
        st.toast(store.changes_seen.pop(0))


def model_picker(container, store: Store, key: str, label: str = "Current model", **kwargs) -> str:
    """A select box of the session's models that is the current model: choosing one makes it
    current, and a model made current elsewhere (this session's training, an offer taken, the
    other page's picker) shows here, rather than the box keeping its earlier choice."""
    options = list(store.models)
    shown = f"_{key}_current"
    if st.session_state.get(shown) != store.current_model or st.session_state.get(key) not in options:
        st.session_state[key] = store.current_model
    choice = container.selectbox(label, options, key=key, **kwargs)
    if choice != store.current_model:
        store.current_model = choice
        refresh_status(store)
    st.session_state[shown] = choice
    return choice


def channel_label(sample, pnn: str) -> str:
    """The marker with its detector, e.g. "CD4 (FL3-A)" (see ``gating_core.reports.plotting.channel_label``)."""
    from gating_core.reports.plotting import sample_channel_label

    return sample_channel_label(sample, pnn)


def scale_select(container, label: str, channel: str, key: str, store: Store) -> dict:
    """Axis transform picker remembered per channel. Returns the axis scale (``AxisScale.to_dict``):
    the picked kind with the panel's parameters for the channel, the same on every patient.
    The picker starts on the panel's default kind (scatter linear, others arcsinh)."""
    from gating_core.gates import with_kind

    from ui import cache

    panel = store.panel_transform(channel)
    kind = container.selectbox(label, SCALE_KINDS, index=SCALE_KINDS.index(panel.kind), key=f"{key}_{channel}",
                               help=SCALE_HELP + " Cofactor and logicle parameters: **Channel transforms** below.")
    if kind != "linear":
        holders = [r for r in store.patients.values() if channel in r.channel_names]
        # a patient whose events are in memory already, rather than one read for this note
        holder = next((r for r in holders if r.sample_loaded), holders[0] if holders else None)
        if holder is not None and cache.channel_numbers_reason(holder.token, channel, holder.sample):
            container.caption(f"{channel} holds channel numbers of log-amplified data: {kind} compresses it a "
                              "second time; linear shows it as recorded.")
    return with_kind(panel, kind).to_dict()


def transform_editor(store: Store, channels: list[str], sample, key: str) -> None:
    """Edit one channel's transform for the whole panel: default view, arcsinh cofactor, logicle
    T / W / M. Every patient, plot and new gate on the channel uses it; gates drawn before keep
    the scale they were drawn on (their cells do not change) and are drawn mapped onto the new one."""
    from gating_core.gates import AxisScale, GateError

    with st.expander("Channel transforms (whole panel)"):
        st.caption("Decided once per panel from the instrument (arcsinh cofactor 5 for mass cytometry, 150 for "
                   "flow; logicle top from the channel's $PnR), the same for every patient. Change them here.")
        channel = st.selectbox("Channel", channels, format_func=lambda c: channel_label(sample, c),
                               key=f"{key}_channel")
        current = store.panel_transform(channel)
        cols = st.columns(5)
        kind = cols[0].selectbox("Default view", SCALE_KINDS, index=SCALE_KINDS.index(current.kind),
                                 key=f"{key}_kind_{channel}")
        cofactor = cols[1].number_input("arcsinh cofactor", value=float(current.cofactor), min_value=1e-6,
                                        format="%g", key=f"{key}_cofactor_{channel}")
        top = cols[2].number_input("logicle T (top)", value=float(current.top), min_value=1.0, format="%g",
                                   key=f"{key}_top_{channel}")
        width = cols[3].number_input("logicle W", value=float(current.width), min_value=0.0, format="%g",
                                     key=f"{key}_width_{channel}")
        decades = cols[4].number_input("logicle M", value=float(current.decades), min_value=0.1, format="%g",
                                       key=f"{key}_decades_{channel}")
        if st.button("Apply to every patient", key=f"{key}_apply"):
            try:
                chosen = AxisScale(kind, cofactor=cofactor, top=top, width=width, decades=decades)
            except GateError as exc:
                st.error(str(exc))
            else:
                store.set_panel_transform(channel, chosen)
                st.rerun()


def plot_range(store: Store, tokens: tuple, channel: str, scale: dict, samples) -> tuple:
    """The display range of channel ``channel`` on a plot drawn with ``scale``: the range set by
    hand for the panel (:meth:`Store.axis_range`, raw units mapped through ``scale``), else the
    shared range of these patients' events."""
    from gating_core.gates import AxisScale

    limits = store.axis_range(channel)
    if limits is None:
        from ui import cache

        return cache.shared_range(tokens, channel, scale, samples)
    low, high = AxisScale.from_dict(scale).forward(np.array(limits, dtype=np.float64))
    return float(low), float(high)


def plot_bins(tokens: tuple, channel: str, scale: dict, samples, value_range, bins: int = 200) -> tuple:
    """((low, high), count): the density and histogram bins of ``channel`` over ``value_range``,
    about ``bins`` of them; when these patients' values sit on evenly spaced channel numbers, each
    bin holds the same number of them (:func:`gating_core.reports.plotting.lattice_bins`), so
    the histogram shows no comb and the density no stripes. A density view passes
    :func:`density_bins` of its events."""
    from gating_core.reports import plotting
    from ui import cache

    return plotting.lattice_bins(value_range, cache.lattice(tuple(tokens), channel, scale, samples), bins)


def density_bins(event_counts) -> int:
    """Bins per axis of density views drawn side by side over patients (or populations) of
    ``event_counts`` events: :func:`gating_core.reports.plotting.density_bins` of the fewest, so
    that the smallest still reads as clusters and the panels share bins, their colours counting
    events per bin alike."""
    from gating_core.reports import plotting

    return plotting.density_bins(min(event_counts, default=0))


def axis_range_editor(store: Store, channels: list[str], sample, key: str, tokens: tuple, samples) -> None:
    """Set a channel's axis range by hand for the whole panel (raw units, FlowJo's axis minimum
    and maximum), or give it back to its events' range. Every plot of the channel uses it, on
    every patient and page, and the library keeps it."""
    from gating_core.gates import AxisScale

    with st.expander("Axis ranges (whole panel)"):
        st.caption("Each channel is drawn over its events' range unless a range is set here, in raw instrument "
                   "units; it holds for every patient, plot and page, and whatever the transform.")
        if store.axis_ranges:
            st.caption("Set by hand: " + "; ".join(
                f"{channel_label(sample, c) if c in sample.pnn else c} {lo:.4g} to {hi:.4g}"
                for c, (lo, hi) in sorted(store.axis_ranges.items())))
        channel = st.selectbox("Channel", channels, format_func=lambda c: channel_label(sample, c),
                               key=f"{key}_channel")
        scale = store.panel_transform(channel)
        current = store.axis_range(channel)
        if current is None:
            shown = AxisScale.from_dict(scale.to_dict()).inverse(
                np.array(plot_range(store, tokens, channel, scale.to_dict(), samples)))
        else:
            shown = current
        cols = st.columns([2, 2, 2, 2])
        low = cols[0].number_input("From (raw units)", value=float(shown[0]), format="%.4g", key=f"{key}_lo_{channel}")
        high = cols[1].number_input("To (raw units)", value=float(shown[1]), format="%.4g", key=f"{key}_hi_{channel}")
        cols[2].write("")
        if cols[2].button("Apply to every plot", key=f"{key}_apply"):
            try:
                store.set_axis_range(channel, (low, high))
            except ValueError as exc:
                st.error(str(exc))
            else:
                st.rerun()
        cols[3].write("")
        if cols[3].button("Automatic again", key=f"{key}_auto", disabled=current is None,
                          help="Drawn over its events' range, as before it was set."):
            store.set_axis_range(channel, None)
            for k in (f"{key}_lo_{channel}", f"{key}_hi_{channel}"):
                st.session_state.pop(k, None)
            st.rerun()


def default_xy(channels: list[str], sample=None, populations=None) -> tuple[int, int]:
    """Indices of a sensible first projection: with a ``sample`` (and its ``populations``), the
    report's first plot (:func:`gating_core.reports.report.channel_pairs`: scatter where the file
    has it, else the two channels that set its largest population apart); else two different
    channels, time-like ones skipped."""
    from gating_core.fcs.transforms import is_time_like

    if sample is not None:
        from gating_core.reports.report import channel_pairs

        pairs = [p for p in channel_pairs(sample, populations) if p[0] in channels and p[1] in channels]
        if pairs:
            return channels.index(pairs[0][0]), channels.index(pairs[0][1])
    usable = [i for i, c in enumerate(channels) if not is_time_like(c)]
    if len(usable) < 2:
        usable = list(range(len(channels)))
    return usable[0], usable[1] if len(usable) > 1 else usable[0]


def require_patients(store: Store, labeled: bool | None = None) -> bool:
    """Show a friendly pointer to the Data page when there is nothing to work on."""
    names = store.patients if labeled is None else (store.labeled() if labeled else store.unlabeled())
    if names:
        return True
    what = "patients" if labeled is None else ("labeled patients" if labeled else "new patients")
    st.info(f"No {what} loaded yet. Open **Data** to drop FCS files or load the sample data.")
    return False


def show_messages(errors, notes, warnings=()) -> None:
    for file_name, message in errors:
        st.error(message, icon="⚠️")
    for file_name, message in warnings:
        st.warning(message)
    for file_name, message in notes:
        st.info(message)


def confirm_action(key: str, button_label: str, confirm_label: str, show_details, *, acknowledge: str | None = None,
                   disabled: bool = False, help: str | None = None) -> bool:
    """A button that asks before it acts: the first click shows ``show_details()`` with a
    confirm and a cancel button (and, when ``acknowledge`` is given, a box to tick first).
    Returns True in the run where the user confirmed; the caller then acts."""
    armed_key = f"{key}_armed"
    if not st.session_state.get(armed_key):
        if st.button(button_label, key=key, disabled=disabled, type="primary", help=help):
            st.session_state[armed_key] = True
            st.rerun()
        return False
    show_details()
    ticked = st.checkbox(acknowledge, key=f"{key}_ack") if acknowledge else True
    confirm_col, cancel_col = st.columns(2)
    if confirm_col.button(confirm_label, key=f"{key}_confirm", type="primary", disabled=not ticked):
        st.session_state[armed_key] = False
        return True
    if cancel_col.button("Cancel", key=f"{key}_cancel"):
        st.session_state[armed_key] = False
        st.rerun()
    return False


def show_label_change(before, after) -> None:
    """Before/after counts per population of a label replacement, with what would be lost."""
    from ui.app_state import label_change_table, lost_populations

    table = label_change_table(before, after)
    if before is None:  # nothing is replaced: a column of zeros and a copy of it would say nothing
        st.caption("It has no labels yet: these become its labels.")
        table = table[["population", "after"]]
    st.dataframe(table, hide_index=True, width="stretch",
                 column_config={c: st.column_config.NumberColumn(format="localized") for c in ("before", "after", "change")})
    lost = lost_populations(before, after)
    if lost:
        st.warning(f"{len(lost)} population(s) of the current labels would be gone: {', '.join(lost)}. "
                   "The next training would learn their cells as other populations. The current labels stay "
                   "in the library as an earlier version you can restore.")


def label_versions(store: Store, patient: str, key: str) -> None:
    """The patient's label versions (the library keeps every one) and a way back to any of them."""
    versions = store.label_versions(patient)
    if not versions:
        return
    import pandas as pd

    with st.expander(f"Label versions of {patient} ({len(versions)})"):
        rows = [{"version": v["id"], "current": "✓" if v["current"] else "", "from": v["provenance"],
                 "saved": v["created_at"][:19].replace("T", " "),
                 "populations": " · ".join(f"{n} {c:,}" for n, c in
                                           sorted(v["populations"].items(), key=lambda item: -item[1]))}
                for v in reversed(versions)]
        st.dataframe(pd.DataFrame(rows), hide_index=True, width="stretch")
        others = [v["id"] for v in reversed(versions) if not v["current"]]
        if not others:
            return
        chosen = st.selectbox("Restore version", others, key=f"{key}_version",
                              format_func=lambda i: next(f"{v['id']}: {v['provenance']}, {v['created_at'][:19]}"
                                                         for v in versions if v["id"] == i))
        if st.button("Restore it as the current labels", key=f"{key}_restore"):
            try:
                store.restore_labels(patient, chosen)
            except ValueError as exc:
                st.error(f"Not restored: {exc}")
            else:
                st.session_state["restored_message"] = f"{patient}: label version {chosen} is current again."
                st.rerun()
        message = st.session_state.pop("restored_message", None)
        if message:
            st.success(message)


def adopt_finished_jobs(store: Store) -> None:
    """Take up what this session's background jobs finished (see :meth:`Store.take_up_jobs`)."""
    store.take_up_jobs()


def others_jobs(store: Store, kind: str) -> list:
    """Unfinished jobs of ``kind`` on this library that other sessions started."""
    from ui import jobs

    return [j for j in jobs.jobs_for(store.library_path, kind) if j.running and j.owner != store.session_id]


def job_progress(store: Store, kind: str, key: str):
    """This session's unfinished job of ``kind``, if any: its progress with a time estimate (or
    its place in the queue), redrawn every second, and a cancel button; and, without a cancel,
    who else runs one and with what settings. Returns this session's job (None when none runs)."""
    from ui import jobs

    what = "A training" if kind == "train" else "A check"
    for other in others_jobs(store, kind):
        st.info(f"{what} {'is queued' if other.waiting else 'is running'}, started by **{other.started_by}**: "
                f"{other.settings}" + ("" if other.waiting else f" ({100 * other.fraction:.0f}% done)") + ".")
    job = jobs.running_job(store.library_path, kind, owner=store.session_id)
    if job is None:
        return None

    @st.fragment(run_every=1.0)
    def panel():
        if not job.running:
            st.rerun()  # the whole page: it shows the result
        if job.waiting:
            ahead = job.queued_behind
            st.info(f"Yours ({job.settings}) is queued: it starts when the one started by "
                    f"{ahead.started_by if ahead is not None else 'another session'} ends.")
        else:
            left = job.remaining_seconds()
            estimate = f" · about {jobs.format_seconds(left)} left" if left is not None else ""
            st.progress(job.fraction, text=f"{job.title}: {job.stage} ({100 * job.fraction:.0f}%) · "
                                           f"{jobs.format_seconds(job.elapsed)} so far{estimate}")
        if job.cancel_requested:
            st.caption("Cancelling at the next step…")
        elif st.button("Cancel", key=f"{key}_cancel"):
            job.cancel()
            st.rerun()

    st.caption("This runs in the background: you can use other pages or reload; come back here to see it.")
    panel()
    return job


def job_outcome(store: Store, kind: str, what: str) -> None:
    """How this session's latest finished job of ``kind`` ended (success is reported by the caller)."""
    from ui import jobs

    finished = [j for j in jobs.jobs_for(store.library_path, kind) if not j.running and j.owner == store.session_id]
    if not finished:
        return
    job = finished[-1]
    if job.status == jobs.FAILED:
        st.error(f"{what} failed: {job.error}")
    elif job.status == jobs.CANCELLED:
        st.info(f"{what} cancelled after {jobs.format_seconds(job.elapsed)}; nothing was stored.")
