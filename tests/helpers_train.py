"""Shared fixtures for the training tests: a tiny corpus, a tiny config, runners (in process, as
a subprocess, under ``torchrun``) and fault injection.

Fault injection and the deterministic sampler are test hooks installed by patching
:class:`asrkit.training.loop.Trainer` / :func:`asrkit.data.sampling.make_sampler`; the library has no
test-only code path. Run as a script, this module installs the hooks described by ``--spec`` (JSON)
and then runs ``asrkit train`` with the remaining arguments, which is how subprocess and
``torchrun`` tests use them::

    python tests/helpers_train.py --spec '{"faults": [...]}' -- --config C --exp-dir E key=value ...
    python -m torch.distributed.run --standalone --nproc_per_node 2 tests/helpers_train.py --spec ... -- ...

Spec keys:
  ``faults``: list of ``{"kind": nan|crash|hang|slow, "rank": r?, "epoch": e?, "batches": [b, ...]?,
  "from_batch": b?, "seconds": s?, "code": c?}``, checked before each micro-batch's forward
  (``batch`` = 1-based index of the batch in its epoch). ``nan`` makes that rank's loss NaN,
  ``inf_grad`` leaves the loss as it is but makes the gradient of one element of the model's
  first parameter inf, ``nan_feats`` (with ``"utt": id``) makes that utterance's features NaN,
  ``crash`` exits the process at once (``os._exit(code)``), ``hang`` sleeps for an hour, ``slow``
  sleeps ``seconds``, ``signal`` sends the process ``signal`` (default SIGTERM).
  ``batches``: deterministic sampler: a list of global batches, each a list of per-rank lists of
  cut ids (``[[ids of rank 0], [ids of rank 1]]``); one process gets their concatenation.
  ``dump_params``: every rank writes its final parameters to ``EXP/params.rank<r>.pt``.
  ``record_layers``: every rank appends to ``EXP/layers.rank<r>.jsonl``, for each training
  forward, ``{"epoch", "batch", "ran": [indices of the encoder layers that ran]}`` (observed by
  forward pre-hooks), so layer drop can be seen.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "conf" / "ctc_tiny.yaml"
PY = sys.executable
WORDS = ["a", "an", "be", "go", "to", "up", "we", "it", "on", "no", "so", "ok", "me", "by", "at", "do"]


# ------------------------------------------------------------------------- corpus
def build_corpus(root: Path, n_train: int = 24, n_dev: int = 4, seed: int = 0) -> dict:
    """Write ``n_train`` + ``n_dev`` short FLACs (tones + noise, 0.6-1.4 s, 16 kHz) with one- or
    two-word transcripts, Lhotse manifests (corpus ``fx``, parts ``train`` and ``dev``) and a
    letters tokenizer under ``root``. Returns the paths."""
    import soundfile as sf
    from lhotse import Recording, RecordingSet, SupervisionSegment, SupervisionSet

    from asrkit.data.manifests import write_part
    from asrkit.tokenizer import CharTokenizer, save_tokenizer

    root = Path(root)
    rng = np.random.default_rng(seed)
    sr = 16000
    for part, n in (("train", n_train), ("dev", n_dev)):
        recs, sups = [], []
        (root / "audio" / part).mkdir(parents=True, exist_ok=True)
        for i in range(n):
            uid = f"{part}-{i:03d}"
            dur = float(rng.uniform(0.6, 1.4))
            t = np.arange(int(dur * sr)) / sr
            x = 0.3 * np.sin(2 * np.pi * rng.uniform(150, 900) * t) + 0.05 * rng.standard_normal(t.size)
            path = root / "audio" / part / f"{uid}.flac"
            sf.write(path, x.astype(np.float32), sr)
            rec = Recording.from_file(path, recording_id=uid)
            text = " ".join(rng.choice(WORDS, size=int(rng.integers(1, 3)))).upper()
            recs.append(rec)
            sups.append(SupervisionSegment(id=uid, recording_id=uid, start=0.0, duration=rec.duration, text=text))
        write_part(root / "manifests", "fx", part, RecordingSet.from_recordings(recs),
                   SupervisionSet.from_segments(sups))
    tok = root / "tokens.json"
    save_tokenizer(CharTokenizer(), tok)
    return {"root": root, "manifests": root / "manifests", "tokens": tok, "audio": root / "audio"}


def corrupt_audio(corpus: dict, ids: list[str], part: str = "train") -> dict:
    """Overwrite the FLACs of ``ids`` with garbage; returns what :func:`restore_audio` needs."""
    saved = {}
    for uid in ids:
        p = corpus["audio"] / part / f"{uid}.flac"
        saved[p] = p.read_bytes()
        p.write_bytes(b"this is not a flac file" * 10)
    return saved


def restore_audio(saved: dict) -> None:
    for p, data in saved.items():
        p.write_bytes(data)


def initial_params(corpus: dict, kw: dict) -> dict:
    """The model parameters a run with these overrides starts from (seeded like the trainer)."""
    import torch

    from asrkit.training.checks import load_config
    from asrkit.model import build_model
    from asrkit.tokenizer import load_tokenizer

    cfg = load_config(TINY, overrides(corpus, **kw))
    torch.manual_seed(cfg.train.seed)
    return build_model(cfg, load_tokenizer(cfg.tokens.path).vocab_size).state_dict()


def train_ids(corpus: dict) -> list[str]:
    from asrkit.data.manifests import load_cuts

    return sorted(c.id for c in load_cuts(corpus["manifests"], "fx", "train"))


def overrides(corpus: dict, dev: bool = False, **kw) -> list[str]:
    """Tiny-model overrides of ``conf/ctc_tiny.yaml`` for the fixture corpus; ``kw`` adds more
    (``train__max_steps=5`` -> ``train.max_steps=5``)."""
    o = {
        "features.n_mels": 40, "specaug.freq_width": 8, "specaug.time_masks": 2,
        "encoder.d_model": 32, "encoder.n_heads": 2, "encoder.d_ff": 64, "encoder.n_layers": 2,
        "data.manifest_dir": str(corpus["manifests"]), "data.corpus": "fx", "data.train_sets": "[train]",
        "data.dev_set": "dev" if dev else "", "data.max_duration": 4.0, "data.num_workers": 0,
        "data.fbank_dir": str(Path(corpus["manifests"]).parent / "fbank"),
        "tokens.path": str(corpus["tokens"]), "train.threads": 1, "train.log_interval": 1,
        "train.ckpt_every_steps": 0, "train.max_epochs": 1, "train.device": "cpu", "train.dist_timeout_s": 60,
    }
    o.update({k.replace("__", "."): v for k, v in kw.items()})
    return [f"{k}={v}" for k, v in o.items()]


def store_features(ovr: list[str]) -> None:
    """Stage 2's stored fbank (train and dev parts) of the fixture corpus that ``ovr`` trains on,
    for its features, under its ``data.fbank_dir``."""
    from asrkit.data import cuts

    kv = dict(o.split("=", 1) for o in ovr)
    parts = ["train"] + ([kv["data.dev_set"]] if kv.get("data.dev_set") else [])
    rc = cuts.main(["--corpus", kv["data.corpus"], "--manifest-dir", kv["data.manifest_dir"], "--parts", *parts,
                    "--fbank-parts", *parts, "--speed-parts", "train", "--fbank-dir", kv["data.fbank_dir"], "--num-jobs", "1",
                    "--train-config", str(TINY), "--train-args", " ".join(ovr)])
    assert rc == 0


def train_args(exp: Path, ovr: list[str]) -> list[str]:
    return ["--config", str(TINY), "--exp-dir", str(exp)] + list(ovr)


# ------------------------------------------------------------------------- hooks
class FixedSampler:
    """Deterministic sampler over explicit global batches (test hook): rank r of w gets the r-th
    per-rank list of each global batch; a single process gets every list concatenated. ``extra``
    (rank -> list of id lists) gives that rank more batches than the others at the end of each
    epoch (under DDP only), as a sampler with unequal batch counts per rank would."""

    def __init__(self, cuts, batches: list, world_size: int = 1, rank: int = 0, extra: Optional[dict] = None):
        self.cuts = cuts
        self.batches = list(batches)
        if world_size > 1:
            self.batches += [[ids] for ids in (extra or {}).get(str(rank), [])]
        self.world_size, self.rank = world_size, rank

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        for per_rank in self.batches:
            if self.world_size == 1:
                ids = [i for lst in per_rank for i in lst]
            else:
                ids = per_rank[self.rank] if len(per_rank) == self.world_size else per_rank[0]
            yield self.cuts.subset(cut_ids=ids)


@contextlib.contextmanager
def hooks(spec: Optional[dict]):
    """Install the test hooks described by ``spec`` (see the module docstring)."""
    import torch

    from asrkit.training import loop

    class InfGrad(torch.autograd.Function):
        """0 in the forward pass (a loss plus it is unchanged: x + 0.0 == x); in the backward pass
        an inf gradient for the first element of its input."""

        @staticmethod
        def forward(ctx, p):
            ctx.shape = p.shape
            return p.new_zeros(())

        @staticmethod
        def backward(ctx, g):
            grad = g.new_zeros(ctx.shape)
            grad.view(-1)[0] = float("inf")
            return grad

    spec = spec or {}
    saved = {"forward": loop.Trainer.forward, "finish": loop.Trainer.finish, "make_sampler": loop.make_sampler}
    faults = spec.get("faults", [])

    def matches(f: dict, tr) -> bool:
        if f.get("rank") is not None and f["rank"] != tr.dist.rank:
            return False
        if f.get("epoch") is not None and f["epoch"] != tr.epoch:
            return False
        b = tr.batch_in_epoch
        if "batches" in f and b not in f["batches"]:
            return False
        return not ("from_batch" in f and b < f["from_batch"])

    def forward(self, batch):
        for f in faults:
            if matches(f, self):
                if f["kind"] == "crash":
                    logging.getLogger("test").error("injected crash on rank %d", self.dist.rank)
                    logging.shutdown()
                    os._exit(f.get("code", 7))
                if f["kind"] == "hang":
                    logging.getLogger("test").error("injected hang on rank %d", self.dist.rank)
                    time.sleep(3600)
                if f["kind"] == "slow":
                    time.sleep(f.get("seconds", 0.2))
                if f["kind"] == "signal":
                    import signal

                    os.kill(os.getpid(), getattr(signal, f.get("signal", "SIGTERM")))
        for f in faults:  # NaN features of one utterance (a real non-finite loss, of that utterance alone)
            if f["kind"] == "nan_feats" and matches(f, self) and f["utt"] in batch["ids"]:
                batch["feats"][batch["ids"].index(f["utt"])] = float("nan")
        ran: list[int] = []
        hooks = [layer.register_forward_pre_hook(lambda mod, args, i=i: ran.append(i))
                 for i, layer in enumerate(self.model.encoder.layers)] if spec.get("record_layers") else []
        try:
            loss = saved["forward"](self, batch)
        finally:
            for h in hooks:
                h.remove()
        if hooks:
            with open(self.exp_dir / f"layers.rank{self.dist.rank}.jsonl", "a") as fh:
                fh.write(json.dumps({"epoch": self.epoch, "batch": self.batch_in_epoch, "ran": ran}) + "\n")
        if any(f["kind"] == "nan" and matches(f, self) for f in faults):
            loss = loss * float("nan")
        if any(f["kind"] == "inf_grad" and matches(f, self) for f in faults):
            loss = loss + InfGrad.apply(next(self.model.parameters()))
        return loss

    def finish(self):
        saved["finish"](self)
        if spec.get("dump_params"):
            torch.save({k: v.detach().clone() for k, v in self.model.state_dict().items()},
                       self.exp_dir / f"params.rank{self.dist.rank}.pt")

    def make_sampler(cuts, data_cfg, train=True, seed=0, world_size=1, rank=0):
        if spec.get("batches") and train:
            return FixedSampler(cuts, spec["batches"], world_size, rank, spec.get("extra"))
        return saved["make_sampler"](cuts, data_cfg, train=train, seed=seed, world_size=world_size, rank=rank)

    loop.Trainer.forward = forward
    loop.Trainer.finish = finish
    loop.make_sampler = make_sampler
    try:
        yield
    finally:
        loop.Trainer.forward = saved["forward"]
        loop.Trainer.finish = saved["finish"]
        loop.make_sampler = saved["make_sampler"]


# ------------------------------------------------------------------------- runners
@contextlib.contextmanager
def restored_logging_and_threads():
    """asrkit's commands reconfigure logging (``force=True``) and torch threads: put both back after."""
    import torch

    root = logging.getLogger()
    handlers, level, threads = list(root.handlers), root.level, torch.get_num_threads()
    try:
        yield
    finally:
        for h in list(root.handlers):
            root.removeHandler(h)
            h.close()
        for h in handlers:
            root.addHandler(h)
        root.setLevel(level)
        torch.set_num_threads(threads)


