"""Chapter Markdown to HTML: CommonMark plus docs/authoring.md's marks; a broken mark raises RenderError."""
from __future__ import annotations

import hashlib
import random
import re
from dataclasses import dataclass, field
from html import escape

import yaml
from markdown_it import MarkdownIt
from markdown_it.rules_block import StateBlock
from markdown_it.rules_inline import StateInline
from mdit_py_plugins.anchors import anchors_plugin

from kvscope.instrumentation.schema import DEVICE, ENGINE, MODEL
from kvscope.server.pages.content import Glossary, frontend_dir

# A widget exists when its file does: frontend/js/widgets/kv-<name>.js defines <kv-<name>>.
WIDGET_TAGS = frozenset(path.stem for path in (frontend_dir() / "js" / "widgets").glob("kv-*.js"))
VALUE_FORMATS = frozenset({"int", "bytes", "float", "text", "seconds", "si"})
# hello's keys a chapter may show (<kv-value key=...>), and what frontend/js/kv-value.js derives from them
VALUE_KEYS = frozenset([f"{name}.{key}" for name, part in (("model", MODEL), ("device", DEVICE), ("engine", ENGINE))
                        for key in part["required"]] + ["engine.decode", "derived.min_decode_step_s",
                       "derived.ridge_flops_per_byte", "derived.weight_bytes_int8", "derived.weight_bytes_int4"])
FIGURE_LINE = re.compile(r"^!\[([^\]]+)\]\(figures/([a-z0-9-]+)\.svg\)\s*$")
WIDGET_LINE = re.compile(r"^<(kv-[a-z][a-z0-9-]*)((?:\s[^<>]*)?)>\s*</\1>\s*$")
KV_VALUE = re.compile(r"<kv-value\b([^>]*)>")
ATTRIBUTE = re.compile(r'([a-z-]+)\s*=\s*"([^"]*)"')
MIN_QUIZ_QUESTIONS = 3


class RenderError(ValueError):
    """A chapter breaks the authoring contract (unknown term, bad quiz, bad key)."""


@dataclass
class RenderContext:
    """Per-render state: where we are (for messages) and counters for unique ids."""
    source: str
    glossary: Glossary
    terms_used: set[str] = field(default_factory=set)
    next_id: int = 0

    def new_id(self, prefix: str) -> str:
        self.next_id += 1
        return f"{prefix}-{self.next_id}"


def _glossary_rule(state: StateInline, silent: bool) -> bool:
    src, pos = state.src, state.pos
    if not src.startswith("[[", pos):
        return False
    end = src.find("]]", pos + 2)
    if end < 0 or "\n" in src[pos + 2:end]:
        return False
    inner = src[pos + 2:end]
    if not inner.strip():
        return False
    if not silent:
        shown, _, name = inner.partition("|")
        token = state.push("kv_term", "kv-term", 0)
        token.meta = {"shown": shown.strip(), "name": (name or shown).strip()}
    state.pos = end + 2
    return True


def _render_term(self, tokens, idx, options, env) -> str:
    ctx: RenderContext = env["kvscope"]
    meta = tokens[idx].meta
    term = ctx.glossary.lookup(meta["name"])
    if term is None:
        raise RenderError(f"{ctx.source}: unknown glossary term [[{meta['name']}]] "
                          "(add it to content/glossary/*.yaml or fix the spelling)")
    ctx.terms_used.add(term.term)
    tip_id = ctx.new_id("kv-tip")
    return (f'<kv-term tabindex="0" role="term" data-term="{escape(term.term)}" aria-describedby="{tip_id}">'
            f'{escape(meta["shown"])}'
            # `hidden`: without the stylesheet the definition must not spill into the sentence.
            f'<span class="kv-term__tip" role="tooltip" id="{tip_id}" hidden>'
            f'<strong>{escape(term.term)}</strong> {escape(term.short)}</span></kv-term>')


