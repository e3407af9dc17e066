#!/usr/bin/env python3
"""Training-speaker subsets for a learning curve (WER against hours of training speech).

    local/subset_train.py --keep 2 --name train_half      # every 2nd training speaker
    local/subset_train.py --keep 4 --name train_quarter   # every 4th

Children (spk2age < 18) and adults are taken separately, each sorted by speaker id, every
``--keep``-th speaker from the first, so a subset keeps the corpus's mix of children and adults.
Writes the part ``NAME`` (data/manifests) and, in every feature store under data/fbank that
holds the part ``train``, its stored features and those of its speed-perturbed copies (parts
``NAME``, ``NAME_sp0.9``, ... as ``train`` has them), selected from the stored ``train`` parts:
nothing is recomputed. Run stages 1-3 of the recipe first; then
train on it with ``./run.sh --stage 4 --stop_stage 4 --tag TAG --train_sets NAME`` (stage 4
alone: the tokens and the LM stay the full training text's, so only the acoustic data shrinks)
and decode with stage 5 (``--stage 5 --stop_stage 6 --tag TAG``).
"""
import argparse
import os
from pathlib import Path

from lhotse import CutSet


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keep", type=int, required=True, help="take every KEEP-th speaker")
    ap.add_argument("--name", required=True, help="name of the new part")
    ap.add_argument("--corpus-dir", default=os.environ.get("SPEECHOCEAN762", "downloads/speechocean762"))
    ap.add_argument("--manifest-dir", default="data/manifests")
    ap.add_argument("--fbank-dir", default="data/fbank")
    a = ap.parse_args()
    src = Path(a.manifest_dir) / "speechocean762_cuts_train.jsonl.gz"
    if not src.is_file():
        raise SystemExit(f"{src} is missing: run stages 1-2 of the recipe first (./run.sh --stop_stage 2)")
    ages = dict(line.split() for line in (Path(a.corpus_dir) / "train" / "spk2age").read_text().splitlines())
    cuts = CutSet.from_file(src)
    spk = sorted({c.supervisions[0].speaker for c in cuts})
    kids = [s for s in spk if int(ages[s]) < 18]
    adults = [s for s in spk if int(ages[s]) >= 18]
    keep = set(kids[::a.keep]) | set(adults[::a.keep])

    def sel(cs):
        return CutSet.from_cuts([c for c in cs if c.supervisions[0].speaker in keep])

    sub = sel(cuts)
    sub.to_file(Path(a.manifest_dir) / f"speechocean762_cuts_{a.name}.jsonl.gz")
    for store in sorted(Path(a.fbank_dir).glob("*/speechocean762_cuts_train.jsonl.gz")):
        for part in [store, *sorted(store.parent.glob("speechocean762_cuts_train_sp*.jsonl.gz"))]:
            suffix = part.name[len("speechocean762_cuts_train"):]
            sel(CutSet.from_file(part)).to_file(store.parent / f"speechocean762_cuts_{a.name}{suffix}")
    hours = sum(c.duration for c in sub) / 3600
    print(f"{a.name}: {len(keep)} of {len(spk)} speakers ({len(set(kids) & keep)} children), "
          f"{len(sub)} utterances, {hours:.2f} h")


if __name__ == "__main__":
    main()
