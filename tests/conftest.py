import os

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "2")


def pytest_sessionstart(session):
    """Build relpos's compiled CPU kernel once, before any test (~25-60 s on a fresh machine, then
    cached in ~/.cache/asrkit/kernels): tests and the training subprocesses they start then load
    it instead of each compiling it inside their own time limits."""
    import logging
    import time

    from asrkit.model import kernels

    t0 = time.time()
    ok = kernels.load("relpos_attention") is not None
    logging.getLogger(__name__).info("relpos kernel %s in %.0f s", "ready" if ok else "NOT available", time.time() - t0)


@pytest.fixture(autouse=True)
def _seed_and_threads():
    import random

    import numpy as np
    import torch

    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    yield


@pytest.fixture(autouse=True)
def _no_flush_to_zero_leak():
    """Commands run in-process (``asrkit.training.command.main``...) put the process in
    flush-to-zero mode (:func:`asrkit.utils.flush_denormals`); later tests must not depend on it."""
    yield
    import torch

    import asrkit.utils

    if asrkit.utils.denormals_flushed():
        torch.set_flush_denormal(False)
        asrkit.utils._DENORMALS_FLUSHED = False
