#!/usr/bin/env bash
# The training curve behind run_pos_compare.sh's step budget: one model trained to --max_steps with a
# checkpoint kept every --every steps, each checkpoint decoded as run.sh decodes (WFST) on --sets, and
# a table of WER [95 % bootstrap interval] against the step in exp/<tag>/budget_curve.md (and a plot,
# budget_curve.png). Choose the budget where the curve has flattened (the models are past their early
# phase).
#   ./run_budget_curve.sh [--encoding sinpos] [--seed 1] [--max_steps 2400] [--every 400] [--sets "dev"] [--threads 0]
# --threads N: training and decoding use N threads (0: torch's default, all cores); give each of
# several jobs run side by side its share, as run_pos_compare.sh --parallel does.
set -euo pipefail
cd "$(dirname "$0")"
encoding=sinpos
seed=1
max_steps=2400
every=400
sets=dev
train_config=conf/train.yaml
decode_args="decode.method=wfst decode.lm=data/lm/graph_letters_1gram decode.lm_weight=0.2"
tag=                # default: budget_<encoding>_seed<seed>
threads=0
__asrkit_opts="encoding seed max_steps every sets train_config decode_args tag threads"
. ../../TEMPLATE/asr1/utils/parse_options.sh
[ $# -eq 0 ] || { echo "$0: unexpected argument(s): $*" >&2; exit 2; }
for v in seed max_steps every threads; do
    [[ "${!v}" =~ ^[0-9]+$ ]] && [ "${!v}" -gt 0 -o "$v" = seed -o "$v" = threads ] || { echo "$0: --$v must be a positive integer (--seed, --threads: 0 or more)" >&2; exit 2; }
done
tag=${tag:-budget_${encoding}_seed${seed}}
[ "$threads" -eq 0 ] || export OMP_NUM_THREADS=$threads

./run.sh --stop_stage 3
./run.sh --stage 4 --stop_stage 4 --tag "$tag" --train_config "$train_config" --train_args \
    "encoder.pos_enc=$encoding train.seed=$seed train.max_steps=$max_steps train.max_minutes=0 train.ckpt_every_steps=$every train.keep_last=0 train.threads=$threads"
. ./path.sh
exp=exp/$tag
for step in $(seq "$every" "$every" "$max_steps"); do
    ck=$exp/checkpoints/$(printf 'step-%08d.pt' "$step")
    [ -f "$ck" ] || { echo "$0: no $ck (training stopped early?)" >&2; continue; }
    done_all=1
    for s in $sets; do [ -f "$exp/decode_${s}_step$step/wer.json" ] || done_all=0; done
    # shellcheck disable=SC2086
    [ "$done_all" = 1 ] || asrkit decode --exp-dir "$exp" --sets $sets --checkpoint "$ck" --suffix "step$step" $decode_args
done
python - "$exp" "$sets" <<'EOF'
import json, re, sys
from pathlib import Path
from asrkit.reports.report import md_table
from asrkit.reports.stats import rescore
from asrkit.scoring.significance import bootstrap_wer

exp, sets = Path(sys.argv[1]), sys.argv[2].split()
rows = {}
for d in sorted(exp.glob("decode_*_step*"), key=lambda p: int(p.name.rsplit("_step", 1)[1])):
    s, step = d.name[len("decode_"):].rsplit("_step", 1)
    if s in sets and (d / "wer.json").is_file():
        doc = json.loads((d / "wer.json").read_text())
        r = rescore(d, doc)
        iv = bootstrap_wer([u.counts.err for u in r.utts], [u.counts.wrd for u in r.utts])
        rows.setdefault(int(step), {})[s] = iv
fmt = lambda iv: f"{iv.wer:.2f} [{iv.low:.1f}, {iv.high:.1f}]" if iv else "-"
lines = [f"# Training curve: {exp.name}", "", "WER in % [95 % bootstrap interval] of each kept checkpoint (EMA weights).", ""]
lines += md_table(["step", *sets], [[str(k), *(fmt(v.get(s)) for s in sets)] for k, v in sorted(rows.items())])
(exp / "budget_curve.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
if rows:  # the same figures as a plot: WER against the step, 95 % intervals as error bars
    from matplotlib.figure import Figure
    from asrkit.reports.plots import save_png
    fig = Figure(figsize=(6, 4), layout="constrained")
    ax = fig.subplots()
    for s in sets:
        pts = [(k, v[s]) for k, v in sorted(rows.items()) if s in v]
        if pts:
            ax.errorbar([k for k, _ in pts], [iv.wer for _, iv in pts], capsize=3, marker="o", label=s,
                        yerr=[[iv.wer - iv.low for _, iv in pts], [iv.high - iv.wer for _, iv in pts]])
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("WER (%)")
    ax.set_title(f"{exp.name}: WER of each kept checkpoint (95 % bootstrap intervals)", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend()
    print(f"plot: {save_png(fig, exp / 'budget_curve.png')}")
EOF
