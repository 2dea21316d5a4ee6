"""Plots: a real PNG file comes out, with and without bootstrap draws."""

from pathlib import Path

import numpy as np
import pytest

from scalerl.errors import InputError
from scalerl.fit import fit_curve, plot_fit, sample_curve

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


def test_plot_to_a_missing_directory_is_an_input_error(tmp_path: Path) -> None:
    result = fit_curve(COMPUTE, PASS_RATE, bootstrap=0)
    with pytest.raises(InputError, match="cannot write the plot"):
        plot_fit(result, COMPUTE, PASS_RATE, tmp_path / "no" / "such" / "dir.png")
