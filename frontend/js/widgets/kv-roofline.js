// <kv-roofline>: chapter 13's roofline, of the machine the engine runs on. Log-log: arithmetic
// intensity (FLOPs per byte moved) across, FLOP/s up. The roof is this device's two
// ceilings as the engine measured them at start-up (`hello.device`: peak bandwidth, peak
// FLOP/s): a slope (bandwidth × intensity) up to the ridge, then flat. The points are the
// engine's own decode steps (`step.cost`: FLOPs, bytes, achieved FLOP/s), grouped by how many
// requests each step decoded. Every request in a decode step shares one read of the weights,
// so a bigger batch does more FLOPs per byte: the point moves right, and up while it stays
// under the slope. The slider picks the batch; live, the learner's button runs that many of
// their own requests together (a one-level `sweep`: one job, within the learner's sweep cap).

import { KvWidget, formatInt, formatSI } from '../widget-base.js';
import { h, svg } from './lib/svg.js';
import { injectStyle } from './lib/style.js';
import { namedRecordingEvents } from './lib/recording.js';
import { runBusy } from './lib/busy.js';
import { SourcePicker, controlRow } from './lib/controls.js';

const RECORDING = 'roofline';
const MAX_TOKENS = 10;   // as the recording's (scripts/make_recordings.py, roofline)
const LIVE_BATCHES = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64];
const PLOT = { w: 560, h: 340, left: 64, right: 16, top: 16, bottom: 44 };

const STYLE = `
kv-roofline .krl-figure { border: 1px solid var(--kv-border); border-radius: var(--kv-radius, 6px); padding: .5rem .6rem; }
kv-roofline .krl-chart text { font-size: 11px; }
kv-roofline .krl-roof { fill: none; stroke: var(--kv-fg); stroke-width: 2.5; }
kv-roofline .krl-grid { stroke: var(--kv-border); stroke-width: 1; }
kv-roofline .krl-dot { fill: var(--kv-cat-8); opacity: .45; }
kv-roofline .krl-point { stroke: var(--kv-bg); stroke-width: 1.5; }
kv-roofline .krl-chosen { stroke: var(--kv-focus); stroke-width: 3; fill: none; }
kv-roofline input[type=range] { width: min(18rem, 100%); }
kv-roofline input:focus-visible { outline: 3px solid var(--kv-focus); outline-offset: 2px; }
kv-roofline .krl-lesson { font-size: .95rem; margin: .3rem 0; }
`;

const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length ? (s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2) : null;
};
const fmtFlops = (v) => `${formatSI(v)}FLOP/s`;

/** Decode-only steps grouped by batch size (rows in the step), each with its cost. */
class Batches {
  constructor() { this.byBatch = new Map(); }

  add(e) {
    if (!e.seqs.length || !e.seqs.every((s) => s.reason === 'decode') || !e.cost || !e.cost.flops) return;
    const n = e.seqs.length;
    if (!this.byBatch.has(n)) this.byBatch.set(n, []);
    this.byBatch.get(n).push({ step: e.step, intensity: e.cost.flops / e.cost.bytes, flops: e.cost.achieved_flops_per_s });
  }

  /** Per batch size with enough steps to trust: its intensity (the same in every step, up to
   *  the attention's share) and its fastest step's FLOP/s: on a shared machine other work only
   *  ever slows a step down, so the best step is the one nearest what the batch can do. */
  points(minSteps = 3) {
    return [...this.byBatch].filter(([, steps]) => steps.length >= minSteps).sort((a, b) => a[0] - b[0])
      .map(([batch, steps]) => ({ batch, steps, intensity: median(steps.map((s) => s.intensity)), flops: Math.max(...steps.map((s) => s.flops)) }));
  }
}

class KvRoofline extends KvWidget {
  static events = ['step', 'request'];
  static requires = ['requests', 'steps'];
  static label = 'The roofline of this machine, with the engine’s decode steps';

