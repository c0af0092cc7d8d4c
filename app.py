"""Flow cytometry auto-gating: the browser app. Run with ``streamlit run app.py``.

The app is a thin layer over ``gating_core``: each page under ``pages/`` reads top to bottom
(Data -> Explore -> Gate -> Train -> Auto-gate) and keeps its state in ``ui.store.Store``.
"""

import streamlit as st

from ui.common import get_store, sidebar_status

st.set_page_config(page_title="Flow auto-gating", page_icon=":material/biotech:", layout="wide",
                   initial_sidebar_state="expanded")

store = get_store()
pages = [
    st.Page("pages/1_data.py", title="Data", icon=":material/upload_file:", default=True),
    st.Page("pages/2_explore.py", title="Explore", icon=":material/scatter_plot:"),
    st.Page("pages/3_gate.py", title="Gate", icon=":material/draw:"),
    st.Page("pages/4_train.py", title="Train", icon=":material/model_training:"),
    st.Page("pages/5_autogate.py", title="Auto-gate", icon=":material/auto_awesome:"),
]
navigation = st.navigation(pages)
sidebar_status(store)
navigation.run()
