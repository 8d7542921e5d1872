"""How many cores: per-model controllers that turn measured response times into core demands.

Every controller has the same small interface (``CoreController``), so ROMA's PI controller and
its baselines run side by side from the config. They are pure: they are handed the measurement
and return a number; the control loop in gateway/ owns the clock and the actuation.
"""