def line_rule(pattern: re.Pattern, token_type: str, meta):
    """A block rule: a line matching `pattern` alone is one `token_type` token with meta(match), unless None."""
    def rule(state: StateBlock, start_line: int, end_line: int, silent: bool) -> bool:
        if state.sCount[start_line] - state.blkIndent >= 4:
            return False
        begin = state.bMarks[start_line] + state.tShift[start_line]
        match = pattern.match(state.src[begin:state.eMarks[start_line]])
        if not match or meta(match) is None:
            return False
        if not silent:
            token = state.push(token_type, "", 0)
            token.meta, token.map = meta(match), [start_line, start_line + 1]
            state.line = start_line + 1
        return True
    return rule


def _widget_meta(match: re.Match) -> dict | None:
    if match.group(1) in ("kv-value", "kv-term", "kv-quiz"):
        return None
    return {"tag": match.group(1), "attributes": match.group(2) or ""}


def _render_widget(self, tokens, idx, options, env) -> str:
    ctx: RenderContext = env["kvscope"]
    tag, attributes = tokens[idx].meta["tag"], tokens[idx].meta["attributes"]
    if tag not in WIDGET_TAGS:
        raise RenderError(f"{ctx.source}: unknown widget <{tag}> (known: {', '.join(sorted(WIDGET_TAGS))})")
    # The class lets the page lay the widget out before its script has loaded.
    return f'<{tag} class="kv-widget"{attributes}></{tag}>\n'


def _render_figure(self, tokens, idx, options, env) -> str:
    ctx: RenderContext = env["kvscope"]
    name, caption = tokens[idx].meta["name"], tokens[idx].meta["caption"]
    path = frontend_dir() / "figures" / f"{name}.svg"
    if not path.is_file():
        raise RenderError(f"{ctx.source}: no figure frontend/figures/{name}.svg (run scripts/make_figures.py)")
    return (f'<figure class="kv-figure" id="figure-{name}">{path.read_text(encoding="utf-8").strip()}'
            f'<figcaption>{escape(caption)}</figcaption></figure>\n')


def _quiz_questions(text: str, source: str) -> list[dict]:
    try:
        questions = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise RenderError(f"{source}: the quiz is not valid YAML: {error}") from error
    if not isinstance(questions, list) or len(questions) < MIN_QUIZ_QUESTIONS:
        raise RenderError(f"{source}: a quiz needs a list of at least {MIN_QUIZ_QUESTIONS} questions")
    for n, question in enumerate(questions, 1):
        choices = question.get("choices") if isinstance(question, dict) else None
        if not isinstance(question, dict) or not question.get("q") or not isinstance(choices, list) or len(choices) < 2:
            raise RenderError(f"{source}: quiz question {n} needs `q` and at least two `choices`")
        if sum(1 for c in choices if isinstance(c, dict) and c.get("correct") is True) != 1:
            raise RenderError(f"{source}: quiz question {n} needs exactly one choice with `correct: true`")
        for m, choice in enumerate(choices, 1):
            if not isinstance(choice, dict) or not choice.get("text") or not choice.get("why"):
                raise RenderError(f"{source}: quiz question {n}, choice {m} needs `text` and `why`")
    return questions


def shuffled_choices(source: str, question: str, choices: list) -> list:
    """The choices in an order fixed by chapter and question (authors list the correct one first)."""
    seed = int.from_bytes(hashlib.sha256(f"{source}\n{question}".encode()).digest()[:8], "big")
    order = list(choices)
    random.Random(seed).shuffle(order)
    return order


