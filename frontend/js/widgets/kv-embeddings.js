// <kv-embeddings prompt="…">: the embedding rows the live model looks up for the
// learner's tokens, drawn as colour strips; the tokens whose rows point the most the same
// way as a chosen token's (cosine similarity over the real embedding matrix); and a 2-D
// map (the matrix's two principal axes, computed on the server) where the learner's
// tokens sit among the vocabulary.

import { KvWidget, CATEGORICAL, heatColor } from '../widget-base.js';
import { h, svg } from './lib/svg.js';
import { injectStyle } from './lib/style.js';
import { WatchedRun } from './lib/watched-run.js';
import { visibleText } from './lib/tokens.js';

const STYLE = `
kv-embeddings .kve-strips { display: grid; grid-template-columns: auto 1fr; gap: 2px .5rem; align-items: center; }
kv-embeddings .kve-strips button { font-family: var(--kv-font-mono); font-size: .85rem; text-align: right; background: none; border: 1px solid transparent; border-radius: 3px; color: var(--kv-fg); cursor: pointer; white-space: pre; }
kv-embeddings .kve-strips button[aria-pressed=true] { border-color: var(--kv-focus); font-weight: 700; }
kv-embeddings .kve-strips button:focus-visible { outline: 2px solid var(--kv-focus); }
kv-embeddings .kve-cols { display: flex; flex-wrap: wrap; gap: 1rem; }
kv-embeddings .kve-near { font-family: var(--kv-font-mono); font-size: .85rem; list-style: none; padding: 0; margin: 0; min-width: 14rem; }
kv-embeddings .kve-near li { display: grid; grid-template-columns: 7rem 1fr 3.5rem; gap: .4rem; align-items: center; }
kv-embeddings .kve-vocab { fill: var(--kv-fg-soft); opacity: .35; }
kv-embeddings .kve-mine { stroke: var(--kv-bg); stroke-width: 1.5; }
`;
const MINE = CATEGORICAL[5];
const CHOSEN = CATEGORICAL[0];

class KvEmbeddings extends KvWidget {
  static events = [];
  static requires = ['requests', 'internals'];
  static label = 'Embeddings: your tokens as rows of numbers';

  setup() {
    injectStyle('kv-embeddings', STYLE);
    this.run = new WatchedRun(this, {
      watch: { internals: true, layers: [], sampling: false }, wants: ['internals.embeddings'],
      params: { temperature: 0, max_tokens: 1 },
      onEvent: (e) => { if (e.type === 'internals.embeddings') this.add(e); },
      onReset: () => { this.rows = new Map(); this.chosen = -1; this.vocab = null; },
    });
    this.stripsEl = h('div', { class: 'kve-strips', role: 'group', 'aria-label': 'embedding rows; choose a token' });
    this.nearEl = h('div', {});
    this.mapEl = h('div', {});
    this.body.append(this.run.controls, this.stripsEl, h('div', { class: 'kve-cols' }, this.nearEl, this.mapEl));
    this.setLegend([
      { label: 'strip: each of the row’s numbers, faint = near 0, strong colour = large (either sign)', color: heatColor(0.8) },
      { label: 'your tokens on the map', color: MINE, shape: 'circle' },
      { label: 'the chosen token', color: CHOSEN, shape: 'circle' },
      { label: 'other vocabulary tokens', color: 'var(--kv-fg-soft)', shape: 'circle' },
    ]);
  }

  connectedCallback() { super.connectedCallback(); this.run?.attach(); }
  disconnectedCallback() { super.disconnectedCallback(); this.run?.detach(); }

  add(e) {
    e.positions.forEach((p, r) => {
      this.rows.set(p, { id: e.token_ids[r], text: e.texts[r], row: e.rows[r], norm: e.norms[r], near: e.neighbours[r], pca: e.pca[r] });
    });
    if (e.vocab) this.vocab = e.vocab;
    if (this.chosen < 0) this.chosen = e.positions[0];
  }

  render() {
    const positions = [...this.rows.keys()].sort((a, b) => a - b);
    if (!positions.length) {
      this.stripsEl.replaceChildren(h('p', { class: 'kvw-note' }, this.run.rid ? 'Waiting for the model…' : 'Press Run to look up your tokens in the live model’s embedding table.'));
      this.nearEl.replaceChildren();
      this.mapEl.replaceChildren();
      return;
    }
    const top = Math.max(...positions.flatMap((p) => this.rows.get(p).row.map(Math.abs))) || 1;
    const width = Math.max(200, Math.min((this.clientWidth || 700) - 140, 600));
    const hadFocus = this.stripsEl.contains(document.activeElement);
    this.stripsEl.replaceChildren(...positions.flatMap((p) => {
      const r = this.rows.get(p);
      const button = h('button', { type: 'button', 'aria-pressed': String(p === this.chosen), 'data-pos': p,
        onclick: () => { this.chosen = p; this.requestRender(); }, onkeydown: (ev) => this.onKey(ev, positions) }, this.run.labelAt(p));
      const w = width / r.row.length;
      const strip = svg('svg', { class: 'kvw-svg', width, height: 16, viewBox: `0 0 ${width} 16`, role: 'img',
        'aria-label': `embedding row of ${this.run.labelAt(p)}: ${r.row.length} numbers, norm ${r.norm.toFixed(3)}` },
      ...r.row.map((v, i) => svg('rect', { x: i * w, y: 0, width: Math.max(w, 0.5), height: 16, fill: heatColor(Math.abs(v) / top) })));
      return [button, strip];
    }));
    if (hadFocus) this.stripsEl.querySelector(`button[data-pos="${this.chosen}"]`)?.focus();
    this.renderNear();
    this.renderMap(positions);
    this.dataset.tokens = String(positions.length);
  }

