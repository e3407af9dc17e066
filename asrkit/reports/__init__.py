"""What researchers read: per-experiment reports (RESULTS.md), comparisons of experiments,
the Park & Sung analyses and the padding-free pipeline's reports. Above decoding and scoring."""
