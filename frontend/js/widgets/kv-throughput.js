// <kv-throughput>: throughput against latency, measured at rising load. One press of Run asks
// the server for a sweep (the `sweep` command): at each level (1, 2, 4, … requests in flight)
// it keeps that many of the learner's own requests in flight, adding the next the moment one
// finishes, so what it measures is the engine, not the page's round trips. The whole sweep is
// one job: one submit, one request of the learner's in-flight limit; its top level is capped
// by the instructor (session.limits.max_sweep_in_flight), and the widget says so when the
// number typed is above it. Three panels share the in-flight axis: output tokens per second,
// inter-token latency and time to first token (p50 and p90), so the knee is where the first
// flattens while the others climb. An instructor also gets the engine's sequence cap and
// token budget, applied before the sweep.
// Without a live engine it plots the sweep the project recorded (frontend/recordings/throughput).

import { KvWidget, formatInt, formatSeconds, formatFloat } from '../widget-base.js';
import { h, svg } from './lib/svg.js';
import { injectStyle } from './lib/style.js';
import { percentile } from './lib/request-trace.js';
import { namedRecordingEvents } from './lib/recording.js';
import { setBusy, isBusy } from './lib/busy.js';
import { modeBadge, showMode } from './lib/controls.js';

const RUN_GAP_S = 0.3;   // the server pauses 0.5 s between a sweep's levels
const INSTRUCTOR_TOP = 256;
const DEFAULT_TOP = 32;
const W = 560;
const PANEL_H = 112;
const PAD = { left: 64, right: 16, top: 18, bottom: 8 };
const AXIS_H = 34;
// [key of the figure, name, colour, dashed?]
const PANELS = [
  { title: 'throughput, output tokens/s', unit: 'tok/s', series: [['throughput', 'throughput', 'var(--kv-cat-3)', false]] },
  { title: 'inter-token latency', unit: 's', series: [['itl_p50', 'inter-token p50', 'var(--kv-cat-1)', false], ['itl_p90', 'inter-token p90', 'var(--kv-cat-1)', true]] },
  { title: 'time to first token', unit: 's', series: [['ttft_p50', 'TTFT p50', 'var(--kv-cat-2)', false], ['ttft_p90', 'TTFT p90', 'var(--kv-cat-2)', true]] },
];
const H = PANELS.length * PANEL_H + AXIS_H;

const STYLE = `
kv-throughput .ktp-knobs { display: flex; flex-wrap: wrap; gap: .5rem 1rem; align-items: end; }
kv-throughput .ktp-knobs label { display: flex; flex-direction: column; font-size: .85rem; color: var(--kv-fg-soft); }
kv-throughput svg:focus-visible { outline: 3px solid var(--kv-focus); outline-offset: 2px; }
kv-throughput table { border-collapse: collapse; font-size: .82rem; font-variant-numeric: tabular-nums; width: 100%; }
kv-throughput th, kv-throughput td { padding: .15rem .35rem; border-bottom: 1px solid var(--kv-border); text-align: right; }
kv-throughput th { font-weight: 600; vertical-align: bottom; }
kv-throughput td { white-space: nowrap; }
kv-throughput .ktp-measured, kv-throughput .ktp-levels { margin: .2rem 0 .4rem; }
kv-throughput .ktp-cap { margin: .2rem 0; padding: .3rem .5rem; border-left: 3px solid var(--kv-cat-2); }
kv-throughput .ktp-summary { margin: .3rem 0; font-weight: 600; }
`;

/** The levels of a sweep up to `top`: doublings from 1, and `top` itself. */
export function sweepLevels(top) {
  const levels = [];
  for (let n = 1; n < top; n *= 2) levels.push(n);
  return [...levels, top];
}

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

