// <kv-heads prompt="…">: every attention head of the live model at once, for the
// learner's prompt: a layer × head grid of small attention maps (rows: query tokens,
// columns: the tokens they look at), query heads grouped under the KV head they share
// (grouped-query attention), and what that sharing saves in KV-cache bytes for this
// model and this request compared with one KV head per query head.

import { KvWidget, CATEGORICAL, cssVar, heatColor, formatBytes } from '../widget-base.js';
import { h } from './lib/svg.js';
import { injectStyle } from './lib/style.js';
import { WatchedRun } from './lib/watched-run.js';
import { AttentionStore } from './lib/attention-store.js';

const STYLE = `
kv-heads .kvh-grid { display: block; cursor: pointer; }
kv-heads .kvh-grid:focus { outline: none; }
kv-heads .kvh-grid:focus-visible { outline: 2px solid var(--kv-focus); outline-offset: 2px; }
kv-heads .kvh-groups { display: flex; flex-wrap: wrap; gap: .4rem; margin: .4rem 0; font-size: .85rem; }
kv-heads .kvh-groups span { border: 2px solid; border-radius: 4px; padding: .1rem .4rem; }
`;
const GAP = 6;
const TOP = 20;
const LEFT = 56;

class KvHeads extends KvWidget {
  static events = [];
  static requires = ['requests', 'attention'];
  static label = 'Every head of every layer';

  setup() {
    injectStyle('kv-heads', STYLE);
    this.run = new WatchedRun(this, {
      watch: { sampling: false }, wants: ['attention'], params: { temperature: 0, max_tokens: 1 },
      onEvent: (e) => { if (e.type === 'attention') this.store.add(e); },
      onReset: () => { this.store = new AttentionStore(); },
    });
    this.sel = { layer: 0, head: 0 };
    this.gridEl = h('div', { class: 'kvw-scroll' });
    this.groupsEl = h('div', { class: 'kvh-groups' });
    this.infoEl = h('p', { class: 'kvw-note', 'aria-live': 'polite' });
    this.bytesEl = h('div', { class: 'kvw-panel' });
    this.body.append(this.run.controls, this.gridEl, this.infoEl, this.groupsEl, this.bytesEl,
      h('p', { class: 'kvw-note' }, 'Focus the grid and use the arrow keys to move between heads (←/→) and layers (↑/↓).'));
  }

  connectedCallback() { super.connectedCallback(); this.run?.attach(); }
  disconnectedCallback() { super.disconnectedCallback(); this.run?.detach(); }

  get model() { return this.client.hello?.model; }

  render() {
    const m = this.model;
    const n = this.store.size;
    if (!m || !n) {
      this.gridEl.replaceChildren(h('p', { class: 'kvw-note' }, this.run.rid ? 'Waiting for the model…' : 'Press Run: the engine attends over your prompt with every head of every layer.'));
      this.infoEl.textContent = '';
      this.renderGroups(m);
      return;
    }
    const group = m.num_heads / m.num_kv_heads;
    const width = Math.min(this.gridEl.clientWidth || 700, 900);
    const cell = Math.max(36, Math.floor((width - LEFT - GAP * m.num_heads - (m.num_kv_heads - 1) * GAP) / m.num_heads));
    const W = LEFT + m.num_heads * (cell + GAP) + (m.num_kv_heads - 1) * GAP;
    const H = TOP + m.num_layers * (cell + GAP);
    const canvas = h('canvas', { class: 'kvh-grid', tabindex: 0, role: 'img',
      'aria-label': `Attention maps for ${m.num_layers} layers × ${m.num_heads} heads over ${n} tokens. Selected: layer ${this.sel.layer}, head ${this.sel.head}.` });
    const ratio = window.devicePixelRatio || 1;
    canvas.width = W * ratio;
    canvas.height = H * ratio;
    canvas.style.width = `${W}px`;
    canvas.style.height = `${H}px`;
    const ctx = canvas.getContext('2d');
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    ctx.font = '11px system-ui, sans-serif';
    ctx.fillStyle = cssVar('--kv-fg') || '#000';
    const xOf = (head) => LEFT + head * (cell + GAP) + Math.floor(head / group) * GAP;
    const yOf = (layer) => TOP + layer * (cell + GAP);
    for (let head = 0; head < m.num_heads; head += 1) {
      ctx.fillStyle = cssVar(CATEGORICAL[Math.floor(head / group) % CATEGORICAL.length]);
      ctx.fillRect(xOf(head), 2, cell, 4);
      ctx.fillStyle = cssVar('--kv-fg') || '#000';
      ctx.fillText(`h${head}`, xOf(head) + 2, 17);
    }
    for (let layer = 0; layer < m.num_layers; layer += 1) {
      ctx.fillStyle = cssVar('--kv-fg') || '#000';
      ctx.fillText(`layer ${layer}`, 4, yOf(layer) + cell / 2 + 4);
      for (let head = 0; head < m.num_heads; head += 1) this.drawMap(ctx, this.store.matrix(layer, head), xOf(head), yOf(layer), cell);
    }
    ctx.strokeStyle = cssVar('--kv-focus') || '#06c';
    ctx.lineWidth = 2;
    ctx.strokeRect(xOf(this.sel.head) - 2, yOf(this.sel.layer) - 2, cell + 4, cell + 4);
    canvas.addEventListener('keydown', (ev) => this.onKey(ev, m));
    canvas.addEventListener('click', (ev) => {
      const head = Array.from({ length: m.num_heads }, (_, i) => i).find((i) => ev.offsetX >= xOf(i) && ev.offsetX < xOf(i) + cell);
      const layer = Math.floor((ev.offsetY - TOP) / (cell + GAP));
      if (head !== undefined && layer >= 0 && layer < m.num_layers) { this.sel = { layer, head }; this.requestRender(); }
    });
    const hadFocus = this.gridEl.contains(document.activeElement);
    this.gridEl.replaceChildren(canvas);
    if (hadFocus) canvas.focus();
    this.describeSelected(m, group);
    this.renderGroups(m);
    this.dataset.maps = String(m.num_layers * m.num_heads);
    this.dataset.rows = String(n);
  }

