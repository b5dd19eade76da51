// <kv-pages>: the engine's real block pool, live — every block's owner, ref count, filled
// slots and cached hash from the `kv` snapshot and its deltas — and each sequence's block
// table (logical block → physical block, highlighted on hover or focus). Below it, a
// sandbox: the learner's own BlockManager on the server, driven by `sandbox` commands.
// A pool too large to read cell by cell (a GPU server's 10^5 blocks) is drawn as a density
// strip of the whole pool, with a detail view of a window of it that the learner moves.

import { KvWidget, formatInt } from '../widget-base.js';
import { h } from './lib/svg.js';
import { injectStyle } from './lib/style.js';
import { KvPool } from './lib/kv-pool.js';
import { PoolCanvas, OwnerPalette } from './lib/pool-canvas.js';
import { DensityStrip } from './lib/pool-density.js';
import { SandboxPanel, SANDBOX_CSS } from './lib/sandbox-panel.js';
import { PrefixDemo, PREFIX_CSS } from './lib/prefix-demo.js';
import { PrefixLessons, LESSONS_CSS } from './lib/prefix-lessons.js';
import { EvictionDemo, EVICTION_CSS } from './lib/eviction-demo.js';
import { AttachedPanel, ATTACHED_CSS } from './lib/attached-panel.js';
import { PoolsRow, POOLS_ROW_CSS } from './lib/pools-row.js';
import { BlockLifetimes, LIFETIMES_CSS } from './lib/block-lifetimes.js';
import { clientHandlers, withHandlers } from './lib/listen.js';
import { LoadMaker } from '../lib/load-maker.js';
import { controlRow, modeBadge, showMode } from './lib/controls.js';

const MAX_TABLES = 24;
const LARGE_POOL = 4096;                 // more blocks than this: the strip and a detail window
const DETAIL_SIZES = [256, 1024, 4096];  // blocks the detail window draws, the learner's pick

const STYLE = `${SANDBOX_CSS}${PREFIX_CSS}${LESSONS_CSS}${EVICTION_CSS}${ATTACHED_CSS}${POOLS_ROW_CSS}${LIFETIMES_CSS}
kv-pages .kvp-pool { display: block; border-radius: 4px; cursor: crosshair; }
kv-pages .kvp-density { display: block; cursor: pointer; border-radius: 4px; }
kv-pages .kvp-density:focus-visible, kv-pages .kvp-pool:focus-visible { outline: 3px solid var(--kv-focus); outline-offset: 2px; }
kv-pages .kvp-large { margin: .3rem 0; }
kv-pages .kvp-window { font-size: .85rem; }
kv-pages .kvp-poolwrap { max-height: 420px; overflow: auto; border: 1px solid var(--kv-border); border-radius: var(--kv-radius, 6px); padding: 4px; }
kv-pages .kvp-detail { font-family: var(--kv-font-mono); font-size: .85rem; min-height: 1.4em; }
kv-pages .kvp-events { font-family: var(--kv-font-mono); font-size: .8rem; color: var(--kv-fg-soft); min-height: 1.3em; }
kv-pages .kvp-tables button { font: inherit; background: none; border: 1px solid transparent; color: inherit; padding: .1rem .3rem; border-radius: 4px; cursor: pointer; text-align: left; }
kv-pages .kvp-chip--shared { border-width: 2px; border-color: var(--kv-fg); font-weight: 600; }
kv-pages .kvp-tables button:hover, kv-pages .kvp-tables button[aria-pressed=true] { border-color: var(--kv-focus); }
`;

class KvPages extends withHandlers(KvWidget) {
  static events = ['kv'];
  // attached to vLLM (no `step` events) the pool still draws; the prefix demo then reads
  // each request's cached tokens from request.finished instead of counting steps
  static requires = ['kv'];
  static label = 'Page allocator';

