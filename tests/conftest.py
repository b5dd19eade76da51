import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
# Two cores shared by the engine and the reference: one thread each avoids oversubscription.
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="session", autouse=True)
def _one_thread():
    import torch
    torch.set_num_threads(1)
