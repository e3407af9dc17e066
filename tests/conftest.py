import os

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "2")


@pytest.fixture(autouse=True)
def _seed_and_threads():
    import random

    import numpy as np
    import torch

    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    yield
