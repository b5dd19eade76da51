// <kv-attention prompt="…">: the attention weights the live model computes for a prompt.
// Submits the prompt as a *watched* request; the engine then sends one `attention` event
// per layer per step (the whole prompt at prefill, one new row per decoded token). Layer
// and head selectors (or the mean over heads), token labels, the causal mask hatched, a
// query row lit up over the text on hover or focus, a colour scale legend.
// Prompt rows whose keys came from the prefix cache (a prompt someone ran before) are
// rebuilt by the instrumentation from the cached keys and recomputed queries, and marked.
// The chosen layer and head stay chosen from one run to the next.
// With no backend it follows the first watched request in the page's recording.

import { KvWidget, heatColor, formatInt, pausedText } from '../widget-base.js';
import { h } from './lib/svg.js';
import { injectStyle } from './lib/style.js';
import { clientHandlers, withHandlers } from './lib/listen.js';
import { drawHeatmap, drawHeatmapCanvas, weightsOverText, CANVAS_ROWS, HEATMAP_CSS } from './lib/heatmap.js';
import { tokenLabel, idLabel, visibleText } from './lib/tokens.js';
import { recordedPromptTokens } from './lib/recording.js';
import { AttentionStore } from './lib/attention-store.js';
import { modeBadge, showMode } from './lib/controls.js';

const DEFAULT_PROMPT = 'The little cat sat on the mat because it was';
const DEFAULT_MAX_TOKENS = 8;

const STYLE = `${HEATMAP_CSS}
kv-attention .kva-scale { display: flex; align-items: center; gap: .5rem; font-size: .8rem; }
kv-attention .kva-ramp { width: 10rem; height: .8rem; border: 1px solid var(--kv-border); border-radius: 2px; }
kv-attention .kva-over { display: flex; flex-wrap: wrap; gap: 2px; font-family: var(--kv-font-mono); font-size: .85rem; margin: .4rem 0; }
kv-attention .kva-over span { padding: .05rem .25rem; border-radius: 3px; white-space: pre; }
kv-attention .kva-over .kva-q { outline: 2px solid var(--kv-focus); outline-offset: 1px; }
kv-attention .kva-over .kva-future { opacity: .45; background: repeating-linear-gradient(45deg, transparent 0 3px, var(--kv-border) 3px 4px); }
`;

class KvAttention extends withHandlers(KvWidget) {
  static events = [];
  static requires = ['requests', 'attention'];
  static replayEvents = ['attention', 'request'];
  static label = 'Attention heatmap';

