"""Node-level arbitration of the controllers' core demands (ROMA Algorithm 2) and the per-period control step."""
