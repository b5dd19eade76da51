// <kv-speculation prompt="…">: your request with speculative decoding on. Every verify
// pass of the target model becomes one column: the drafted tokens it accepted (filled), the
// ones it rejected (outlined, crossed: their KV slots were given back), and the token the
// target added itself (a bonus when every draft was kept). Below, each pass as text, with
// p, q and the uniform draw u for sampled requests; figures: acceptance rate and tokens per
// target pass, as the engine counted them (`spec` events).
// Live it needs a server started with --speculative-config; on any other server, or with no
// backend, it plays the page's recording (the `speculation` capability, widget-base.js). The
// recording holds one request per preset; the controls then choose which one is drawn and
// always show its prompt and decoding, so the frame and the controls never disagree.

import { KvWidget, formatInt, formatFloat } from '../widget-base.js';
import { h, svg } from './lib/svg.js';
import { injectStyle } from './lib/style.js';
import { clientHandlers, withHandlers } from './lib/listen.js';
import { visibleText } from './lib/tokens.js';
import { runBusy } from './lib/busy.js';
import { modeBadge, showMode } from './lib/controls.js';

const PRESETS = {
  repetitive: 'Once upon a time, a little fox found a shiny stone near the river. She was kind, and she loved '
    + 'telling jokes. One sunny morning, Omar and Oscar went to the river to play with her new paint box.\n\n'
    + 'Once upon a time, a little fox found a shiny stone near the river. She',
  'free-form': 'The old lighthouse keeper looked at the sea and',
};
const MAX_TOKENS = 40;
const CELL = 16;
const GAP = 3;

const STYLE = `
kv-speculation .kvs-passes { list-style: none; margin: .4rem 0; padding: 0; max-height: 14rem; overflow-y: auto; font-size: .88rem; }
kv-speculation .kvs-passes li { padding: .15rem 0; border-bottom: 1px solid var(--kv-border); }
kv-speculation .kvs-tok { display: inline-block; font-family: var(--kv-font-mono); padding: 0 .3rem; margin: .1rem .15rem; border-radius: 3px; border: 1px solid var(--kv-border); white-space: pre; }
kv-speculation .kvs-tok--accepted { background: var(--kv-cat-1); border-color: var(--kv-cat-1); color: #fff; }
kv-speculation .kvs-tok--rejected { text-decoration: line-through; border-style: dashed; color: var(--kv-fg-soft); }
kv-speculation .kvs-tok--target { background: var(--kv-cat-2); border-color: var(--kv-cat-2); color: #111; }
kv-speculation .kvs-tok--bonus { background: var(--kv-cat-3); border-color: var(--kv-cat-3); color: #111; }
kv-speculation .kvs-check { font-size: .78rem; color: var(--kv-fg-soft); }
kv-speculation .kvs-chart .kvs-accepted { fill: var(--kv-cat-1); }
kv-speculation .kvs-chart .kvs-target { fill: var(--kv-cat-2); }
kv-speculation .kvs-chart .kvs-bonus { fill: var(--kv-cat-3); }
kv-speculation .kvs-chart .kvs-rejected { fill: none; stroke: var(--kv-fg-soft); stroke-dasharray: 2 2; }
kv-speculation .kvs-chart .kvs-cross { stroke: var(--kv-fg-soft); }
`;

class KvSpeculation extends withHandlers(KvWidget) {
  static events = ['spec'];
  static requires = ['requests', 'speculation'];
  static replayEvents = ['request'];
  static label = 'Speculative decoding: drafts and verification';

