"""Plots: a real PNG file comes out, with and without bootstrap draws; compute on a log axis."""

from pathlib import Path

import numpy as np
import pytest

from scalerl.errors import InputError
from scalerl.fit import fit_curve, plot_fit, sample_curve
from scalerl.fit.plot import figure_of_fit

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
COMPUTE = np.arange(50) * 145.0
PASS_RATE = sample_curve(COMPUTE, 0.61, 1.92, 2542.0, 0.2, noise=0.006, seed=0)


@pytest.mark.parametrize("bootstrap", [100, 0])
def test_plot_writes_a_png(tmp_path: Path, bootstrap: int) -> None:
    result = fit_curve(COMPUTE, PASS_RATE, min_compute=1500.0, bootstrap=bootstrap)
    out = plot_fit(result, COMPUTE, PASS_RATE, tmp_path / "fit.png", predict_to=20_000.0)
    data = out.read_bytes()
    assert data.startswith(PNG_MAGIC)
    assert len(data) > 25_000  # a drawn figure: an empty set of axes is ~10 kB


def test_compute_is_on_a_log_axis_and_r0_stands_for_the_point_at_compute_0() -> None:
    result = fit_curve(COMPUTE, PASS_RATE, min_compute=1500.0, bootstrap=20)
    ax = figure_of_fit(result, COMPUTE, PASS_RATE, predict_to=20_000.0).axes[0]
    assert ax.get_xscale() == "log"
    left, right = ax.get_xlim()
    assert 0 < left <= COMPUTE[1] and right >= 20_000.0
    labels = [line.get_label() for line in ax.get_lines()]
    points = [line for line in ax.get_lines() if line.get_label().startswith("evaluations")]
    plotted = np.concatenate([line.get_xdata() for line in points])
    assert plotted.size == COMPUTE.size - 1  # all but compute 0: no place for it on a log axis
    assert np.all(plotted > 0)
    r0_line = ax.get_lines()[labels.index(f"R0 = {result.R0:.3f} (compute 0)")]
    assert list(r0_line.get_ydata()) == [result.R0, result.R0]


def test_plot_to_a_missing_directory_is_an_input_error(tmp_path: Path) -> None:
    result = fit_curve(COMPUTE, PASS_RATE, bootstrap=0)
    with pytest.raises(InputError, match="cannot write the plot"):
        plot_fit(result, COMPUTE, PASS_RATE, tmp_path / "no" / "such" / "dir.png")
