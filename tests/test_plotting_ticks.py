"""Axis ticks of arcsinh / logicle axes: decades, and 5·10^k / 2·10^k only where the decades
leave a wide stretch of the axis unlabelled (channel numbers 0-1023 on an arcsinh axis)."""

from __future__ import annotations

import numpy as np
import pytest

from gating_core.gates import AxisScale
from gating_core.reports import plotting


def _ticks(scale: AxisScale, raw_lo: float, raw_hi: float, **kwargs):
    display_lo, display_hi = (float(v) for v in scale.forward(np.array([raw_lo, raw_hi])))
    return plotting.raw_ticks(scale, display_lo, display_hi, **kwargs), (display_lo, display_hi)


def _raw(labels) -> list[float]:
    return [float(label.replace("K", "e3")) for label in labels]


# The ticks these axes had before intermediate ticks existed: they have no wide unlabelled
# stretch, so they keep their decades alone, at the same positions.
TYPICAL_AXES = [
    (AxisScale("arcsinh", cofactor=150), -1000.0, 262144.0, ["-100", "0", "100", "1000", "10K", "100K"]),
    (AxisScale("arcsinh", cofactor=5), 0.0, 1e4, ["0", "10", "100", "1000", "10K"]),
    (AxisScale("arcsinh", cofactor=5), -20.0, 20000.0, ["-10", "0", "10", "100", "1000", "10K"]),
    (AxisScale("arcsinh", cofactor=150), 0.0, 262144.0, ["0", "100", "1000", "10K", "100K"]),
    (AxisScale("logicle"), -100.0, 262144.0, ["-100", "0", "100", "1000", "10K", "100K"]),
    (AxisScale("logicle", top=1e4), -10.0, 1e4, ["-10", "0", "10", "100", "1000"]),
]


@pytest.mark.parametrize("scale, raw_lo, raw_hi, labels", TYPICAL_AXES)
def test_typical_axes_keep_their_decade_ticks(scale, raw_lo, raw_hi, labels):
    (positions, text), _ = _ticks(scale, raw_lo, raw_hi)
    assert text == labels
    assert positions == [float(v) for v in scale.forward(np.array(_raw(labels)))]


@pytest.mark.parametrize("raw_hi, labels", [
    (1023.0, ["0", "100", "200", "500", "1000"]),  # channel numbers: 0, 100, 1000 alone before
    (900.0, ["0", "100", "200", "500"]),  # 0 and 100 alone before: two thirds of the axis unlabelled
    (300.0, ["0", "10", "50", "100", "200"]),
])
def test_channel_numbers_on_an_arcsinh_axis_get_intermediate_ticks(raw_hi, labels):
    scale = AxisScale("arcsinh", cofactor=150)
    (positions, text), (display_lo, display_hi) = _ticks(scale, 0.0, raw_hi)
    assert text == labels
    np.testing.assert_allclose(scale.inverse(np.array(positions)), _raw(labels), rtol=1e-12, atol=1e-9)
    span = display_hi - display_lo
    assert np.diff(positions).min() >= 0.04 * span  # no two labels collide
    stretches = np.diff([display_lo, *positions, display_hi])
    assert stretches.max() <= span / 3


def test_intermediate_ticks_on_a_dlbcl_axis_both_transforms():
    """The display range Explore gives a FlowCAP DLBCL channel (FL1.LOG, channel numbers, $PnR
    262144), in arcsinh (cofactor 150) and in logicle: before, labels 0 and 100 only."""
    arcsinh = AxisScale("arcsinh", cofactor=150)
    assert plotting.raw_ticks(arcsinh, -0.0846, 2.2160)[1] == ["0", "100", "200", "500"]
    logicle = AxisScale("logicle", top=262144)
    assert plotting.raw_ticks(logicle, 0.1001, 0.4168)[1] == ["0", "100", "200", "500"]


def test_intermediate_ticks_on_both_sides_of_zero_and_in_thousands():
    (_, text), _ = _ticks(AxisScale("arcsinh", cofactor=150), -1023.0, 1023.0)
    assert text == ["-1000", "-500", "-100", "0", "100", "500", "1000"]
    (_, text), _ = _ticks(AxisScale("arcsinh", cofactor=1500), 0.0, 20000.0)
    assert text == ["0", "1000", "2000", "5000", "10K"]


def test_intermediate_ticks_never_push_out_decades():
    """At most ``max_ticks``: an intermediate tick is added only while there is room, so the
    decades are never thinned for one."""
    scale = AxisScale("arcsinh", cofactor=150)
    assert _ticks(scale, 0.0, 1023.0, max_ticks=3)[0][1] == ["0", "100", "1000"]
    assert _ticks(scale, 0.0, 1023.0, max_ticks=4)[0][1] == ["0", "100", "500", "1000"]  # 5·10^k first
    assert _ticks(scale, 0.0, 1023.0, max_ticks=5)[0][1] == ["0", "100", "200", "500", "1000"]


def test_plots_side_by_side_keep_their_x_ticks_apart_in_the_narrower_axis():
    """Four mass cytometry patients side by side (arcsinh, cofactor 5, raw -1.5 to 200): each x
    axis is a quarter as wide, and -1, 0 and 1, 4% of one axis apart, overlapped."""
    from ui.charts import scatter_panels

    scale = AxisScale("arcsinh", cofactor=5)
    x_range = tuple(float(v) for v in scale.forward(np.array([-1.5, 200.0])))
    grid = (np.ones((8, 8)), np.linspace(*x_range, 8), np.linspace(*x_range, 8))

    def x_ticks(n_panels):
        panels = [{"title": f"p{i}", "grid": grid} for i in range(n_panels)]
        fig = scatter_panels(panels, scale, scale, x_range, x_range, "CD4", "CD8")
        axes = [fig.layout[name] for name in fig.layout if name.startswith("xaxis")]
        assert len(axes) == n_panels and all(list(a.ticktext) == list(axes[0].ticktext) for a in axes)
        return list(axes[0].tickvals), list(axes[0].ticktext), list(fig.layout.yaxis.ticktext)

    values, text, y_text = x_ticks(1)
    assert text == ["-1", "0", "1", "10", "50", "100"] and y_text == text
    values, text, y_text = x_ticks(4)
    assert text == ["0", "10", "100"] and y_text == ["-1", "0", "1", "10", "50", "100"]
    assert np.diff(values).min() >= 0.16 * (x_range[1] - x_range[0])
    # however many plots, an axis keeps ticks to read
    assert x_ticks(12)[1] == ["0", "10", "100"]
