"""Train: fit a gating model on historical patients and check it patient by patient."""

import inspect

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from gating_core.fcs.transforms import is_time_like
from gating_core.model.file_checks import ModelFileError
from gating_core.model.summary import (adapted_populations_text, few_patients_note, pooled_trees_text,
                                      saturated_note, similar_names_note, unknown_cells_text, unknown_name_note)
from ui.app_state import (common_channels, incompatible_label_sets, label_set_disagreements, later_twins,
                          training_panel, twin_labels_note, worst_patient_note)
from ui.common import (adopt_finished_jobs, channel_label, get_store, job_outcome, job_progress, model_offers,
                       model_picker, others_jobs, refresh_status, require_patients, session_name_input)
from ui.jobs import DONE, format_seconds, jobs_for
from ui.model_transforms import model_transforms, transform_choices
from ui.training import (DEFAULT_DICA_COMPONENTS, DICA_LABELS, IW_METHOD, KERNEL_LABELS, LOSS_LABELS, METHOD_LABELS,
                         check_differences, check_matches_model, is_transductive, method_label, method_params,
                         model_class, model_kind, start_check, start_training, training_settings)
from ui.models import load_model_bytes, model_bytes, model_channel_labels

#: The check's scores as its table and messages name them.
METRIC_TITLES = {"accuracy": "accuracy", "macro_f1": "macro-F1"}
store = get_store()
st.title("Train a gating model")
st.caption("Train a model on labeled (historical) patients. **Marginal transfer** (recommended) looks at each "
           "patient's whole cell distribution as well as each cell, and fits each population to the new "
           "patient's own clusters, so it follows a patient, run or center whose cells have moved. The other "
           "methods are there to compare with: **pooling** treats all cells alike (the classic approach); "
           "**importance-weighted Nystroem** refits for each new patient on the training cells most like "
           "its own.")

with st.expander("Load a saved model (.npz, as written by this app or `python -m gating_core train`)"):
    model_file = st.file_uploader("Model file", type=["npz"], key="model_upload")
    if model_file is not None and st.session_state.get("loaded_model_id") != model_file.file_id:
        try:
            model = load_model_bytes(model_file.getvalue(), store.work_dir, name=model_file.name)
            store.add_model(f"loaded: {model_file.name[:60]}", model)
            refresh_status(store)
            st.session_state["loaded_model_id"] = model_file.file_id
            st.success(f"Loaded a model ({model_kind(model)}) for {', '.join(map(str, model.populations_))}.")
        except ModelFileError as exc:  # names the file and the problem
            st.error(str(exc))
        except Exception as exc:  # anything else: shown, never raised
            st.error(f"{model_file.name}: {exc}")

if not require_patients(store, labeled=True):
    st.stop()

labeled = store.labeled()
# One panel by default: patients measured with other channels would be learned on the few
# channel names they happen to share with the rest. They stay choosable, and say why they are out.
active = store.model()
panel, other_panel = training_panel({n: store.patients[n].channel_names for n in labeled},
                                    getattr(active, "training_patients_", ()) if active is not None else ())
# A labeled patient whose events an earlier labeled one holds (the same file loaded twice) is
# not chosen: learned twice, it would count twice, or teach two labelings of the same cells.
twins = later_twins(labeled, list(store.patients),
                    {n: [t for t in ts if t in labeled] for n, ts in store.same_events(labeled).items()})
chosen = st.multiselect("Historical patients to learn from", labeled, default=[n for n in panel if n not in twins],
                        key="train_patients")
if other_panel:
    st.caption("Not chosen by default: " + "; ".join(f"**{n}**, {why}" for n, why in other_panel.items()) + ".")
for name, first in twins.items():
    note = twin_labels_note(name, first, store.patients[name].labels, store.patients[first].labels,
                            chosen=name in chosen and first in chosen)
    (st.warning if name in chosen and first in chosen else st.caption)(note)
if len(chosen) < 2:
    st.info("Pick at least two labeled patients.")
    st.stop()
