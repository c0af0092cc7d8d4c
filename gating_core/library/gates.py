"""Gates drawn in the app (one gate tree per patient) and the panel's display transforms and
axis ranges they are drawn on.

Part of :class:`~gating_core.library.PatientLibrary` (a mixin: it uses the library's
``_connect``, ``_file_path`` and its sibling parts through ``self``)."""

from __future__ import annotations

import json
import math

from gating_core.library.common import LibraryError, _jsonable, _now
import gating_core.library.catalog as catalog


class GatesMixin:
    """Gates drawn in the app (one gate tree per patient) and the panel's display transforms they
    are drawn on."""

    DISPLAY_TRANSFORMS_FILE = "display_transforms.json"

    def load_display_transforms(self) -> dict:
        """The panel's display and gating transform per channel ($PnN -> AxisScale dict), as
        saved by :meth:`save_display_transforms`; empty when none was saved or the file is unreadable."""
        data = self._read_json(self.DISPLAY_TRANSFORMS_FILE)
        if not isinstance(data, dict):
            return {}
        return {str(k): dict(v) for k, v in data.items() if isinstance(v, dict)}

    def save_display_transforms(self, transforms: dict) -> None:
        """Store the per-channel display transforms ($PnN -> AxisScale dict)."""
        self._write_json(self.DISPLAY_TRANSFORMS_FILE, {str(k): dict(v) for k, v in transforms.items()})

    AXIS_RANGES_FILE = "axis_ranges.json"

    def load_axis_ranges(self) -> dict:
        """The panel's axis ranges set by hand ($PnN -> (low, high) in raw units), as saved by
        :meth:`save_axis_ranges`; a channel without one is drawn on its events' own range. An
        entry that is not two finite increasing numbers is left out; empty when none was saved
        or the file is unreadable."""
        data = self._read_json(self.AXIS_RANGES_FILE)
        if not isinstance(data, dict):
            return {}
        ranges = {}
        for channel, limits in data.items():
            try:
                low, high = (float(v) for v in limits)
            except (TypeError, ValueError):
                continue
            if math.isfinite(low) and math.isfinite(high) and low < high:
                ranges[str(channel)] = (low, high)
        return ranges

    def save_axis_ranges(self, ranges: dict) -> None:
        """Store the axis ranges set by hand ($PnN -> (low, high) in raw units)."""
        self._write_json(self.AXIS_RANGES_FILE, {str(k): [float(v[0]), float(v[1])] for k, v in ranges.items()})

    def save_gates(self, name: str, gates_json) -> int:
        """Store the patient's gate tree: JSON text, or a JSON-serialisable object. Earlier versions
        are kept. Returns the gate set id."""
        if isinstance(gates_json, (str, bytes)):
            text = gates_json.decode() if isinstance(gates_json, bytes) else gates_json
            try:
                json.loads(text)
            except ValueError as exc:
                raise LibraryError(f"gates are not valid JSON ({exc})", patient=name) from None
        else:
            try:
                text = json.dumps(_jsonable(gates_json))
            except TypeError as exc:
                raise LibraryError(f"gates cannot be stored as JSON ({exc})", patient=name) from None
        with self._connect() as conn, catalog.write_transaction(conn):
            row = self._patient_row(conn, name)
            now = _now()
            cursor = conn.execute("INSERT INTO gate_sets (patient_id, gates_json, created_at) VALUES (?, ?, ?)",
                                  (row["id"], text, now))
            self._audit(conn, "save gates", row["id"], row["name"], None, {"gate_set_id": cursor.lastrowid}, now)
            return cursor.lastrowid

    def load_gates(self, name: str, *, as_text: bool = False):
        """The patient's latest gate tree, decoded from JSON (or the JSON text), or None."""
        with self._connect() as conn, catalog.read_transaction(conn):
            row = self._patient_row(conn, name)
            found = conn.execute("SELECT gates_json FROM gate_sets WHERE patient_id = ? ORDER BY id DESC LIMIT 1",
                                 (row["id"],)).fetchone()
        if found is None:
            return None
        return found[0] if as_text else json.loads(found[0])
