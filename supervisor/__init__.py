"""Node-level arbitration of the controllers' core demands (ROMA Algorithm 2) and its actuation."""
