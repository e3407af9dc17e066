"""Inference outside the recipe: transcribe any audio, model packages, ONNX and sherpa-onnx export.

Sits above :mod:`asrkit.decode` and :mod:`asrkit.model` and below the CLI; nothing in data,
model, decode or training imports it.

* :func:`load_model` / :class:`Transcriber` (:mod:`.transcriber`): the Python API
  (``asrkit.load_model(DIR).transcribe(path_or_array)``); ``asrkit transcribe`` (:mod:`.transcribe`).
* :mod:`.audio`: any format, rate and channel count, read span by span.
* :mod:`.align`: word timings from the CTC alignment or the attention decoder.
* :mod:`.chunking`: long recordings as overlapping chunks merged between words.
* :mod:`.formats`: text, JSON, SRT, WebVTT, CTM.
* :mod:`.package`, :mod:`.onnx`, :mod:`.sherpa`: ``asrkit export`` (:mod:`.export`).
"""
from __future__ import annotations

from asrkit.inference.align import Word
from asrkit.inference.audio import InputError
from asrkit.inference.transcriber import Transcriber, Transcript, load_model

__all__ = ["load_model", "Transcriber", "Transcript", "Word", "InputError"]
