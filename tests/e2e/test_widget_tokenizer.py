"""<kv-tokenizer> against the real server: its ids are /api/tokenize's, its counts are the
text's, emoji and multi-byte text come out as byte pieces, and it works by keyboard alone."""
from __future__ import annotations

import json
import urllib.request

from widget_checks import check_exports, open_live_widget

TEXTS = [
    "Hello, world!",
    "café 東京 👋🏽 — naïve",
    "line one\nline two\twith a tab",
    "<|endoftext|>special tokens are recognised",
]


def api_tokenize(base: str, text: str, chat: bool = False) -> dict:
    body = {"text": text, "chat": True} if chat else {"text": text}
    request = urllib.request.Request(base + "/api/tokenize", data=json.dumps(body).encode(),
                                     headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.load(response)


def shown(widget, text: str) -> dict:
    widget.page.wait_for_function("([el, t]) => el.dataset.text === t", arg=[widget.element_handle(), text])
    return widget.evaluate("el => el.exportData()")


def test_tokenizer_ids_match_the_api(page, live_server, screenshot, assert_clean):
    widget = open_live_widget(page, live_server, "/chapters/02-tokens", "kv-tokenizer")
    textarea = widget.get_by_label("Text to tokenize")
    for text in TEXTS:
        textarea.fill(text)
        data = shown(widget, text)
        expected = api_tokenize(live_server, text)
        assert data["ids"] == expected["ids"], text
        assert data["num_chars"] == len(text)
        assert data["num_bytes"] == len(text.encode("utf-8"))
        assert data["num_tokens"] == len(expected["ids"])
        # The chips: one per token, each carrying its id and byte span
        chips = widget.locator(".kvt-tok")
        assert chips.count() == len(expected["ids"])
        assert [int(x) for x in chips.evaluate_all("els => els.map(e => e.dataset.id)")] == expected["ids"]
        assert widget.locator("[data-count=tokens]").inner_text() == str(len(expected["ids"]))
        if "👋" in text:
            labels = chips.evaluate_all("els => els.map(e => e.querySelector('.kvt-piece').textContent)")
            assert any(label.startswith("<0x") for label in labels), labels
        if "\n" in text:
            assert "↵" in widget.locator(".kvt-tokens").inner_text()
        if text.startswith("<|endoftext|>"):
            assert widget.locator(".kvt-tok.kvt-special").count() == 1
    # The chat template: the formatted text's ids, its special tokens marked.
    widget.get_by_label("as a chat message", exact=False).check()
    page.wait_for_function("el => el.dataset.chat === 'true' && el.exportData().text.includes('<|im_start|>')",
                           arg=widget.element_handle())
    data = widget.evaluate("el => el.exportData()")
    expected = api_tokenize(live_server, TEXTS[-1], chat=True)
    assert data["ids"] == expected["ids"]
    assert widget.locator(".kvt-tok.kvt-special").count() == sum(t["special"] for t in expected["tokens"]) >= 3
    widget.get_by_label("as a chat message", exact=False).uncheck()
    # Hovering a token highlights its bytes in the text.
    textarea.fill(TEXTS[1])
    data = shown(widget, TEXTS[1])
    widget.locator(".kvt-tok").nth(1).hover()
    highlighted = widget.locator(".kvt-text .kvt-on").inner_text()
    token = data["tokens"][1]
    assert TEXTS[1].encode("utf-8")[token["start"]:token["end"]].decode("utf-8", "ignore") in highlighted
    screenshot(widget, "widget-tokenizer")
    check_exports(widget, "image/svg+xml")
    assert_clean(page)


def test_tokenizer_by_keyboard_alone(page, live_server, screenshot, assert_clean):
    widget = open_live_widget(page, live_server, "/chapters/02-tokens", "kv-tokenizer")
    page.locator("body").focus()
    # Tab until the text box has focus (the chapter's links come first).
    for _ in range(200):
        page.keyboard.press("Tab")
        if page.evaluate("() => document.activeElement && document.activeElement.classList.contains('kvt-input')"):
            break
    else:
        raise AssertionError("the text box cannot be reached with Tab")
    page.keyboard.press("Control+A")
    text = "The cat sat. 🙂"
    page.keyboard.type(text)
    data = shown(widget, text)
    assert data["ids"] == api_tokenize(live_server, text)["ids"]
    page.keyboard.press("Tab")   # into the token list: the first token takes focus
    active = page.evaluate("() => document.activeElement.dataset.index")
    assert active == "0"
    for expected in (1, 2, 3):
        page.keyboard.press("ArrowRight")
        assert widget.get_attribute("data-active") == str(expected)
        assert page.evaluate("() => document.activeElement.getAttribute('aria-selected')") == "true"
    token = data["tokens"][3]
    piece = text.encode("utf-8")[token["start"]:token["end"]].decode("utf-8", "ignore")
    assert piece in widget.locator(".kvt-text .kvt-on").inner_text()
    page.keyboard.press("End")
    assert widget.get_attribute("data-active") == str(len(data["tokens"]) - 1)
    page.keyboard.press("Home")
    assert widget.get_attribute("data-active") == "0"
    assert "bytes 0–" in widget.locator(".kvt-detail").inner_text()
    details = []
    for _ in range(3):    # the hover detail shows text, never the byte alphabet (Ġ = space)
        page.keyboard.press("ArrowRight")
        details.append(widget.locator(".kvt-detail").inner_text())
    assert not [d for d in details if "Ġ" in d or "Ā" in d] and "“␣cat”" in details[0]
    page.keyboard.press("Home")
    assert "2,048 pieces" in widget.inner_text()     # and why the vocabulary is that small
    # The focus ring is visible on the focused token.
    outline = page.evaluate("() => getComputedStyle(document.activeElement).outlineStyle")
    assert outline != "none"
    screenshot(widget, "widget-tokenizer-keyboard")
    assert_clean(page)


def test_tokenizer_names_itself_and_compares_vocabulary_sizes(page, live_server, assert_clean):
    """The note under the widget says whose tokenizer it is and how many pieces it has (the
    hello event's model facts), and counts how the text in the box splits per word."""
    widget = open_live_widget(page, live_server, "/chapters/02-tokens", "kv-tokenizer")
    model = page.evaluate("() => window.kvscope.client.hello.model")
    text = "The little cat sat on the warm mat"
    widget.get_by_label("Text to tokenize").fill(text)
    shown(widget, text)
    num_tokens = len(api_tokenize(live_server, text)["ids"])
    note = widget.locator("[data-vocab]")
    page.wait_for_function("el => el.textContent.includes('words became')", arg=note.element_handle())
    said = note.text_content()
    assert f"This is the tokenizer of {model['name']}: {model['vocab_size']:,} pieces." in said
    assert f"8 words became {num_tokens} tokens ({num_tokens / 8:.2f} per word)" in said
    large = model["vocab_size"] >= 100_000
    assert note.get_attribute("data-vocab") == ("large" if large else "small")
    if not large:   # the embedded model: a small table, compared with a large real one
        assert "Qwen3: 151,936 pieces" in said and "fewer pieces" in said
    assert_clean(page)
