// <kv-batch-timeline>: continuous batching as it happens. Rows are requests, columns are the
// engine's steps (one per `step` event); each cell says what that request did in that step:
// waited, prefilled a chunk (its size on hover), decoded one token, was preempted. A burst
// button sends the learner's own requests, of different lengths, so they visibly join and
// leave mid-flight: they are submitted held and released in one `pace` command, so they start
// in the same step, and paced (each steps at most every BURST_PACE_S), so the burst lasts long
// enough to watch — only the learner's own requests go slowly, nobody else's. Beside it: the same finished requests under static batching (each batch
// waits for its longest member), computed from the very same requests, and the difference.
// The grid shows as many recent steps as fit at a readable cell width (never squeezed); the
// earlier ones kept are a button or a key away (arrows, Page Up/Down, Home/End).

import { KvWidget, formatInt, formatFloat } from '../widget-base.js';
import { h, svg, uniqueId } from './lib/svg.js';
import { injectStyle } from './lib/style.js';
import { BatchModel, staticBatching, continuousBatching } from './lib/batch-model.js';
import { LoadMaker } from '../lib/load-maker.js';
import { setBusy, isBusy } from './lib/busy.js';
import { controlRow, modeBadge, showMode } from './lib/controls.js';

const CELL_W = 22;   // px at 1:1; the grid shows fewer steps rather than narrower cells
const CELL_H = 20;
const LABEL_W = 58;
const BAR_H = 30;
const COLOURS = {
  waiting: 'var(--kv-free)', prefill: 'var(--kv-prefill)', decode: 'var(--kv-decode)', preempted: 'var(--kv-evicted)',
};
// The burst: three requests now, a fourth once the shortest has left, so both joining and
// leaving mid-flight show. Lengths differ so they leave at different steps; at one step per
// BURST_PACE_S the longest lasts about 9 s.
const BURST = [10, 30, 18];
const LATE = 16;
const BURST_PACE_S = 0.3;

const STYLE = `
kv-batch-timeline .kbt-grid:focus-visible { outline: 3px solid var(--kv-focus); outline-offset: 2px; }
kv-batch-timeline .kbt-grid[hidden] { display: none; }
kv-batch-timeline .kbt-detail { font-family: var(--kv-font-mono); font-size: .85rem; min-height: 1.4em; }
kv-batch-timeline .kbt-compare { display: grid; grid-template-columns: max-content 1fr max-content; gap: .2rem .6rem; align-items: center; font-size: .9rem; }
kv-batch-timeline .kbt-compare .kvw-bar { min-width: 6rem; }
kv-batch-timeline .kbt-hatch { stroke: var(--kv-fg-soft); stroke-width: 1; }
`;

class KvBatchTimeline extends KvWidget {
  static events = ['step', 'request'];
  static requires = ['requests', 'steps', 'step_rows'];
  static label = 'Continuous batching, step by step';

