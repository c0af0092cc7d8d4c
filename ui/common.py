"""Helpers every page uses: the session store, the sidebar, channel and scale pickers."""

from __future__ import annotations

from pathlib import Path

import streamlit as st

from ui.store import Store

REPO = Path(__file__).resolve().parent.parent
SAMPLE_DATA = REPO / "sample_data"
SCALE_KINDS = ("arcsinh", "logicle", "linear")
SCALE_HELP = ("How values are spread along the axis. arcsinh and logicle show dim and bright cells "
              "together (ticks stay in raw instrument units); linear suits scatter channels.")


def get_store() -> Store:
    if "store" not in st.session_state:
        st.session_state["store"] = Store()
    return st.session_state["store"]


def sidebar_status(store: Store) -> None:
    with st.sidebar:
        st.markdown("### Session")
        n_lab, n_new = len(store.labeled()), len(store.unlabeled())
        st.markdown(f"**{len(store.patients)}** patients loaded  \n"
                    f"{n_lab} labeled (historical) · {n_new} new")
        model = store.model()
        if model is not None:
            st.markdown(f"Model: **{store.current_model}**")
        else:
            st.caption("No model trained or loaded yet.")
        evaluated = sum(p.result is not None or p.result_loader is not None for p in store.patients.values())
        if evaluated:
            st.markdown(f"Auto-gated: **{evaluated}** patients")
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


def channel_label(sample, pnn: str) -> str:
    try:
        return sample.channels[sample.channel_index(pnn)].label
    except KeyError:
        return pnn


def scale_select(container, label: str, channel: str, key: str) -> str:
    """Axis transform picker remembered per channel; scatter channels start linear, others arcsinh."""
    from gating_core.transforms import is_scatter

    default = SCALE_KINDS.index("linear") if is_scatter(channel) else 0
    return container.selectbox(label, SCALE_KINDS, index=default, key=f"{key}_{channel}", help=SCALE_HELP)


def default_xy(channels: list[str]) -> tuple[int, int]:
    """Indices of a sensible first projection: skip time-like channels; two different ones."""
    from gating_core.transforms import is_time_like

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


def show_messages(errors, notes) -> None:
    for file_name, message in errors:
        st.error(message, icon="⚠️")
    for file_name, message in notes:
        st.info(message)