  setup() {
    injectStyle('kv-roofline', STYLE);
    this.recorded = new Batches();
    this.live = new Batches();
    this.mine = new Set();
    this.source = 'recorded';
    this.batch = 1;
    const uid = this.getAttribute('aria-labelledby');
    this.picker = new SourcePicker({ id: `${uid}-source`, label: 'Steps from', onChange: (source) => this.show(source),
      recorded: 'Recorded: batches of 1 to 128', live: 'Live: your requests' });
    this.slider = h('input', { type: 'range', id: `${uid}-batch`, min: 0, max: 0, step: 1, value: 0, oninput: () => this.pick() });
    this.batchOut = h('output', { for: this.slider.id });
    this.runButton = h('button', { type: 'button', class: 'kvw-btn kvw-btn--primary', onclick: () => this.runLive() }, 'Run them together');
    this.errorEl = h('p', { class: 'kvw-error', role: 'alert' });
    this.chart = svg('svg', { class: 'kvw-svg krl-chart', role: 'img', viewBox: `0 0 ${PLOT.w} ${PLOT.h}`, width: PLOT.w, height: PLOT.h });
    this.figures = h('dl', { class: 'kvw-figures' });
    this.lessonEl = h('p', { class: 'krl-lesson', 'data-lesson': '' });
    this.body.append(
      this.picker.row('Which steps', this.picker.badge),
      controlRow('Batch size', h('label', { for: this.slider.id }, 'Requests decoded together'), this.slider, this.batchOut, this.runButton),
      this.errorEl,
      h('div', { class: 'krl-figure' }, h('div', { class: 'kvw-scroll' }, this.chart), this.figures, this.lessonEl));
    this.setLegend([
      { label: 'the roof: bandwidth × intensity, then the peak FLOP/s (measured at start-up)', color: 'var(--kv-fg)', shape: 'line' },
      { label: 'one decode step', color: 'var(--kv-cat-8)', shape: 'circle' },
      { label: 'a batch size, at its fastest step (the chosen one ringed)', color: 'var(--kv-cat-1)', shape: 'circle' },
    ]);
    this.onModeChange(this.client.mode);
    namedRecordingEvents(RECORDING).then((events) => {
      this.recordedDevice = events.find((e) => e.type === 'hello').device;
      for (const e of events) if (e.type === 'step') this.recorded.add(e);
      this.dataset.recordedBatches = String(this.recorded.points().length);
      this.fitSlider();
    });
  }

  get batches() { return this.source === 'live' ? this.live : this.recorded; }

  get device() { return this.source === 'live' ? this.client.hello && this.client.hello.device : this.recordedDevice; }

  /** Live: batch sizes up to what a sweep may keep in flight (the learner's cap, stated by
   * the server); recorded: the batch sizes it has. */
  get choices() {
    if (this.source === 'recorded') return this.recorded.points().map((p) => p.batch);
    const limits = this.client.session && this.client.session.limits;
    const instructor = this.client.session && this.client.session.role === 'instructor';
    const most = instructor ? LIVE_BATCHES[LIVE_BATCHES.length - 1] : (limits && limits.max_sweep_in_flight) || 4;
    return LIVE_BATCHES.filter((n) => n <= most);
  }

  fitSlider() {
    const choices = this.choices;
    this.slider.max = String(Math.max(0, choices.length - 1));
    const i = choices.indexOf(this.batch);
    this.slider.value = String(i >= 0 ? i : choices.length - 1);
    this.pick();
  }

  pick() {
    const choices = this.choices;
    this.batch = choices[Number(this.slider.value)] ?? 1;
    this.batchOut.textContent = `${this.batch}`;
    this.slider.setAttribute('aria-valuetext', `${this.batch} request${this.batch === 1 ? '' : 's'}`);
    this.runButton.textContent = `Run ${this.batch} of my requests together`;
    this.requestRender();
  }

  onModeChange(mode) {
    this.runButton.hidden = this.source !== 'live';
    this.picker.followMode(mode);
  }

  onEvent(event) {
    if (this.client.mode !== 'live') return;
    const session = this.client.session;
    if (event.type === 'request.added' && session && event.owner === session.client_id) this.mine.add(event.request_id);
    else if (event.type === 'step' && event.seqs.length && event.seqs.every((s) => this.mine.has(s.request_id))) {
      this.live.add(event);
      if (this.source === 'live') this.requestRender();
    }
  }

  show(source) {
    this.source = source;
    this.picker.value = source;
    this.runButton.hidden = source !== 'live';
    this.fitSlider();
  }

