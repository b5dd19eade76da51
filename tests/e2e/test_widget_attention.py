"""<kv-attention> against the real engine: a watched request's attention, every layer and
head — rows sum to 1, the upper triangle (the causal mask) is 0, the head count is the
model's — with the heatmap drawn and a query row lit over the text by keyboard."""
from __future__ import annotations

from widget_checks import check_exports, model_config, open_live_widget


def test_attention_rows_are_causal_distributions(page, live_server, screenshot, assert_clean):
    config = model_config()
    widget = open_live_widget(page, live_server, "/chapters/04-attention", "kv-attention")
    widget.get_by_label("Prompt").fill("The cat sat on the mat.")
    widget.get_by_role("button", name="Run").click()
    page.wait_for_selector("kv-attention[data-finished]", timeout=30000)

    data = widget.evaluate("el => el.exportData()")
    n = len(data["matrix"])
    assert data["num_heads"] == config["num_attention_heads"]
    assert data["heads_received"] == list(range(config["num_attention_heads"]))
    assert sorted(int(k) for k in data["layers"]) == list(range(config["num_hidden_layers"]))
    # prompt rows, then one row per decoded token but the last (drawn, never computed)
    assert data["num_output_tokens"] >= 1
    assert n == data["num_prompt_tokens"] + data["num_output_tokens"] - 1
    assert data["tokens"][0] == "The"
    heads = ["mean"] + list(range(config["num_attention_heads"]))
    for layer in range(config["num_hidden_layers"]):
        for head in heads:
            matrix = widget.evaluate("(el, [l, h]) => el.matrix(l, h)", [layer, head])
            assert len(matrix) == n and all(row is not None for row in matrix), (layer, head)
            for q, row in enumerate(matrix):
                assert abs(sum(row) - 1.0) < 2e-3 + 5e-5 * (q + 1), (layer, head, q, sum(row))
                assert all(w == 0 for w in row[q + 1:]), (layer, head, q)      # causal mask
                assert all(w >= 0 for w in row)

    # The drawing: the lower triangle as cells, the mask as one hatched shape.
    assert widget.locator(".kva-heatmap rect[data-col]").count() == n * (n + 1) // 2
    assert widget.locator(".kva-mask").count() == 1
    # Another layer and a single head through the selectors.
    widget.get_by_label("Layer", exact=True).select_option("1")
    widget.get_by_label("Head", exact=True).select_option("3")
    page.wait_for_function("el => el.exportData().layer === 1 && el.exportData().head === '3'", arg=widget.element_handle())
    # Keyboard: focus a query row, move down, the row's weights light up over the text.
    widget.locator(".kva-row").nth(2).focus()
    page.keyboard.press("ArrowDown")
    assert widget.get_attribute("data-active-row") == "3"
    spans = widget.locator(".kva-over span")
    assert spans.count() == n
    assert widget.locator(".kva-over .kva-q").count() == 1
    screenshot(widget, "widget-attention")
    check_exports(widget, "image/svg+xml")
    assert_clean(page)


def run_and_wait(page, widget) -> None:
    widget.get_by_role("button", name="Run", exact=True).click()
    page.wait_for_function("el => el.dataset.finished === 'true' && el.exportData().matrix.length > 0",
                           arg=widget.element_handle(), timeout=30000)


def test_second_run_of_a_cached_prompt_has_every_prompt_row(new_page, live_server, screenshot, assert_clean):
    """A prompt someone ran before comes from the prefix cache; its rows are recomputed,
    marked, and none is blank. The chosen layer and head survive the next run."""
    page = new_page(viewport={"width": 768, "height": 1000}, color_scheme="dark")
    widget = open_live_widget(page, live_server, "/chapters/04-attention", "kv-attention")
    widget.get_by_label("Prompt").fill("A prompt that a whole class runs: the fox jumps over the dog.")
    run_and_wait(page, widget)
    widget.get_by_label("Layer", exact=True).select_option("2")
    widget.get_by_label("Head", exact=True).select_option("1")
    run_and_wait(page, widget)
    data = widget.evaluate("el => el.exportData()")
    assert data["layer"] == 2 and data["head"] == "1"
    assert data["recomputed_rows"] and data["recomputed_rows"][0] == 0
    assert all(row is not None for row in data["matrix"])
    assert widget.get_attribute("data-missing-rows") == "0"
    assert widget.locator(".kva-recomputed").count() == len(data["recomputed_rows"])
    assert widget.locator(".kva-split").count() == 1
    assert "from the prefix cache" in widget.inner_text()
    screenshot(widget, "widget-attention-cached-dark-768")
    assert_clean(page)