  setup() {
    injectStyle('kv-speculation', STYLE);
    const uid = this.getAttribute('aria-labelledby');
    this.promptEl = h('textarea', { class: 'kvw-textarea', id: `${uid}-prompt`, rows: 3 });
    this.promptEl.value = this.getAttribute('prompt') || PRESETS.repetitive;
    this.presetEl = h('select', { class: 'kvw-select', id: `${uid}-preset`, onchange: () => this.onPreset() },
      h('option', { value: 'repetitive' }, 'A story told twice (repetitive)'),
      h('option', { value: 'free-form' }, 'A fresh sentence (free-form)'));
    this.samplingEl = h('select', { class: 'kvw-select', id: `${uid}-sampling` },
      h('option', { value: 'greedy' }, 'greedy (temperature 0)'),
      h('option', { value: 'sampled' }, 'sampled (temperature 0.8, seed 1)'));
    this.runBtn = h('button', { type: 'button', class: 'kvw-btn kvw-btn--primary', onclick: () => this.run() }, 'Generate');
    this.modeBadge = modeBadge();
    this.configEl = h('p', { class: 'kvw-note' });
    this.shownEl = h('p', { class: 'kvw-note', 'data-shown': '' });
    this.errorEl = h('p', { class: 'kvw-error', role: 'alert' });
    this.figuresEl = h('dl', { class: 'kvw-figures', 'aria-label': 'Speculation figures' });
    this.chartEl = h('div', { class: 'kvw-scroll' });
    this.passesEl = h('ol', { class: 'kvs-passes', 'aria-label': 'Verify passes, newest last' });
    this.body.append(
      h('div', { class: 'kvw-row' }, h('label', { for: this.presetEl.id }, 'Prompt'), this.presetEl,
        h('label', { for: this.samplingEl.id }, 'Decoding'), this.samplingEl, this.runBtn, this.modeBadge),
      h('label', { for: this.promptEl.id, class: 'kvw-sr' }, 'Prompt text'), this.promptEl,
      this.configEl, this.shownEl, this.errorEl, this.figuresEl, this.chartEl, this.passesEl,
    );
    this.setLegend([
      { label: 'draft accepted by the target', color: 'var(--kv-cat-1)' },
      { label: 'draft rejected (dashed, crossed): its KV slot is given back', color: 'var(--kv-fg-soft)', shape: 'line' },
      { label: 'token chosen by the target at the first rejection', color: 'var(--kv-cat-2)' },
      { label: 'bonus token: every draft was accepted', color: 'var(--kv-cat-3)' },
    ]);
    this.handlers = clientHandlers(this, {
      'request.added': (e) => this.onAdded(e),
      'request.finished': (e) => { const r = this.requests.get(e.request_id); if (r) { r.finished = true; this.requestRender(); } },
      engine: (e) => { if (e.reason === 'reset' && this.client.mode === 'replay') this.clear(); },
    });
    this.handlers.attach();
    this.clear();
  }

  clear() {
    this.rid = null;
    this.requests = new Map();   // request id -> { prompt, preset, greedy, passes, finished }
    this.requestRender();
  }

  /** The verify passes of the request drawn. */
  get passes() {
    const shown = this.requests.get(this.rid);
    return shown ? shown.passes : [];
  }

  get replaying() {
    return this.client.mode === 'replay';
  }

  onPreset() {
    if (this.replaying) {
      this.showRecorded();
      this.announce(this.shownText());
    } else this.promptEl.value = PRESETS[this.presetEl.value];
  }

  /** Replay: draw the recorded request of the chosen preset, its prompt and decoding in the controls. */
  showRecorded() {
    const recorded = [...this.requests.entries()];
    const index = [...this.presetEl.options].findIndex((o) => o.value === this.presetEl.value);
    const match = recorded.find(([, r]) => r.preset === this.presetEl.value)
      || recorded.find(([, r], i) => r.preset === null && i === index);
    this.rid = match ? match[0] : null;
    this.dataset.requestId = this.rid || '';
    if (match) {
      this.promptEl.value = match[1].prompt;
      this.samplingEl.value = match[1].greedy ? 'greedy' : 'sampled';
    }
    this.dataset.passes = String(this.passes.length);
    this.requestRender();
  }

  connectedCallback() {
    super.connectedCallback();
    this.onModeChange(this.client.mode);
  }

  onModeChange(mode) {
    showMode(this.modeBadge, mode);
    this.runBtn.disabled = mode !== 'live';
    // in replay the decoding and the prompt are the recorded request's, not a choice
    this.samplingEl.disabled = mode === 'replay';
    this.promptEl.readOnly = mode === 'replay';
    this.requestRender();
  }

  get speculative() {
    const hello = this.client.hello;
    return hello && hello.engine ? hello.engine.speculative || null : null;
  }

  run() {
    const prompt = this.promptEl.value.trim();
    if (!prompt) return;
    runBusy(this, this.runBtn, this.errorEl, async () => {
      this.clear();
      const sampled = this.samplingEl.value === 'sampled';
      const preset = Object.keys(PRESETS).find((key) => PRESETS[key] === prompt) || null;
      const params = sampled ? { temperature: 0.8, seed: 1, max_tokens: MAX_TOKENS } : { temperature: 0, max_tokens: MAX_TOKENS };
      const ack = await this.client.command('submit', { prompt, params });
      this.rid = ack.request_id;
      this.requests.set(this.rid, { prompt, preset, greedy: !sampled, passes: [], finished: false });
      this.dataset.requestId = this.rid;
      this.announce(`Request ${this.rid} submitted with speculation${this.speculative ? '' : ' off on this server'}.`);
    });
  }