  setup() {
    injectStyle('kv-attention', STYLE);
    this.reset();
    this.layer = 0;
    this.head = 'mean';
    const uid = this.getAttribute('aria-labelledby');
    this.promptEl = h('input', { class: 'kvw-input', id: `${uid}-prompt`, type: 'text', size: 40 });
    this.promptEl.value = this.getAttribute('prompt') || DEFAULT_PROMPT;
    this.runBtn = h('button', { type: 'button', class: 'kvw-btn kvw-btn--primary', onclick: () => this.run() }, 'Run');
    this.promptEl.addEventListener('keydown', (e) => { if (e.key === 'Enter') this.run(); });
    this.layerSel = h('select', { class: 'kvw-select', id: `${uid}-layer`, onchange: () => { this.layer = Number(this.layerSel.value); this.requestRender(); } });
    this.headSel = h('select', { class: 'kvw-select', id: `${uid}-head`, onchange: () => { this.head = this.headSel.value; this.requestRender(); } });
    this.scaleSel = h('select', { class: 'kvw-select', id: `${uid}-scale`, onchange: () => { this.rowScale = this.scaleSel.value === 'row'; this.requestRender(); } },
      h('option', { value: 'map' }, 'whole map: 0 to its largest weight'), h('option', { value: 'row' }, 'each row: 0 to that row’s largest'));
    this.rowScale = false;
    this.modeBadge = modeBadge();
    this.ramp = h('span', { class: 'kva-ramp' });
    this.rampMax = h('span', {}, '1');
    this.mapEl = h('div', { class: 'kvw-scroll' });
    this.mapEl.addEventListener('pointerover', (e) => {
      const r = e.target.closest('[data-row]');
      if (r) this.setActive(Number(r.dataset.row), false);
    });
    this.mapEl.addEventListener('keydown', (e) => this.onRowKey(e));
    this.mapEl.addEventListener('focusin', (e) => {
      const r = e.target.closest('[data-row]');
      if (r) this.setActive(Number(r.dataset.row), false);
    });
    this.mapEl.addEventListener('click', (e) => {
      const r = e.target.closest('[data-row]');
      if (r) this.setActive(Number(r.dataset.row), true);
    });
    this.overEl = h('div', { class: 'kva-over', 'aria-live': 'off' });
    this.overCaption = h('p', { class: 'kvw-note' });
    this.infoEl = h('p', { class: 'kvw-note' });
    this.errorEl = h('p', { class: 'kvw-error', role: 'alert' });
    this.body.append(
      h('div', { class: 'kvw-row' }, h('label', { for: this.promptEl.id }, 'Prompt'), this.promptEl, this.runBtn, this.modeBadge),
      h('div', { class: 'kvw-row' },
        h('label', { for: this.layerSel.id }, 'Layer'), this.layerSel,
        h('label', { for: this.headSel.id }, 'Head'), this.headSel),
      h('div', { class: 'kvw-row' },
        h('label', { for: this.scaleSel.id }, 'Colour scale'), this.scaleSel,
        h('span', { class: 'kva-scale', role: 'img', 'aria-label': 'colour scale: the page background is 0, the strongest colour is the largest weight shown' }, '0', this.ramp, this.rampMax)),
      this.errorEl, this.infoEl, this.mapEl, this.overCaption, this.overEl,
      h('p', { class: 'kvw-note' }, 'Rows are query tokens, columns the tokens they attend to. Tab to the row labels, then use ↑/↓ to move between rows.'),
    );
    this.ramp.style.background = `linear-gradient(to right, ${[0, 0.25, 0.5, 0.75, 1].map((t) => heatColor(t)).join(', ')})`;
    this.setLegend([
      { label: 'attention weight: fades into the page near 0, strongest colour = largest (scale above)', color: heatColor(0.7) },
      { label: 'causal mask: a token cannot attend to later tokens (weight 0)', color: 'var(--kv-border)', shape: 'hatch' },
      { label: 'row not received yet (dashed outline)', color: 'var(--kv-border)', shape: 'line' },
      { label: 'row whose keys came from the prefix cache: recomputed from the cached keys', color: 'var(--kv-cached)' },
      { label: 'line between the prompt rows (above) and the generated rows (below)', color: 'var(--kv-fg)', shape: 'line' },
      { label: 'selected query row', color: 'var(--kv-focus)', shape: 'line' },
    ]);
    this.handlers = clientHandlers(this, {
      attention: (e) => this.onAttention(e),
      'request.added': (e) => this.onAdded(e),
      'request.token': (e) => this.onToken(e),
      'request.finished': (e) => this.onFinished(e),
      error: (e) => { if (e.request_id && e.request_id === this.rid) this.errorEl.textContent = e.message; },
      engine: (e) => { if (e.reason === 'reset' && this.client.mode === 'replay') this.reset(); },
    });
    this.handlers.attach();
    this.updateMode(this.client.mode);
    if (this.client.hello) this.onEvent(this.client.hello);
  }

  reset() {
    this.rid = null;
    this.buffer = [];            // events that came before the submit's ack named the request
    this.store = new AttentionStore();
    this.recomputed = new Set(); // positions rebuilt from prefix-cached keys
    this.labels = [];            // position -> label
    this.tokenIds = [];
    this.numPrompt = 0;
    this.numHeads = this.client?.hello?.model?.num_heads || 0;
    this.finished = false;
    this.numOutput = 0;
    this.active = -1;
    this.seenAdded = new Map();  // replay: requests seen before one is followed
    this.seenTokens = [];        // replay: their tokens (a prefill's token comes before its attention)
    delete this.dataset?.finished;
    this.requestRender?.();
  }

  onEvent(event) {
    if (event.type === 'hello') {
      const m = event.model;
      this.numHeads = m.num_heads;
      this.layerSel.replaceChildren(...Array.from({ length: m.num_layers }, (_, i) => h('option', { value: i }, `layer ${i}`)));
      this.layerSel.value = String(Math.min(this.layer, m.num_layers - 1));
      const group = m.num_heads / m.num_kv_heads;
      this.headSel.replaceChildren(h('option', { value: 'mean' }, 'mean over heads'),
        ...Array.from({ length: m.num_heads }, (_, i) => h('option', { value: i }, `head ${i} (KV head ${Math.floor(i / group)})`)));
      this.headSel.value = String(this.head);
    }
  }

  onModeChange(mode) {
    this.updateMode(mode);
  }

  connectedCallback() {
    super.connectedCallback();
    this.onModeChange(this.client.mode);
  }

  updateMode(mode) {
    this.runBtn.disabled = mode === 'replay' || this.pending;
    this.runBtn.title = mode === 'replay' ? 'Running a prompt needs the live engine' : '';
    showMode(this.modeBadge, mode);
  }