records = [store.patients[n] for n in chosen]
all_pops = sorted({str(p) for r in records for p in pd.unique(r.labels)})
default_pops = [p for p in all_pops if p.casefold() not in ("other", "ungated")]
c1, c2 = st.columns([3, 2])
pops = c1.multiselect("Populations to learn", all_pops, default=default_pops, key="train_pops",
                      help="Cells of populations left out are learned as `other`.")
renamed = [p for p in all_pops if p not in pops and p != "other"]
if renamed:
    # A lab's own name for cells of no population ("ungated") would otherwise vanish without a word.
    st.caption("Learned as `other` (not among the populations to learn): "
               + ", ".join(f"`{p}`" for p in renamed) + ". Auto-gated patients show these cells as `other`.")
# Populations one patient has and another lacks are learned as `other` for the latter: say so,
# and refuse (unless overridden) when a patient's labeling is of another kind altogether.
label_sets = {r.name: set(pd.unique(np.asarray(r.labels).astype(str))) & set(pops) for r in records}
disagreements = label_set_disagreements(label_sets)
incompatible = incompatible_label_sets(label_sets)
train_anyway = True
if disagreements:
    lines = "\n".join(f"- **{pop}**: none in {', '.join(lacking)}" for pop, lacking in disagreements.items())
    if incompatible:
        st.error(f"The label sets of {', '.join(incompatible)} are not like the others' (a population no other "
                 "patient has, or most populations missing): training would learn the others' populations "
                 "as `other` there.  \n" + lines + "  \nRestore an earlier label version (Gate or Auto-gate "
                 "page), leave these patients out, or train anyway.")
        train_anyway = st.checkbox("Train anyway on these label sets", key="train_anyway")
    else:
        st.warning("Some patients have no cells of a population the others have (this can be biology, "
                   "e.g. a B-cell-depleted patient); their cells are learned as the populations they are "
                   "labeled with.  \n" + lines)
method = c2.radio("Method", list(METHOD_LABELS), key="train_method", horizontal=True, format_func=METHOD_LABELS.get,
                  help="Multitask: k_P = tau between two training patients (a further baseline; see Advanced). "
                       "Importance-weighted Nystroem: a kernel ridge fit weighted by p_new/p_train, refitted for "
                       "every patient it gates (seconds per patient; its model file keeps training cells).")
transductive = method == IW_METHOD
channels_all = common_channels([r.sample for r in records])
from gating_core.method.groups import groups_from_keyword, shared_group_keywords  # noqa: E402

group_by = st.selectbox(
    "Groups of patients (center, batch or run)", ["auto", "none", *shared_group_keywords([r.sample for r in records])],
    key="train_groups",
    format_func=lambda g: {"auto": "Found from the data (near-duplicate patients kept together)",
                           "none": "None: every patient on its own"}.get(g, f"By the keyword {g}"),
    help="Model selection and the check hold out whole groups: a new patient usually comes from a run "
         "the model has not seen, so a patient whose twin stayed in training says too little.")


def _groups(samples):
    """Groups for training (None: inferred by the model) from the choice above."""
    if group_by == "auto":
        return None
    if group_by == "none":
        return [s.name for s in samples]
    return groups_from_keyword(samples, group_by)