  /** Replay: keep every recorded request; the one of the chosen preset is drawn. */
  onAdded(e) {
    if (!this.replaying || this.requests.has(e.request_id)) return;
    const prompt = e.prompt || '';
    const preset = Object.keys(PRESETS).find((key) => PRESETS[key] === prompt) || null;
    this.requests.set(e.request_id, { prompt, preset, greedy: !e.params || e.params.temperature === 0, passes: [], finished: false });
    if (!this.rid) this.showRecorded();
  }

  onEvent(event) {
    if (event.type === 'hello') { this.requestRender(); return; }
    if (event.type !== 'spec') return;
    const request = this.requests.get(event.request_id);
    if (!request) return;
    request.passes.push(event);
    if (event.request_id !== this.rid) return;
    this.dataset.passes = String(this.passes.length);
    const r = event.running;
    this.announce(`Pass ${this.passes.length}: ${event.accepted} of ${event.proposed.length} drafts accepted, `
      + `${event.token_ids.length} token${event.token_ids.length === 1 ? '' : 's'} added. Acceptance so far ${Math.round(100 * r.acceptance_rate)} percent.`);
    this.requestRender();
  }

  figures() {
    const last = this.passes[this.passes.length - 1];
    const r = last ? last.running : { proposed: 0, accepted: 0, acceptance_rate: 0, target_passes: 0, tokens_per_pass: 0 };
    return {
      num_passes: this.passes.length, proposed: r.proposed, accepted: r.accepted, acceptance_rate: r.acceptance_rate,
      tokens_per_target_pass: r.tokens_per_pass,
      slots_released: this.passes.reduce((n, p) => n + p.rejected_slots, 0),
      bonus_tokens: this.passes.filter((p) => p.bonus).length,
      method: last ? last.method : (this.speculative ? this.speculative.method : null),
    };
  }

  render() {
    const f = this.figures();
    const spec = this.speculative;
    if (this.replaying) this.configEl.textContent = 'Replaying a recording of the engine with speculation on: it holds one request per prompt; choose the prompt to see its passes.';
    else if (spec) this.configEl.textContent = spec.method === 'ngram'
      ? `This engine drafts by prompt lookup: k = ${spec.num_speculative_tokens} tokens, n-grams of ${spec.prompt_lookup_min} to ${spec.prompt_lookup_max} tokens.`
      : `This engine drafts with the model ${spec.model}: k = ${spec.num_speculative_tokens} tokens per pass.`;
    const fig = (label, value, key) => h('div', {}, h('dt', {}, label), h('dd', { 'data-figure': key }, value));
    this.figuresEl.replaceChildren(
      fig('Verify passes', formatInt(f.num_passes), 'num_passes'),
      fig('Drafts accepted', `${formatInt(f.accepted)} of ${formatInt(f.proposed)}`, 'accepted'),
      fig('Acceptance rate', f.proposed ? `${formatFloat(100 * f.acceptance_rate, 0)} %` : '—', 'acceptance_rate'),
      fig('Tokens per target pass', f.num_passes ? formatFloat(f.tokens_per_target_pass, 2) : '—', 'tokens_per_pass'),
      fig('KV slots given back', formatInt(f.slots_released), 'slots_released'),
    );
    const shown = this.requests.get(this.rid);
    this.shownEl.textContent = this.shownText();
    this.shownEl.dataset.shown = shown ? `${shown.preset || 'own'} ${shown.greedy ? 'greedy' : 'sampled'}` : '';
    this.chartEl.replaceChildren(this.chart());
    this.passesEl.replaceChildren(...this.passes.map((p, i) => this.passItem(p, i)));
    this.passesEl.scrollTop = this.passesEl.scrollHeight;
    if (!this.passes.length) this.passesEl.replaceChildren(h('li', { class: 'kvw-note' }, this.replaying
      ? 'Waiting for the recording to reach a verify pass…'
      : (this.rid ? 'Waiting for the first verify pass (drafts start once the prompt is computed)…' : 'Press Generate.')));
  }

