"""`python -m asrkit.data.download URL DEST [--sha256 HEX] [--extract DIR]`: fetch a corpus tarball.

* Resumable: the bytes go to ``DEST.part``; a rerun (or the next of ``--tries`` attempts after a
  dropped connection) asks the server for the rest with an HTTP ``Range`` request and appends
  (a server that ignores ``Range`` and answers 200 sends the whole file again, which replaces the
  part). ``DEST`` appears (renamed from ``DEST.part``) only once complete and verified.
* Verified: with ``--sha256`` the file's SHA-256 must match, else the download is refused (the
  bad file is deleted, so that a rerun starts afresh) with one line saying so. Without it the
  SHA-256 is printed and written to ``DEST.sha256``; a later call with an existing ``DEST`` checks
  it against that record.
* ``--extract DIR`` unpacks the tarball into ``DIR`` (members outside ``DIR`` are refused),
  through a temporary directory renamed at the end.

Exit status 0 done, 1 failed (the last line says why and what to do).
"""
from __future__ import annotations

import argparse
import hashlib
import http.client
import logging
import os
import shutil
import sys
import tarfile
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Optional

logger = logging.getLogger(__name__)

CHUNK = 1 << 20


class DownloadError(RuntimeError):
    """A download that cannot complete or does not verify; the message says what to do."""


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            h.update(block)
    return h.hexdigest()


def _fetch_once(url: str, part: Path, timeout: float) -> None:
    """One request: resume ``part`` from its size (Range), or start it anew."""
    from tqdm import tqdm

    have = part.stat().st_size if part.exists() else 0
    req = urllib.request.Request(url, headers={"Range": f"bytes={have}-"} if have else {})
    try:
        resp = urllib.request.urlopen(req, timeout=timeout)
    except urllib.error.HTTPError as e:
        if e.code == 416 and have:  # the part is already complete
            return
        raise
    with resp:
        if have and resp.status == 206:
            mode, start = "ab", have
        else:
            mode, start = "wb", 0
        total = resp.headers.get("Content-Length")
        total = int(total) + start if total is not None else None
        if start:
            logger.info("resuming %s at %d bytes", url, start)
        with open(part, mode) as f, tqdm(total=total, initial=start, unit="B", unit_scale=True, desc=part.name,
                                         dynamic_ncols=True) as bar:
            while True:
                block = resp.read(CHUNK)
                if not block:
                    break
                f.write(block)
                bar.update(len(block))
        if total is not None and part.stat().st_size < total:
            raise ConnectionError(f"connection closed at {part.stat().st_size} of {total} bytes")


def download(url: str, dest: Path, sha256: Optional[str] = None, tries: int = 5, timeout: float = 60.0) -> str:
    """Download ``url`` to ``dest`` (module docstring); returns the SHA-256."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    record = dest.with_name(dest.name + ".sha256")
    expected = (sha256 or "").strip().lower() or None
    if not dest.exists():
        part = dest.with_name(dest.name + ".part")
        for attempt in range(1, tries + 1):
            try:
                _fetch_once(url, part, timeout)
                break
            except (urllib.error.URLError, http.client.HTTPException, ConnectionError, OSError, TimeoutError) as e:
                if isinstance(e, urllib.error.HTTPError) and e.code in (403, 404, 410):
                    raise DownloadError(f"{url}: HTTP {e.code}; check the URL (db.sh)") from None
                if attempt == tries:
                    raise DownloadError(f"{url}: {e}; {part.stat().st_size if part.exists() else 0} bytes are in {part}: "
                                        "rerun the same command to resume") from None
                logger.warning("%s: %s; retrying (%d of %d) from %d bytes", url, e, attempt + 1, tries,
                               part.stat().st_size if part.exists() else 0)
                time.sleep(min(2.0 * attempt, 10.0) if "PYTEST_CURRENT_TEST" not in os.environ else 0.0)
        got = sha256_of(part)
        if expected and got != expected:
            part.unlink()
            raise DownloadError(f"{url}: SHA-256 {got} is not the expected {expected}: the file is damaged or another "
                                "one; it was deleted, rerun to download it again (or fix the expected SHA-256)")
        os.replace(part, dest)
        if not expected:
            record.write_text(f"{got}  {dest.name}\n")
            print(f"{dest}: SHA-256 {got} (no expected checksum given; recorded in {record})")
        return got
    got = sha256_of(dest)
    if not expected and record.is_file():
        expected = record.read_text().split()[0]
    if expected and got != expected:
        raise DownloadError(f"{dest}: SHA-256 {got} is not the expected {expected}; delete {dest} and rerun to download it again")
    return got


def extract(tarball: Path, out_dir: Path) -> None:
    """Unpack ``tarball`` into ``out_dir`` through a temporary directory (members may not leave it)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".extract.", dir=out_dir))
    try:
        with tarfile.open(tarball) as tf:
            for m in tf.getmembers():
                target = (tmp / m.name).resolve()
                if not (str(target) + os.sep).startswith(str(tmp.resolve()) + os.sep) or m.issym() or m.islnk():
                    raise DownloadError(f"{tarball}: member {m.name!r} would be written outside {out_dir} or is a link; refused")
            tf.extractall(tmp)
        for top in tmp.iterdir():
            final = out_dir / top.name
            if final.exists():
                shutil.rmtree(final) if final.is_dir() else final.unlink()
            os.replace(top, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    from asrkit.utils import setup_logging

    p = argparse.ArgumentParser(prog="python -m asrkit.data.download", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("url")
    p.add_argument("dest", type=Path)
    p.add_argument("--sha256", default=None, help="expected SHA-256 (hex)")
    p.add_argument("--extract", type=Path, default=None, help="unpack the tarball into this directory")
    p.add_argument("--tries", type=int, default=5)
    p.add_argument("--timeout", type=float, default=60.0)
    args = p.parse_args(argv)
    setup_logging()
    try:
        download(args.url, args.dest, args.sha256, args.tries, args.timeout)
        if args.extract:
            extract(args.dest, args.extract)
    except (DownloadError, tarfile.TarError, OSError) as e:
        print(f"download: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
