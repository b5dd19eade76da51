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


@pytest.fixture(scope="module")
def server():
    """A live server with the embedded model, one per test module (a module that needs other
    settings defines its own `server`)."""
    from server_harness import LiveServer
    s = LiveServer()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def oai(server):
    """The official OpenAI client, pointed at the module's server."""
    import openai
    from server_harness import TOKEN
    return openai.OpenAI(base_url=f"{server.http}/v1", api_key=TOKEN, max_retries=0, timeout=60)