with st.expander("Advanced: loss, DICA, cell kernel and the multitask baseline"):
    if transductive:
        st.caption("The importance-weighted Nystroem model is a squared-loss kernel ridge fit on the channels: "
                   "the loss and DICA choices are of the other methods.")
    loss = st.radio("Loss", list(LOSS_LABELS), key="train_loss", horizontal=True, format_func=LOSS_LABELS.get,
                    disabled=transductive,
                    help="Squared is fastest and the default; hinge and logistic are the papers' other losses, "
                         "several times slower to train.")
    task_similarity = st.number_input("Task similarity tau (multitask)", min_value=0.01, max_value=1.0, value=0.5,
                                      step=0.01, key="train_tau", disabled=method != "multitask",
                                      help="k_P between two different training patients; 1 is pooling.")
    d1, d2 = st.columns([3, 1])
    dica = d1.radio("Domain-invariant projection (DICA)", list(DICA_LABELS), key="train_dica", horizontal=True,
                    format_func=DICA_LABELS.get, disabled=transductive,
                    help="Muandet et al. 2013: project the cells onto directions along which the patients' "
                         "distributions differ least (DICA keeps those that tell the populations apart). "
                         "Fitted once on the training patients; the check refits it per fold.")
    dica_components = d2.number_input("Components", min_value=1, max_value=600, value=DEFAULT_DICA_COMPONENTS,
                                      step=1, key="train_dica_components", disabled=transductive or dica == "none",
                                      help="Directions DICA keeps (1 to 600).")
    kernel_x = st.radio("Cell kernel", list(KERNEL_LABELS), key="train_kernel", horizontal=True,
                        format_func=KERNEL_LABELS.get, disabled=transductive,
                        help="Linear: each patient's gate is linear in the cell and the patient is seen through "
                             "its mean cell (the JMLR flow experiment); coarser than the Gaussian kernel on "
                             "these populations (README).")
    if transductive:
        loss, dica, kernel_x = "squared", "none", "gaussian"

with st.expander("Channels, their transforms and hyperparameters (automatic unless you change them)"):
    channels = st.multiselect("Channels", channels_all, format_func=lambda c: channel_label(records[0].sample, c),
                              default=[c for c in channels_all if c.lower() != "time"], key="train_channels")
    model_channels = channels or [c for c in channels_all if not is_time_like(c)]
    transforms_set = transform_choices(store, records, model_channels)
    hand = st.checkbox("Set hyperparameters by hand", key="train_hand")
    params, hand_defaults = {}, {}
    if hand:
        # The chosen method's own parameters (the IW model's have their own widget keys: its
        # defaults differ from GatingModel's for a parameter of the same name).
        sig = inspect.signature(model_class(method).__init__)
        prefix = "hp_iw_" if transductive else "hp_"
        cols = st.columns(3)
        k = 0
        for name, p in sig.parameters.items():
            if name in ("self", "method", "channels", "transform", "random_state", "compensate", "task_similarity",
                        "dica", "dica_components"):
                continue
            col = cols[k % 3]
            if isinstance(p.default, bool):
                params[name] = col.checkbox(name, value=p.default, key=f"{prefix}{name}")
            elif isinstance(p.default, (int, float)):
                params[name] = col.number_input(name, value=p.default, key=f"{prefix}{name}")
            elif p.default == "auto":  # chosen by cross-validation unless set
                value = col.number_input(f"{name} (empty = cross-validated)", value=None, min_value=0.0,
                                         max_value=1.0, format="%.4g", key=f"{prefix}{name}")
                if value is not None:
                    params[name] = float(value)
                hand_defaults[name] = p.default
                k += 1
                continue
            elif p.default is None:
                value = col.number_input(f"{name} (empty = automatic)", value=None, min_value=0.0, format="%.4g",
                                         key=f"{prefix}{name}")
                if value is not None:
                    params[name] = float(value)
            else:
                continue
            hand_defaults[name] = p.default
            k += 1


# The choices above first; what was set by hand overrides them (the IW model's defaults).
params = {**method_params(method, loss, task_similarity, dica, dica_components, kernel_x), **params}
changed_by_hand = {k: v for k, v in params.items() if k in hand_defaults and v != hand_defaults[k]}
if transforms_set:
    params["transform"] = dict(transforms_set)
    changed_by_hand["transform"] = ", ".join(f"{c} {t}" for c, t in transforms_set.items())


def _training_labels(record):
    labels = np.asarray(record.labels).astype(object)
    keep = np.isin(labels.astype(str), pops)
    return np.where(keep, labels, "other").astype(object)