  setup() {
    injectStyle('kv-pages', STYLE);
    // attached to several vLLM pools (servers, data-parallel ranks) the `kv` events carry
    // `pool`; the big view draws the one picked in the row of pools above it
    this.pools = new Map([[0, new KvPool()]]);
    this.selectedPool = 0;
    this.palette = new OwnerPalette();
    this.poolsRow = new PoolsRow({ onPick: (i) => this.pickPool(i), colourOf: (owner) => this.palette.resolved(owner) });
    this.poolTitle = h('strong', {}, 'The engine’s pool');
    this.lifetimes = new BlockLifetimes();
    this.cursor = -1;
    this.highlightSeq = null;
    this.pinnedSeq = null;
    this.modeBadge = modeBadge();
    this.figuresEl = h('dl', { class: 'kvw-figures', 'aria-label': 'Pool figures' });
    this.canvas = h('canvas', {
      class: 'kvp-pool', tabindex: '0', role: 'application', 'aria-roledescription': 'block pool',
      'aria-label': 'Block pool: arrow keys move between blocks, Home/End jump', 'aria-describedby': `${this.getAttribute('aria-labelledby')}-detail`,
    });
    this.painter = new PoolCanvas(this.canvas);
    this.buildLargeView();
    this.detailEl = h('p', { class: 'kvp-detail', id: `${this.getAttribute('aria-labelledby')}-detail`, 'aria-live': 'polite' });
    this.eventsEl = h('p', { class: 'kvp-events' });
    this.tablesEl = h('ul', { class: 'kvp-tables', 'aria-label': 'Block tables of the sequences in flight' });
    this.load = new LoadMaker(this.client, { keep: 3, paceS: 0.2, onChange: () => this.showLoad() });
    this.loadButton = h('button', { type: 'button', class: 'kvw-btn', 'aria-pressed': 'false', onclick: () => this.toggleLoad() },
      'Keep 3 requests running');
    this.loadStatus = h('span', { class: 'kvw-note', 'aria-live': 'polite' });
    // pool-only (the projector): the engine's pool and tables, without the learner's own
    // load and sandbox, which a room's screen has no use for
    this.poolOnly = this.hasAttribute('pool-only');
    this.sandbox = this.poolOnly ? null : new SandboxPanel(this, this.palette);
    this.attached = new AttachedPanel();
    this.demo = this.getAttribute('prompt') ? new PrefixDemo(this, this.getAttribute('prompt')) : null;
    this.lessons = this.demo ? new PrefixLessons(this, this.getAttribute('prompt')) : null;
    this.eviction = this.demo && this.sandbox ? new EvictionDemo(this) : null;
    this.handlers = clientHandlers(this, {
      'request.added': (e) => this.lessons?.onAdded(e),
      'request.finished': (e) => { this.demo?.onFinished(e); this.lessons?.onFinished(e); },
      step: (e) => this.demo?.onStep(e),
    });
    this.followSteps();
    this.handlers.attach();
    this.body.append(
      ...(this.demo ? [this.demo.el, this.lessons.el] : []),
      h('div', { class: 'kvw-row' }, this.poolTitle, this.modeBadge),
      this.attached.el,
      this.poolsRow.el,
      ...(this.poolOnly ? [] : [controlRow('Load of your own', this.loadButton, this.loadStatus)]),
      this.figuresEl,
      this.largeEl,
      h('div', { class: 'kvp-poolwrap' }, this.canvas),
      this.detailEl, this.eventsEl,
      this.lifetimes.el,
      this.attached.blocksEl,
      h('h4', {}, 'Block tables (logical → physical)'),
      this.tablesEl,
      ...(this.eviction ? [this.eviction.el] : []),
      ...(this.sandbox ? [this.sandbox.el] : []),
    );
    this.canvas.addEventListener('keydown', (e) => this.onPoolKey(e));
    this.canvas.addEventListener('pointermove', (e) => {
      const r = this.canvas.getBoundingClientRect();
      const sx = (parseFloat(this.canvas.style.width) || r.width) / (r.width || 1);
      const sy = (parseFloat(this.canvas.style.height) || r.height) / (r.height || 1);
      const id = this.painter.blockAt((e.clientX - r.left) * sx, (e.clientY - r.top) * sy);
      if (id >= 0 && id !== this.cursor) { this.cursor = id; this.describeBlock(id); this.requestRender(); }
    });
    this.canvas.addEventListener('focus', () => {
      if (this.cursor >= 0 || !this.pool.numBlocks) return;
      this.cursor = this.large ? this.windowStart : 0;
      this.describeBlock(this.cursor);
      this.requestRender();
    });
    this.tablesEl.addEventListener('mouseleave', () => this.setHighlight(this.pinnedSeq));
    this.setLegend([
      { label: 'free block', color: 'var(--kv-free)' },
      { label: 'held by a sequence (colour = owner; filled from the bottom = slots used)', color: 'var(--kv-used)' },
      { label: 'shared: ref count > 1 (thick border, count inside)', color: 'var(--kv-fg)', shape: 'line' },
      { label: 'free but cached: keeps its hash, a later prefix can reuse it', color: 'var(--kv-cached)', shape: 'hatch' },
    ]);
    this.updateMode(this.client.mode);
    this.showLoad();
    this.sandbox?.start();
    this.poolsRow.setDeployment(this.client.hello?.deployment, this.selectedPool);
  }