/** One sentence on the sweep's shape: what the last doubling bought and what it cost. */
export function sweepSummary(points) {
  if (points.length < 2) return '';
  const [first, last] = [points[0], points[points.length - 1]];
  const prev = points[points.length - 2];
  const pct = (a, b) => `${b >= a ? '+' : '−'}${formatFloat(Math.abs(b / a - 1) * 100, 0)} %`;
  return `From ${first.concurrency} to ${last.concurrency} in flight: throughput ${formatFloat(first.throughput, 0)} → ${formatFloat(last.throughput, 0)} tok/s, `
    + `inter-token p50 ${formatSeconds(first.itl_p50)} → ${formatSeconds(last.itl_p50)}, TTFT p50 ${formatSeconds(first.ttft_p50)} → ${formatSeconds(last.ttft_p50)}. `
    + `The last step (${prev.concurrency} → ${last.concurrency}) changed throughput ${pct(prev.throughput, last.throughput)} and inter-token p50 ${pct(prev.itl_p50, last.itl_p50)}.`;
}

class KvThroughput extends KvWidget {
  static events = ['request'];
  static requires = ['requests'];
  static label = 'Throughput against latency, measured';

  setup() {
    injectStyle('kv-throughput', STYLE);
    this.points = [];
    this.recorded = [];          // the project's recorded sweep, shown without a live engine
    this.run = null;
    namedRecordingEvents('throughput').then((events) => {
      this.recorded = recordedRuns(events);
      this.requestRender();
    });
    this.modeBadge = modeBadge();
    const number = (label, value, min, max) => {
      const input = h('input', { class: 'kvw-input', type: 'number', value, min, max, step: 1 });
      return [h('label', {}, label, input), input];
    };
    let label;
    [label, this.topInput] = number('Most requests in flight', DEFAULT_TOP, 1, INSTRUCTOR_TOP);
    const topLabel = label;
    [label, this.tokensInput] = number('Tokens each', 24, 4, 64);
    const tokensLabel = label;
    [label, this.seqsInput] = number('Sequence cap (instructor)', 64, 1, 256);
    this.seqsLabel = label;
    [label, this.budgetInput] = number('Token budget (instructor)', 256, 16, 8192);
    this.budgetLabel = label;
    this.topInput.addEventListener('input', () => this.showLevels());
    this.runButton = h('button', { type: 'button', class: 'kvw-btn kvw-btn--primary', onclick: () => { if (!isBusy(this.runButton)) this.start(); } }, 'Run the sweep');
    this.errorEl = h('p', { class: 'kvw-error', role: 'alert' });
    this.levelsEl = h('p', { class: 'kvw-note ktp-levels', 'data-levels': '' });
    this.capEl = h('p', { class: 'kvw-note ktp-cap', role: 'status', hidden: true });
    this.measuredEl = h('p', { class: 'kvw-note ktp-measured' });
    this.summaryEl = h('p', { class: 'ktp-summary', 'aria-live': 'polite' });
    this.chart = svg('svg', { class: 'kvw-svg', role: 'img', tabindex: '0', width: W, height: H, viewBox: `0 0 ${W} ${H}` });
    this.table = h('table', { 'aria-label': 'Every level of the sweep: its setting and what it measured' });
    this.body.append(
      h('div', { class: 'ktp-knobs', role: 'group', 'aria-label': 'Sweep settings' }, topLabel, tokensLabel, this.seqsLabel, this.budgetLabel,
        this.runButton, this.modeBadge),
      this.levelsEl, this.capEl, this.errorEl, this.measuredEl, this.summaryEl,
      h('div', { class: 'kvw-scroll' }, this.chart), h('div', { class: 'kvw-scroll' }, this.table),
    );
    this.setLegend(PANELS.flatMap((p) => p.series).map(([, name, color, dashed]) => ({ label: `${name}${dashed ? ' (dashed)' : ''}`, color })));
    this.updateMode(this.client.mode);
  }

  onModeChange(mode) {
    this.updateMode(mode);
    this.requestRender();
    if (mode === 'replay') this.announce('Without a live engine: the sweep the project recorded on it. Press Run the sweep when it is back.');
  }

  get instructor() {
    return Boolean(this.client.session && this.client.session.role === 'instructor');
  }

