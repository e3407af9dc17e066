"""Plot dev loss and greedy dev WER against steps from the train.log of speechocean762 runs.

    python docs/results/speechocean762_dev_loss.py OUT.png LABEL=EXP_DIR ...
"""
import re
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

PAT = re.compile(r"step (\d+): dev loss ([0-9.]+), dev WER ([0-9.]+)%")


def main(out: str, runs: list[str]) -> None:
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for item in runs:
        label, exp = item.split("=", 1)
        pts = [tuple(map(float, m.groups())) for m in PAT.finditer((Path(exp) / "train.log").read_text())]
        a.plot([p[0] for p in pts], [p[1] for p in pts], marker=".", label=label)
        b.plot([p[0] for p in pts], [p[2] for p in pts], marker=".", label=label)
    a.set(xlabel="optimizer steps", ylabel="dev CTC loss per utterance", title="dev loss")
    b.set(xlabel="optimizer steps", ylabel="dev WER (%), CTC greedy", title="dev WER, greedy")
    for ax in (a, b):
        ax.grid(alpha=0.3)
    a.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