  runLive() {
    const n = this.batch;
    return runBusy(this, this.runButton, this.errorEl, async () => {
      let finished = 0;
      let expected = Infinity;   // the server says how many requests its one level runs
      let resolveDone;
      const done = new Promise((resolve) => { resolveDone = resolve; });
      const off = this.client.on('request.finished', (e) => {
        if (!this.mine.has(e.request_id)) return;
        finished += 1;
        if (finished >= expected) resolveDone();
      });
      let ack;
      try {
        ack = await this.client.command('sweep', { levels: [n], max_tokens: MAX_TOKENS });
      } catch (error) {
        off();
        throw error;
      }
      expected = ack.requests[0];
      if (finished >= expected) resolveDone();
      this.announce(`Running ${n} of your requests together…`);
      await done;
      off();
      this.dataset.liveRuns = String(Number(this.dataset.liveRuns || 0) + 1);
      this.requestRender();
      const p = this.live.points(1).find((q) => q.batch === n);
      if (p) this.announce(`${n} together: ${p.intensity.toFixed(2)} FLOP per byte, ${fmtFlops(p.flops)}.`);
    });
  }

  render() {
    const device = this.device;
    const points = this.batches.points(this.source === 'live' ? 1 : 3);
    const chosen = points.find((p) => p.batch === this.batch) || null;
    this.dataset.source = this.source;
    this.dataset.batch = String(this.batch);
    if (chosen) {
      this.dataset.intensity = chosen.intensity.toFixed(4);
      this.dataset.flops = String(Math.round(chosen.flops));
    } else {
      delete this.dataset.intensity;
      delete this.dataset.flops;
    }
    if (!device) {
      this.chart.replaceChildren();
      this.lessonEl.textContent = 'Loading…';
      return;
    }
    const bw = device.peak_bandwidth_bytes_per_s;
    const peak = device.peak_flops;
    const ridge = peak / bw;
    this.drawChart(points, chosen, bw, peak, ridge);
    const roofAt = (i) => Math.min(peak, bw * i);
    const fig = (label, value, key) => h('div', {}, h('dt', {}, label), h('dd', { [`data-${key}`]: '' }, value));
    this.figures.replaceChildren(
      fig('memory ceiling (the slope)', `${formatSI(bw)}B/s`, 'bw'), fig('compute ceiling', fmtFlops(peak), 'peak'),
      fig('ridge point', `${ridge.toFixed(1)} FLOP/byte`, 'ridge'),
      fig(`batch of ${this.batch}: intensity`, chosen ? `${chosen.intensity.toFixed(2)} FLOP/byte` : '—', 'x'),
      fig('achieved', chosen ? fmtFlops(chosen.flops) : '—', 'y'),
      fig('the roof there', chosen ? fmtFlops(roofAt(chosen.intensity)) : '—', 'roof'));
    if (!chosen) {
      this.lessonEl.textContent = this.source === 'live'
        ? `No decode step of ${this.batch} of your requests yet: press the button to run them together.`
        : 'Loading the recorded steps…';
      return;
    }
    const perRequest = chosen.intensity / chosen.batch;
    const bound = chosen.intensity < ridge ? 'memory-bound: left of the ridge, under the slope' : 'compute-bound: right of the ridge, under the flat roof';
    const above = chosen.flops > roofAt(chosen.intensity)
      ? ' The point sits above the roof: this small model’s weights fit in the processor’s caches, which are faster than the memory the roof was measured on.' : '';
    this.lessonEl.textContent = `${chosen.batch} request${chosen.batch === 1 ? '' : 's'} per step (the fastest of ${chosen.steps.length} steps): `
      + `${chosen.intensity.toFixed(2)} FLOPs per byte, ${fmtFlops(chosen.flops)}, ${bound}. Each request adds about `
      + `${perRequest.toFixed(2)} FLOP per byte, because all of them share one read of the weights; the ridge at ${ridge.toFixed(1)} `
      + `${chosen.intensity < ridge ? 'would take' : 'was passed at'} about ${formatInt(Math.ceil(ridge / perRequest))} requests in one step.${above}`;
  }

