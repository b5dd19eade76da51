"""<kv-memory> against the real server: its figures are the `hello`, `memory` and `step`
events' (checked against a second, independent connection), and the estimator agrees with
the live config and with Qwen3-0.6B's public shape."""
from __future__ import annotations

import json
import time

from widget_checks import check_exports, wait_idle


def figure(widget, key: str) -> float:
    return float(widget.locator(f"[data-figure={key}]").first.get_attribute("data-value"))


def test_memory_figures_are_the_engine_events(page, live_server, screenshot, assert_clean):
    from websockets.sync.client import connect

    with connect(live_server.replace("http://", "ws://") + "/ws?subscribe=memory,step", max_size=None) as ws:
        seen: list[dict] = []

        def drain(until, timeout=20.0):
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                if until():
                    return
                try:
                    frame = json.loads(ws.recv(timeout=0.5))
                except TimeoutError:
                    continue
                seen.extend(frame if isinstance(frame, list) else [frame])
            raise AssertionError("the expected events did not arrive")

        drain(lambda: any(e["type"] == "hello" for e in seen) and any(e["type"] == "memory" for e in seen))
        hello = next(e for e in seen if e["type"] == "hello")
        memory = next(e for e in seen if e["type"] == "memory")

        page.goto(live_server + "/chapters/13-gpu-memory-hierarchy")
        page.wait_for_selector("kv-memory[data-painted]", state="attached")
        page.wait_for_function("() => window.kvscope && window.kvscope.client.mode === 'live'")
        widget = page.locator("kv-memory").first
        widget.scroll_into_view_if_needed()
        page.wait_for_function("el => el.exportData().memory !== null", arg=widget.element_handle())

        data = widget.evaluate("el => el.exportData()")
        assert data["device"] == hello["device"]
        assert data["h100"] == hello["h100"]
        assert data["model"]["kv_bytes_per_token"] == hello["model"]["kv_bytes_per_token"]
        levels = {level["key"]: level for level in data["levels"]}
        assert levels["hbm"]["bytes"] == hello["h100"]["memory_bytes"]
        assert levels["hbm"]["bandwidth"] == hello["h100"]["bandwidth_bytes_per_s"]
        assert levels["l2"]["bytes"] == hello["h100"]["l2_bytes"]
        assert levels["host"]["bandwidth"] == hello["h100"]["pcie_bytes_per_s"]
        assert levels["nvlink"]["bandwidth"] == hello["h100"]["nvlink_bytes_per_s"]
        # Memory figures that do not move while the engine runs equal the independent event's.
        for key in ("device_total_bytes", "weights_bytes", "kv_cache_bytes", "num_blocks", "block_bytes"):
            assert data["memory"][key] == memory[key], key
        for key in ("device_total_bytes", "weights_bytes", "kv_cache_bytes", "kv_used_bytes", "activations_bytes", "process_bytes"):
            assert figure(widget, key) == data["memory"][key], key

        # A step: the widget's figures are that step's cost, as the second connection saw it.
        widget.get_by_role("button", name="Send a prompt to make steps").click()
        page.wait_for_function("el => el.dataset.step !== undefined", arg=widget.element_handle(), timeout=30000)
        wait_idle(live_server)
        page.wait_for_timeout(200)   # the last step's frame drawn
        shown = widget.evaluate("el => el.exportData().step")
        drain(lambda: any(e["type"] == "step" and e["step"] == shown["step"] for e in seen))
        step = next(e for e in seen if e["type"] == "step" and e["step"] == shown["step"])
        assert shown["cost"] == step["cost"]
        per_token = hello["model"]["kv_bytes_per_token"]
        assert step["cost"]["kv_read_bytes"] == sum(s["context_len"] for s in step["seqs"]) * per_token
        assert step["cost"]["kv_write_bytes"] == sum(s["num_tokens"] for s in step["seqs"]) * per_token
        for key in ("weight_bytes", "kv_read_bytes", "kv_write_bytes", "bytes", "achieved_bytes_per_s", "arithmetic_intensity"):
            assert figure(widget, key) == step["cost"][key], key
        assert figure(widget, "peak_bandwidth_bytes_per_s") == hello["device"]["peak_bandwidth_bytes_per_s"]
        assert abs(figure(widget, "achieved_fraction")
                   - step["cost"]["achieved_bytes_per_s"] / hello["device"]["peak_bandwidth_bytes_per_s"]) < 1e-9
        assert figure(widget, "h100") == step["cost"]["h100"]["time_s"]

    # The estimator: the live model's figures are its config's; Qwen3-0.6B's are public.
    estimator = widget.get_by_role("region", name="Memory estimator")
    estimator.get_by_label("Model").select_option(label=f"the live model ({hello['model']['name']})")
    assert figure(estimator, "kv_bytes_per_token") == hello["model"]["kv_bytes_per_token"]
    assert figure(estimator, "num_params") == hello["model"]["num_params"]
    assert figure(estimator, "weight_bytes") == hello["model"]["weight_bytes"]
    estimator.get_by_label("Model").select_option("Qwen3-0.6B")
    estimator.get_by_label("KV dtype").select_option("bfloat16")
    estimator.get_by_label("Weights dtype").select_option("bfloat16")
    estimator.get_by_label("Context length (tokens)").fill("1000")
    estimator.get_by_label("Batch (sequences)").fill("2")
    assert figure(estimator, "kv_bytes_per_token") == 114688          # 112 KiB per token
    assert figure(estimator, "kv_bytes") == 114688 * 1000 * 2
    assert abs(figure(estimator, "weight_bytes") - 1.19e9) < 0.01e9
    # The presets' shapes give their public sizes (parameters, bf16 KV per token).
    presets = page.evaluate("""async () => {
        const m = await import('/static/js/widgets/lib/memory-model.js');
        return Object.fromEntries(Object.entries(m.PRESETS).map(([k, c]) => [k, [m.paramCount(c), m.kvBytesPerToken(c, 2)]]));
    }""")
    assert abs(presets["Qwen3-0.6B"][0] - 0.596e9) < 0.005e9 and presets["Qwen3-0.6B"][1] == 112 * 1024
    assert abs(presets["Qwen3-8B"][0] - 8.19e9) < 0.02e9 and presets["Qwen3-8B"][1] == 144 * 1024
    assert abs(presets["Llama-3-8B"][0] - 8.03e9) < 0.02e9 and presets["Llama-3-8B"][1] == 128 * 1024
    screenshot(widget, "widget-memory")
    check_exports(widget, "image/svg+xml")
    assert_clean(page)