  async run() {
    const prompt = this.promptEl.value.trim();
    if (!prompt) return;
    this.errorEl.textContent = '';
    if (this.rid && !this.finished) this.client.command('cancel', { request_id: this.rid }).catch(() => {});
    this.reset();
    this.pending = true;
    this.runBtn.disabled = true;
    const maxTokens = Number(this.getAttribute('max-tokens')) || DEFAULT_MAX_TOKENS;
    this.client.command('tokenize', { text: prompt }).then((t) => this.labelPrompt(t)).catch(() => {});
    try {
      const ack = await this.client.command('submit', {
        prompt, params: { temperature: 0, max_tokens: maxTokens }, watch: { sampling: false },
      });
      this.rid = ack.request_id;
      this.numPrompt = ack.num_prompt_tokens;
      this.announce(`Request ${this.rid} submitted: ${ack.num_prompt_tokens} prompt tokens, watching every layer.`);
      for (const e of this.buffer.splice(0)) if (e.request_id === this.rid) this.dispatchOwn(e);
    } catch (error) {
      this.errorEl.textContent = this.describeError(error);
    } finally {
      this.pending = false;
      this.runBtn.disabled = this.client.mode === 'replay';
      this.buffer = [];
    }
  }

  labelPrompt(tokens) {
    if (!tokens || !tokens.tokens) return;
    if (this.tokenIds.length && tokens.ids.some((id, i) => this.tokenIds[i] !== undefined && this.tokenIds[i] !== id)) return;
    tokens.tokens.forEach((t, i) => { this.labels[i] = tokenLabel(t); });
    this.requestRender();
  }

  /** Is this event about the request we follow? Live: ours; replay: the first watched one. */
  accept(e) {
    if (this.rid) return e.request_id === this.rid;
    if (this.pending) { this.buffer.push(e); return false; }
    if (this.client.mode !== 'replay') return false;
    if (e.type === 'request.added') {
      this.seenAdded.set(e.request_id, e);
      return false;
    }
    if (e.type === 'request.token') this.seenTokens.push(e);
    if (e.type !== 'attention') return false;
    this.rid = e.request_id;
    const added = this.seenAdded.get(e.request_id);
    if (added) this.onAdded(added);
    else if (e.query_positions.length > 1) this.numPrompt = e.query_positions[e.query_positions.length - 1] + 1;
    for (const token of this.seenTokens.splice(0)) if (token.request_id === this.rid) this.onToken(token);
    // a request's first event lists its whole context; a later one only what is new
    this.labelFromRecording(e.token_ids.length === e.context_len ? e.token_ids : this.tokenIds.slice(0, this.numPrompt));
    return true;
  }

  dispatchOwn(e) {
    if (e.type === 'attention') this.onAttention(e);
    else if (e.type === 'request.added') this.onAdded(e);
    else if (e.type === 'request.token') this.onToken(e);
    else if (e.type === 'request.finished') this.onFinished(e);
  }

  async labelFromRecording(ids) {
    this.labelPrompt(await recordedPromptTokens(this.client, ids));
  }

  onAdded(e) {
    if (!this.accept(e)) return;
    this.numPrompt = e.num_prompt_tokens;
    e.prompt_token_ids.forEach((id, i) => { this.tokenIds[i] = id; });
  }

  onToken(e) {
    if (!this.accept(e)) return;
    const pos = (this.numPrompt || 0) + e.index;
    this.numOutput = Math.max(this.numOutput, e.index + 1);
    this.tokenIds[pos] = e.token_id;
    this.labels[pos] = visibleText(e.text || '') || idLabel(e.token_id);
    this.requestRender();
  }

  onFinished(e) {
    if (!this.accept(e)) return;
    this.finished = true;
    this.dataset.finished = 'true';
    this.announce(`Request ${e.request_id} finished (${e.reason}) after ${e.num_output_tokens} tokens.`);
    this.requestRender();
  }

  onAttention(e) {
    if (!this.accept(e)) return;
    this.numHeads = e.num_heads;
    const first = e.context_len - e.token_ids.length;   // the ids new since the last event (all in the first)
    e.token_ids.forEach((id, i) => { this.tokenIds[first + i] = id; });
    this.store.add(e);
    if (e.recomputed) e.query_positions.forEach((p) => this.recomputed.add(p));
    this.requestRender();
  }

  get size() { return this.store.size; }

  /** The layer drawn: the chosen one, or while it has no data (a recording that watched
   * only some layers) the first that has; the choice itself is kept for the next run. */
  get shownLayer() {
    if (this.store.layers.has(this.layer) || !this.store.layers.size) return this.layer;
    return Math.min(...this.store.layers.keys());
  }

  /** The n×n matrix of a layer and head (default: the shown ones). */
  matrix(layer = this.shownLayer, head = this.head) { return this.store.matrix(layer, head); }

  labelAt(i) {
    return this.labels[i] ?? (this.tokenIds[i] !== undefined ? idLabel(this.tokenIds[i]) : `#${i}`);
  }