# Training runs as a background job: leaving the page or reloading does not stop it. One runs
# at a time on a library; a training asked for while another session's runs waits behind it.
session_name_input(store)
training = job_progress(store, "train", "train_job")
busy = others_jobs(store, "train")
if st.button("Train model", type="primary", key="train_button",
             disabled=not pops or not train_anyway or training is not None,
             help="It goes on in the background while you use other pages. One training runs at a time on "
                  "this library: while another runs, yours waits for it and then starts."):
    samples = [r.sample for r in records]
    kind = method_label(method, loss, params.get("task_similarity"), params.get("dica"), params.get("dica_components"))
    name = f"{kind}, {len(records)} patients"
    start_training(store, name=name, method=method, channels=channels,
                   params=params, samples=samples, labels=[_training_labels(r) for r in records],
                   groups=_groups(samples), training_patients=chosen,
                   settings=training_settings(kind, chosen, pops, channels, changed_by_hand))
    st.rerun()
if busy and training is None:
    st.caption("Pressing **Train model** now queues your training behind the one above.")
job_outcome(store, "train", "Training")
mine = [j for j in jobs_for(store.library_path, "train") if not j.running and j.owner == store.session_id]
if training is None and mine and mine[-1].status == DONE:
    adopt_finished_jobs(store)
    last = mine[-1].result
    label = next((lbl for lbl, i in store.model_ids.items() if i == last["model_id"]), last["name"])
    st.success(f"Trained **{label}** on {last['n_cells']:,} cells in {format_seconds(mine[-1].elapsed)}.")
    refresh_status(store)

if store.models:
    st.subheader("Models")
    model_offers(store, "train")
    current = model_picker(st, store, "current_model_pick")
    model = store.models[current]
    adapted, unknown, trees = adapted_populations_text(model), unknown_cells_text(model), pooled_trees_text(model)
    st.markdown(f"Method: {model_kind(model)}  \n"
                f"Populations: {', '.join(map(str, model.populations_))}  \n"
                f"Channels: {', '.join(model_channel_labels(model))}  \n"
                f"Channel transforms: {model_transforms(model)}"
                + (f"  \nEach patient's own populations: {adapted}" if adapted else "")
                + (f"  \nPooled trees: {trees}" if trees else "")
                + (f"  \nUnknown cells: {unknown}" if unknown else ""))
    for note in (few_patients_note(model), unknown_name_note(model), similar_names_note(model), saturated_note(model)):
        if note:
            st.info(note[0].upper() + note[1:] + ".")
    st.download_button("Save model (.npz)", data=lambda: model_bytes(model, store.work_dir),
                       file_name="gating_model.npz", mime="application/octet-stream", key="save_model",
                       help="Same format as the command line: `python -m gating_core gate --model …`.")

st.subheader("Check on held-out patients")
st.caption("Each group of patients (center, batch or run; chosen above) in turn is gated by a model trained "
           "on the others: the honest estimate of how well a patient from a new run will be gated. Leaving "
           "one patient out is shown beside it, fitted from the statistics of all patients minus the held-out "
           "one (about the cost of one training; its labels never reach its fold). Marginal transfer, pooling "
           "and linear discriminant analysis (LDA, a strong simple baseline) run on the same split, with the "
           "settings chosen above.")
checking = job_progress(store, "check", "check_job")
if transductive:
    st.caption("The check here does not offer the importance-weighted Nystroem model (it refits for every "
               "patient it gates); the command line measures it beside the baselines: `gating-core evaluate "
               "--method iw-nystroem lda ...`. Choose another method above to run the check here.")
elif dica != "none":
    st.caption("With DICA the projection is refitted on each fold's training patients (never on the held-out "
               "one), so each fold is a full training of marginal transfer and of pooling: the check takes longer.")
if st.button("Run the check", key="lopo_button", disabled=checking is not None or transductive):
    model_params = dict(params)
    if channels:
        model_params["channels"] = channels
    samples = [r.sample for r in records]
    start_check(store, samples=samples, labels=[_training_labels(r) for r in records], groups=_groups(samples),
                model_params=model_params,
                settings=training_settings(method_label(method, loss), chosen, pops, channels, changed_by_hand))
    st.rerun()
