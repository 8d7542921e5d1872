"""Whether an output computed one way is the same as computed another: a request run alone and
stacked with others (gateway/stacking_check.py), a batch run as it is and padded with zero rows
(executors/batch_shapes.py)."""

from __future__ import annotations

import numpy as np

# How far float outputs may be apart, as a share of how they vary (their norm about their mean).
# Kernels pick other blockings per batch size (the last bits), and a dynamically quantized model
# (onnxruntime.quantization's quantize_dynamic) takes its scale from a run's whole input, rows
# together: 0.5% on a quantized MLP. Mixed rows are another request's: 75% to 104% on the models
# that mix that were tried.
RELATIVE_ERROR = 0.05


def why_not_same(name: str, alone: np.ndarray, other: np.ndarray, which: str, how: str) -> str | None:
    """Why output ``name`` of ``which`` rows is not the same ``how`` (stacked, padded) as alone,
    or None: floats within ``RELATIVE_ERROR`` of the norm of the values about their mean (of
    their norm where they are all one value), with the same infinities and NaNs; anything else
    equal."""
    if alone.shape != other.shape:
        return f"output '{name}' of the {which} has shape {list(alone.shape)} alone, {list(other.shape)} {how}"
    if alone.dtype.kind in "fc":
        finite = np.isfinite(alone)
        # NaN where NaN was is the same (np.array_equal's own NaN never equals itself: a model
        # answering NaN anywhere looked as if its runs differed, and was never checked).
        if not np.array_equal(finite, np.isfinite(other)) or not np.array_equal(alone[~finite], other[~finite], equal_nan=True):
            return f"output '{name}' of the {which} has other infinities or NaNs {how} than alone"
        values = alone[finite].astype(np.float64)
        error = float(np.linalg.norm(other[finite].astype(np.float64) - values))
        # Measured against how the values vary, not their size: an offset common to every value
        # (x - mean(x) + 100) hid another request's rows, 0.05% of the norm.
        scale = float(np.linalg.norm(values - values.mean())) if values.size else 0.0
        same = error <= RELATIVE_ERROR * (scale or float(np.linalg.norm(values))) or error == 0.0
    else:
        same = np.array_equal(other, alone)
    return None if same else f"output '{name}' of the {which} is not the same {how} as alone"