  /** The pool the big view draws (the first, unless one is picked in the row of pools). */
  get pool() {
    return this.pools.get(this.selectedPool) ?? this.pools.get(0);
  }

  pickPool(index) {
    if (!this.pools.has(index)) this.pools.set(index, new KvPool());
    this.selectedPool = index;
    this.cursor = -1;
    this.windowStart = 0;
    this.poolsRow.select(index);
    this.showLifetimes();
    this.requestRender();
  }

  /** The drawn pool's block lifetimes (attached to vLLM only). */
  showLifetimes() {
    const pools = this.client.engine?.vllm?.pools;
    const state = pools?.find((p) => p.pool === this.selectedPool);
    this.lifetimes.show(state ? state.metrics || {} : null, state?.name ?? 'This server');
  }

  /** The whole of a large pool (a density strip) and the controls of the detail window. */
  buildLargeView() {
    this.windowStart = 0;
    this.windowSize = DETAIL_SIZES[1];
    this.strip = h('canvas', {
      class: 'kvp-density', tabindex: '0', role: 'slider', 'aria-orientation': 'horizontal',
      'aria-label': 'Whole pool, as a density strip: choose the blocks the detail view draws (arrow keys, Page Up/Down, Home/End; Enter goes to the detail)',
    });
    this.stripPainter = new DensityStrip(this.strip);
    this.zoomSelect = h('select', { class: 'kvw-input', 'aria-label': 'Blocks in the detail view' },
      ...DETAIL_SIZES.map((n) => h('option', { value: String(n) }, formatInt(n))));
    this.zoomSelect.value = String(this.windowSize);
    this.zoomSelect.addEventListener('change', () => {
      this.windowSize = Number(this.zoomSelect.value);
      this.moveWindow(this.cursor >= 0 ? this.cursor - this.windowSize / 2 : this.windowStart);
    });
    this.jumpButton = h('button', { type: 'button', class: 'kvw-btn', onclick: () => this.jumpToBlocksInUse() }, 'Next blocks in use');
    this.windowEl = h('p', { class: 'kvw-note kvp-window', 'aria-live': 'polite' });
    this.largeEl = h('section', { class: 'kvp-large', 'aria-label': 'Whole pool', hidden: '' },
      this.strip,
      h('div', { class: 'kvw-row' }, h('label', {}, 'Detail view: ', this.zoomSelect, ' blocks'), this.jumpButton),
      this.windowEl);
    const pick = (e) => {
      const r = this.strip.getBoundingClientRect();
      const x = (e.clientX - r.left) * ((parseFloat(this.strip.style.width) || r.width) / (r.width || 1));
      this.moveWindow(this.stripPainter.blockAt(x) - this.windowSize / 2);
    };
    this.strip.addEventListener('pointerdown', pick);
    this.strip.addEventListener('pointermove', (e) => { if (e.buttons) pick(e); });
    this.strip.addEventListener('keydown', (e) => {
      const n = this.pool.numBlocks;
      const w = this.windowSize;
      const moves = { ArrowRight: this.windowStart + w, ArrowLeft: this.windowStart - w, PageDown: this.windowStart + 8 * w,
        PageUp: this.windowStart - 8 * w, Home: 0, End: n - w };
      if (e.key === 'Enter') { e.preventDefault(); this.canvas.focus(); return; }
      if (!(e.key in moves)) return;
      e.preventDefault();
      this.moveWindow(moves[e.key]);
    });
  }

