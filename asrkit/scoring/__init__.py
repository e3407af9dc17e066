"""Word error rates as NIST sclite counts them, the report files, and significance tests.

- :mod:`asrkit.scoring.align`: word alignments, ``sclite`` (default) and ``levenshtein``;
- :mod:`asrkit.scoring.score`: counts per utterance, duration bin and long-form window;
- :mod:`asrkit.scoring.report`: ``asrkit score`` and the files it writes (``result.txt``, ...);
- :mod:`asrkit.scoring.significance`: bootstrap confidence intervals (Bisani & Ney, 2004) and
  the tests of NIST ``sc_stats`` (MAPSSWE, sign, Wilcoxon) for comparing two systems.

Imports nothing from asrkit but :mod:`asrkit.textnorm` and :mod:`asrkit.utils`, and no torch.
"""
from __future__ import annotations

from asrkit.scoring.align import (
    ALIGNMENTS,
    DEFAULT_ALIGNMENT,
    EPS,
    AlignPair,
    ScoringError,
    align,
    align_levenshtein,
    align_sclite,
    get_alignment,
)
from asrkit.scoring.report import (
    format_errors,
    format_per_utt,
    format_result,
    main,
    score_dir,
    write_outputs,
)
from asrkit.scoring.score import (
    DEFAULT_BINS,
    UNITS,
    WER_JSON_FORMAT,
    BinResult,
    Counts,
    ErrorStats,
    Pair,
    ScoreResult,
    UttResult,
    WindowResult,
    alignment_counts,
    bin_index,
    bin_labels,
    parse_bins,
    read_decode_info,
    read_hyp_jsonl,
    score_pairs,
)

__all__ = [
    "ALIGNMENTS",
    "DEFAULT_ALIGNMENT",
    "DEFAULT_BINS",
    "EPS",
    "WER_JSON_FORMAT",
    "AlignPair",
    "Pair",
    "Counts",
    "UttResult",
    "BinResult",
    "WindowResult",
    "ErrorStats",
    "ScoreResult",
    "ScoringError",
    "align",
    "align_levenshtein",
    "align_sclite",
    "alignment_counts",
    "bin_index",
    "bin_labels",
    "get_alignment",
    "parse_bins",
    "score_pairs",
    "UNITS",
    "read_hyp_jsonl",
    "read_decode_info",
    "score_dir",
    "write_outputs",
    "format_result",
    "format_per_utt",
    "format_errors",
    "main",
]