  render() {
    const n = this.size;
    if (!n) {
      this.mapEl.replaceChildren(h('p', { class: 'kvw-note' }, this.rid ? (this.client.engine?.paused ? `${pausedText(this.client.engine)}: the first step runs when they resume.` : 'Waiting for the first step…') : 'Press Run to send the prompt to the engine and watch its attention.'));
      this.overEl.replaceChildren();
      this.overCaption.textContent = '';
      return;
    }
    const rows = this.matrix();
    let vmax = 0;
    for (const row of rows) if (row) for (const w of row) vmax = Math.max(vmax, w);
    this.vmax = vmax || 1;
    this.rampMax.textContent = this.rowScale ? 'row’s max' : this.vmax.toFixed(2);
    const labels = Array.from({ length: n }, (_, i) => this.labelAt(i));
    const headName = this.head === 'mean' ? 'mean over heads' : `head ${this.head}`;
    const width = Math.min(this.mapEl.clientWidth || this.clientWidth || 640, 900);
    const layer = this.shownLayer;
    if (this.layerSel.value !== String(layer)) this.layerSel.value = String(layer);
    const title = `Attention weights, layer ${layer}, ${headName}: ${n} query rows`;
    let map;
    if (n > CANVAS_ROWS) {
      const { canvas, cell } = drawHeatmapCanvas({ n, rows, active: this.active, vmax: this.vmax, width, title, rowScale: this.rowScale, split: this.numPrompt });
      canvas.addEventListener('pointermove', (e) => this.setActive(Math.floor(e.offsetY / cell), false));
      map = canvas;
      this.rowEls = Array.from({ length: n }, () => canvas);
    } else {
      const drawn = drawHeatmap({ n, rows, labels, active: this.active, vmax: this.vmax, width, title, rowScale: this.rowScale, split: this.numPrompt, recomputed: this.recomputed });
      map = drawn.svg;
      this.rowEls = drawn.rowEls;
    }
    const rowEls = this.rowEls;
    const hadFocus = this.mapEl.contains(document.activeElement);
    this.mapEl.replaceChildren(map);
    if (hadFocus && this.active >= 0) rowEls[this.active]?.focus();
    const decoded = Math.max(0, n - this.numPrompt);
    const missing = rows.filter((r) => !r).length;
    const cached = this.recomputed.size
      ? ` (${formatInt(this.recomputed.size)} of them from the prefix cache: the engine skipped them, so they were recomputed from the cached keys for this view)`
      : '';
    this.infoEl.textContent = `${this.rid || ''} · ${formatInt(this.numPrompt)} prompt rows${cached} + ${formatInt(decoded)} generated rows`
      + `${missing ? ` · ${formatInt(missing)} rows not received yet` : ''} · ${this.numHeads} heads per layer${this.finished ? ' · finished' : ''}`;
    this.dataset.missingRows = String(missing);
    this.dataset.recomputedRows = String(this.recomputed.size);
    this.dataset.rows = String(n);
    this.dataset.numHeads = String(this.numHeads);
    this.drawOver(rows, labels);
  }

  drawOver(rows, labels) {
    const { caption, spans } = weightsOverText(rows, labels, this.active);
    this.overCaption.textContent = caption;
    this.overEl.replaceChildren(...spans);
  }

  setActive(r, focus) {
    if (!Number.isFinite(r) || r < 0 || r >= this.size || r === this.active) {
      if (focus && this.rowEls?.[r]) this.rowEls[r].focus();
      return;
    }
    this.active = r;
    this.dataset.activeRow = String(r);
    this.render();
    if (focus) this.rowEls[r]?.focus();
  }

  onRowKey(e) {
    const n = this.size;
    const moves = { ArrowDown: this.active + 1, ArrowUp: this.active - 1, Home: 0, End: n - 1, PageDown: this.active + 5, PageUp: this.active - 5 };
    if (!(e.key in moves) || !n) return;
    e.preventDefault();
    this.setActive(Math.max(0, Math.min(n - 1, moves[e.key])), true);
  }

  exportData() {
    const n = this.size;
    return {
      request_id: this.rid, layer: this.shownLayer, head: this.head, recomputed_rows: [...this.recomputed].sort((x, y) => x - y), num_heads: this.numHeads,
      colour_scale: this.rowScale ? 'row' : 'map', vmax: this.vmax ?? null,
      heads_received: [...this.store.headsSeen].sort((x, y) => x - y), num_prompt_tokens: this.numPrompt,
      num_output_tokens: this.numOutput,
      tokens: Array.from({ length: n }, (_, i) => this.labelAt(i)), token_ids: this.tokenIds.slice(0, n),
      matrix: this.matrix(), layers: this.store.summary(), finished: this.finished, active_row: this.active,
    };
  }
}

customElements.define('kv-attention', KvAttention);