  get large() {
    return this.pool.numBlocks > LARGE_POOL;
  }

  /** Start the detail window at `start` (clamped to the pool). */
  moveWindow(start) {
    const n = this.pool.numBlocks;
    this.windowStart = Math.max(0, Math.min(Math.max(0, n - this.windowSize), Math.round(start)));
    this.strip.setAttribute('aria-valuenow', String(this.windowStart));   // at once, not at the next frame
    if (this.cursor >= 0 && (this.cursor < this.windowStart || this.cursor >= this.windowStart + this.windowSize)) this.cursor = this.windowStart;
    this.requestRender();
  }

  /** The next window (after this one, wrapping round) holding a block in use, else a cached one. */
  jumpToBlocksInUse() {
    const { blocks } = this.pool;
    const n = blocks.length;
    const from = this.windowStart + this.windowSize;
    for (const wanted of [(b) => b.ref > 0, (b) => Boolean(b.hash)]) {
      for (let k = 0; k < n; k += 1) {
        const i = (from + k) % n;
        if (wanted(blocks[i])) {
          this.cursor = i;
          this.moveWindow(Math.floor(i / this.windowSize) * this.windowSize);
          this.describeBlock(i);
          return;
        }
      }
    }
    this.windowEl.textContent = 'No block is in use or cached: the whole pool is free.';
  }

  toggleLoad() {
    if (this.load.active) this.load.stop();
    else this.load.start();
  }

  /** The load control: pressed while it keeps requests running, and which ones they are. */
  showLoad() {
    const { active, running, error } = this.load;
    this.loadButton.setAttribute('aria-pressed', String(active));
    this.loadButton.textContent = active ? 'Stop my requests' : 'Keep 3 requests running';
    const attached = this.client.hello?.backend?.engine === 'vllm';
    this.loadButton.disabled = !this.isLive || attached;
    this.dataset.load = active ? 'on' : 'off';
    if (!this.isLive) this.loadStatus.textContent = 'Needs the live engine.';
    else if (attached) this.loadStatus.textContent = 'Paced requests need kvscope’s own engine; attached to vLLM, send prompts from the prefix demo or any OpenAI client.';
    else if (error) this.loadStatus.textContent = this.describeError(error);
    else if (active || running.size) {
      this.loadStatus.textContent = `${running.size} of your requests in flight (${[...running].join(', ')}), each stepped every ${this.load.paceS} s so you can watch its blocks fill and be freed.`;
    } else this.loadStatus.textContent = 'Your own requests fill the pool; no instructor needed.';
  }

  /** The prefix demo counts its requests' work from `step` events. */
  followSteps() {
    // replaying, the recorded requests' events too: the lessons panel lists them
    if (this.demo && !this.stopSteps) this.stopSteps = this.client.subscribe(this.isLive ? ['step'] : ['step', 'request']);
  }

  connectedCallback() {
    super.connectedCallback();
    if (this.handlers) this.followSteps();
  }

  disconnectedCallback() {
    super.disconnectedCallback();
    this.load?.stop();
    this.stopSteps?.();
    this.stopSteps = null;
  }

  onModeChange(mode) {
    this.showLoad();
    if (this.demo) this.demo.freeButton.disabled = mode !== 'live';
    this.updateMode(mode);
    this.sandbox?.start();
    if (this.stopSteps) {   // live and replay follow different families
      this.stopSteps();
      this.stopSteps = null;
      this.followSteps();
    }
    this.lessons?.showBlockSize();
    this.eviction?.showButton();
  }

  updateMode(mode) {
    showMode(this.modeBadge, mode);
  }

