"""The live page at /ui: what each model, the node and its GPUs did over the last minutes.

``series.py`` keeps the per-second series (pure, fed by the engine's events), ``live.py`` answers
their JSON at ``GET /admin/live``, ``assets.py`` serves the page and its files from ``static/``
(uPlot, vendored with its license: the page loads nothing from outside the gateway).
"""
