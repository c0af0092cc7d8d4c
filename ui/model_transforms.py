"""The transforms a model learns its channels on, as the Train page shows and sets them: found
from the training patients' values (:func:`gating_core.model.preprocessing.found_transform`) with
the reason, changed per channel by text or taken from the panel's views (the Explore page's
scales)."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from ui.common import channel_label


#: What a channel's transform may be set to on the Train page
#: (:func:`gating_core.fcs.transforms.parse_transform_spec`).
TRANSFORM_FORMS = ("arcsinh:COFACTOR, linear:SCALE (x / SCALE), channel-scale (channel numbers 0-1023 "
                   "used as they are) or logicle:T")


def found_table(samples, channels) -> pd.DataFrame:
    """One row per channel of ``channels``: the transform training would find on ``samples``
    (:func:`gating_core.model.preprocessing.found_transform`) as text, and why."""
    from gating_core.fcs.transforms import transform_spec
    from gating_core.model.preprocessing import found_transform

    found, reasons = found_transform(samples, channels)
    return pd.DataFrame({"channel": list(channels),
                         "found": [transform_spec(k, p) for k, p in zip(found.kinds, found.params)],
                         "why": [reasons[name] for name in channels]})


def transform_table(found: pd.DataFrame, overrides: dict) -> pd.DataFrame:
    """The Train page's channel transforms: :func:`found_table` with the transform each channel
    will use (``overrides``: channel -> text set by the user; why: "set by you")."""
    used = [overrides.get(c, spec) for c, spec in zip(found["channel"], found["found"])]
    why = ["set by you" if c in overrides else reason for c, reason in zip(found["channel"], found["why"])]
    return pd.DataFrame({"channel": found["channel"].tolist(), "found": found["found"].tolist(), "used": used,
                         "why": why})


def checked_transform(text: str) -> str:
    """A transform the user typed, normalised ("ArcSinh:40 " -> "arcsinh:40"); ValueError (naming
    the accepted forms) when it is none of them."""
    from gating_core.fcs.transforms import parse_transform_spec

    text = str(text).strip().lower()
    parse_transform_spec(text)  # its message names the accepted forms
    return text


def panel_view_spec(scale) -> str:
    """A panel's view of a channel (an :class:`~gating_core.gates.AxisScale`, as the Explore
    page sets it) as a model transform text; logicle keeps its top (the model's logicle takes the
    standard W and M)."""
    if scale.kind == "arcsinh":
        return f"arcsinh:{scale.cofactor:.12g}"
    if scale.kind == "logicle":
        return f"logicle:{scale.top:.12g}"
    return "linear"


def same_for_the_model(a: str, b: str) -> bool:
    """Whether two transform texts give the model the same cells: every linear scale does, since
    the model standardises each channel."""
    from gating_core.fcs.transforms import parse_transform_spec

    (kind_a, params_a), (kind_b, params_b) = parse_transform_spec(a), parse_transform_spec(b)
    return kind_a == kind_b and (kind_a == "linear" or params_a == params_b)


def model_transforms(model) -> str:
    """A fitted model's channel transforms in a line: "FL1.LOG: channel scale (x / 1024); ..."."""
    from gating_core.fcs.transforms import describe_transform

    return "; ".join(describe_transform(model.transform_, list(model.channels_)))


def transform_choices(store, records, channels: list[str]) -> dict:
    """The Train page's channel transforms, drawn in the current container: a table of each
    channel's transform as training will find it on the patients ``records``, why, the one it
    will use and the panel's view, and the controls that set one. Returns the transforms the
    user set (channel -> text), kept in the session for the channels still chosen."""
    # Set per channel; kept for the channels still chosen (one dict per session, like the widgets).
    transforms_set = st.session_state.setdefault("train_transforms", {})
    for name in [c for c in transforms_set if c not in channels]:
        transforms_set.pop(name)
    st.markdown("**Channel transforms** (the scale the model learns on; found from these patients' values)")
    found_key = (tuple(id(r.sample) for r in records), tuple(channels))
    if st.session_state.get("train_found_key") != found_key:  # a few seconds on large panels: once per choice
        try:
            st.session_state["train_found"] = found_table([r.sample for r in records], channels)
        except Exception as exc:  # shown, never raised: training decides again from its own cells
            st.session_state["train_found"] = pd.DataFrame({"channel": channels, "found": "",
                                                            "why": f"not found ({exc})"[:200]})
        st.session_state["train_found_key"] = found_key
    table = transform_table(st.session_state["train_found"], transforms_set)
    table.insert(3, "panel view", [panel_view_spec(store.panel_transform(c)) for c in table["channel"]])
    # the reason is the long column
    st.dataframe(table, hide_index=True, width="stretch", column_config={
        "why": st.column_config.TextColumn(width="large", help="Why this transform: click a cell to read it whole")})
    unlike_panel = {c: view for c, used, view in zip(table["channel"], table["used"], table["panel view"])
                    if used and c not in transforms_set and not same_for_the_model(used, view)}
    if unlike_panel and st.button(
            f"Use the panel's views ({', '.join(unlike_panel)})", key="train_transform_panel",
            help="The scales the Explore and Gate pages show these channels on (Channel transforms there); "
                 "a linear view is the same to the model whatever its scale."):
        transforms_set.update(unlike_panel)
        st.rerun()
    t1, t2, t3, t4 = st.columns([2, 2, 1, 1], vertical_alignment="bottom")
    transform_channel = t1.selectbox("Channel", channels, key="train_transform_channel",
                                     format_func=lambda c: channel_label(records[0].sample, c))
    transform_text = t2.text_input("Transform", key="train_transform_text", help=f"{TRANSFORM_FORMS}.",
                                   placeholder=str(table.set_index("channel").loc[transform_channel, "found"]))
    if t3.button("Set", key="train_transform_set"):
        try:
            transforms_set[transform_channel] = checked_transform(transform_text)
        except ValueError as exc:
            st.error(f"{transform_channel}: {exc}")
        else:
            st.rerun()
    if t4.button("As found", key="train_transform_reset", disabled=not transforms_set,
                 help="Every channel back to the transform found from its values."):
        transforms_set.clear()
        st.rerun()
    return transforms_set