  onEvent(event) {
    if (event.type === 'kv') {
      const index = event.pool ?? 0;
      if (!this.pools.has(index)) this.pools.set(index, new KvPool());
      if (!this.pools.get(index).apply(event)) return;
      this.dirtyPools = (this.dirtyPools || new Set()).add(index);
      this.dataset.step = String(this.pool.step);
      this.requestRender();
    } else if (event.type === 'engine' && event.reason === 'reset') {
      this.requestRender();
    }
    if (event.type === 'engine') {
      this.attached.onEngine(event);
      this.poolsRow.onEngine(event.vllm);
      this.showLifetimes();
    }
    if (event.type === 'hello') {
      this.poolsRow.setDeployment(event.deployment, this.selectedPool);
      this.dirtyPools = new Set(this.pools.keys());
      this.demo?.showEngine();
      this.showLoad();
      this.lessons?.showBlockSize();
    }
  }

  setHighlight(rid) {
    if (rid === this.highlightSeq) return;
    this.highlightSeq = rid;
    this.requestRender();
  }

  describeBlock(id) {
    const b = this.pool.blocks[id];
    if (!b) return;
    const tables = [...this.pool.tables].filter(([, t]) => t.includes(id)).map(([rid, t]) => `${rid}[${t.indexOf(id)}]`);
    const state = b.ref > 0 ? `ref count ${b.ref}` : (b.hash ? 'free, cached' : 'free');
    this.detailEl.textContent = `block ${id}: ${state} · ${b.filled}/${this.pool.blockSize} slots · hash ${b.hash || '—'}`
      + `${b.owners.length ? ` · owners ${b.owners.join(', ')}` : ''}${tables.length ? ` · logical ${tables.join(', ')}` : ''}`
      + `${b.hits ? ` · ${b.hits} hit${b.hits === 1 ? '' : 's'}` : ''}${b.text ? ` · “${b.text}”` : ''}`;
  }

  onPoolKey(e) {
    const n = this.pool.numBlocks;
    if (!n) return;
    const cols = this.painter.cols;
    const c = Math.max(this.cursor, 0);
    const moves = { ArrowRight: c + 1, ArrowLeft: c - 1, ArrowDown: c + cols, ArrowUp: c - cols, Home: 0, End: n - 1, PageDown: c + cols * 8, PageUp: c - cols * 8 };
    if (!(e.key in moves)) return;
    e.preventDefault();
    this.cursor = Math.max(0, Math.min(n - 1, moves[e.key]));
    if (this.large && (this.cursor < this.windowStart || this.cursor >= this.windowStart + this.windowSize)) {
      this.windowStart = Math.max(0, Math.min(n - this.windowSize, Math.floor(this.cursor / this.windowSize) * this.windowSize));
    }
    this.describeBlock(this.cursor);
    this.requestRender();
  }