  /** The top level a learner may reach (the instructor's limit), or null when none applies. */
  get cap() {
    const limits = this.client.session && this.client.session.limits;
    return this.instructor || !limits || limits.max_sweep_in_flight === undefined ? null : limits.max_sweep_in_flight;
  }

  /** What a press of Run would run: the levels, and the number typed when the cap lowers it. */
  plan() {
    const typed = Math.max(1, Math.min(INSTRUCTOR_TOP, Math.round(Number(this.topInput.value) || 1)));
    const top = this.cap === null ? typed : Math.min(typed, this.cap);
    return { typed, top, levels: top >= 1 ? sweepLevels(top) : [] };
  }

  /** The levels line, and the cap stated whenever it lowers what was typed. */
  showLevels() {
    const { typed, top, levels } = this.plan();
    this.topInput.max = String(this.cap === null ? INSTRUCTOR_TOP : Math.max(1, this.cap));
    this.levelsEl.textContent = levels.length ? `Levels this sweep runs (requests in flight): ${levels.join(', ')}.` : '';
    this.levelsEl.dataset.levels = levels.join(',');
    const capped = this.cap !== null && typed > this.cap;
    this.capEl.hidden = !capped;
    this.capEl.textContent = !capped ? '' : this.cap === 0
      ? 'Learner sweeps are off on this server (kvscope serve --learner-max-sweep-in-flight 0); ask the instructor.'
      : `You typed ${typed}, but a learner's sweep stops at ${this.cap} in flight: the instructor's limit `
        + `(kvscope serve --learner-max-sweep-in-flight, within the learners' share of the engine). The sweep runs up to ${top}.`;
  }

  updateMode(mode) {
    showMode(this.modeBadge, mode);
    // attached to vLLM its caps are its own, set when it started: no knob to turn here
    this.seqsLabel.hidden = !this.instructor || this.attached;
    this.budgetLabel.hidden = !this.instructor || this.attached;
    this.runButton.disabled = mode !== 'live' || this.cap === 0;
    this.topInput.disabled = this.tokensInput.disabled = mode !== 'live';
    setBusy(this.runButton, Boolean(this.run));   // busy, not disabled: focus stays on Run
    this.showLevels();
    this.measuredEl.textContent = mode === 'live' && this.attached
      ? 'What a sweep measures: at each level the server keeps that many of your requests in flight against the attached vLLM server and sends the next one the moment one finishes (the same story prompts, sampled, every token counted). Times are taken at vLLM’s API, so they include the network between kvscope and vLLM; vLLM’s own scheduler caps apply (set when it started, not from this page).'
      : mode === 'live'
      ? 'What a sweep measures: at each level the server keeps that many of your requests in flight and adds the next one the moment one finishes (the same story prompts, sampled, every token counted), so the figures are the engine’s. The whole sweep counts as one submit and one of your requests in flight.'
      : 'The sweep the project recorded on the embedded model, driven as a live sweep is (scripts/make_recordings.py).';
  }

  get attached() {
    return this.client.hello?.backend?.engine === 'vllm';
  }

  async start() {
    this.errorEl.textContent = '';
    const clamp = (input) => Math.max(Number(input.min), Math.min(Number(input.max), Math.round(Number(input.value) || 1)));
    const { levels } = this.plan();
    const setting = { max_tokens: clamp(this.tokensInput) };
    try {
      if (this.instructor && !this.attached) {
        const ack = await this.client.command('set_knobs', { max_num_seqs: clamp(this.seqsInput), max_num_batched_tokens: clamp(this.budgetInput) });
        Object.assign(setting, { max_num_seqs: ack.knobs.max_num_seqs, token_budget: ack.knobs.max_num_batched_tokens });
      }
    } catch (error) {
      this.errorEl.textContent = this.describeError(error);
      return;
    }
    this.points = [];
    this.run = { setting, levels, requests: null, added: [], finished: new Map() };
    this.updateMode(this.client.mode);
    this.requestRender();
    this.announce(`Running the sweep: ${levels.join(', ')} in flight…`);
    try {
      const ack = await this.client.command('sweep', { levels, max_tokens: setting.max_tokens });
      if (this.run) this.run.requests = ack.requests;
      this.collect();
    } catch (error) {
      this.errorEl.textContent = this.describeError(error);
      this.announce('The sweep did not start.');   // the "Running…" line must not stay
      this.run = null;
      this.updateMode(this.client.mode);
    }
  }