  setup() {
    injectStyle('kv-batch-timeline', STYLE);
    this.model = new BatchModel({ maxSteps: 64, maxRequests: 14 });
    this.cursor = null;              // { row, col } of the focused cell
    this.load = new LoadMaker(this.client, { onChange: () => this.showControls(), onFinished: (rid) => this.onMineFinished(rid) });
    this.late = null;                // the burst request whose finish lets the late one join
    this.modeBadge = modeBadge();
    this.burstButton = h('button', { type: 'button', class: 'kvw-btn kvw-btn--primary', onclick: () => { if (!isBusy(this.burstButton)) this.burst(); } },
      'Send a burst of my requests');
    this.loadStatus = h('span', { class: 'kvw-note', 'aria-live': 'polite' });
    this.patternId = uniqueId('kbt-hatch');
    this.grid = svg('svg', { class: 'kvw-svg kbt-grid', tabindex: '0', role: 'img', hidden: '' });   // shown from the first step
    this.viewEndStep = null;         // the step drawn last (null: follow the newest)
    this.earlierButton = h('button', { type: 'button', class: 'kvw-btn', onclick: () => this.page(-1) }, 'Earlier steps');
    this.laterButton = h('button', { type: 'button', class: 'kvw-btn', onclick: () => this.page(1) }, 'Later steps');
    this.latestButton = h('button', { type: 'button', class: 'kvw-btn', onclick: () => { this.viewEndStep = null; this.requestRender(); } }, 'Follow the newest');
    this.rangeEl = h('span', { class: 'kvw-note', 'data-range': '' });
    this.gridWrap = h('div', { class: 'kbt-wrap' }, this.grid);
    this.detailEl = h('p', { class: 'kbt-detail', 'aria-live': 'polite' });
    this.compareEl = h('div', { class: 'kbt-compare', 'aria-label': 'Continuous versus static batching of the same requests' });
    this.verdictEl = h('p', { class: 'kvw-note' });
    this.body.append(
      h('div', { class: 'kvw-row' }, this.burstButton, this.modeBadge, this.loadStatus),
      controlRow('Which steps the grid shows', this.earlierButton, this.laterButton, this.latestButton, this.rangeEl),
      this.gridWrap,
      this.detailEl,
      h('section', { class: 'kvw-panel', 'aria-label': 'Static batching of the same requests' },
        h('h4', {}, 'The same requests, batched statically'), this.compareEl, this.verdictEl),
    );
    this.grid.addEventListener('keydown', (e) => this.onKey(e));
    this.grid.addEventListener('focus', () => { if (!this.cursor) this.moveCursor(0, this.model.steps.length - 1); });
    this.grid.addEventListener('blur', () => this.requestRender());
    this.resizer = new ResizeObserver(() => {   // a new width: a new number of columns
      if (this.gridWrap.clientWidth !== this.drawnFor) this.requestRender();
    });
    this.resizer.observe(this.gridWrap);
    this.setLegend([
      { label: 'waiting (in the queue, or held)', color: COLOURS.waiting },
      { label: 'prefill (hover: chunk size)', color: COLOURS.prefill },
      { label: 'decode: one token', color: COLOURS.decode },
      { label: 'preempted (blocks freed)', color: COLOURS.preempted },
      { label: 'finished in this step (dot)', color: 'var(--kv-fg)', shape: 'circle' },
      { label: 'bottom row: tokens computed in the step (hover: of the token budget)', color: 'var(--kv-cat-8)' },
    ]);
    this.updateMode(this.client.mode);
  }

  onModeChange(mode) {
    this.updateMode(mode);
  }

  updateMode(mode) {
    showMode(this.modeBadge, mode);
    this.showControls();
  }

  onEvent(event) {
    if (this.model.apply(event)) {
      this.dataset.steps = String(this.model.steps.length);
      this.requestRender();
    }
  }

  disconnectedCallback() {
    super.disconnectedCallback();
    this.load?.stop();
  }

  // -- which steps are drawn --------------------------------------------------------------
  /** Steps that fit the widget's width at CELL_W each. */
  get columns() {
    const avail = this.gridWrap.clientWidth || 600;
    return Math.max(6, Math.floor((avail - LABEL_W - 4) / CELL_W));
  }

  /** [start, end) indexes into the kept steps: the newest that fit, or those ending at viewEndStep. */
  window() {
    const steps = this.model.steps;
    let end = steps.length;
    if (this.viewEndStep !== null) {
      const i = steps.findIndex((step) => step.step >= this.viewEndStep);
      end = i < 0 ? steps.length : i + 1;
    }
    end = Math.min(steps.length, Math.max(end, Math.min(this.columns, steps.length)));
    return [Math.max(0, end - this.columns), end];
  }

  /** Show the step at index `col` (a window that ends at the newest follows new steps). */
  reveal(col) {
    const steps = this.model.steps;
    const [start, end] = this.window();
    if (col >= steps.length - 1) this.viewEndStep = null;
    else if (col >= end) this.viewEndStep = steps[col].step;
    else if (col < start) this.viewEndStep = steps[Math.min(steps.length - 1, col + this.columns - 1)].step;
  }