  render() {
    const p = this.pool;
    const counts = p.counts();
    this.renderPoolsRow();
    const fig = (label, value, key) => h('div', {}, h('dt', {}, label), h('dd', { 'data-figure': key }, value));
    this.figuresEl.replaceChildren(
      fig('Blocks', p.ready ? `${formatInt(p.numBlocks)} × ${p.blockSize} slots` : '—', 'num_blocks'),
      fig('In use', formatInt(counts.used + counts.shared), 'used'),
      fig('Shared', formatInt(counts.shared), 'shared'),
      fig('Free', formatInt(p.totals.num_free), 'num_free'),
      fig('Cached (free)', formatInt(p.totals.num_cached), 'num_cached'),
      fig('Prefix hits', formatInt(p.totals.prefix_hits), 'prefix_hits'),
      fig('Evictions', formatInt(p.totals.evictions), 'evictions'),
      fig('Step', formatInt(p.step), 'step'),
    );
    if (!p.ready) {
      const hint = this.client.engine?.vllm?.kv_events;
      this.detailEl.textContent = hint && !hint.startsWith('subscribed') ? hint : 'Waiting for the pool snapshot…';
      return;
    }
    if (this.client.hello?.backend?.engine === 'vllm') this.attached.renderBlocks(p.blocks);
    const live = new Set(p.tables.keys());
    const rid = this.highlightSeq && live.has(this.highlightSeq) ? this.highlightSeq : null;
    const table = rid ? p.tables.get(rid) : null;
    const colours = new Map();
    const colourOf = (owner) => {
      if (!colours.has(owner)) colours.set(owner, this.palette.resolved(owner));
      return colours.get(owner);
    };
    const width = Math.min((this.body.clientWidth || 700) - 12, 960);
    const large = this.large;
    this.largeEl.hidden = !large;
    this.dataset.large = String(large);
    const range = large ? { offset: this.windowStart, count: this.windowSize } : {};
    this.painter.draw({
      blocks: p.blocks, blockSize: p.blockSize, colourOf, cursor: this.cursor,
      highlight: table ? new Set(table) : null, logical: table ? new Map(table.map((b, i) => [b, i])) : null,
      width, ...range,
    });
    const whole = `${counts.used + counts.shared} in use (${counts.shared} shared), ${formatInt(p.totals.num_cached)} cached, ${formatInt(p.totals.num_free)} free`;
    if (large) this.renderStrip(width);
    this.canvas.setAttribute('aria-label', large
      ? `Detail of the block pool: blocks ${formatInt(this.painter.offset)} to ${formatInt(this.painter.offset + this.painter.count - 1)} of ${formatInt(p.numBlocks)}. The whole pool: ${whole}. Arrow keys move between blocks; past the edge the window follows.`
      : `Block pool of ${p.numBlocks} blocks: ${whole}. Arrow keys move between blocks.`);
    this.eventsEl.textContent = p.lastEvents.length
      ? `step ${p.step}: ${p.lastEvents.slice(0, 12).map((e) => `${e.op} ${e.block}${e.request_id ? ` (${e.request_id})` : ''}`).join(', ')}${p.lastEvents.length > 12 ? ', …' : ''}`
      : '';
    if (this.cursor >= 0) this.describeBlock(this.cursor);
    else this.detailEl.textContent = 'Hover a block, or Tab to the pool and use the arrow keys, to read its state.';
    this.renderTables();
  }

  /** The cards of the pools that changed (attached to several pools only). */
  renderPoolsRow() {
    const dirty = this.dirtyPools;
    this.dirtyPools = null;
    const names = this.client.hello?.deployment?.pools;
    this.poolTitle.textContent = names?.length > 1
      ? `The pool of ${names.find((x) => x.pool === this.selectedPool)?.name ?? 'server 1'}`
      : 'The engine’s pool';
    if (this.poolsRow.el.hidden || !dirty) return;
    const cols = Math.max(1, Math.min(this.poolsRow.cards.size, Math.floor((this.body.clientWidth || 700) / 240)));
    const width = Math.floor((this.body.clientWidth || 700) / cols) - 40;
    for (const index of dirty) if (this.pools.has(index)) this.poolsRow.draw(index, this.pools.get(index), width);
  }

  /** The strip of a large pool, and what its window holds, in words for every reader. */
  renderStrip(width) {
    const p = this.pool;
    this.stripPainter.draw({ blocks: p.blocks, width, windowStart: this.windowStart, windowSize: this.windowSize });
    let used = 0;
    let cached = 0;
    const end = Math.min(p.numBlocks, this.windowStart + this.windowSize);
    for (let i = this.windowStart; i < end; i += 1) {
      if (p.blocks[i].ref > 0) used += 1;
      else if (p.blocks[i].hash) cached += 1;
    }
    const text = `Detail: blocks ${formatInt(this.windowStart)}–${formatInt(end - 1)} of ${formatInt(p.numBlocks)}: ${formatInt(used)} in use, ${formatInt(cached)} cached. `
      + `The strip above is the whole pool, ${formatInt(this.stripPainter.perColumn)} blocks a column (in use from the bottom, then cached); the bars above and below it mark the detail.`;
    if (this.windowEl.textContent !== text) this.windowEl.textContent = text;
    this.strip.setAttribute('aria-valuemin', '0');
    this.strip.setAttribute('aria-valuemax', String(Math.max(0, p.numBlocks - this.windowSize)));
    this.strip.setAttribute('aria-valuenow', String(this.windowStart));
    this.strip.setAttribute('aria-valuetext', `blocks ${this.windowStart} to ${end - 1} of ${p.numBlocks}: ${used} in use, ${cached} cached`);
  }

