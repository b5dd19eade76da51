"""The inside-the-model widgets against the real engine: each runs a learner's prompt as a
watched request and draws the live model's tensors, also when the prompt is already in
the prefix cache (the second run), in light mode, and in dark mode at 768 px."""
from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

import pytest

from widget_checks import check_exports, model_config, open_live_widget


def run_prompt(page, widget, prompt: str) -> dict:
    widget.get_by_label("Prompt", exact=True).fill(prompt)
    page.wait_for_function("el => !el.querySelector('.kvw-btn--primary').disabled", arg=widget.element_handle())
    widget.get_by_role("button", name="Run", exact=True).click()
    page.wait_for_function("el => el.dataset.finished === 'true'", arg=widget.element_handle(), timeout=30000)
    page.wait_for_timeout(100)
    return widget.evaluate("el => el.exportData()")


@dataclass
class Views:
    """One widget of a chapter, live: in light mode on `page`, then in dark mode at 768 px."""
    page: object
    new_page: object
    live_server: str
    screenshot: object
    assert_clean: object

    def open(self, chapter: str, tag: str):
        return open_live_widget(self.page, self.live_server, f"/chapters/{chapter}", tag)

    def run_twice(self, widget, prompt: str):
        """Runs `prompt` twice, yielding each run's data: the second run's prompt comes from
        the prefix cache."""
        for _ in range(2):
            yield run_prompt(self.page, widget, prompt)

    def finish(self, widget, image_type: str = "image/svg+xml") -> None:
        """The light view's screenshot, exports and clean console; then the same widget in a
        dark page at 768 px runs a short prompt, and its screenshot and console."""
        tag = widget.evaluate("el => el.localName")
        name = "widget-" + tag.removeprefix("kv-")
        self.screenshot(widget, name)
        check_exports(widget, image_type)
        self.assert_clean(self.page)
        dark_page = self.new_page(viewport={"width": 768, "height": 1000}, color_scheme="dark")
        dark = open_live_widget(dark_page, self.live_server, urlsplit(widget.page.url).path, tag)
        run_prompt(dark_page, dark, "A dog ran")
        self.screenshot(dark, name + "-dark-768")
        self.assert_clean(dark_page)


@pytest.fixture
def views(page, new_page, live_server, screenshot, assert_clean) -> Views:
    return Views(page, new_page, live_server, screenshot, assert_clean)


def test_logit_lens_last_layer_is_the_engine_output(page, views):
    widget = views.open("09-full-model", "kv-logit-lens")
    for data in views.run_twice(widget, "The little cat sat on the"):
        positions = data["positions"]
        assert [p["position"] for p in positions] == list(range(len(positions)))
        assert len(positions) >= 7
        for p in positions:
            assert len(p["layers"]) == 4 and all(len(top) == 5 for top in p["layers"])
            for top in p["layers"]:
                probs = [t["prob"] for t in top]
                assert probs == sorted(probs, reverse=True) and 0 < sum(probs) <= 1.0001
    assert widget.locator("rect[data-layer]").count() == 4 * len(positions)
    widget.locator(".kvl-grid").focus()
    page.keyboard.press("Home")
    page.wait_for_function("el => el.exportData().position === 0", arg=widget.element_handle())
    views.finish(widget)


def test_mlp_histograms_count_every_neuron(page, views):
    inter = model_config()["intermediate_size"]
    widget = views.open("07-mlp", "kv-mlp")
    for data in views.run_twice(widget, "The little cat sat on the mat"):
        mlp = data["mlp"]
        assert data["intermediate_size"] == inter
        for kind in ("gate", "activation", "up", "product"):
            assert sum(mlp["hist"][kind]["counts"]) == inter, kind
        assert len(mlp["top"]) == 8 and mlp["down"] > 0 and mlp["stream"] > 0
        assert all(abs(n["product"]) >= abs(mlp["top"][-1]["product"]) for n in mlp["top"])
    widget.get_by_label("Layer", exact=True).select_option("2")
    page.wait_for_function("el => el.exportData().layer === 2", arg=widget.element_handle())
    assert widget.get_attribute("data-histograms") == "4"
    views.finish(widget)


def test_residual_stream_and_rmsnorm(page, views):
    widget = views.open("08-transformer-block", "kv-residual")
    for data in views.run_twice(widget, "The little cat sat on the mat"):
        stream = data["stream"]
        assert len(stream) == 1 + 2 * 4 and stream[0]["added_norm"] is None
        assert all(p["stream_norm"] > 0 and (p["added_norm"] is None or p["added_norm"] > 0) for p in stream)
        n = data["rmsnorm"]
        rms = (sum(x * x for x in n["input"]) / len(n["input"]) + n["eps"]) ** 0.5
        assert abs(rms - n["rms"]) < 1e-3 * rms
        assert all(abs(o - x / rms * w) < 2e-3 for x, w, o in zip(n["input"], n["weight"], n["output"]))
    assert widget.locator("rect[data-kind=stream]").count() == 9
    views.finish(widget)


def test_embeddings_rows_neighbours_and_map(page, views):
    widget = views.open("03-embeddings", "kv-embeddings")
    for data in views.run_twice(widget, "The cat and the dog sat on the mat"):
        tokens = data["tokens"]
        assert [t["position"] for t in tokens] == list(range(len(tokens))) and len(tokens) >= 9
        for t in tokens:
            assert len(t["row"]) == 256 and t["near"][0]["id"] == t["id"] and t["near"][0]["cosine"] > 0.999
            assert len(t["pca"]) == 2
        assert data["vocab_points"] == 2027      # the rows the tokenizer can reach
    widget.locator(".kve-strips button").nth(0).focus()
    page.keyboard.press("ArrowDown")
    page.wait_for_function("el => el.exportData().chosen === 1", arg=widget.element_handle())
    assert widget.locator(".kve-mine").count() == len(tokens)
    views.finish(widget)


