"""Predicting before running: a step's time on many devices (scaling.py's cost models, one
predictor per traffic pattern in predictors.py), from one device's measurement (measure.py) and
the links' presets (hardware.py). The memory planner is memory/'s."""