  renderTables() {
    const entries = [...this.pool.tables];
    const shown = entries.slice(0, MAX_TABLES);
    const focused = this.tablesEl.contains(document.activeElement) ? document.activeElement.dataset.seq : null;
    this.tablesEl.replaceChildren(...shown.map(([rid, t]) => {
      const button = h('button', {
        type: 'button', 'data-seq': rid, 'aria-pressed': this.pinnedSeq === rid ? 'true' : 'false',
        'aria-label': `${rid}: ${t.length} blocks, logical to physical ${t.map((b, i) => `${i} to ${b}${this.refOf(b) > 1 ? ' (shared)' : ''}`).join(', ')}. Press to keep it highlighted.`,
      }, h('strong', { style: `color:${this.palette.cssColour(rid)}` }, `■ ${rid}`), ` ${t.length} block${t.length === 1 ? '' : 's'}: `,
      ...t.slice(0, 32).map((b, i) => this.chip(b, i)), t.length > 32 ? ' …' : '');
      button.addEventListener('pointerenter', () => this.setHighlight(rid));
      button.addEventListener('focus', () => this.setHighlight(rid));
      button.addEventListener('blur', () => this.setHighlight(this.pinnedSeq));
      button.addEventListener('click', () => {
        this.pinnedSeq = this.pinnedSeq === rid ? null : rid;
        this.setHighlight(this.pinnedSeq ?? rid);
        this.renderTables();
      });
      return h('li', {}, button);
    }), ...(entries.length > MAX_TABLES ? [h('li', { class: 'kvw-note' }, `… and ${entries.length - MAX_TABLES} more`)] : []),
    ...(entries.length ? [] : [h('li', { class: 'kvw-note' }, this.isLive
      ? `No sequence holds blocks right now.${this.poolOnly ? '' : ' Press “Keep 3 requests running” to see tables appear.'}`
      : 'No sequence holds blocks right now: the recorded requests have finished and their blocks are free.')]));
    if (focused) this.tablesEl.querySelector(`[data-seq="${CSS.escape(focused)}"]`)?.focus();
    const owners = entries.slice(0, 6).map(([rid]) => ({ label: rid, color: this.palette.cssColour(rid) }));
    this.legendOwners(owners);
  }

  refOf(block) {
    return this.pool.blocks[block]?.ref ?? 0;
  }

  // A table entry; a block other sequences hold too (a prefix hit, or a parallel-sampling
  // fork before copy-on-write) is drawn bold with its ref count.
  chip(block, index) {
    const ref = this.refOf(block);
    return ref > 1
      ? h('span', { class: 'kvp-chip kvp-chip--shared', 'data-shared': String(ref), title: `shared by ${ref} sequences` }, `${index}→${block} ×${ref}`)
      : h('span', { class: 'kvp-chip' }, `${index}→${block}`);
  }

  legendOwners(owners) {
    const key = owners.map((o) => o.label).join(',');
    if (key === this.legendKey) return;
    this.legendKey = key;
    this.setLegend([
      { label: 'free block', color: 'var(--kv-free)' },
      { label: 'held (filled from the bottom = slots used)', color: 'var(--kv-used)' },
      { label: 'shared: ref count > 1 (thick border, count inside)', color: 'var(--kv-fg)', shape: 'line' },
      { label: 'free but cached (keeps its hash)', color: 'var(--kv-cached)', shape: 'hatch' },
      ...owners,
    ]);
  }

  exportData() {
    return { pool: this.pool.toJSON(), sandbox: this.sandbox ? this.sandbox.state : null };
  }
}

customElements.define('kv-pages', KvPages);
