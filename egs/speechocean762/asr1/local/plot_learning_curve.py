#!/usr/bin/env python3
"""Plot a learning curve (WER against hours of training speech) from an ``asrkit compare`` result.

    local/plot_learning_curve.py --compare exp/compare_curve/compare.json \
        --hours full=2.63 half=1.27 quarter=0.68 --out learning_curve.png

One line per test set (the ``all`` column of each table), error bars the 95 % intervals of the
comparison, hours on a log-2 axis. Also prints the figures as a Markdown table and a power-law fit
``WER = a * hours^b`` per set (least squares on log WER against log hours) with the hours at which
it would reach 30 %: an extrapolation, named as such.
"""
import argparse
import json
import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--compare", required=True, help="compare.json of asrkit compare")
    ap.add_argument("--hours", nargs="+", required=True, help="EXPERIMENT=HOURS of training speech, each")
    ap.add_argument("--out", required=True, help="PNG to write")
    ap.add_argument("--target", type=float, default=30.0, help="WER the fit is extrapolated to")
    a = ap.parse_args()
    hours = {k: float(v) for k, v in (h.split("=", 1) for h in a.hours)}
    d = json.load(open(a.compare))
    fig, ax = plt.subplots(figsize=(6, 4))
    print("| set | " + " | ".join(f"{k} ({h:g} h)" for k, h in hours.items()) + " | fit: WER ~ hours^b | hours for "
          f"{a.target:g} % (extrapolated) |")
    print("|---|" + "---:|" * (len(hours) + 2))
    for t in d["tables"]:
        rows = [(hours[k], t["rows"][k]["all"]) for k in hours if k in t["rows"]]
        rows.sort()
        x = np.array([h for h, _ in rows])
        y = np.array([c["wer"] for _, c in rows])
        err = np.array([[c["wer"] - c["low"], c["high"] - c["wer"]] for _, c in rows]).T
        ax.errorbar(x, y, yerr=err, marker="o", capsize=3, label=t["name"])
        b, log_a = np.polyfit(np.log(x), np.log(y), 1)
        need = math.exp((math.log(a.target) - log_a) / b) if b < 0 else float("inf")
        cells = " | ".join(f"{t['rows'][k]['all']['wer']:.2f}" if k in t["rows"] else "-" for k in hours)
        print(f"| {t['name']} | {cells} | b = {b:.3f} | {need:.0f} |")
    ax.set_xscale("log", base=2)
    ticks = sorted(hours.values())
    ax.set_xticks(ticks, [f"{h:g}" for h in ticks])
    ax.minorticks_off()
    ax.set_xlabel("hours of training speech")
    ax.set_ylabel("WER (%)")
    ax.set_title("WER against training data (95 % intervals)")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(a.out, dpi=120)


if __name__ == "__main__":
    main()