  /** One window's width earlier (-1) or later (+1). */
  page(direction) {
    const steps = this.model.steps;
    if (!steps.length) return;
    const [, end] = this.window();
    const last = Math.max(0, Math.min(steps.length - 1, end - 1 + direction * this.columns));
    this.viewEndStep = last >= steps.length - 1 ? null : steps[Math.max(last, Math.min(this.columns, steps.length) - 1)].step;
    this.requestRender();
  }

  // -- load -------------------------------------------------------------------------------
  async burst() {
    setBusy(this.burstButton, true);
    this.late = 'first';             // the first of the burst to finish lets the late one in
    const held = [];
    for (const maxTokens of BURST) held.push(...await this.load.burst(1, { ...this.requestFields(maxTokens), hold: true }));
    try {
      // one command releases them all between two engine steps: they start in the same step
      if (held.length) await this.client.command('pace', { request_ids: held, interval_s: BURST_PACE_S });
    } catch (error) {
      this.load.error = error;
    }
    this.showControls();
  }

  onMineFinished() {
    if (this.late !== 'first') return;
    this.late = null;
    this.load.burst(1, this.requestFields(LATE)).then(() => this.showControls());
  }

  requestFields(maxTokens) {
    return { pace_s: BURST_PACE_S, params: { temperature: 0.8, seed: maxTokens, max_tokens: maxTokens, ignore_eos: true } };
  }

  showControls() {
    if (!this.load) return;
    this.burstButton.disabled = !this.isLive;
    setBusy(this.burstButton, this.isLive && this.load.running.size > 0);   // busy, not disabled: focus stays
    if (!this.isLive) this.loadStatus.textContent = 'The burst needs the live engine; the grid replays a recording.';
    else if (this.load.error) this.loadStatus.textContent = this.describeError(this.load.error);
    else if (this.load.running.size) this.loadStatus.textContent = `Your requests in flight: ${[...this.load.running].join(', ')}${this.late ? '; one more joins when the shortest leaves' : ''}.`;
    else this.loadStatus.textContent = `Sends 3 of your requests of different lengths, started in the same step, and a 4th once the first has left; yours step once every ${BURST_PACE_S} s so you can follow them (nobody else’s are slowed).`;
  }

  // -- keyboard ---------------------------------------------------------------------------
  onKey(e) {
    const rows = this.model.visibleRequests().length;
    const cols = this.model.steps.length;
    if (!rows || !cols) return;
    const { row, col } = this.cursor || { row: 0, col: cols - 1 };
    const moves = { ArrowRight: [row, col + 1], ArrowLeft: [row, col - 1], ArrowDown: [row + 1, col], ArrowUp: [row - 1, col], Home: [row, 0], End: [row, cols - 1],
      PageUp: [row, col - this.columns], PageDown: [row, col + this.columns] };
    if (!(e.key in moves)) return;
    e.preventDefault();
    this.moveCursor(...moves[e.key]);
  }

  moveCursor(row, col) {
    const requests = this.model.visibleRequests();
    const steps = this.model.steps;
    if (!requests.length || !steps.length) return;
    this.cursor = { row: Math.max(0, Math.min(requests.length - 1, row)), col: Math.max(0, Math.min(steps.length - 1, col)) };
    this.reveal(this.cursor.col);
    this.describe(requests[this.cursor.row], steps[this.cursor.col]);
    this.requestRender();
  }

  describe(request, step) {
    const cell = this.model.cell(request.rid, step.step);
    const what = !cell ? 'not in flight'
      : cell.kind === 'prefill' ? `prefill of ${cell.tokens} prompt tokens${cell.samples ? ', then its first token' : ' (a chunk)'}`
        : cell.kind === 'decode' ? 'decoded one token'
          : cell.kind === 'preempted' ? 'preempted: its blocks were freed' : 'waiting';
    this.detailEl.textContent = `step ${step.step} · ${request.rid}: ${what}${cell && cell.finished ? ', and finished' : ''}`
      + ` · the step ran ${step.seqs} sequences, ${step.tokens}/${step.budget} tokens`;
  }

