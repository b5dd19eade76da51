// <kv-tokenizer prompt="…">: type text and see how the live model's tokenizer cuts it —
// pieces (whitespace made visible, byte-fallback pieces as <0xNN>), ids, the UTF-8 bytes
// each token covers (highlighted in the text on hover or focus), and the counts.
// Talks to the engine with the `tokenize` command (debounced); with no backend it shows
// the tokenizations stored in the page's recording.

import { KvWidget, formatInt, CATEGORICAL } from '../widget-base.js';
import { h, debounce } from './lib/svg.js';
import { tokenLabel, byteMap, unitSpan, utf8, hex2 } from './lib/tokens.js';
import { injectStyle } from './lib/style.js';
import { recordedOfType } from './lib/recording.js';
import { modeBadge, showMode } from './lib/controls.js';

// Vocabularies this big (Llama 3: 128,256; Qwen3: 151,936) keep most common words whole.
const LARGE_VOCAB = 100000;
const DEFAULT_TEXT = 'Hello, world! Tokenizers cut text into pieces: café, 東京, 👋🏽.\nNew lines count too.';
const DEBOUNCE_MS = 200;
const MAX_BYTE_CELLS = 400;
const SHADES = 4;   // chips alternate through this many tints

const STYLE = `
kv-tokenizer .kvt-text {
  font-family: var(--kv-font-mono); white-space: pre-wrap; word-break: break-word; line-height: 1.9;
  padding: .5rem .6rem; background: var(--kv-bg-soft); border-radius: var(--kv-radius, 6px); margin: .4rem 0;
}
kv-tokenizer .kvt-seg { border-radius: 2px; padding: .05em 0; }
${[0, 1, 2, 3].map((i) => `kv-tokenizer .kvt-shade-${i} { background: color-mix(in srgb, ${CATEGORICAL[i]} 20%, transparent); box-shadow: inset 0 -2px 0 color-mix(in srgb, ${CATEGORICAL[i]} 70%, transparent); }`).join('\n')}
kv-tokenizer .kvt-seg.kvt-on, kv-tokenizer .kvt-byte.kvt-on {
  background: var(--kv-fg); color: var(--kv-bg); box-shadow: none; outline: 2px solid var(--kv-focus);
}
kv-tokenizer .kvt-tokens { display: flex; flex-wrap: wrap; gap: .35rem; list-style: none; padding: 0; margin: .5rem 0; }
kv-tokenizer .kvt-tok {
  display: inline-flex; flex-direction: column; align-items: center; min-width: 2rem;
  border: 1px solid var(--kv-border); border-radius: 4px; padding: .1rem .35rem; cursor: default;
  font-family: var(--kv-font-mono); font-size: .9rem; line-height: 1.35;
}
kv-tokenizer .kvt-tok .kvt-piece { white-space: pre; }
kv-tokenizer .kvt-tok .kvt-id { font-size: .72rem; color: var(--kv-fg-soft); font-variant-numeric: tabular-nums; }
kv-tokenizer .kvt-tok[aria-selected=true] { outline: 3px solid var(--kv-focus); outline-offset: 1px; }
kv-tokenizer .kvt-tok.kvt-special { border-style: dashed; border-width: 2px; font-weight: 700; }
kv-tokenizer .kvt-tok.kvt-partial .kvt-piece { font-style: italic; }
kv-tokenizer .kvt-bytes { display: flex; flex-wrap: wrap; gap: 2px; font-family: var(--kv-font-mono); font-size: .72rem; margin: .3rem 0; }
kv-tokenizer .kvt-byte { padding: 0 .15rem; border-radius: 2px; }
kv-tokenizer .kvt-detail { font-family: var(--kv-font-mono); font-size: .85rem; min-height: 1.4em; }
kv-tokenizer .kvt-chat { font-size: .85rem; color: var(--kv-fg-soft); }
kv-tokenizer .kvt-ids { font-family: var(--kv-font-mono); font-size: .8rem; word-break: break-all; color: var(--kv-fg-soft); }
`;

class KvTokenizer extends KvWidget {
  static events = [];
  static requires = ['tokenize'];
  static label = 'Tokenizer';

