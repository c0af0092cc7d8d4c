"""Streamlit-side helpers shared by the app's pages (session store, cached computations, charts)."""
