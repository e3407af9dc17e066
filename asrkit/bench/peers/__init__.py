"""``peers``: asrkit side by side with ESPnet on the same real data, machine and budget.

    tools/peers/espnet/setup.sh                      # ESPnet in its own venv (once)
    python -m asrkit.bench peers --steps 800 --decode-fraction 0.25 --out table.md   # under the heavy-job lock
    python -m asrkit.bench peers --only relpos       # just the attention micro-benchmark
    python -m asrkit.bench peers --arch espnet       # the same model (ESPnet's) on both sides: step + decoding, A B A B

Both toolkits train a CTC model on the same Kaldi data dirs (default: the speechocean762 recipe's
``egs/speechocean762/asr1/data/kaldi/{train,dev,test,test_longform,test_session}``), one after the
other on this machine, with the same threads (``--threads``, default 2) and the same number of
optimizer steps, then decode the test sets (batch 1, no language model on either side) and are
scored by asrkit's scorer with the same normalizer. One table: test WER with 95 % bootstrap
intervals and the significance of the difference (``asrkit compare``: MAPSSWE and sign test),
training throughput (audio seconds per wall second and per step), peak training memory, decoding
real-time factor, time to the first step, lines of configuration; and the relpos attention
micro-benchmark (ESPnet's ``RelPositionMultiHeadedAttention`` + ``RelPositionalEncoding`` vs
asrkit's ``relpos`` attention, forward + backward at T = 1000, paired rounds).

How each side runs:

* data: every Kaldi dir is copied to ``WORK/data/<set>`` with absolute wav paths (relative ones are
  resolved against the recipe dir, then the Kaldi dir and its parents) and any ``segments`` cut
  into wav files; both toolkits read these same dirs.
* asrkit: ``asrkit prepare kaldi`` (its importer of Kaldi dirs: Lhotse manifests), then ``asrkit tokens``, ``asrkit train --config CONF`` (the recipe's config; ``train.max_steps``,
  ``train.threads``, ``train.log_interval=1``, features on the fly as ESPnet computes them),
  ``asrkit decode decode.method=greedy`` one set per command.
* ESPnet (its venv ``tools/peers/espnet/.venv``; this module never imports it):
  ``tools/peers/espnet/run.py`` runs ``espnet2.bin.tokenize_text`` (char token list),
  ``espnet2.bin.asr_train --collect_stats true`` + ``aggregate_stats_dirs``, ``espnet2.bin.asr_train``
  with the config :func:`espnet_config` generates from asrkit's, and greedy CTC decoding through
  ESPnet's Python inference API (``espnet2.bin.asr_inference.Speech2Text``: its model loading,
  audio iterator, encoder, ``CTC.argmax``, tokenizer; the ``asr_inference`` command's CTC-only beam
  search costs minutes per long-form recording, run.py says why); its ``1best_recog/text`` becomes asrkit's
  ``hyp.jsonl`` + ``decode_info.json`` (:func:`espnet_hyps_to_records`) and is scored by
  :func:`asrkit.scoring.report.score_dir`.

Measurements: every command runs under a small wrapper process that reports the largest resident
set of any process it waited for (``ru_maxrss`` of its children): peak memory of training is that
of the training command. Time to first step: from the start of the training command to the
timestamp of its first logged step (both log every step here). Throughput: asrkit from its
``train_info.json`` (audio seconds of the batches / training wall, validation and checkpoints
excluded) and per whole training command; ESPnet per whole training command and per its logged
epoch train time, with its audio per step estimated as (training audio) / (its batches per pass)
from its own ``N-batch`` log line (ESPnet logs no audio count). Decoding RTF: the wall time of the
decoding command (process start, model load and every utterance) / audio seconds, for both.

``--arch espnet`` (:mod:`asrkit.bench.peers.equal`) compares toolkits rather than models: both
sides build ESPnet's CTC Transformer (asrkit from ``conf/train_espnet_equal.yaml``, checked against
ESPnet's weights and output in tests/test_peers.py) and time its training step and decoding in
alternating fresh processes. Without it, each side trains the recipe config's model, and the two
models differ (docs/results/espnet_side_by_side.md says how).

``--espnet-config FILE`` (the recipe-default row) gives ESPnet one of its own recipe YAMLs as written
(:func:`espnet_recipe_config`: its budget, log interval and CPU amp changed; asr.sh's global_mvn,
fold lengths and sample rate added by run.py ``--asr-sh true``) and asrkit ``--config`` as written,
each stopped after the same passes over the data: two recipes, two different models, labelled so.

Modules: ``equal`` (the equal-architecture benchmark), ``espnet_weights`` (ESPnet's state dict in
asrkit's names), ``espnet_config`` (the generated ESPnet config and its epochs x iterations plan),
``data`` (the Kaldi dirs both read), ``sides`` (running each side: measured commands, training,
decoding), ``espnet_output`` (ESPnet's hypotheses as asrkit's decode dirs), ``relpos`` (the
attention micro-benchmark), ``table`` (the Markdown table), ``cli`` (the command line).

Step budget: ESPnet trains in epochs of ``num_iters_per_epoch`` steps; the step count is made a
multiple E x I with E about the number of full passes over the data the budget allows, so both
sides validate about once per pass and train exactly E x I steps.
"""
from __future__ import annotations

from asrkit.bench.peers.cli import main
from asrkit.bench.peers.common import (
    DEFAULT_RECIPE,
    DEFAULT_SETS,
    ESPNET_RELPOS,
    ESPNET_RUN,
    ESPNET_VENV,
    NORM,
    REPO,
    PeersError,
)
from asrkit.bench.peers.data import normalize_kaldi_dir
from asrkit.bench.peers.espnet_config import (
    batches_per_pass,
    config_lines,
    config_settings,
    espnet_config,
    espnet_recipe_config,
    plan_steps,
)
from asrkit.bench.peers.espnet_output import (
    espnet_hyps_to_records,
    read_kaldi_text,
    write_espnet_decode_dir,
)
from asrkit.bench.peers.sides import measured, run_asrkit, run_espnet
from asrkit.bench.peers.table import compare_cells, format_table

__all__ = [
    "DEFAULT_RECIPE", "DEFAULT_SETS", "ESPNET_RELPOS", "ESPNET_RUN", "ESPNET_VENV", "NORM", "REPO", "PeersError",
    "batches_per_pass", "compare_cells", "config_lines", "config_settings", "espnet_config", "espnet_recipe_config",
    "espnet_hyps_to_records", "format_table", "main", "measured", "normalize_kaldi_dir", "plan_steps",
    "read_kaldi_text", "run_asrkit", "run_espnet", "write_espnet_decode_dir",
]