def run_inprocess(exp: Path, ovr: list[str], spec: Optional[dict] = None) -> int:
    """``asrkit train`` in this process (with hooks); restores logging and torch threads after."""
    from asrkit.training import command as train

    with restored_logging_and_threads(), hooks(spec):
        return train.main(train_args(exp, ovr))


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, world: int, port: int, exp: Path, ovr: list[str], spec: Optional[dict]) -> None:
    """Body of a forked rank: the environment torchrun would set, then ``asrkit train``."""
    import torch

    from asrkit.training import command as train

    if world > 1:
        os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world),
                          MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    rc = 1
    try:
        with hooks(spec):
            rc = train.main(train_args(exp, ovr))
    finally:
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc)


def start_forked(exp: Path, ovr: list[str], spec: Optional[dict] = None, nproc: int = 1) -> list:
    """Start ``nproc`` ranks of ``asrkit train`` as processes forked from this one (no interpreter
    start-up or import cost: the cheap way to run several ranks on a busy 2-core machine). Each
    rank is set up exactly as under ``torchrun`` (RANK, WORLD_SIZE, MASTER_ADDR/PORT)."""
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    port = free_port()
    procs = [ctx.Process(target=_rank_main, args=(r, nproc, port, exp, ovr, spec), daemon=False) for r in range(nproc)]
    for p in procs:
        p.start()
    return procs


