"""Chapter 10's sampling widget under a grammar, as a learner sees it on the live engine:
with the JSON schema chosen the output on screen parses and has exactly the schema's
fields, every drawn token's row shows an allowed count below the vocabulary and says the
drawn token was among the allowed ones; with "none" no allowed count is shown."""
from __future__ import annotations

import json

from playwright.sync_api import expect
from widget_checks import open_live_widget

CHAPTER = "/chapters/10-sampling"




def run_constrained(page, widget, prompt: str, constraint: str) -> None:
    """Choose the constraint and press Run, by keyboard."""
    widget.get_by_label("Constrain the output").select_option(label=constraint)
    widget.get_by_label("Prompt", exact=True).fill(prompt)
    page.wait_for_function("el => !el.querySelector('.kvw-btn--primary').disabled", arg=widget.element_handle())
    run = widget.get_by_role("button", name="Run", exact=True)
    run.focus()
    run.press("Enter")
    page.wait_for_function("el => el.dataset.finished === 'true'", arg=widget.element_handle(), timeout=60000)
    page.wait_for_timeout(200)


def token_rows(widget) -> list[dict]:
    return widget.evaluate("""el => [...el.querySelectorAll('.kvs-grammar tbody tr')].map(tr => ({
        allowed: tr.dataset.allowed, vocab: Number(tr.dataset.vocab), inMask: tr.dataset.inMask,
        cell: tr.querySelector('[data-cell=allowed]').textContent, said: tr.children[4].textContent}))""")


def test_json_schema_mask_and_valid_output(new_page, live_server, screenshot, assert_clean):
    page = new_page(viewport={"width": 1280, "height": 800})
    widget = open_live_widget(page, live_server, CHAPTER, "kv-sampling")
    vocab = page.evaluate("window.kvscope.client.hello.model.vocab_size")

    run_constrained(page, widget, "Describe a person as JSON:", 'a JSON schema: {"name": string, "age": integer}')
    output = widget.locator("[data-output]").inner_text()
    person = json.loads(output)                          # what the learner reads is JSON ...
    assert sorted(person) == ["age", "name"]             # ... of the schema
    assert isinstance(person["name"], str) and len(person["name"]) <= 12
    assert isinstance(person["age"], int) and 0 <= person["age"] <= 120
    assert widget.locator("[data-verdict=true]").inner_text().startswith("✓ valid JSON for the schema")
    rows = token_rows(widget)
    assert len(rows) >= 6
    for r in rows:
        assert r["vocab"] == vocab and 0 < int(r["allowed"]) < vocab
        assert r["cell"] == f"{int(r['allowed']):,} of {vocab:,}"
    shown = [r for r in rows if r["inMask"]]
    assert len(shown) >= len(rows) - 1 and all(r["inMask"] == "true" and r["said"].startswith("✓ yes,") for r in shown)
    assert len({r["allowed"] for r in rows}) > 1         # the mask changes as the grammar moves on
    # the chart of a constrained step draws only allowed tokens, and says how many
    first = max((i for i, r in enumerate(rows) if r["inMask"]), key=lambda i: int(rows[i]["allowed"]))
    widget.get_by_role("button", name=f"Show the distribution of token {first + 1}", exact=True).press("Enter")
    page.wait_for_function(f"el => el.exportData().token_index === {first}", arg=widget.element_handle())
    # the figure is drawn on the next frame after the choice: wait for it, then read the chart
    expect(widget).to_contain_text(f"The grammar allowed {int(rows[first]['allowed'])} of {vocab} tokens here")
    assert int(widget.get_attribute("data-kept")) <= int(rows[first]["allowed"])
    screenshot(widget, "widget-sampling-structured-json")
    assert_clean(page)

    run_constrained(page, widget, "Is the sky blue?", 'a choice: "yes" or "no"')
    assert widget.locator("[data-output]").inner_text() in ("yes", "no")
    assert all(0 < int(r["allowed"]) < vocab for r in token_rows(widget))

    run_constrained(page, widget, "Describe a person as JSON:", "none: any token may follow")
    assert widget.get_attribute("data-constrained") == "false"
    assert widget.locator(".kvs-grammar tbody tr").count() == 0
    assert "Allowed" not in widget.locator(".kvs-grammar").inner_text()
    assert "The grammar allowed" not in widget.inner_text()
    screenshot(widget.locator(".kvs-grammar"), "widget-sampling-structured-none")
    assert_clean(page)


def test_structured_outputs_dark_768(new_page, live_server, screenshot, assert_clean):
    page = new_page(viewport={"width": 768, "height": 1000}, color_scheme="dark")
    widget = open_live_widget(page, live_server, CHAPTER, "kv-sampling")
    run_constrained(page, widget, "Describe a person as JSON:", 'a JSON schema: {"name": string, "age": integer}')
    json.loads(widget.locator("[data-output]").inner_text())
    width = widget.evaluate("el => el.scrollWidth <= el.clientWidth + 1")
    assert width, "the widget overflows at 768 px"
    screenshot(widget, "widget-sampling-structured-json-dark-768")
    assert_clean(page)