  setup() {
    injectStyle('kv-tokenizer', STYLE);
    this.result = null;          // the last `tokens` event shown
    this.active = -1;            // index of the highlighted token
    this.seq = 0;                // request counter, to drop stale replies
    this.recorded = null;        // replay: recorded `tokens` events
    const uid = this.getAttribute('aria-labelledby');

    this.input = h('textarea', {
      class: 'kvw-textarea kvt-input', id: `${uid}-input`, rows: 3, spellcheck: 'false',
      'aria-describedby': `${uid}-help`,
    });
    this.input.value = this.getAttribute('prompt') || DEFAULT_TEXT;
    this.input.addEventListener('input', () => this.tokenizeSoon());

    this.chatBox = h('input', { type: 'checkbox', id: `${uid}-chat` });
    this.chatBox.addEventListener('change', () => this.tokenize());
    this.modeBadge = modeBadge();
    this.countsEl = h('dl', { class: 'kvw-figures', 'aria-label': 'Counts' });
    this.textEl = h('div', { class: 'kvt-text', 'aria-hidden': 'true' });
    this.tokensEl = h('ol', {
      class: 'kvt-tokens', role: 'listbox', 'aria-label': 'Tokens (arrow keys move between them)',
      'aria-orientation': 'horizontal',
    });
    this.tokensEl.addEventListener('keydown', (e) => this.onTokenKey(e));
    this.tokensEl.addEventListener('focusin', (e) => {
      const li = e.target.closest('.kvt-tok');
      if (li) this.setActive(Number(li.dataset.index), false);
    });
    this.tokensEl.addEventListener('pointerover', (e) => {
      const li = e.target.closest('.kvt-tok');
      if (li) this.setActive(Number(li.dataset.index), false);
    });
    this.detailEl = h('p', { class: 'kvt-detail', 'aria-live': 'off' });
    this.bytesEl = h('div', { class: 'kvt-bytes', 'aria-hidden': 'true' });
    this.idsEl = h('p', { class: 'kvt-ids' });
    this.errorEl = h('p', { class: 'kvw-error', role: 'alert' });

    this.body.append(
      h('div', { class: 'kvw-row' },
        h('label', { for: this.input.id }, 'Text to tokenize'), this.modeBadge,
        h('label', { for: this.chatBox.id, class: 'kvt-chat' }, this.chatBox, ' as a chat message (the model’s chat template adds special tokens)')),
      this.input,
      h('p', { class: 'kvw-note', id: `${uid}-help` },
        'Tokens update as you type. In the list below, use the arrow keys (Home/End) to move between tokens; the bytes each one covers light up in the text.'),
      this.errorEl,
      this.vocabEl = h('p', { class: 'kvw-note' }),
      this.countsEl,
      this.textEl,
      this.tokensEl,
      this.detailEl,
      h('details', {}, h('summary', {}, 'UTF-8 bytes and ids'), this.bytesEl, this.idsEl),
    );
    this.setLegend([
      { label: 'a token (tints alternate so neighbours stand apart)', color: CATEGORICAL[0] },
      { label: 'special token (dashed border)', color: 'var(--kv-fg)', shape: 'line' },
      { label: 'highlighted token and its bytes', color: 'var(--kv-focus)' },
      { label: '␣ space, ↵ new line, ⇥ tab, <0xNN> one byte of a split character', color: 'transparent' },
    ]);
    this.tokenizeSoon = debounce(() => this.tokenize(), DEBOUNCE_MS);
    this.updateMode(this.client.mode);
    this.tokenize();
  }

  onModeChange(mode) {
    this.updateMode(mode);
    this.tokenize();
  }

  updateMode(mode) {
    showMode(this.modeBadge, mode);
  }

  async tokenize() {
    const text = this.input.value;
    const seq = ++this.seq;
    this.errorEl.textContent = '';
    if (!text) {
      this.show({ type: 'tokens', text: '', num_bytes: 0, num_chars: 0, ids: [], tokens: [] });
      return;
    }
    if (this.client.mode === 'replay') {
      await this.showRecorded(text, seq);
      return;
    }
    try {
      const reply = await this.client.command('tokenize', this.chatBox.checked ? { text, chat: true } : { text });
      if (seq !== this.seq) return;
      this.show(reply);
    } catch (error) {
      if (seq !== this.seq) return;
      if (error.code === 'replay') await this.showRecorded(text, seq);
      else this.errorEl.textContent = this.describeError(error);
    }
  }