  onKey(ev, positions) {
    const i = positions.indexOf(this.chosen);
    const moves = { ArrowDown: i + 1, ArrowUp: i - 1 };
    if (!(ev.key in moves)) return;
    ev.preventDefault();
    this.chosen = positions[Math.max(0, Math.min(positions.length - 1, moves[ev.key]))];
    this.requestRender();
  }

  renderNear() {
    const r = this.rows.get(this.chosen);
    this.nearEl.replaceChildren(h('h4', {}, `Nearest to “${this.run.labelAt(this.chosen)}” (cosine similarity)`),
      h('ul', { class: 'kve-near' }, ...r.near.map((n) => {
        const bar = h('span', { class: 'kvw-bar' }, h('span', {}));
        bar.firstChild.style.width = `${Math.max(0, n.cosine) * 100}%`;
        bar.firstChild.style.background = CHOSEN;
        return h('li', {}, h('span', {}, visibleText(n.text)), bar, h('span', {}, n.cosine.toFixed(3)));
      })),
      h('p', { class: 'kvw-note' }, `Each token’s own row comes first (cosine 1). ${r.row.length} numbers per row.`));
  }

  renderMap(positions) {
    if (!this.vocab) { this.mapEl.replaceChildren(); return; }
    const S = 300;
    const pts = [...this.vocab.points, ...positions.map((p) => this.rows.get(p).pca)];
    const xs = pts.map((p) => p[0]);
    const ys = pts.map((p) => p[1]);
    const [x0, x1, y0, y1] = [Math.min(...xs), Math.max(...xs), Math.min(...ys), Math.max(...ys)];
    const sx = (x) => 10 + ((x - x0) / (x1 - x0 || 1)) * (S - 20);
    const sy = (y) => S - 10 - ((y - y0) / (y1 - y0 || 1)) * (S - 20);
    const root = svg('svg', { class: 'kvw-svg', width: S, height: S, viewBox: `0 0 ${S} ${S}`, role: 'img',
      'aria-label': `2-D map of ${this.vocab.points.length} vocabulary tokens on the embedding matrix's two principal axes, with your ${positions.length} tokens marked` });
    root.append(svg('rect', { x: 0, y: 0, width: S, height: S, fill: 'none', stroke: 'var(--kv-border)' }));
    this.vocab.points.forEach(([x, y], i) => root.append(svg('circle', { cx: sx(x), cy: sy(y), r: 1.6, class: 'kve-vocab' },
      svg('title', {}, visibleText(this.vocab.texts[i])))));
    for (const p of positions) {
      const { pca } = this.rows.get(p);
      const on = p === this.chosen;
      root.append(svg('circle', { cx: sx(pca[0]), cy: sy(pca[1]), r: on ? 6 : 4.5, class: 'kve-mine', style: `fill: ${on ? CHOSEN : MINE}` },
        svg('title', {}, this.run.labelAt(p))));
      const right = sx(pca[0]) > S - 60;   // labels near the right edge grow leftwards
      root.append(svg('text', { x: sx(pca[0]) + (right ? -6 : 6), y: sy(pca[1]) - 5, 'font-size': 11, 'font-weight': on ? 700 : 400,
        'text-anchor': right ? 'end' : 'start' }, this.run.labelAt(p)));
    }
    const [a, b] = this.vocab.explained;
    this.mapEl.replaceChildren(h('h4', {}, 'Your tokens among the vocabulary'), root,
      h('p', { class: 'kvw-note' }, `Axes: the two directions along which the ${this.vocab.points.length} rows’ directions (each row scaled to length 1, as for cosine similarity) vary most (PCA, ${(a * 100).toFixed(1)}% and ${(b * 100).toFixed(1)}% of the variance); the rest of the ${this.rows.get(positions[0]).row.length} dimensions is flattened away.`));
  }

  exportData() {
    const positions = [...this.rows.keys()].sort((a, b) => a - b);
    return { request_id: this.run.rid, chosen: this.chosen,
      tokens: positions.map((p) => ({ position: p, token: this.run.labelAt(p), ...this.rows.get(p) })),
      vocab_points: this.vocab ? this.vocab.points.length : 0, explained: this.vocab?.explained ?? null };
  }
}

customElements.define('kv-embeddings', KvEmbeddings);
