"""The sampling widget's transform (frontend/js/widgets/lib/sampling-math.js, run by node)
equals the engine's sampler (filtered_logits + softmax) on the same logits, for every
filter alone and combined; both follow docs/engine.md "How a token is drawn"."""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from kvscope.engine.sampler import filtered_logits
from kvscope.sampling_params import SamplingParams

MODULE = Path(__file__).resolve().parents[1] / "frontend" / "js" / "widgets" / "lib" / "sampling-math.js"
CASES = [dict(temperature=1.0), dict(temperature=0.7), dict(temperature=1.3, top_k=5), dict(temperature=1.0, top_p=0.8),
         dict(temperature=0.9, min_p=0.05), dict(temperature=1.2, top_k=40, top_p=0.9, min_p=0.02),
         dict(temperature=0.0), dict(temperature=2.0, top_p=0.3), dict(temperature=0.5, top_k=1)]


def js_reshape(logits: list[float], cases: list[dict]) -> list[list[float]]:
    script = (f"import {{ reshape }} from {json.dumps(MODULE.as_uri())};\n"
              "let data = '';\nprocess.stdin.on('data', (c) => { data += c; });\n"
              "process.stdin.on('end', () => { const { logits, cases } = JSON.parse(data);\n"
              "  console.log(JSON.stringify(cases.map((c) => reshape(logits, c)))); });\n")
    out = subprocess.run(["node", "--experimental-default-type=module", "--input-type=module", "-e", script],
                         input=json.dumps({"logits": logits, "cases": cases}), capture_output=True, text=True,
                         check=True, timeout=60)
    return json.loads(out.stdout)


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_js_transform_equals_the_engine_sampler():
    torch.manual_seed(0)
    logits = (torch.randn(2048) * 3).double().round(decimals=4).float()   # as the event sends them
    got = js_reshape(logits.tolist(), CASES)
    for case, probs in zip(CASES, got):
        params = SamplingParams(**case)
        if params.greedy:
            want = torch.zeros(2048)
            want[logits.argmax()] = 1.0
        else:
            want = filtered_logits(logits.unsqueeze(0), [params]).softmax(dim=1)[0]
        probs = torch.tensor(probs, dtype=torch.float64)
        assert abs(float(probs.sum()) - 1.0) < 1e-9, case
        assert int((probs > 0).sum()) == int((want > 0).sum()), case      # the same tokens survive
        assert torch.allclose(probs.float(), want, atol=1e-6), case