  drawChart(points, chosen, bw, peak, ridge) {
    const all = points.flatMap((p) => p.steps);
    const xs = [...all.map((s) => s.intensity), ridge];
    const ys = [...all.map((s) => s.flops), peak];
    const x0 = 10 ** Math.floor(Math.log10(Math.min(...xs) / 2));
    const x1 = 10 ** Math.ceil(Math.log10(Math.max(...xs) * 3));
    const y0 = 10 ** Math.floor(Math.log10(Math.min(...ys, bw * x0) / 2));
    const y1 = 10 ** Math.ceil(Math.log10(Math.max(...ys) * 2));
    const { w, h: hh, left, right, top, bottom } = PLOT;
    const X = (v) => left + ((Math.log10(v) - Math.log10(x0)) / (Math.log10(x1) - Math.log10(x0))) * (w - left - right);
    const Y = (v) => hh - bottom - ((Math.log10(v) - Math.log10(y0)) / (Math.log10(y1) - Math.log10(y0))) * (hh - top - bottom);
    const nodes = [];
    for (let v = x0; v <= x1 * 1.001; v *= 10) {
      nodes.push(svg('line', { class: 'krl-grid', x1: X(v), x2: X(v), y1: top, y2: hh - bottom }),
        svg('text', { x: X(v), y: hh - bottom + 14, 'text-anchor': 'middle', class: 'kvw-soft' }, formatSI(v)));
    }
    for (let v = y0; v <= y1 * 1.001; v *= 10) {
      nodes.push(svg('line', { class: 'krl-grid', x1: left, x2: w - right, y1: Y(v), y2: Y(v) }),
        svg('text', { x: left - 6, y: Y(v) + 4, 'text-anchor': 'end', class: 'kvw-soft' }, formatSI(v)));
    }
    nodes.push(svg('text', { x: (left + w - right) / 2, y: hh - 6, 'text-anchor': 'middle' }, 'arithmetic intensity (FLOPs per byte moved, log scale)'),
      svg('text', { x: 12, y: (top + hh - bottom) / 2, 'text-anchor': 'middle', transform: `rotate(-90 12 ${(top + hh - bottom) / 2})` }, 'FLOP/s (log scale)'));
    // the roof: the slope from the left edge to the ridge, then flat
    const xStart = Math.max(x0, y0 / bw);
    nodes.push(svg('polyline', { class: 'krl-roof', points: `${X(xStart)},${Y(bw * xStart)} ${X(ridge)},${Y(peak)} ${X(x1)},${Y(peak)}` }),
      svg('line', { x1: X(ridge), x2: X(ridge), y1: Y(peak), y2: hh - bottom, stroke: 'var(--kv-fg-soft)', 'stroke-dasharray': '4 3' }),
      svg('text', { x: X(ridge) + 4, y: hh - bottom - 6 }, `ridge ${ridge.toFixed(1)}`),
      // the slope is named in the figures under the plot: a label on it would sit among the decode points
      svg('text', { x: X(x1) - 4, y: Y(peak) - 6, 'text-anchor': 'end' }, `compute: ${fmtFlops(peak)}`));
    for (const s of all) nodes.push(svg('circle', { class: 'krl-dot', cx: X(s.intensity), cy: Y(s.flops), r: 2.5 }));
    points.forEach((p, i) => {
      const color = `var(--kv-cat-${(i % 7) + 1})`;
      nodes.push(svg('circle', { class: 'krl-point', cx: X(p.intensity), cy: Y(p.flops), r: 6, fill: color, 'data-batch': p.batch, 'data-x': X(p.intensity).toFixed(1), 'data-y': Y(p.flops).toFixed(1) },
        svg('title', {}, `${p.batch} at once: ${p.intensity.toFixed(2)} FLOP/byte, ${fmtFlops(p.flops)}`)),
      svg('text', { x: X(p.intensity), y: Y(p.flops) + 18, 'text-anchor': 'middle' }, `${p.batch}`));
    });
    if (chosen) nodes.push(svg('circle', { class: 'krl-chosen', cx: X(chosen.intensity), cy: Y(chosen.flops), r: 10 }));
    this.chart.setAttribute('aria-label', `Roofline: memory ceiling ${formatSI(bw)}B/s, compute ceiling ${fmtFlops(peak)}, ridge at ${ridge.toFixed(1)} FLOP per byte. `
      + points.map((p) => `${p.batch} at once: ${p.intensity.toFixed(2)} FLOP per byte, ${fmtFlops(p.flops)}`).join('; ') + '.');
    this.chart.replaceChildren(...nodes);
  }

  exportData() {
    return { source: this.source, batch: this.batch, device: this.device,
      points: this.batches.points(1).map(({ batch, intensity, flops, steps }) => ({ batch, intensity, flops, steps })) };
  }
}

customElements.define('kv-roofline', KvRoofline);