def set_slider(page, widget, param: str, value: float) -> None:
    widget.locator(f"input[data-param={param}]").evaluate(
        "(el, v) => { el.value = String(v); el.dispatchEvent(new Event('input', { bubbles: true })); }", value)


def test_sampling_sliders_reshape_and_sum_to_one(page, views):
    widget = views.open("10-sampling", "kv-sampling")
    for _ in views.run_twice(widget, "Once upon a time, a little fox"):
        page.wait_for_function("el => el.exportData().sum !== null", arg=widget.element_handle())
    data = widget.evaluate("el => el.exportData()")
    assert abs(data["sum"] - 1) < 1e-6 and data["kept"] == 2048
    before = [r["shaped"] for r in data["top"]]
    set_slider(page, widget, "top_k", 3)
    page.wait_for_function("el => el.exportData().kept === 3", arg=widget.element_handle())
    data = widget.evaluate("el => el.exportData()")
    assert abs(data["sum"] - 1) < 1e-6
    assert all(r["shaped"] > 0 for r in data["top"][:3]) and all(r["shaped"] == 0 for r in data["top"][3:])
    assert data["top"][0]["shaped"] > before[0]
    set_slider(page, widget, "top_k", 0)
    set_slider(page, widget, "temperature", 2)
    page.wait_for_function("el => el.exportData().params.temperature === 2", arg=widget.element_handle())
    hot = widget.evaluate("el => el.exportData()")
    assert abs(hot["sum"] - 1) < 1e-6 and hot["top"][0]["shaped"] < before[0]    # flatter
    # keyboard: the sliders are range inputs
    widget.locator("input[data-param=temperature]").focus()
    page.keyboard.press("ArrowLeft")
    page.wait_for_function("el => el.exportData().params.temperature === 1.95", arg=widget.element_handle())
    widget.get_by_role("button", name="Draw").click()
    widget.get_by_role("button", name="Draw").click()
    first = widget.evaluate("el => el.exportData().drawn")
    assert len(first) == 2
    set_slider(page, widget, "top_p", 0.5)   # a change starts a fresh stream of draws from the seed
    set_slider(page, widget, "top_p", 1)
    set_slider(page, widget, "temperature", 1.95)
    widget.get_by_role("button", name="Draw").click()
    widget.get_by_role("button", name="Draw").click()
    assert widget.evaluate("el => el.exportData().drawn") == first              # same seed, same draws
    widget.get_by_role("button", name="Continue both").click()
    page.wait_for_function("el => el.dataset.continued === 'true'", arg=widget.element_handle(), timeout=30000)
    data = widget.evaluate("el => el.exportData()")
    assert data["greedy"].startswith("Once upon a time") and len(data["greedy"]) > len("Once upon a time, a little fox")
    assert data["sampled"].startswith("Once upon a time")
    views.finish(widget)


def test_heads_grid_every_layer_and_head(page, views):
    widget = views.open("05-multi-head-attention", "kv-heads")
    page.wait_for_function("el => el.innerText.includes('What sharing saves')", arg=widget.element_handle())
    assert "For your" not in widget.inner_text()   # no prompt run yet: only the recorded example's count
    for data in views.run_twice(widget, "The keys to the old cabinet are on the table"):
        assert sorted(int(k) for k in data["layers"]) == list(range(data["num_layers"]))
        for layer in data["layers"].values():
            assert layer["heads"] == list(range(data["num_heads"]))
            assert layer["rows"] == list(range(data["rows"]))          # every prompt row, cached or not
        for q, row in enumerate(data["selected_matrix"]):
            assert abs(sum(row) - 1) < 3e-3 and all(w == 0 for w in row[q + 1:])
    assert widget.get_attribute("data-maps") == str(data["num_layers"] * data["num_heads"])
    group = data["num_heads"] // data["num_kv_heads"]
    assert f"{group}× less" in widget.inner_text()
    assert f"For your {data['rows'] + 1} tokens" in widget.inner_text()
    widget.locator(".kvh-grid").focus()
    page.keyboard.press("ArrowRight")
    page.keyboard.press("ArrowDown")
    page.wait_for_function("el => el.exportData().selected.layer === 1 && el.exportData().selected.head === 1",
                           arg=widget.element_handle())
    views.finish(widget, "image/png")


def test_rope_score_depends_only_on_distance(page, views):
    cfg = model_config()
    widget = views.open("06-positional-encoding", "kv-rope")
    for _ in views.run_twice(widget, "RoPE turns every pair"):
        page.wait_for_function("el => el.exportData().score !== null", arg=widget.element_handle())
    data = widget.evaluate("el => el.exportData()")
    assert data["rope_theta"] == cfg["rope_theta"] and len(data["inv_freq"]) == cfg["head_dim"] // 2
    assert abs(data["inv_freq"][1] - cfg["rope_theta"] ** (-2 / cfg["head_dim"])) < 1e-6
    before = data["score"]
    widget.get_by_role("button", name="Shift both by +5").click()
    page.wait_for_function("el => el.exportData().m === 10", arg=widget.element_handle())
    after = widget.evaluate("el => el.exportData()")
    assert after["n"] == 7 and abs(after["score"] - before) < 1e-9
    widget.locator("input[data-param=n]").focus()
    page.keyboard.press("ArrowRight")
    page.wait_for_function("el => el.exportData().n === 8", arg=widget.element_handle())
    assert abs(widget.evaluate("el => el.exportData().score") - before) > 1e-6     # the distance changed
    views.finish(widget)