  onEvent(event) {
    const run = this.run;
    if (!run) return;
    if (event.type === 'request.added' && event.owner === (this.client.session && this.client.session.client_id)) run.added.push(event);
    if (event.type === 'request.finished') run.finished.set(event.request_id, event);
    this.collect();
  }

  /** Each level's point once all its requests have finished: the levels run one after the
   * other, so the k-th level's requests are the next `requests[k]` of ours to arrive. */
  collect() {
    const run = this.run;
    if (!run || !run.requests) return;
    let from = run.requests.slice(0, this.points.length).reduce((a, n) => a + n, 0);
    while (this.points.length < run.levels.length) {
      const k = this.points.length;
      const added = run.added.slice(from, from + run.requests[k]);
      if (added.length < run.requests[k] || !added.every((e) => run.finished.has(e.request_id))) break;
      this.points.push(runReport(added, added.map((e) => run.finished.get(e.request_id)),
        { ...run.setting, concurrency: run.levels[k], total: run.requests[k] }));
      from += run.requests[k];
      const failed = added.filter((e) => run.finished.get(e.request_id).reason === 'error');
      // one line when some requests failed (vLLM gone mid-run, say): the point counts the rest
      this.errorEl.textContent = failed.length
        ? `${failed.length} of ${added.length} requests at ${run.levels[k]} in flight failed: ${run.finished.get(failed[0].request_id).error}` : '';
      const p = this.points[k];
      this.announce(`${p.concurrency} in flight: ${formatFloat(p.throughput, 1)} tokens/s, inter-token p50 ${formatSeconds(p.itl_p50)}, first token p50 ${formatSeconds(p.ttft_p50)}.`);
    }
    if (this.points.length === run.levels.length) {
      this.run = null;
      this.updateMode(this.client.mode);
    }
    this.requestRender();
  }