  /** Replay: the recording's tokenization of this text, or of the first recorded text. */
  async showRecorded(text, seq) {
    if (!this.recorded) this.recorded = await recordedOfType(this.client, 'tokens');
    if (seq !== this.seq) return;
    const exact = this.recorded.find((e) => e.text === text);
    if (exact) {
      this.show(exact);
      return;
    }
    if (this.recorded.length && !this.shownRecorded) {
      this.shownRecorded = true;
      this.input.value = this.recorded[0].text;
      this.show(this.recorded[0]);
      this.announce('Replaying a recording: this is its tokenization. Typing your own text needs the live engine.');
      return;
    }
    this.errorEl.textContent = this.recorded.length
      ? 'Replaying a recording: only the texts it holds can be shown; tokenizing new text needs the live engine.'
      : 'Tokenizing needs the live engine; the page is replaying a recording that holds no tokenizations.';
  }

  show(result) {
    this.result = result;
    this.active = Math.min(this.active, result.tokens.length - 1);
    // With the chat template the tokenized text is the formatted one; the input stays as typed.
    this.dataset.text = this.chatBox.checked && this.client.mode !== 'replay' ? this.input.value : result.text;
    this.dataset.chat = this.chatBox.checked ? 'true' : 'false';
    this.dataset.numTokens = String(result.tokens.length);
    this.requestRender();
  }

  /** Which tokenizer this is and why its vocabulary is the size it is, from the model's own
   *  numbers (the `hello` event), and what that means for the text in the box. */
  describeVocabulary() {
    const model = this.client.hello?.model;
    if (!model?.vocab_size) return;
    const vocab = model.vocab_size;
    const r = this.result;
    const words = r ? r.text.split(/\s+/).filter(Boolean).length : 0;
    const split = r && words ? ` Your text: ${formatInt(words)} words became ${formatInt(r.tokens.length)} tokens (${(r.tokens.length / words).toFixed(2)} per word).` : '';
    const which = `This is the tokenizer of ${model.name}: ${vocab.toLocaleString('en')} pieces.`;
    this.vocabEl.dataset.vocab = vocab >= LARGE_VOCAB ? 'large' : 'small';
    this.vocabEl.textContent = vocab >= LARGE_VOCAB
      ? `${which} A table this large holds most common words whole, so the same sentence splits into fewer pieces than in a small model’s table.${split}`
      : `${which} It was trained on simple stories, so a small table covers their words; anything else falls apart into short pieces or single bytes. Large models use far bigger tables (Qwen3: 151,936 pieces), where most words are one token, so the same sentence splits into fewer pieces.${split}`;
  }