  // -- drawing ----------------------------------------------------------------------------
  render() {
    const requests = this.model.visibleRequests();
    const kept = this.model.steps;
    const [start, end] = this.window();
    const steps = kept.slice(start, end);
    this.drawnFor = this.gridWrap.clientWidth;
    const width = LABEL_W + this.columns * CELL_W + 4;
    const height = 20 + requests.length * CELL_H + BAR_H + 18;
    const focused = document.activeElement === this.grid;
    this.grid.toggleAttribute('hidden', !kept.length);   // nothing to draw yet: the note below says what to do (an SVG element has no .hidden)
    const nodes = [svg('defs', {}, svg('pattern', { id: this.patternId, width: 4, height: 4, patternUnits: 'userSpaceOnUse', patternTransform: 'rotate(45)' },
      svg('line', { x1: 0, y1: 0, x2: 0, y2: 4, class: 'kbt-hatch' })))];
    nodes.push(svg('text', { x: 0, y: 12, 'font-size': 12, class: 'kvw-soft' }, steps.length ? `steps ${steps[0].step}–${steps[steps.length - 1].step} →` : 'no step yet'));
    requests.forEach((r, row) => {
      const y = 20 + row * CELL_H;
      nodes.push(svg('text', { x: 0, y: y + 14, 'font-size': 12 }, r.rid));
      steps.forEach((step, col) => {
        const cell = r.cells.get(step.step);
        if (!cell) return;
        const x = LABEL_W + col * CELL_W;
        nodes.push(svg('rect', {
          x, y: y + 1, width: CELL_W - 2, height: CELL_H - 2, rx: 2, fill: COLOURS[cell.kind], 'data-rid': r.rid, 'data-step': step.step, 'data-kind': cell.kind,
        }, svg('title', {}, `step ${step.step}, ${r.rid}: ${cell.kind}${cell.kind === 'prefill' ? ` ${cell.tokens} tokens` : ''}`)));
        if (cell.kind === 'waiting') nodes.push(svg('rect', { x, y: y + 1, width: CELL_W - 2, height: CELL_H - 2, fill: `url(#${this.patternId})` }));
        if (cell.finished) nodes.push(svg('circle', { cx: x + CELL_W / 2 - 1, cy: y + CELL_H / 2, r: 4, fill: 'var(--kv-fg)' }));
      });
    });
    const barTop = 20 + requests.length * CELL_H + 4;
    const tallest = Math.max(1, ...kept.map((step) => step.tokens));
    nodes.push(svg('text', { x: 0, y: barTop + 10, 'font-size': 11, class: 'kvw-soft' }, 'tokens'));
    nodes.push(svg('text', { x: 0, y: barTop + BAR_H - 2, 'font-size': 10, class: 'kvw-soft' }, `max ${tallest}`));
    steps.forEach((step, col) => {
      const frac = step.tokens / tallest;
      const hBar = Math.max(1, frac * BAR_H);
      nodes.push(svg('rect', { x: LABEL_W + col * CELL_W, y: barTop + BAR_H - hBar, width: CELL_W - 2, height: hBar, fill: 'var(--kv-cat-8)' },
        svg('title', {}, `step ${step.step}: ${step.tokens} of ${step.budget} tokens, ${step.seqs} sequences`)));
    });
    if (this.cursor && focused && requests.length && kept.length) {
      const row = Math.min(this.cursor.row, requests.length - 1);
      const col = Math.min(this.cursor.col, kept.length - 1) - start;
      if (col >= 0 && col < steps.length) nodes.push(svg('rect', { x: LABEL_W + col * CELL_W - 1, y: 20 + row * CELL_H, width: CELL_W, height: CELL_H, fill: 'none', stroke: 'var(--kv-focus)', 'stroke-width': 2 }));
    }
    this.grid.replaceChildren(...nodes);
    this.grid.setAttribute('viewBox', `0 0 ${width} ${height}`);
    this.grid.setAttribute('width', String(width));
    this.grid.setAttribute('height', String(height));
    this.grid.setAttribute('aria-label', `Batching timeline: ${requests.length} requests; steps ${steps.length ? `${steps[0].step} to ${steps[steps.length - 1].step}` : 'none yet'} shown of the ${kept.length} kept. `
      + 'Arrow keys move between cells, Page Up and Page Down by a screenful, Home and End to the oldest and newest; each cell is described below.');
    this.showRange(start, end);
    if (!requests.length) this.detailEl.textContent = this.isLive ? 'Press the burst button, or wait for the class’s requests.' : 'Waiting for the recording’s requests…';
    else if (!this.cursor) this.detailEl.textContent = 'Hover a cell, or Tab to the grid and use the arrow keys, to read what a request did in a step.';
    this.renderComparison();
  }