  /** Which request the frame draws: its prompt and decoding, in words. */
  shownText() {
    const shown = this.requests.get(this.rid);
    const presetName = (key) => [...this.presetEl.options].find((o) => o.value === key)?.textContent.toLowerCase();
    if (!shown) return this.replaying && this.requests.size ? 'The recording has not reached a request with this prompt yet.' : '';
    const f = this.figures();
    return `Drawn: ${this.replaying ? 'the recorded' : 'your'} request ${this.rid} — ${shown.preset ? presetName(shown.preset) : 'your own prompt'}, `
      + `${shown.greedy ? 'greedy' : 'sampled (temperature 0.8, seed 1)'}${shown.finished ? '' : ', still running'}`
      + `${f.proposed ? `: ${formatFloat(100 * f.acceptance_rate, 0)} % of its drafts accepted` : ''}.`;
  }

  chart() {
    const k = Math.max(1, ...this.passes.map((p) => p.proposed.length));
    const cols = Math.max(this.passes.length, 12);
    const width = cols * (CELL + GAP) + 40;
    const height = (k + 1) * (CELL + GAP) + 24;
    const root = svg('svg', { class: 'kvw-svg kvs-chart', width, height, viewBox: `0 0 ${width} ${height}`, role: 'img',
      'aria-label': `One column per verify pass, bottom up: ${chartSummary(this.figures())}` });
    this.passes.forEach((p, i) => {
      const x = 36 + i * (CELL + GAP);
      p.proposed.forEach((_tok, j) => {
        const y = height - 20 - (j + 1) * (CELL + GAP);
        const accepted = j < p.accepted;
        root.append(svg('rect', { x, y, width: CELL, height: CELL, rx: 2, class: accepted ? 'kvs-accepted' : 'kvs-rejected' }));
        if (!accepted) root.append(svg('path', { d: `M${x + 3} ${y + 3} L${x + CELL - 3} ${y + CELL - 3} M${x + CELL - 3} ${y + 3} L${x + 3} ${y + CELL - 3}`, class: 'kvs-cross' }));
      });
      const y = height - 20 - (p.accepted + 1) * (CELL + GAP);
      if (p.accepted < p.proposed.length) {
        root.append(svg('circle', { cx: x + CELL / 2, cy: y + CELL / 2, r: CELL / 3, class: 'kvs-target' }));
      } else {
        root.append(svg('rect', { x, y, width: CELL, height: CELL, rx: CELL / 2, class: 'kvs-bonus' }));
      }
    });
    root.append(svg('text', { x: 2, y: height - 6, class: 'kvw-soft', 'font-size': 11 }, 'pass →'));
    root.append(svg('text', { x: 2, y: 12, class: 'kvw-soft', 'font-size': 11 }, `k = ${k}`));
    return root;
  }

  passItem(p, i) {
    const tokens = p.proposed.map((id, j) => {
      const text = visibleText(p.proposed_text[j]) || `#${id}`;
      const accepted = j < p.accepted;
      const check = p.checks[j];
      const detail = check ? (check.u === null ? `p = ${formatFloat(check.p, 3)}; greedy: kept only if it is the target's top token`
        : `p = ${formatFloat(check.p, 3)}, q = ${formatFloat(check.q, 3)}, u = ${formatFloat(check.u, 3)}: ${check.accepted ? 'u < p/q, kept' : 'u ≥ p/q, rejected'}`) : 'after a rejection: not checked, discarded';
      return h('span', { class: `kvs-tok kvs-tok--${accepted ? 'accepted' : 'rejected'}`, title: detail,
        'aria-label': `draft “${text}” ${accepted ? 'accepted' : 'rejected'}; ${detail}` }, text);
    });
    const last = p.token_ids.length - 1;
    const own = visibleText(p.token_text[last]) || `#${p.token_ids[last]}`;
    const checks = p.checks.filter((c) => c.u !== null)
      .map((c) => `p ${formatFloat(c.p, 2)} q ${formatFloat(c.q, 2)} u ${formatFloat(c.u, 2)}`).join(' · ');
    return h('li', {}, `pass ${i + 1} (engine step ${p.step}): `, ...tokens, ' → ',
      h('span', { class: `kvs-tok kvs-tok--${p.bonus ? 'bonus' : 'target'}`, 'aria-label': `${p.bonus ? 'bonus' : 'target'} token “${own}”` }, own),
      ` +${p.token_ids.length}`, checks ? h('span', { class: 'kvs-check' }, ` (${checks})`) : null);
  }

  exportData() {
    return { request_id: this.rid, ...this.figures(), passes: this.passes };
  }
}

function chartSummary(s) {
  return s.num_passes ? `${s.accepted} of ${s.proposed} drafts accepted over ${s.num_passes} passes` : 'no verify pass yet';
}

customElements.define('kv-speculation', KvSpeculation);