  render() {
    this.describeVocabulary();
    const r = this.result;
    if (!r) return;
    const map = byteMap(r.text);
    const bytes = utf8(r.text);
    this.map = map;
    this.countsEl.replaceChildren(
      ...[['Characters', r.num_chars, 'chars'], ['UTF-8 bytes', r.num_bytes, 'bytes'], ['Tokens', r.tokens.length, 'tokens'],
        ['Bytes per token', r.tokens.length ? (r.num_bytes / r.tokens.length).toFixed(2) : '—', 'ratio']]
        .map(([k, v, key]) => h('div', {}, h('dt', {}, k), h('dd', { 'data-count': key }, typeof v === 'number' ? formatInt(v) : v))),
    );

    // The text, one segment per token (tokens that split one character share its segment).
    const segs = [];
    r.tokens.forEach((tok, i) => {
      const [u0, u1] = unitSpan(map, tok.start, tok.end);
      const last = segs[segs.length - 1];
      if (last && u0 < last.u1) {
        last.tokens.push(i);
        last.u1 = Math.max(last.u1, u1);
      } else {
        if (last && u0 > last.u1) segs.push({ u0: last.u1, u1: u0, tokens: [] });
        else if (!last && u0 > 0) segs.push({ u0: 0, u1: u0, tokens: [] });
        segs.push({ u0, u1, tokens: [i] });
      }
    });
    const tail = segs.length ? segs[segs.length - 1].u1 : 0;
    if (tail < r.text.length) segs.push({ u0: tail, u1: r.text.length, tokens: [] });
    this.segEls = [];
    this.textEl.replaceChildren(...segs.map((s) => {
      const span = h('span', { class: s.tokens.length ? `kvt-seg kvt-shade-${s.tokens[0] % SHADES}` : '' }, r.text.slice(s.u0, s.u1));
      span.dataset.tokens = s.tokens.join(',');
      this.segEls.push(span);
      return span;
    }));

    // The token chips.
    const focusIndex = this.active >= 0 ? this.active : 0;
    this.tokenEls = r.tokens.map((tok, i) => {
      const label = tokenLabel(tok);
      const li = h('li', {
        class: `kvt-tok kvt-shade-${i % SHADES}${tok.special ? ' kvt-special' : ''}${tok.complete === false ? ' kvt-partial' : ''}`,
        role: 'option', tabindex: i === focusIndex ? '0' : '-1', 'aria-selected': i === this.active ? 'true' : 'false',
        'aria-label': `Token ${i + 1} of ${r.tokens.length}: ${label}${tok.special ? ' (special)' : ''}, id ${tok.id}, bytes ${tok.start} to ${tok.end}`,
        dataset: { index: String(i), id: String(tok.id), start: String(tok.start), end: String(tok.end) },
      }, h('span', { class: 'kvt-piece' }, label), h('span', { class: 'kvt-id' }, String(tok.id)));
      if (tok.special) li.title = 'special token';
      return li;
    });
    this.tokensEl.replaceChildren(...this.tokenEls);

    // Bytes, coloured by token.
    const owner = new Array(bytes.length).fill(-1);
    r.tokens.forEach((tok, i) => { for (let b = tok.start; b < tok.end && b < owner.length; b += 1) owner[b] = i; });
    this.byteEls = [];
    const n = Math.min(bytes.length, MAX_BYTE_CELLS);
    const cells = [];
    for (let b = 0; b < n; b += 1) {
      const cell = h('span', { class: `kvt-byte${owner[b] >= 0 ? ` kvt-shade-${owner[b] % SHADES}` : ''}` }, hex2(bytes[b]));
      cell.dataset.token = String(owner[b]);
      this.byteEls.push(cell);
      cells.push(cell);
    }
    if (bytes.length > n) cells.push(h('span', {}, `… ${formatInt(bytes.length - n)} more`));
    this.bytesEl.replaceChildren(...cells);
    this.idsEl.textContent = `ids: [${r.ids.join(', ')}]`;
    this.highlight();
  }

  setActive(i, focus) {
    if (!this.result || i < 0 || i >= this.result.tokens.length) return;
    this.active = i;
    this.tokenEls.forEach((el, k) => {
      el.setAttribute('tabindex', k === i ? '0' : '-1');
      el.setAttribute('aria-selected', k === i ? 'true' : 'false');
    });
    if (focus) this.tokenEls[i].focus();
    this.highlight();
  }

  highlight() {
    const i = this.active;
    const r = this.result;
    for (const seg of this.segEls || []) seg.classList.toggle('kvt-on', seg.dataset.tokens.split(',').includes(String(i)));
    for (const cell of this.byteEls || []) cell.classList.toggle('kvt-on', cell.dataset.token === String(i));
    this.dataset.active = String(i);
    if (!r || i < 0) {
      this.detailEl.textContent = r && r.tokens.length ? 'Hover or focus a token to see its bytes.' : '';
      return;
    }
    const tok = r.tokens[i];
    const bytes = utf8(r.text).slice(tok.start, tok.end);
    const hexes = [...bytes].map(hex2).join(' ');
    // the visible text, never the tokenizer's internal byte alphabet (Ġ for a space, Ā…)
    this.detailEl.textContent = `#${i + 1} id ${tok.id} · “${tokenLabel(tok)}” · bytes ${tok.start}–${tok.end} (${hexes})`
      + `${tok.special ? ' · special token' : ''}${tok.complete === false ? ' · part of a multi-byte character' : ''}`;
  }

  onTokenKey(event) {
    if (!this.result || !this.result.tokens.length) return;
    const n = this.result.tokens.length;
    const i = this.active >= 0 ? this.active : 0;
    const moves = { ArrowRight: i + 1, ArrowDown: i + 1, ArrowLeft: i - 1, ArrowUp: i - 1, Home: 0, End: n - 1 };
    if (!(event.key in moves)) return;
    event.preventDefault();
    this.setActive(Math.max(0, Math.min(n - 1, moves[event.key])), true);
  }

  exportData() {
    const r = this.result;
    return r ? {
      text: r.text, num_chars: r.num_chars, num_bytes: r.num_bytes, num_tokens: r.tokens.length,
      ids: r.ids, tokens: r.tokens, active: this.active,
    } : { text: this.input.value, tokens: [] };
  }
}

customElements.define('kv-tokenizer', KvTokenizer);