def join_all(procs: list, timeout: float) -> list:
    """Exit codes of the processes (None for one still running after ``timeout`` s: it is killed)."""
    deadline = time.time() + timeout
    for p in procs:
        p.join(max(0.0, deadline - time.time()))
    codes = [p.exitcode for p in procs]
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join(10)
    return codes


def run_forked(exp: Path, ovr: list[str], spec: Optional[dict] = None, nproc: int = 1, timeout: float = 120) -> list:
    return join_all(start_forked(exp, ovr, spec, nproc), timeout)


def cmd(exp: Path, ovr: list[str], spec: Optional[dict] = None, nproc: int = 1) -> list[str]:
    """Command line running ``asrkit train`` with hooks in a new process (``torchrun`` if nproc > 1)."""
    script = [str(Path(__file__).resolve()), "--spec", json.dumps(spec or {}), "--"] + train_args(exp, ovr)
    if nproc == 1:
        return [PY] + script
    return [PY, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc),
            "--max_restarts", "0", "--monitor_interval", "0.5"] + script


def env() -> dict:
    e = dict(os.environ)
    e.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", PYTHONPATH=str(ROOT) + os.pathsep + e.get("PYTHONPATH", ""))
    return e


def run_subprocess(exp: Path, ovr: list[str], spec: Optional[dict] = None, nproc: int = 1,
                   timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(cmd(exp, ovr, spec, nproc), env=env(), capture_output=True, text=True, timeout=timeout)


def processes_mentioning(text: str) -> list[int]:
    """Pids of live processes whose command line contains ``text`` (to prove none is left)."""
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            cmdline = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = next((ln for ln in (d / "status").read_text().splitlines() if ln.startswith("State:")), "")
        except OSError:
            continue
        if text in cmdline and "zombie" not in state:
            pids.append(int(d.name))
    return pids


def children_of(pid: int) -> list[int]:
    """Pids of the live child processes of ``pid``."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rfind(")") + 2:].split()
            if int(fields[1]) == pid and fields[0] != "Z":
                out.append(int(d.name))
    return out


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2:].split()[0] != "Z"


def model_params(path: Path) -> dict:
    """Model parameters of a checkpoint file, or of a ``params.rank<r>.pt`` dump."""
    import torch

    st = torch.load(path, map_location="cpu", weights_only=False)
    return st["model"] if "model" in st else st


def last_params(exp: Path) -> dict:
    from asrkit.checkpoint import list_checkpoints

    return model_params(list_checkpoints(exp)[-1])


def max_abs_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a) if a else 0.0


def bitwise_equal(a: dict, b: dict) -> bool:
    import torch

    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def info(exp: Path) -> dict:
    return json.loads((Path(exp) / "train_info.json").read_text())


def _main(argv: list[str]) -> int:
    """Script entry: ``--spec JSON -- <asrkit train args>``."""
    sys.path.insert(0, str(ROOT))
    spec = {}
    if argv[:1] == ["--spec"]:
        spec = json.loads(argv[1])
        argv = argv[2:]
    if argv[:1] == ["--"]:
        argv = argv[1:]
    from asrkit.training import command as train

    with hooks(spec):
        return train.main(argv)


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