job_outcome(store, "check", "The check")
adopt_finished_jobs(store)

table = store.evaluation
if table is not None and len(table):
    record = store.check_record
    belongs = check_matches_model(record, store.models[store.current_model]) if store.models else None
    if belongs:
        when = str(record.get("saved_at", ""))[:16].replace("T", " ")
        st.caption("This check was run on the current model's patients, populations and settings"
                   + (f" ({when} UTC)." if when else "."))
    elif belongs is False and is_transductive(store.models[store.current_model]):
        st.info("This check measured marginal transfer, pooling and LDA, not the current model "
                "(importance-weighted Nystroem, which the check does not offer).")
    elif belongs is False:
        differences = check_differences(record, store.models[store.current_model])
        st.info("This check does not describe the current model"
                + (f": {'; '.join(differences)}" if differences else "")
                + ". Train a model with the patients and settings the check measured for it to apply, or choose "
                  "the model's and run the check again.")
    protocols = list(dict.fromkeys(table["protocol"])) if "protocol" in table.columns else []
    if len(protocols) > 1:
        protocol = st.radio("Protocol", protocols, key="check_protocol", horizontal=True,
                            help="Leave-one-group-out is what a patient from a new run will see.")
        table = table[table["protocol"] == protocol]
    elif protocols:
        st.caption(f"Protocol: {protocols[0]}: each patient is held out in turn (the groups found leave no "
                   "other split: one group, or one patient a group).")
    show = table.copy()
    order = [m for m in ("marginal", "pooling", "lda") if m in set(show["method"])]
    wide = show.pivot_table(index="patient", columns="method", values=["accuracy", "macro_f1"])
    wide = wide[[(metric, m) for metric in ("accuracy", "macro_f1") for m in order]]
    wide.columns = [f"{METRIC_TITLES[metric]} ({method})" for metric, method in wide.columns]
    key = "macro-F1 (marginal)" if "macro-F1 (marginal)" in wide.columns else wide.columns[-1]
    means = show.groupby("method")[["accuracy", "macro_f1"]].mean().loc[order]
    cols = st.columns(len(means))
    for col, (m, row) in zip(cols, means.iterrows()):
        col.metric(f"{m}: mean accuracy", f"{100 * row['accuracy']:.1f}%",
                   help=f"mean macro-F1 {row['macro_f1']:.3f}")
    kind, note, worst = worst_patient_note(wide[key], key)
    getattr(st, kind)(note)
    st.dataframe(wide.style.format("{:.3f}").apply(
        lambda r: ["background-color: #fde2d4" if r.name == worst else "" for _ in r], axis=1),
        width="stretch")
    fig = go.Figure()
    for m, color in (("marginal", "#0072B2"), ("pooling", "#E69F00"), ("lda", "#999999")):
        part = show[show["method"] == m].sort_values("patient")  # the table's order
        if len(part):
            fig.add_trace(go.Bar(x=part["patient"], y=part["macro_f1"], name=m, marker_color=color))
    low = float(show["macro_f1"].min())
    fig.update_layout(barmode="group", height=340, yaxis_title="macro F1 (zoomed)",
                      yaxis_range=[max(0.0, low - 0.1 * (1.0 - low) - 0.02), 1.0],
                      margin=dict(l=60, r=20, t=20, b=50), plot_bgcolor="white")
    if worst is not None:
        fig.add_annotation(x=worst, y=float(wide.loc[worst, key]), text="worst", showarrow=True, arrowhead=2)
    st.plotly_chart(fig, width="stretch", key="lopo_chart")
    f1_cols = [c for c in show.columns if c.startswith("f1:")]
    if f1_cols:
        with st.expander("F1 per population"):
            st.dataframe(show[["patient", "method", *f1_cols]].style.format({c: "{:.3f}" for c in f1_cols}),
                         hide_index=True, width="stretch")
