// <kv-throughput>: throughput against latency, measured. Each press of Run asks the server for
// a measured run (the `measure` command): it keeps so many of the learner's own requests in
// flight, adding the next the moment one finishes, so what the run measures is the engine —
// not the page's round trips, and never the learner's submit limit (a run counts as one
// submit). The plot: output tokens per second against time to first token and inter-token
// latency (p50 and p90). Points accumulate into the curve. An instructor also gets the
// engine's sequence cap and token budget, applied before the run.
// Without a live engine it plots the runs the project recorded (frontend/recordings/throughput).

import { KvWidget, formatInt, formatSeconds, formatFloat } from '../widget-base.js';
import { h, svg } from './lib/svg.js';
import { injectStyle, modeText } from './lib/style.js';
import { percentile } from './lib/request-trace.js';
import { namedRecordingEvents } from './lib/recording.js';
import { setBusy, isBusy } from './lib/busy.js';

const RUN_GAP_S = 0.3;   // scripts/make_recordings.py pauses 0.5 s between runs
const W = 560;
const H = 276;
const PAD = { left: 56, right: 16, top: 12, bottom: 72 };
const LABEL_ROWS = 4;   // concurrency labels under the axis: close runs go on the next row, not on each other
const LABEL_GAP = 26;   // px a label needs beside another on its row
const SERIES = [
  ['ttft_p50', 'TTFT p50', 'var(--kv-cat-2)', 'circle'],
  ['ttft_p90', 'TTFT p90', 'var(--kv-cat-2)', 'ring'],
  ['itl_p50', 'inter-token p50', 'var(--kv-cat-1)', 'square'],
  ['itl_p90', 'inter-token p90', 'var(--kv-cat-1)', 'box'],
];

const STYLE = `
kv-throughput .ktp-knobs { display: flex; flex-wrap: wrap; gap: .5rem 1rem; align-items: end; }
kv-throughput .ktp-knobs label { display: flex; flex-direction: column; font-size: .85rem; color: var(--kv-fg-soft); }
kv-throughput svg:focus-visible { outline: 3px solid var(--kv-focus); outline-offset: 2px; }
kv-throughput table { border-collapse: collapse; font-size: .82rem; font-variant-numeric: tabular-nums; width: 100%; }
kv-throughput th, kv-throughput td { padding: .15rem .35rem; border-bottom: 1px solid var(--kv-border); text-align: right; }
kv-throughput th { font-weight: 600; vertical-align: bottom; }
kv-throughput td { white-space: nowrap; }
kv-throughput .ktp-measured { margin: .2rem 0 .4rem; }
`;

/** The figures of one finished run, from its requests' `request.added` and `request.finished` events. */
export function runReport(added, finished, setting) {
  const start = Math.min(...added.map((e) => e.ts));
  const end = Math.max(...finished.map((e) => e.ts));
  const tokens = finished.reduce((a, e) => a + e.num_output_tokens, 0);
  const ttft = finished.map((e) => e.ttft_s).filter((v) => v !== null);
  const itl = finished.flatMap((e) => e.itl_s);
  return {
    ...setting, requests: finished.length, tokens, seconds: end - start, throughput: tokens / (end - start),
    ttft_p50: percentile(ttft, 0.5), ttft_p90: percentile(ttft, 0.9), itl_p50: percentile(itl, 0.5), itl_p90: percentile(itl, 0.9),
  };
}

/** A recording's runs: requests that follow each other with less than RUN_GAP_S between one's
 * finish and the next one's arrival form one run; its concurrency is the most of them in
 * flight at once. Each run's report comes from runReport, as live. */
export function recordedRuns(events) {
  const added = new Map(events.filter((e) => e.type === 'request.added').map((e) => [e.request_id, e]));
  const done = events.filter((e) => e.type === 'request.finished' && added.has(e.request_id))
    .sort((a, b) => added.get(a.request_id).ts - added.get(b.request_id).ts);
  const runs = [];
  let run = null;
  for (const f of done) {
    const start = added.get(f.request_id).ts;
    if (!run || start > run.end + RUN_GAP_S) runs.push(run = { finished: [], end: -Infinity });
    run.finished.push(f);
    run.end = Math.max(run.end, f.ts);
  }
  return runs.map(({ finished }) => {
    const spans = finished.map((f) => [added.get(f.request_id).ts, f.ts]);
    const concurrency = Math.max(...spans.map(([s]) => spans.filter(([a, b]) => a <= s && s < b).length));
    return runReport(finished.map((f) => added.get(f.request_id)), finished,
      { concurrency, total: finished.length, max_tokens: Math.max(...finished.map((f) => f.num_output_tokens)), recorded: true });
  });
}