def test_binary_frames_decode_in_the_browser_as_python_encodes_them(page, live_server, assert_clean):
    """A multi-layer attention event (three layers, two heads, three rows) through both wire
    forms (a binary frame, and a recording's base64 line) decoded by frontend/js/lib/frames.js:
    the same shape and values as sent, to float16's precision, laid out [layer][head][row][key];
    the client hands a binary frame to its listeners decoded, and the widgets' store files
    each layer's rows under that layer."""
    import numpy as np

    from kvscope.instrumentation.encode import binary_frame, json_text
    rng = np.random.default_rng(0)
    weights = rng.random((3, 2, 3, 5)).astype(np.float32)
    weights /= weights.sum(-1, keepdims=True)
    mean = weights.mean(1)
    event = {"type": "attention", "ts": 1.0, "request_id": "r1", "step": 3, "layers": [0, 2, 3], "heads": [1, 6],
             "kv_heads": [0, 1], "num_heads": 8, "query_positions": [2, 3, 4], "context_len": 5,
             "token_ids": [5, 6, 7, 8, 9], "recomputed": False, "weights": weights, "mean": mean}
    page.goto(live_server + "/chapters/04-attention")
    page.wait_for_function("() => window.kvscope && window.kvscope.client.mode === 'live'")
    decoded, stored = page.evaluate("""async ([frame, line]) => {
        const { decodeBinaryFrame, expandTensors } = await import('/static/js/lib/frames.js');
        const { AttentionStore } = await import('/static/js/widgets/lib/attention-store.js');
        const { passesFilters } = await import('/static/js/lib/replay-socket.js');
        const client = window.kvscope.client;
        const heard = new Promise((resolve) => { const off = client.on('attention', (e) => { off(); resolve(e); }); });
        const buffer = new Uint8Array(frame).buffer;
        client._receive(buffer);
        const fromClient = await heard;
        const plain = (e) => ({ ...e, weights: e.weights.map((l) => l.map((h) => h.map((r) => Array.from(r)))),
                                mean: e.mean.map((l) => l.map((r) => Array.from(r))) });
        const store = new AttentionStore();
        store.add(decodeBinaryFrame(buffer));
        const rows = (layer, head) => store.matrix(layer, head).slice(2).map((r) => r.slice(0, 5));
        return [[plain(decodeBinaryFrame(buffer)), plain(expandTensors(JSON.parse(line))), plain(fromClient)],
                { layers: [...store.layers.keys()], l2h6: rows(2, 6), l3mean: rows(3, 'mean'),
                  filtered: [[2], [1, 4], 3].map((layer) => passesFilters(fromClient, { layer })) }];
    }""", [list(binary_frame(event)), json_text(event)])
    for got in decoded:
        assert "tensors" not in got and "payload" not in got
        assert {k: got[k] for k in ("request_id", "layers", "heads", "query_positions", "context_len")} == \
            {k: event[k] for k in ("request_id", "layers", "heads", "query_positions", "context_len")}
        assert np.array(got["weights"]).shape == (3, 2, 3, 5) and np.array(got["mean"]).shape == (3, 3, 5)
        assert np.allclose(np.array(got["weights"]), weights, atol=5e-4)
        assert np.allclose(np.array(got["mean"]), mean, atol=5e-4)
    assert stored["layers"] == [0, 2, 3]
    assert stored["filtered"] == [True, False, True]   # a replay's layer filter: any layer of the event
    causal = np.tril(np.ones((3, 5)), k=2)   # rows at positions 2, 3, 4 see keys up to their own
    assert np.allclose(stored["l2h6"], weights[1, 1] * causal, atol=5e-4)   # layer 2 is index 1, head 6 index 1
    assert np.allclose(stored["l3mean"], mean[2] * causal, atol=5e-4)
    assert decoded[0] == decoded[1] == decoded[2]   # one decoder, whichever way the bytes came
    assert_clean(page)
