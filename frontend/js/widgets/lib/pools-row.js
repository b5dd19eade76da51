// The allocator's row of pools when kvscope is attached to several (`kvscope serve --attach
// URL URL ...`, or one server with data parallelism): one card per pool, side by side —
// its name, whether its server and its KV-event publisher answer, a small drawing of its
// blocks, and its own figures (blocks cached, hits and hit rate, evictions, running and
// waiting, TTFT, ITL from its rank's /metrics). A card's button picks the pool the big
// view under the row draws.

import { h } from './svg.js';
import { formatInt, formatSeconds } from '../../widget-base.js';
import { KvPool } from './kv-pool.js';
import { PoolCanvas } from './pool-canvas.js';
import { DensityStrip } from './pool-density.js';

const CARD_LARGE = 2048;   // more blocks than this: the card draws a density strip

export class PoolsRow {
  constructor({ onPick, colourOf }) {
    this.onPick = onPick;
    this.colourOf = colourOf;
    this.cards = new Map();    // pool -> { el, canvas, painter, large, status, figures, button }
    this.listEl = h('div', { class: 'kvp-pools', role: 'list' });
    this.el = h('section', { class: 'kvw-panel kvp-poolsrow', 'aria-label': 'Every pool, side by side', hidden: '' },
      h('h4', {}, 'Every pool, side by side'), this.listEl,
      h('p', { class: 'kvw-note' }, 'One pool per vLLM server and per data-parallel rank: each has its own scheduler, its own blocks and its own prefix cache, so a prefix cached in one is a miss in the others.'));
  }

  /** From hello.deployment: one card per pool. */
  setDeployment(deployment, selected) {
    const pools = deployment?.pools || [];
    this.el.hidden = pools.length < 2;   // one pool: the big view alone draws it
    this.cards.clear();
    this.listEl.replaceChildren(...(pools.length < 2 ? [] : pools.map((p) => this.card(p, selected))));
  }

  card(p, selected) {
    const large = p.num_blocks > CARD_LARGE;
    const canvas = h('canvas', { class: 'kvp-poolcard-canvas', role: 'img', 'aria-label': `${p.name}: waiting for its pool` });
    const status = h('p', { class: 'kvw-note', 'data-pool-status': '' }, 'Waiting for its first event…');
    const figures = h('dl', { class: 'kvw-figures kvp-poolcard-figures', 'aria-label': `${p.name}: figures` });
    const button = h('button', { type: 'button', class: 'kvw-btn', 'aria-pressed': String(p.pool === selected),
      onclick: () => this.onPick(p.pool) }, 'Draw below');
    const el = h('article', { class: 'kvp-poolcard', role: 'listitem', 'data-pool': String(p.pool), 'aria-label': p.name },
      h('div', { class: 'kvw-row' }, h('strong', {}, p.name), button),
      h('p', { class: 'kvw-note kvp-mono' }, `${p.url} · ${formatInt(p.num_blocks)} blocks of ${p.block_size}`),
      status, canvas, figures);
    this.cards.set(p.pool, { el, canvas, painter: large ? new DensityStrip(canvas) : new PoolCanvas(canvas), large, status, figures, button, name: p.name });
    return el;
  }

  select(pool) {
    for (const [i, c] of this.cards) c.button.setAttribute('aria-pressed', String(i === pool));
  }

  /** From engine.vllm.pools: each pool's server and publisher state, and its metrics. */
  onEngine(vllm) {
    for (const state of vllm?.pools || []) {
      const c = this.cards.get(state.pool);
      if (!c) continue;
      c.el.dataset.connected = String(state.connected);
      c.el.dataset.events = state.events;
      c.status.textContent = state.connected
        ? state.events_note
        : 'Disconnected: its server is not answering (the other pools keep working; it is drawn again when the server returns).';
      c.metrics = state.metrics || {};
      this.renderFigures(state.pool);
    }
  }

  /** A pool's blocks changed: redraw its card. */
  draw(index, pool, width) {
    const c = this.cards.get(index);
    if (!c || !pool.ready) return;
    c.pool = pool;
    const w = Math.max(120, width);
    if (c.large) c.painter.draw({ blocks: pool.blocks, width: w, windowStart: 0, windowSize: 0 });
    else c.painter.draw({ blocks: pool.blocks, blockSize: pool.blockSize, colourOf: this.colourOf, width: w, height: 150, cursor: -1 });
    const counts = pool.counts();
    c.canvas.setAttribute('aria-label', `${c.name}: ${formatInt(pool.numBlocks)} blocks, ${formatInt(counts.cached)} cached, ${formatInt(counts.used + counts.shared)} held by requests from these pages, ${formatInt(pool.totals.prefix_hits)} prefix hits drawn`);
    c.el.dataset.cached = String(counts.cached + counts.used + counts.shared);
    c.el.dataset.hits = String(pool.totals.prefix_hits);
    this.renderFigures(index);
  }

  renderFigures(index) {
    const c = this.cards.get(index);
    if (!c) return;
    const m = c.metrics || {};
    const p = c.pool || new KvPool();
    const counts = p.counts();
    const opt = (x, f) => (x === null || x === undefined ? '—' : f(x));
    const fig = (label, value, key) => h('div', {}, h('dt', {}, label), h('dd', { 'data-figure': key }, value));
    c.figures.replaceChildren(
      fig('Blocks cached', formatInt(counts.cached + counts.used + counts.shared), 'cached'),
      fig('KV used', opt(m.kv_usage, (x) => `${(x * 100).toFixed(1)} %`), 'kv_usage'),
      fig('Hits (tokens)', opt(m.prefix_cache_hits, formatInt), 'prefix_cache_hits'),
      fig('Hit rate', opt(m.prefix_cache_hit_rate, (x) => `${(x * 100).toFixed(1)} %`), 'hit_rate'),
      fig('Evictions', formatInt(p.totals.evictions), 'evictions'),
      fig('Running / waiting', `${formatInt(m.running ?? 0)} / ${formatInt(m.waiting ?? 0)}`, 'queues'),
      fig('TTFT (mean)', opt(m.ttft_mean_s, formatSeconds), 'ttft_s'),
      fig('ITL (mean)', opt(m.itl_mean_s, formatSeconds), 'itl_s'),
    );
  }
}

export const POOLS_ROW_CSS = `
kv-pages .kvp-pools { display: grid; grid-template-columns: repeat(auto-fit, minmax(220px, 1fr)); gap: .6rem; }
kv-pages .kvp-poolcard { border: 1px solid var(--kv-border); border-radius: var(--kv-radius, 6px); padding: .4rem; min-width: 0; }
kv-pages .kvp-poolcard[data-connected=false] { border-color: var(--kv-danger, #b00020); }
kv-pages .kvp-poolcard[data-connected=false] [data-pool-status], kv-pages .kvp-poolcard[data-events=silent] [data-pool-status] { color: var(--kv-danger, #b00020); font-weight: 600; }
kv-pages .kvp-poolcard-canvas { display: block; max-width: 100%; }
kv-pages .kvp-poolcard-figures { font-size: .8rem; display: grid; grid-template-columns: 1fr 1fr; gap: .1rem .5rem; }
kv-pages .kvp-poolcard .kvw-row { justify-content: space-between; }
`;
