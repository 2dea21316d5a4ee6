"""The sigmoidal scaling law of ScaleRL, its fitter, comparison of runs, and plots."""