class KvThroughput extends KvWidget {
  static events = ['request'];
  static requires = ['requests'];
  static label = 'Throughput against latency, measured';

  setup() {
    injectStyle('kv-throughput', STYLE);
    this.points = [];
    this.recorded = [];          // the project's recorded runs, shown without a live engine
    this.run = null;
    namedRecordingEvents('throughput').then((events) => {
      this.recorded = recordedRuns(events);
      this.requestRender();
    });
    this.modeBadge = h('span', { class: 'kvw-mode' });
    const number = (label, value, min, max) => {
      const input = h('input', { class: 'kvw-input', type: 'number', value, min, max, step: 1 });
      return [h('label', {}, label, input), input];
    };
    let label;
    [label, this.concurrencyInput] = number('Requests in flight', 1, 1, 4);
    const concurrencyLabel = label;
    [label, this.totalInput] = number('Requests in the run', 8, 1, 16);
    const totalLabel = label;
    [label, this.tokensInput] = number('Tokens each', 24, 4, 64);
    const tokensLabel = label;
    [label, this.seqsInput] = number('Sequence cap (instructor)', 64, 1, 256);
    this.seqsLabel = label;
    [label, this.budgetInput] = number('Token budget (instructor)', 256, 16, 8192);
    this.budgetLabel = label;
    this.runButton = h('button', { type: 'button', class: 'kvw-btn kvw-btn--primary', onclick: () => { if (!isBusy(this.runButton)) this.start(); } }, 'Run');
    this.clearButton = h('button', { type: 'button', class: 'kvw-btn', onclick: () => { this.points = []; this.requestRender(); } }, 'Clear points');
    this.errorEl = h('p', { class: 'kvw-error', role: 'alert' });
    this.measuredEl = h('p', { class: 'kvw-note ktp-measured' });
    this.chart = svg('svg', { class: 'kvw-svg', role: 'img', tabindex: '0', width: W, height: H, viewBox: `0 0 ${W} ${H}` });
    this.table = h('table', { 'aria-label': 'Every run: its setting and what it measured' });
    this.body.append(
      h('div', { class: 'ktp-knobs', role: 'group', 'aria-label': 'Load settings' }, concurrencyLabel, totalLabel, tokensLabel, this.seqsLabel, this.budgetLabel,
        this.runButton, this.clearButton, this.modeBadge),
      this.errorEl, this.measuredEl, h('div', { class: 'kvw-scroll' }, this.chart), h('div', { class: 'kvw-scroll' }, this.table),
    );
    this.setLegend(SERIES.map(([, name, color, shape]) => ({ label: `${name} (${shape})`, color, shape: shape === 'circle' || shape === 'ring' ? 'circle' : 'square' })));
    this.updateMode(this.client.mode);
  }

  onModeChange(mode) {
    this.updateMode(mode);
    this.requestRender();
    if (mode === 'replay') this.announce('Without a live engine: the runs the project recorded on it (6 requests with 1, 2 and 4 in flight). Press Run when it is back.');
  }

  updateMode(mode) {
    this.modeBadge.className = `kvw-mode kvw-mode--${mode}`;
    this.modeBadge.textContent = modeText(mode);
    const instructor = this.client.session && this.client.session.role === 'instructor';
    // attached to vLLM its caps are its own, set when it started: no knob to turn here
    this.seqsLabel.hidden = !instructor || this.attached;
    this.budgetLabel.hidden = !instructor || this.attached;
    const limits = this.client.session && this.client.session.limits;
    if (limits && limits.max_active_requests) this.concurrencyInput.max = String(instructor ? 64 : limits.max_active_requests);
    this.runButton.disabled = mode !== 'live';
    setBusy(this.runButton, Boolean(this.run));   // busy, not disabled: focus stays on Run
    this.measuredEl.textContent = mode === 'live' && this.attached
      ? 'What a run measures: the server keeps your requests in flight against the attached vLLM server, the number you ask for, and sends the next one the moment one finishes (the same story prompts, sampled, every token counted). Times are taken at vLLM’s API, so they include the network between kvscope and vLLM; vLLM’s own scheduler caps apply (set when it started, not from this page).'
      : mode === 'live'
      ? 'What a run measures: the server keeps your requests in flight, the number you ask for, and adds the next one the moment one finishes (the same story prompts, sampled, every token counted), so the figures are the engine’s — a run counts as one submit against your limit.'
      : 'The runs the project recorded on the embedded model, each driven as a live run is (scripts/make_recordings.py).';
  }