  drawMap(ctx, rows, x, y, size) {
    const n = rows.length;
    const c = size / n;
    ctx.fillStyle = cssVar('--kv-bg-soft') || '#eee';
    ctx.fillRect(x, y, size, size);
    rows.forEach((row, r) => {
      if (!row) return;
      const top = Math.max(...row.slice(0, r + 1)) || 1;
      for (let k = 0; k <= r; k += 1) {
        ctx.fillStyle = heatColor(row[k] / top);
        ctx.fillRect(x + k * c, y + r * c, Math.ceil(c), Math.ceil(c));
      }
    });
    ctx.strokeStyle = cssVar('--kv-border') || '#ccc';
    ctx.lineWidth = 1;
    ctx.strokeRect(x + 0.5, y + 0.5, size - 1, size - 1);
  }

  describeSelected(m, group) {
    const { layer, head } = this.sel;
    const rows = this.store.matrix(layer, head);
    const last = rows[rows.length - 1];
    let text = `Layer ${layer}, head ${head} reads KV head ${Math.floor(head / group)}.`;
    if (last) {
      const best = last.indexOf(Math.max(...last));
      text += ` Its last row (“${this.run.labelAt(rows.length - 1)}”) looks most at “${this.run.labelAt(best)}” (${(last[best] * 100).toFixed(0)}%).`;
    }
    this.infoEl.textContent = text;
  }

  renderGroups(m) {
    if (!m) return;
    const group = m.num_heads / m.num_kv_heads;
    this.groupsEl.replaceChildren(h('span', { style: 'border-color: transparent' }, 'Query heads sharing one KV head:'),
      ...Array.from({ length: m.num_kv_heads }, (_, k) => h('span', { style: `border-color: ${CATEGORICAL[k % CATEGORICAL.length]}` },
        `KV head ${k}: query heads ${Array.from({ length: group }, (_, i) => k * group + i).join(', ')}`)));
    const gqa = m.kv_bytes_per_token;
    const mha = gqa * group;
    // Before a run there is no prompt to count: say the per-token saving only.
    const tokens = this.store.size ? this.store.size + 1 : 0;
    const whose = this.dataset.example ? 'the example’s' : 'your';   // before a Run: the recorded example
    const yours = tokens ? `For ${whose} ${tokens} tokens: ${formatBytes(gqa * tokens)} instead of ${formatBytes(mha * tokens)} — ` : 'That is ';
    this.bytesEl.replaceChildren(h('h4', {}, 'What sharing saves'),
      h('p', {}, `Each token stores ${m.num_kv_heads} keys and ${m.num_kv_heads} values per layer: ${formatBytes(gqa)} per token `
        + `in ${m.dtype}. With one KV head per query head (${m.num_heads}) it would be ${formatBytes(mha)}. `
        + `${yours}${group}× less, so ${group}× as many tokens fit in the same KV cache.`));
    this.setLegend([
      ...Array.from({ length: m.num_kv_heads }, (_, k) => ({ label: `KV head ${k} (bar above its query heads)`, color: CATEGORICAL[k % CATEGORICAL.length] })),
      { label: 'attention weight, per row from faint (near 0) to strong (the row’s largest)', color: heatColor(0.8) },
      { label: 'selected head', color: 'var(--kv-focus)', shape: 'line' },
    ]);
  }

  onKey(ev, m) {
    const moves = { ArrowRight: [0, 1], ArrowLeft: [0, -1], ArrowDown: [1, 0], ArrowUp: [-1, 0] };
    if (!(ev.key in moves)) return;
    ev.preventDefault();
    const [dl, dh] = moves[ev.key];
    this.sel = { layer: Math.max(0, Math.min(m.num_layers - 1, this.sel.layer + dl)), head: Math.max(0, Math.min(m.num_heads - 1, this.sel.head + dh)) };
    this.requestRender();
  }

  exportData() {
    const m = this.model;
    return { request_id: this.run.rid, selected: this.sel, num_layers: m?.num_layers, num_heads: m?.num_heads,
      num_kv_heads: m?.num_kv_heads, kv_bytes_per_token: m?.kv_bytes_per_token, rows: this.store.size,
      layers: this.store.summary(), selected_matrix: this.store.matrix(this.sel.layer, this.sel.head) };
  }
}

customElements.define('kv-heads', KvHeads);