  render() {
    const pts = (this.isLive ? this.points : this.recorded).slice().sort((a, b) => a.concurrency - b.concurrency);
    const levels = this.isLive && this.run ? this.run.levels : pts.map((p) => p.concurrency);
    // in flight on a log axis: each doubling one equal step
    const maxLevel = Math.max(2, ...levels);
    const x = (n) => PAD.left + (Math.log2(n) / Math.log2(maxLevel)) * (W - PAD.left - PAD.right);
    const nodes = [];
    PANELS.forEach((panel, i) => {
      const top = i * PANEL_H + PAD.top;
      const bottom = (i + 1) * PANEL_H - PAD.bottom;
      const max = Math.max(1e-9, ...pts.flatMap((p) => panel.series.map(([k]) => p[k] || 0))) * 1.1;
      const y = (v) => bottom - (v / max) * (bottom - top);
      const fmt = (v) => (panel.unit === 's' ? formatSeconds(v) : formatFloat(v, 0));   // (the title names tok/s)
      nodes.push(
        svg('text', { x: PAD.left, y: top - 5, 'font-size': 11, 'font-weight': 600 }, panel.title),
        svg('line', { x1: PAD.left, x2: W - PAD.right, y1: bottom, y2: bottom, stroke: 'var(--kv-fg-soft)' }),
        svg('line', { x1: PAD.left, x2: PAD.left, y1: top, y2: bottom, stroke: 'var(--kv-fg-soft)' }),
        svg('text', { x: PAD.left - 4, y: bottom, 'font-size': 10, 'text-anchor': 'end', class: 'kvw-soft' }, '0'),
      );
      // scale ends only once there is a point: before the first level they would be made-up numbers
      if (pts.length) nodes.push(svg('text', { x: PAD.left - 4, y: top + 8, 'font-size': 10, 'text-anchor': 'end', class: 'kvw-soft' }, fmt(max)));
      for (const [key, name, color, dashed] of panel.series) {
        const line = pts.filter((p) => p[key] !== null && p[key] !== undefined);
        if (line.length > 1) nodes.push(svg('polyline', { points: line.map((p) => `${x(p.concurrency)},${y(p[key])}`).join(' '), fill: 'none', stroke: color, 'stroke-width': 2, 'stroke-dasharray': dashed ? '4 3' : null }));
        for (const p of line) {
          const mark = svg('circle', { cx: x(p.concurrency), cy: y(p[key]), r: 4, fill: dashed ? 'var(--kv-bg)' : color, stroke: color, 'stroke-width': 2, 'data-series': key, 'data-level': p.concurrency });
          mark.append(svg('title', {}, `${p.concurrency} in flight: ${name} ${fmt(p[key])}${panel.unit === 's' ? '' : ' tok/s'}`));
          nodes.push(mark);
        }
      }
    });
    const axisY = PANELS.length * PANEL_H;
    for (const n of levels) {
      nodes.push(svg('line', { x1: x(n), x2: x(n), y1: axisY - PAD.bottom, y2: axisY - PAD.bottom + 4, stroke: 'var(--kv-fg-soft)' }),
        svg('text', { x: x(n), y: axisY + 8, 'font-size': 10, 'text-anchor': 'middle', class: 'kvw-soft', 'data-label': n }, String(n)));
    }
    nodes.push(svg('text', { x: (W + PAD.left) / 2, y: H - 4, 'font-size': 11, 'text-anchor': 'middle' }, 'requests in flight (each step doubles) →'));
    if (!pts.length) nodes.push(svg('text', { x: W / 2, y: PANEL_H / 2, 'text-anchor': 'middle', 'font-size': 12, class: 'kvw-soft' },
      !this.isLive ? 'Loading the recorded sweep…' : this.run ? 'Running the first level…' : 'Press Run the sweep: each level adds a point to every panel.'));
    this.dataset.shown = this.isLive ? 'live' : 'recorded';
    this.dataset.points = String(pts.length);   // set as they are drawn: a reader of the table sees them all
    if (!this.isLive && pts.length) {   // the controls say what the recorded sweep ran
      this.topInput.value = String(Math.max(...pts.map((p) => p.concurrency)));
      this.tokensInput.value = String(Math.max(...pts.map((p) => p.max_tokens)));
    }
    this.showLevels();   // the session (and its cap) may arrive after the mode
    this.chart.replaceChildren(...nodes);
    this.summaryEl.textContent = sweepSummary(pts);
    this.chart.setAttribute('aria-label', `Throughput and latency against requests in flight: ${pts.length} levels. ${pts.map((p) => `${p.concurrency} in flight: ${formatFloat(p.throughput, 1)} tokens per second, inter-token p50 ${formatSeconds(p.itl_p50)}, first token p50 ${formatSeconds(p.ttft_p50)}`).join('; ')}`);
    const abbr = (short, long) => h('abbr', { title: long }, short);
    const head = h('tr', {}, ...['in flight', 'tok/s', [abbr('ITL', 'inter-token latency'), ' p50'], [abbr('ITL', 'inter-token latency'), ' p90'],
      [abbr('TTFT', 'time to first token'), ' p50'], [abbr('TTFT', 'time to first token'), ' p90'], 'took'].map((c) => h('th', { scope: 'col' }, ...[c].flat())));
    this.table.replaceChildren(h('thead', {}, head), h('tbody', {}, ...pts.map((p) => h('tr', { title: `${p.requests} requests, ${formatInt(p.tokens)} tokens` },
      ...[p.concurrency, formatFloat(p.throughput, 1), formatSeconds(p.itl_p50), formatSeconds(p.itl_p90), formatSeconds(p.ttft_p50), formatSeconds(p.ttft_p90),
        `${formatFloat(p.seconds, 2)} s`].map((v) => h('td', {}, String(v)))))));
  }

  exportData() {
    return { points: this.points, recorded: this.recorded };
  }
}

customElements.define('kv-throughput', KvThroughput);
