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


#: the test files that take minutes (tools/test.sh's --durations list), run first: with pytest-xdist's
#: --dist loadfile each goes to a worker at the start instead of one of them ending the run alone
#: (a quiet 2-core Ice Lake, 2 workers: the speechocean762 learning test, last in collection order,
#: ran 7 minutes after every other test had finished)
SLOW_FILES_FIRST = ("test_speechocean762_learning.py", "test_mini_recipe.py", "test_learning.py")


def pytest_collection_modifyitems(config, items):
    first = {name: i for i, name in enumerate(SLOW_FILES_FIRST)}
    items.sort(key=lambda item: first.get(item.path.name, len(first)))  # stable: the rest keep their order


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