  get attached() {
    return this.client.hello?.backend?.engine === 'vllm';
  }

  async start() {
    this.errorEl.textContent = '';
    const clamp = (input) => Math.max(Number(input.min), Math.min(Number(input.max), Math.round(Number(input.value) || 1)));
    const setting = { concurrency: clamp(this.concurrencyInput), total: clamp(this.totalInput), max_tokens: clamp(this.tokensInput) };
    try {
      if (this.client.session && this.client.session.role === 'instructor' && !this.attached) {
        const ack = await this.client.command('set_knobs', { max_num_seqs: clamp(this.seqsInput), max_num_batched_tokens: clamp(this.budgetInput) });
        Object.assign(setting, { max_num_seqs: ack.knobs.max_num_seqs, token_budget: ack.knobs.max_num_batched_tokens });
      }
    } catch (error) {
      this.errorEl.textContent = this.describeError(error);
      return;
    }
    setting.concurrency = Math.min(setting.concurrency, setting.total);
    this.run = { setting, added: [], finished: [] };
    this.updateMode(this.client.mode);
    this.announce(`Running ${setting.total} requests, ${setting.concurrency} at a time…`);
    try {
      await this.client.command('measure', { concurrency: setting.concurrency, total: setting.total, max_tokens: setting.max_tokens });
    } catch (error) {
      this.errorEl.textContent = this.describeError(error);
      this.announce('The run did not start.');   // the "Running…" line must not stay
      this.run = null;
      this.updateMode(this.client.mode);
    }
  }

  onEvent(event) {
    const run = this.run;
    if (!run) return;
    if (event.type === 'request.added' && event.owner === (this.client.session && this.client.session.client_id)) run.added.push(event);
    if (event.type !== 'request.finished' || !run.added.some((e) => e.request_id === event.request_id)) return;
    run.finished.push(event);
    if (run.finished.length === run.setting.total) {   // (the server adds the next ones itself)
      const ids = new Set(run.finished.map((e) => e.request_id));
      this.points.push(runReport(run.added.filter((e) => ids.has(e.request_id)), run.finished, run.setting));
      this.run = null;
      this.dataset.points = String(this.points.length);
      this.updateMode(this.client.mode);
      const p = this.points[this.points.length - 1];
      const failed = run.finished.filter((e) => e.reason === 'error');
      // one line when some requests failed (vLLM gone mid-run, say): the point counts the rest
      this.errorEl.textContent = failed.length ? `${failed.length} of ${run.finished.length} requests failed: ${failed[0].error}` : '';
      this.announce(`${p.concurrency} in flight: ${formatFloat(p.throughput, 1)} tokens/s, first token p50 ${formatSeconds(p.ttft_p50)}, inter-token p50 ${formatSeconds(p.itl_p50)}.`);
      this.requestRender();
    }
  }