def _render_quiz(md: MarkdownIt, text: str, env: dict) -> str:
    ctx: RenderContext = env["kvscope"]
    questions = _quiz_questions(text, ctx.source)
    quiz_id = ctx.new_id("kv-quiz")
    inline = lambda s: md.renderInline(str(s), env)  # noqa: E731 - short and local
    parts = [f'<kv-quiz id="{quiz_id}" data-questions="{len(questions)}">']
    for n, question in enumerate(questions, 1):
        qid = f"{quiz_id}-q{n}"
        parts.append(f'<fieldset class="kv-quiz__question" id="{qid}">'
                     f'<legend>{n}. {inline(question["q"])}</legend>'
                     f'<ul class="kv-quiz__choices" role="list">')
        for m, choice in enumerate(shuffled_choices(ctx.source, str(question["q"]), question["choices"])):
            cid = f"{qid}-c{m}"
            correct = "true" if choice.get("correct") is True else "false"
            parts.append(
                f'<li class="kv-quiz__choice" data-correct="{correct}">'
                f'<label for="{cid}"><input type="radio" id="{cid}" name="{qid}" value="{m}">'
                f'<span>{inline(choice["text"])}</span></label>'
                f'<p class="kv-quiz__why" id="{cid}-why" hidden>{inline(choice["why"])}</p></li>')
        parts.append('</ul><div class="kv-quiz__actions">'
                     '<button type="button" class="kv-button kv-quiz__check">Check answer</button>'
                     '<p class="kv-quiz__feedback" role="status" aria-live="polite"></p></div></fieldset>')
    parts.append('<p class="kv-quiz__score" role="status" aria-live="polite"></p></kv-quiz>\n')
    return "".join(parts)


def _check_values(source: str, text: str) -> None:
    for match in KV_VALUE.finditer(text):
        attributes = dict(ATTRIBUTE.findall(match.group(1)))
        key, fmt = attributes.get("key"), attributes.get("format", "int")
        if key not in VALUE_KEYS:
            raise RenderError(f"{source}: <kv-value key={key!r}> is not a key of the hello event")
        if fmt not in VALUE_FORMATS:
            raise RenderError(f"{source}: <kv-value format={fmt!r}> (one of {', '.join(sorted(VALUE_FORMATS))})")


def make_markdown() -> MarkdownIt:
    md = MarkdownIt("commonmark", {"html": True, "typographer": False})
    md.enable("table")
    md.use(anchors_plugin, min_level=2, max_level=3, permalink=False)
    md.inline.ruler.before("link", "kv_term", _glossary_rule)
    md.block.ruler.before("html_block", "kv_widget", line_rule(WIDGET_LINE, "kv_widget", _widget_meta),
                          {"alt": ["paragraph", "reference", "blockquote"]})
    md.add_render_rule("kv_term", _render_term)
    md.add_render_rule("kv_widget", _render_widget)
    figure_meta = lambda m: {"caption": m.group(1), "name": m.group(2)}  # noqa: E731 - short and local
    md.block.ruler.before("paragraph", "kv_figure", line_rule(FIGURE_LINE, "kv_figure", figure_meta),
                          {"alt": ["paragraph", "reference", "blockquote"]})
    md.add_render_rule("kv_figure", _render_figure)

    default_fence = md.renderer.rules["fence"]

    def fence(self, tokens, idx, options, env):
        if tokens[idx].info.strip() == "quiz":
            return _render_quiz(md, tokens[idx].content, env)
        return default_fence(tokens, idx, options, env)

    md.add_render_rule("fence", fence)
    return md


@dataclass
class Rendered:
    html: str
    terms_used: set[str]
    widgets: list[str]
    has_quiz: bool
    headings: list[tuple[str, str]]   # (id, text) of the h2 sections


def render_markdown(md: MarkdownIt, text: str, glossary: Glossary, source: str) -> Rendered:
    _check_values(source, text)
    ctx = RenderContext(source=source, glossary=glossary)
    env = {"kvscope": ctx}
    tokens = md.parse(text, env)
    html = md.renderer.render(tokens, md.options, env)
    widgets = [t.meta["tag"] for t in tokens if t.type == "kv_widget"]
    headings = [(token.attrs.get("id", ""), "".join(c.content for c in tokens[i + 1].children or []
                                                    if c.type in ("text", "code_inline")))
                for i, token in enumerate(tokens) if token.type == "heading_open" and token.tag == "h2"]
    return Rendered(html=html, terms_used=ctx.terms_used, widgets=widgets,
                    has_quiz=any(t.type == "fence" and t.info.strip() == "quiz" for t in tokens),
                    headings=headings)
