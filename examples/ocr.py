"""The numpy steps of the PP-OCRv4 pipeline (examples/config.toml, [pipelines.ocr]):

    image -> detector_input -> ppocr_det -> text_boxes -> ppocr_cls -> recognizer_input -> ppocr_rec -> decode_text

The models are the three of the rapidocr-onnxruntime 1.4.4 wheel (examples/make_models.py takes
them out of it), and these steps follow what that package does around them (its config.yaml:
mean and std 0.5, DB's threshold 0.3, box threshold 0.5, unclip ratio 1.6, the angle classifier
at 3x48x192 with a 0.9 threshold, the recognizer at height 48 and at least 320 wide, CTC greedy
decoding over the character list stored in the recognizer's metadata). Boxes are upright
rectangles around DB's connected regions, which is what horizontal text needs; image resizing is
Pillow's bilinear, connected regions scipy's. No OpenCV: these few operations do not need it.

Each function takes and returns a dict of numpy arrays; a bad image raises ValueError (the
gateway answers 400).
"""

from __future__ import annotations

import math
from functools import cache
from pathlib import Path

import numpy as np
from PIL import Image
from scipy import ndimage

MODELS = Path(__file__).resolve().parent / "models"
CHARACTERS = MODELS / "ppocr_keys.txt"
LIMIT_SIDE = 960  # the detector's input: the longer side at most this, each a multiple of 32
DB_THRESHOLD = 0.3
BOX_THRESHOLD = 0.5
UNCLIP_RATIO = 1.6
MIN_BOX_SIDE = 3
CLS_SHAPE = (48, 192)
CLS_THRESHOLD = 0.9
REC_HEIGHT = 48
REC_MIN_WIDTH = 320


def _check_image(image: np.ndarray) -> np.ndarray:
    if image.ndim != 3 or image.shape[2] != 3:
        raise ValueError(f"the image must be HxWx3 (RGB), got shape {list(image.shape)}")
    if min(image.shape[:2]) < 8 or max(image.shape[:2]) > 4096:
        raise ValueError(f"the image must be 8 to 4096 pixels a side, got {image.shape[0]}x{image.shape[1]}")
    return image


def _resize(image: np.ndarray, height: int, width: int) -> np.ndarray:
    return np.asarray(Image.fromarray(image).resize((width, height), Image.BILINEAR))


def _normalize(image: np.ndarray) -> np.ndarray:
    """HxWx3 uint8 -> 3xHxW float32 in [-1, 1] (mean and std 0.5, as the three models expect)."""
    return ((image.astype(np.float32) / 255.0 - 0.5) / 0.5).transpose(2, 0, 1)


def detector_input(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The image resized for the detector (sides multiples of 32, the longer at most 960)."""
    image = _check_image(inputs["image"])
    height, width = image.shape[:2]
    ratio = min(1.0, LIMIT_SIDE / max(height, width))
    h, w = (max(32, round(side * ratio / 32) * 32) for side in (height, width))
    x = _normalize(_resize(image, h, w))[None]
    return {"x": x, "scale": np.array([h / height, w / width], np.float32)}


def text_boxes(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """DB's post-processing: the regions of the probability map over the threshold whose mean
    is over the box threshold, each grown by the unclip ratio (offset = area x ratio /
    perimeter), mapped back to the image; top to bottom, then left to right. Also each box's
    crop as the angle classifier takes it (3x48x192)."""
    image = _check_image(inputs["image"])
    probability = inputs["probability"][0, 0]
    scale_y, scale_x = (float(s) for s in inputs["scale"])
    labels, count = ndimage.label(probability > DB_THRESHOLD)
    boxes = []
    for index, region in enumerate(ndimage.find_objects(labels), start=1):
        if region is None:
            continue
        y0, y1, x0, x1 = region[0].start, region[0].stop, region[1].start, region[1].stop
        if min(y1 - y0, x1 - x0) < MIN_BOX_SIDE:
            continue
        if probability[region][labels[region] == index].mean() < BOX_THRESHOLD:
            continue
        height, width = y1 - y0, x1 - x0
        offset = height * width * UNCLIP_RATIO / (2 * (height + width))
        top, bottom = (y0 - offset) / scale_y, (y1 + offset) / scale_y
        left, right = (x0 - offset) / scale_x, (x1 + offset) / scale_x
        box = [max(0, math.floor(left)), max(0, math.floor(top)), min(image.shape[1], math.ceil(right)),
               min(image.shape[0], math.ceil(bottom))]  # fmt: skip
        if box[2] - box[0] >= MIN_BOX_SIDE and box[3] - box[1] >= MIN_BOX_SIDE:
            boxes.append(box)
    boxes.sort(key=lambda b: (b[1] // 10, b[0]))
    crops = [_cls_crop(image[y0:y1, x0:x1]) for x0, y0, x1, y1 in boxes]
    return {
        "boxes": np.array(boxes, np.int32).reshape(-1, 4),
        "crops": np.stack(crops) if crops else np.zeros((0, 3, *CLS_SHAPE), np.float32),
    }


def _fit_height(crop: np.ndarray, height: int, max_width: int | None = None) -> np.ndarray:
    """The crop resized to ``height``, its aspect kept (at most ``max_width`` wide), normalized."""
    width = max(1, math.ceil(height * crop.shape[1] / crop.shape[0]))
    if max_width is not None:
        width = min(width, max_width)
    return _normalize(_resize(np.ascontiguousarray(crop), height, width))


def _cls_crop(crop: np.ndarray) -> np.ndarray:
    height, width = CLS_SHAPE
    padded = np.zeros((3, height, width), np.float32)
    fitted = _fit_height(crop, height, width)
    padded[:, :, : fitted.shape[2]] = fitted
    return padded


def recognizer_input(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Each box's crop turned upright where the classifier says 180 degrees with confidence,
    at height 48, padded to the widest (at least 320 wide, a multiple of 32 so that batches of
    different requests stack)."""
    image = _check_image(inputs["image"])
    boxes, angles = inputs["boxes"], inputs["angle"]
    crops = []
    for (x0, y0, x1, y1), scores in zip(boxes, angles, strict=True):
        crop = image[y0:y1, x0:x1]
        if int(np.argmax(scores)) == 1 and float(scores[1]) > CLS_THRESHOLD:
            crop = crop[::-1, ::-1]
        crops.append(_fit_height(crop, REC_HEIGHT))
    width = max([REC_MIN_WIDTH, *(c.shape[2] for c in crops)])
    width = math.ceil(width / 32) * 32
    x = np.zeros((len(crops), 3, REC_HEIGHT, width), np.float32)
    for i, crop in enumerate(crops):
        x[i, :, :, : crop.shape[2]] = crop
    return {"x": x}


@cache
def characters() -> list[str]:
    """CTC's classes: the blank, the recognizer's character list, and the space."""
    return ["", *CHARACTERS.read_text(encoding="utf-8").split("\n"), " "]


def decode_text(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """CTC greedy decoding: the best class at each step, repeats merged, blanks dropped; the
    score is the mean probability of the characters kept."""
    table = characters()
    probabilities = inputs["probabilities"]
    texts, scores = [], []
    for steps in probabilities:
        best, confidence = steps.argmax(axis=1), steps.max(axis=1)
        keep = (best != 0) & np.concatenate([[True], best[1:] != best[:-1]])
        texts.append("".join(table[i] for i in best[keep]).encode())
        scores.append(float(confidence[keep].mean()) if keep.any() else 0.0)
    return {"text": np.array(texts, dtype=np.object_), "score": np.array(scores, np.float32)}