  render() {
    const pts = this.isLive ? this.points : this.recorded;
    const maxX = Math.max(1, ...pts.map((p) => p.throughput)) * 1.1;
    const maxY = Math.max(0.001, ...pts.flatMap((p) => SERIES.map(([k]) => p[k] || 0))) * 1.1;
    const x = (v) => PAD.left + (v / maxX) * (W - PAD.left - PAD.right);
    const y = (v) => H - PAD.bottom - (v / maxY) * (H - PAD.top - PAD.bottom);
    const nodes = [
      svg('line', { x1: PAD.left, x2: W - PAD.right, y1: H - PAD.bottom, y2: H - PAD.bottom, stroke: 'var(--kv-fg-soft)' }),
      svg('line', { x1: PAD.left, x2: PAD.left, y1: PAD.top, y2: H - PAD.bottom, stroke: 'var(--kv-fg-soft)' }),
      svg('text', { x: (W + PAD.left) / 2, y: H - 6, 'font-size': 11, 'text-anchor': 'middle' }, 'throughput, output tokens per second →'),
      svg('text', { x: PAD.left + 6, y: PAD.top + 6, 'font-size': 11 }, '↑ latency'),
    ];
    // Scale ends only once there is a point: before the first run they would be made-up numbers.
    if (pts.length) nodes.push(
      svg('text', { x: PAD.left - 4, y: PAD.top + 10, 'font-size': 10, 'text-anchor': 'end', class: 'kvw-soft' }, formatSeconds(maxY)),
      svg('text', { x: W - PAD.right, y: H - PAD.bottom - 4, 'font-size': 10, 'text-anchor': 'end', class: 'kvw-soft' }, `${formatFloat(maxX, 1)} tok/s`),
    );
    for (const [key, name, color, shape] of SERIES) {
      const line = pts.filter((p) => p[key] !== null).sort((a, b) => a.throughput - b.throughput);
      if (line.length > 1) nodes.push(svg('polyline', { points: line.map((p) => `${x(p.throughput)},${y(p[key])}`).join(' '), fill: 'none', stroke: color, 'stroke-width': 1, 'stroke-dasharray': shape === 'ring' || shape === 'box' ? '3 3' : null }));
      pts.forEach((p, i) => {
        if (p[key] === null) return;
        const cx = x(p.throughput);
        const cy = y(p[key]);
        const filled = shape === 'circle' || shape === 'square';
        const attrs = { fill: filled ? color : 'var(--kv-bg)', stroke: color, 'stroke-width': 2, 'data-point': i, 'data-series': key };
        const mark = shape === 'circle' || shape === 'ring' ? svg('circle', { cx, cy, r: 5, ...attrs }) : svg('rect', { x: cx - 4.5, y: cy - 4.5, width: 9, height: 9, ...attrs });
        mark.append(svg('title', {}, `${p.concurrency} in flight: ${formatFloat(p.throughput, 1)} tok/s, ${name} ${formatSeconds(p[key])}`));
        nodes.push(mark);
      });
    }
    // Each run's concurrency under its throughput, with a tick; a run too close to one already
    // labelled goes on the next row down, so no two labels overlap.
    const rowEnds = Array(LABEL_ROWS).fill(-Infinity);
    for (const p of [...pts].sort((a, b) => a.throughput - b.throughput || a.concurrency - b.concurrency)) {
      const at = x(p.throughput);
      let row = rowEnds.findIndex((end) => at - end >= LABEL_GAP);
      if (row < 0) row = rowEnds.indexOf(Math.min(...rowEnds));
      rowEnds[row] = at;
      nodes.push(svg('line', { x1: at, x2: at, y1: H - PAD.bottom, y2: H - PAD.bottom + 4 + row * 12, stroke: 'var(--kv-fg-soft)', 'stroke-width': 0.75 }),
        svg('text', { x: at, y: H - PAD.bottom + 14 + row * 12, 'font-size': 10, 'text-anchor': 'middle', class: 'kvw-soft', 'data-label': p.concurrency }, `×${p.concurrency}`));
    }
    if (!pts.length) nodes.push(svg('text', { x: W / 2, y: H / 2, 'text-anchor': 'middle', 'font-size': 12, class: 'kvw-soft' }, this.isLive ? 'Press Run: each run adds a point per latency.' : 'Loading the recorded runs…'));
    this.dataset.shown = this.isLive ? 'live' : 'recorded';
    this.chart.replaceChildren(...nodes);
    this.chart.setAttribute('aria-label', `Throughput against latency: ${pts.length} runs. ${pts.map((p) => `${p.concurrency} in flight: ${formatFloat(p.throughput, 1)} tokens per second, first token p50 ${formatSeconds(p.ttft_p50)}, inter-token p50 ${formatSeconds(p.itl_p50)}`).join('; ')}`);
    // Seven columns that fit a 30rem side column: the inter-token ones are the lesson's other half.
    const head = h('tr', {}, ...['in flight', 'tok/s', 'TTFT p50', 'TTFT p90', 'inter-token p50', 'inter-token p90', 'run took'].map((c) => h('th', { scope: 'col' }, c)));
    this.table.replaceChildren(h('thead', {}, head), h('tbody', {}, ...pts.map((p) => h('tr', { title: `${p.requests} requests, ${formatInt(p.tokens)} tokens` },
      ...[p.concurrency, formatFloat(p.throughput, 1), formatSeconds(p.ttft_p50), formatSeconds(p.ttft_p90), formatSeconds(p.itl_p50), formatSeconds(p.itl_p90),
        `${formatFloat(p.seconds, 2)} s`].map((v) => h('td', {}, String(v)))))));
  }

  exportData() {
    return { points: this.points, recorded: this.recorded };
  }
}

customElements.define('kv-throughput', KvThroughput);
