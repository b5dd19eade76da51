"""<kv-tensor-parallel>: the live model's split over N ranks, from the hello facts, and —
when the server runs with --tensor-parallel-size 2 — rank 0's own weight and KV cache bytes
and the bytes its steps all-reduced (step events)."""
from __future__ import annotations

from widget_checks import check_exports

CHAPTER = "/chapters/19-tensor-and-pipeline-parallelism"


def open_widget(page, url):
    page.goto(url + CHAPTER)
    page.wait_for_selector("kv-tensor-parallel[data-painted]", state="attached")
    page.wait_for_function("() => window.kvscope && window.kvscope.client.hello")
    widget = page.locator("kv-tensor-parallel").first
    widget.scroll_into_view_if_needed()
    page.wait_for_function("el => el.exportData().figures !== null", arg=widget.element_handle())
    return widget


def test_split_follows_the_model(page, live_server, screenshot, assert_clean):
    widget = open_widget(page, live_server)
    m = page.evaluate("() => window.kvscope.client.hello.model")
    select = widget.get_by_label("Ranks (N)")
    options = select.evaluate("el => [...el.options].map(o => +o.value)")
    assert options == [n for n in (1, 2, 4, 8) if m["num_heads"] % n == 0 and m["num_kv_heads"] % n == 0]
    select.select_option("2")
    f = widget.evaluate("el => el.exportData().figures")
    assert f["ranks"] == 2 and f["kv_heads_per_rank"] == m["num_kv_heads"] / 2
    assert f["rank_kv_bytes_per_token"] == m["kv_bytes_per_token"] / 2
    assert m["weight_bytes"] / 2 <= f["rank_weight_bytes"] < m["weight_bytes"] * 0.6
    b = m["dtype_bytes"]
    assert f["allreduce_bytes_per_token"] == m["hidden_size"] * b * (1 + 2 * m["num_layers"]) + m["vocab_size"] // 2 * b
    assert widget.locator("svg rect").count() == 2 * 7          # seven parts, two slices each
    assert "one process" in widget.locator("[data-measured]").inner_text()
    screenshot(widget, "widget-tensor-parallel")
    check_exports(widget, "image/svg+xml")
    assert_clean(page)


def test_measured_on_a_two_rank_server(new_page, own_server, tmp_path, screenshot):
    url, _stop = own_server(tmp_path, extra_args=("--tensor-parallel-size", "2", "--threads", "1"))
    page = new_page(viewport={"width": 768, "height": 1000}, color_scheme="dark")
    widget = open_widget(page, url)
    page.evaluate("() => window.kvscope.client.command('submit', {prompt: 'Once upon a time', params: {temperature: 0, max_tokens: 8}})")
    page.wait_for_function("el => { const m = el.exportData().measured; return m && m.steps >= 4; }",
                           arg=widget.element_handle(), timeout=30000)
    hello = page.evaluate("() => window.kvscope.client.hello")
    measured = widget.evaluate("el => el.exportData().measured")
    assert measured["ranks"] == hello["engine"]["tensor_parallel_size"] == 2
    weights = hello["model"]["weight_bytes"]
    assert weights / 2 <= measured["rank_weight_bytes"] < weights * 0.6   # rank 0 holds about half
    figures = widget.evaluate("el => el.exportData().figures")
    assert 0 < measured["allreduce_bytes_per_token"] <= figures["allreduce_bytes_per_token"]
    screenshot(widget, "widget-tensor-parallel-2-ranks-dark-768")


def test_replay_draws_the_recorded_model(new_page, static_site, screenshot):
    page = new_page()
    widget = open_widget(page, static_site)
    assert widget.evaluate("el => el.exportData().figures.ranks") >= 1
    screenshot(widget, "widget-tensor-parallel-replay")
