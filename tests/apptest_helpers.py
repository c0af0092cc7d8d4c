"""What the app's AppTest files share: starting the app, changing page, the session store."""

from __future__ import annotations

from pathlib import Path

from streamlit.testing.v1 import AppTest

REPO = Path(__file__).resolve().parent.parent
APP = str(REPO / "app.py")


def start(page: str | None = None) -> AppTest:
    """The app, run once (and on ``page`` when given), with no exception raised."""
    at = AppTest.from_file(APP, default_timeout=300)
    at.run()
    assert not at.exception
    if page:
        goto(at, page)
    return at


def goto(at: AppTest, page: str) -> AppTest:
    at.switch_page(page)
    at.run()
    assert not at.exception, at.exception
    return at


def store_of(at: AppTest):
    return at.session_state["store"]