  showRange(start, end) {
    const kept = this.model.steps;
    this.earlierButton.disabled = start <= 0;
    this.laterButton.disabled = end >= kept.length;
    this.latestButton.disabled = this.viewEndStep === null;
    this.rangeEl.textContent = !kept.length ? '' : `Steps ${kept[start].step}–${kept[end - 1].step} of the last ${kept.length}`
      + (this.viewEndStep === null ? ', following the newest.' : '.');
    this.dataset.firstShown = kept.length ? String(kept[start].step) : '';
  }

  renderComparison() {
    const done = this.model.finishedRequests();
    const batchSize = this.model.maxNumSeqs;
    const cont = continuousBatching(done);
    const stat = staticBatching(done, batchSize);
    this.comparison = { requests: done.map((r) => ({ rid: r.rid, arrival_step: r.arrivalStep, output_tokens: r.output })), batch_size: batchSize, continuous: cont, static: stat };
    this.dataset.compared = String(done.length);
    if (!done.length) {
      this.compareEl.replaceChildren(h('span', { class: 'kvw-note' }, 'Appears once requests have finished.'));
      this.verdictEl.textContent = '';
      return;
    }
    const longest = Math.max(cont.steps, stat.steps, 1);
    const bar = (value, colour) => h('div', { class: 'kvw-bar', 'aria-hidden': 'true' }, h('span', { style: `width:${(100 * value) / longest}%;background:${colour}` }));
    this.compareEl.replaceChildren(
      h('strong', {}, 'Continuous'), bar(cont.steps, 'var(--kv-decode)'),
      h('span', { 'data-figure': 'continuous' }, `${formatInt(cont.steps)} steps · ${formatFloat(cont.tokensPerStep, 2)} tokens/step`),
      h('strong', {}, 'Static'), bar(stat.steps, 'var(--kv-cat-8)'),
      h('span', { 'data-figure': 'static' }, `${formatInt(stat.steps)} steps · ${formatFloat(stat.tokensPerStep, 2)} tokens/step`),
    );
    const saved = stat.steps - cont.steps;
    this.verdictEl.textContent = `${done.length} finished requests, ${formatInt(cont.tokens)} tokens. In static batches of up to ${batchSize} `
      + `(${stat.batches.length} batch${stat.batches.length === 1 ? '' : 'es'}), each batch runs until its longest member is done and late arrivals wait for the next batch: `
      + (saved > 0 ? `${formatInt(saved)} more steps than the engine really needed.` : saved < 0 ? `${formatInt(-saved)} fewer steps (the engine also ran prefill chunks or preemptions).` : 'the same number of steps here, as no one arrived late or left early.');
  }

  exportData() {
    return {
      steps: this.model.steps,
      requests: this.model.visibleRequests().map((r) => ({
        rid: r.rid, arrival_step: r.arrivalStep, reason: r.reason, output_tokens: r.output,
        cells: [...r.cells].map(([step, c]) => ({ step, ...c })),
      })),
      comparison: this.comparison || null,
    };
  }
}

customElements.define('kv-batch-timeline', KvBatchTimeline);
