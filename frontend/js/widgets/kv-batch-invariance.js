// <kv-batch-invariance>: chapter 20's aside made live. One prompt drawn greedily twice, with
// each token's log-probability (`request.token`'s `logprob`, `top`): first alone, then while a
// one-level `sweep` keeps other requests in flight beside it (each run under its own cache
// salt, so the second computes everything again). Per position: both tokens, both
// logprobs, their difference, and how many requests were in flight when the crowd's token
// was drawn. Where the texts agree the difference is only rounding that changed with the
// batch's shape; the first position whose tokens differ is marked as a flip, and after it
// the two runs continue different texts, so their later differences are not counted.
// Sources: the recording (scripts/make_recordings.py, batch-invariance) or the learner's own
// two runs (two submits and one sweep: within a learner's limits).

import { KvWidget, formatInt } from '../widget-base.js';
import { h, svg } from './lib/svg.js';
import { injectStyle } from './lib/style.js';
import { namedRecordingEvents } from './lib/recording.js';
import { runBusy } from './lib/busy.js';
import { SourcePicker, controlRow } from './lib/controls.js';

const RECORDING = 'batch-invariance';
const PROMPT = 'Once upon a time';   // as the recording's (INVARIANCE_PROMPT)
const PARAMS = { temperature: 0, ignore_eos: true, max_tokens: 24, logprobs: 2 };
const CROWD = 8;                      // the sweep level beside the second run (at most the learner's sweep cap)
const CROWD_TOKENS = 32;              // the crowd's requests outlast the prompt's 24 tokens
const CHART = { w: 560, h: 150, left: 56, right: 8, top: 12, bottom: 28 };

const STYLE = `
kv-batch-invariance .kbi-figure { border: 1px solid var(--kv-border); border-radius: var(--kv-radius, 6px); padding: .5rem .6rem; }
kv-batch-invariance .kbi-chart text { font-size: 11px; }
kv-batch-invariance .kbi-bar { fill: var(--kv-cat-1); }
kv-batch-invariance .kbi-bar[data-after-flip] { fill: var(--kv-border); }
kv-batch-invariance .kbi-flip { stroke: var(--kv-cat-4); stroke-width: 2; stroke-dasharray: 4 3; }
kv-batch-invariance .kvw-table { border-collapse: collapse; font-variant-numeric: tabular-nums; margin: .4rem 0; font-size: .82rem; }
kv-batch-invariance .kvw-table caption { text-align: left; }
kv-batch-invariance .kvw-table th, kv-batch-invariance .kvw-table td { padding: .1rem .5rem .1rem 0; text-align: right; border-bottom: 1px solid var(--kv-border); white-space: nowrap; }
kv-batch-invariance .kvw-table td.kbi-token { font-family: var(--kv-font-mono); text-align: left; white-space: pre; }
kv-batch-invariance .kvw-table th[scope=col] { white-space: normal; vertical-align: bottom; }
kv-batch-invariance .kvw-table tr[data-flip] td { background: color-mix(in srgb, var(--kv-cat-4) 18%, transparent); }
kv-batch-invariance .kbi-lesson { font-size: .95rem; margin: .3rem 0; }
`;

const show = (text) => JSON.stringify(text).slice(1, -1);
const fmtLogprob = (x) => x.toFixed(7);
/** A difference of logprobs: 0 exactly, else two significant digits (they live near 1e-6). */
const fmtDelta = (x) => (x === 0 ? '0' : `${x > 0 ? '+' : '−'}${Math.abs(x).toExponential(1)}`);

/** The two runs compared position by position, and the company the second one had. */
function compare(alone, crowd, others) {
  const rows = [];
  let flip = null;
  for (let i = 0; i < Math.min(alone.tokens.length, crowd.tokens.length); i += 1) {
    const a = alone.tokens[i];
    const c = crowd.tokens[i];
    if (flip === null && a.token_id !== c.token_id) flip = i;
    const beside = others.filter((o) => o.added <= c.ts && (o.finished === null || c.ts <= o.finished)).length;
    const margin = a.top.length > 1 ? a.top[0].logprob - a.top[1].logprob : null;   // how near a tie
    rows.push({ index: i, alone: a, crowd: c, delta: c.logprob - a.logprob, beside, margin, afterFlip: flip !== null && i > flip });
  }
  const same = rows.filter((r) => !r.afterFlip && r.index !== flip);
  const maxDelta = same.length ? Math.max(...same.map((r) => Math.abs(r.delta))) : 0;
  const besides = rows.map((r) => r.beside).sort((x, y) => x - y);
  return {
    rows, flip, maxDelta, differing: same.filter((r) => r.delta !== 0).length, compared: same.length,
    medianBeside: besides.length ? besides[Math.floor(besides.length / 2)] : 0,
    closest: Math.min(...rows.filter((r) => !r.afterFlip && r.margin !== null).map((r) => r.margin)),
  };
}

/** The two runs (requests whose tokens carry logprobs, in order of arrival) and the other
 *  requests' lifetimes, from a list of events. */
function runsOf(events) {
  const tokens = new Map();
  const lives = new Map();
  for (const e of events) {
    if (e.type === 'request.token' && e.logprob !== undefined) {
      if (!tokens.has(e.request_id)) tokens.set(e.request_id, []);
      tokens.get(e.request_id).push(e);
    } else if (e.type === 'request.added') lives.set(e.request_id, { added: e.ts, finished: null });
    else if (e.type === 'request.finished' && lives.has(e.request_id)) lives.get(e.request_id).finished = e.ts;
  }
  const runs = [...tokens].map(([rid, list]) => ({ rid, tokens: list.sort((a, b) => a.index - b.index) }))
    .sort((a, b) => a.tokens[0].ts - b.tokens[0].ts);
  const others = [...lives].filter(([rid]) => !tokens.has(rid)).map(([, life]) => life);
  return runs.length >= 2 ? { alone: runs[0], crowd: runs[1], others } : null;
}

class KvBatchInvariance extends KvWidget {
  static events = ['request'];
  static requires = ['requests'];
  static label = 'The same prompt, alone and in a crowd';

  setup() {
    injectStyle('kv-batch-invariance', STYLE);
    this.recorded = null;
    this.live = null;
    this.liveEvents = [];
    this.mine = new Set();
    this.source = 'recorded';
    const uid = this.getAttribute('aria-labelledby');
    this.picker = new SourcePicker({ id: `${uid}-source`, label: 'Runs from', onChange: (source) => this.show(source),
      recorded: 'Recorded: alone, then beside 8 in flight', live: 'Live: your two runs' });
    this.runButton = h('button', { type: 'button', class: 'kvw-btn kvw-btn--primary', onclick: () => this.runLive() },
      'Run it alone, then in a crowd');
    this.errorEl = h('p', { class: 'kvw-error', role: 'alert' });
    this.chart = svg('svg', { class: 'kvw-svg kbi-chart', role: 'img', viewBox: `0 0 ${CHART.w} ${CHART.h}`, width: CHART.w, height: CHART.h });
    this.figures = h('dl', { class: 'kvw-figures' });
    this.lessonEl = h('p', { class: 'kbi-lesson', 'data-lesson': '' });
    this.tableEl = h('div', { class: 'kvw-scroll' });
    this.body.append(
      h('p', {}, `The prompt “${PROMPT}”, drawn greedily for ${PARAMS.max_tokens} tokens, twice.`),
      controlRow('Your own runs', this.runButton, this.picker.badge),
      this.errorEl,
      this.picker.row('Which runs'),
      h('div', { class: 'kbi-figure' }, h('div', { class: 'kvw-scroll' }, this.chart), this.figures, this.lessonEl, this.tableEl));
    this.setLegend([
      { label: '|crowd − alone| logprob at a position where both runs read the same text', color: 'var(--kv-cat-1)' },
      { label: 'the first position whose token differs (a flip)', color: 'var(--kv-cat-4)', shape: 'line' },
      { label: 'after a flip: different texts, not compared', color: 'var(--kv-border)' },
    ]);
    this.onModeChange(this.client.mode);
    namedRecordingEvents(RECORDING).then((events) => {
      const runs = runsOf(events);
      this.recorded = runs && compare(runs.alone, runs.crowd, runs.others);
      this.dataset.recordedPositions = String(this.recorded ? this.recorded.rows.length : 0);
      this.requestRender();
    });
  }

  get comparison() { return this.source === 'live' ? this.live : this.recorded; }

  onModeChange(mode) {
    this.runButton.disabled = mode !== 'live';
    this.picker.followMode(mode, Boolean(this.live));
  }

  onEvent(event) {
    if (this.client.mode !== 'live' || !event.type.startsWith('request.')) return;
    const session = this.client.session;
    if (event.type === 'request.added' && session && event.owner === session.client_id) this.mine.add(event.request_id);
    if (this.collecting && this.mine.has(event.request_id)) this.liveEvents.push(event);
  }

  /** Until `n` more of this page's requests have finished. */
  finishes(n) {
    let left = n;
    let off = () => {};
    const done = new Promise((resolve) => {
      off = this.client.on('request.finished', (e) => {
        if (!this.mine.has(e.request_id)) return;
        left -= 1;
        if (left <= 0) resolve();
      });
    });
    return { done, off, add: (k) => { left += k; } };
  }

  async submitPrompt(salt) {
    const ack = await this.client.command('submit', { prompt: PROMPT, params: PARAMS, cache_salt: salt });
    this.mine.add(ack.request_id);
    return ack.request_id;
  }

  runLive() {
    return runBusy(this, this.runButton, this.errorEl, async () => {
      this.liveEvents = [];
      this.collecting = true;
      const salt = `invariance-${Date.now()}`;   // neither run may reuse blocks cached by an earlier one
      const waits = [];
      try {
        const alone = this.finishes(1);
        waits.push(alone);
        await this.submitPrompt(`${salt}-alone`);
        this.announce('Running the prompt alone…');
        await alone.done;
        const limits = this.client.session && this.client.session.limits;
        const instructor = this.client.session && this.client.session.role === 'instructor';
        const level = instructor ? CROWD : Math.min(CROWD, (limits && limits.max_sweep_in_flight) || CROWD);
        const crowd = this.finishes(1);   // the prompt, and then the sweep's requests
        waits.push(crowd);
        const sweep = await this.client.command('sweep', { levels: [level], max_tokens: CROWD_TOKENS });
        crowd.add(sweep.requests[0]);
        await this.submitPrompt(`${salt}-crowd`);
        this.announce(`Running it again beside ${level} of your requests in flight…`);
        await crowd.done;
        const runs = runsOf(this.liveEvents);
        if (!runs) throw new Error('the two runs did not both report their tokens');
        this.live = compare(runs.alone, runs.crowd, runs.others);
        this.dataset.liveRuns = String(Number(this.dataset.liveRuns || 0) + 1);
        this.onModeChange(this.client.mode);
        this.show('live');
        this.announce(this.summary(this.live));
      } finally {
        this.collecting = false;
        for (const w of waits) w.off();
      }
    });
  }

  show(source) {
    this.source = source;
    this.picker.value = source;
    this.requestRender();
  }

  summary(c) {
    const flip = c.flip === null ? 'no token flipped' : `the token at position ${c.flip} flipped`;
    return `${c.compared} positions with the same text: ${c.differing} of them differ in logprob, at most by ${c.maxDelta.toExponential(1)}; ${flip}.`;
  }

  render() {
    const c = this.comparison;
    this.dataset.source = this.source;
    if (!c) {
      this.chart.replaceChildren();
      this.figures.replaceChildren();
      this.tableEl.replaceChildren();
      this.lessonEl.textContent = this.source === 'live' ? 'Press the button to run the prompt twice.' : 'Loading the recorded runs…';
      return;
    }
    this.dataset.maxDelta = String(c.maxDelta);
    this.dataset.flip = c.flip === null ? 'none' : String(c.flip);
    const fig = (label, value, key) => h('div', {}, h('dt', {}, label), h('dd', { [`data-${key}`]: '' }, value));
    this.figures.replaceChildren(
      fig('same text', c.flip === null ? 'yes, every token' : `no: first flip at position ${c.flip}`, 'same'),
      fig('max |Δ logprob| (same text)', c.maxDelta === 0 ? '0 exactly' : c.maxDelta.toExponential(2), 'max'),
      fig('positions that differ', `${c.differing} of ${c.compared}`, 'differing'),
      fig('requests in flight beside it (median)', formatInt(c.medianBeside), 'beside'),
      fig('closest tie, alone (top-1 − top-2 logprob)', Number.isFinite(c.closest) ? c.closest.toFixed(3) : '—', 'closest'));
    this.lessonEl.textContent = `${this.summary(c)} Same prompt, same greedy rule, same weights: only the batch around it changed, `
      + 'and with it how the kernels grouped their additions. A flip needs a difference larger than the gap between the top two '
      + 'tokens; batch-invariant kernels would make every difference here exactly 0, at some cost in speed.';
    this.drawChart(c);
    this.drawTable(c);
  }

  drawChart(c) {
    const { w, h: hh, left, right, top, bottom } = CHART;
    const n = c.rows.length;
    const most = c.maxDelta || 1e-6;
    const bw = (w - left - right) / Math.max(n, 1);
    const Y = (v) => hh - bottom - (v / most) * (hh - top - bottom);
    const nodes = [
      svg('line', { x1: left, x2: w - right, y1: Y(0), y2: Y(0), stroke: 'var(--kv-fg-soft)' }),
      svg('text', { x: left - 4, y: Y(0) + 4, 'text-anchor': 'end' }, '0'),
      svg('text', { x: left - 4, y: Y(most) + 4, 'text-anchor': 'end' }, most.toExponential(1)),
      svg('text', { x: (left + w - right) / 2, y: hh - 4, 'text-anchor': 'middle' }, 'position in the output (|crowd − alone| logprob)'),
    ];
    for (const r of c.rows) {
      const x = left + r.index * bw;
      const v = r.afterFlip || r.index === c.flip ? most : Math.abs(r.delta);
      nodes.push(svg('rect', { class: 'kbi-bar', x: x + 1, y: Y(v), width: Math.max(1, bw - 2), height: Y(0) - Y(v),
        'data-after-flip': r.afterFlip || r.index === c.flip ? '' : null, 'data-index': r.index },
      svg('title', {}, `position ${r.index}: ${fmtDelta(r.delta)}`)));
      if (r.index % 4 === 0) nodes.push(svg('text', { x: x + bw / 2, y: hh - bottom + 12, 'text-anchor': 'middle', class: 'kvw-soft' }, String(r.index)));
    }
    if (c.flip !== null) {
      const x = left + (c.flip + 0.5) * bw;
      nodes.push(svg('line', { class: 'kbi-flip', x1: x, x2: x, y1: top, y2: hh - bottom }));
    }
    this.chart.setAttribute('aria-label', `Difference in logprob per position, crowd minus alone: largest ${c.maxDelta.toExponential(1)} `
      + `over ${c.compared} positions with the same text; ${c.flip === null ? 'no flip' : `first flip at position ${c.flip}`}.`);
    this.chart.replaceChildren(...nodes);
  }

  drawTable(c) {
    const head = ['#', 'token (alone → crowd where they differ)', 'logprob alone', 'logprob in a crowd', 'Δ = crowd − alone', 'requests beside it'];
    this.tableEl.replaceChildren(h('table', { class: 'kvw-table', 'data-positions': '' },
      h('caption', {}, 'Each position: both runs’ tokens and logprobs, their difference (crowd − alone) and the requests in flight beside the crowd’s'),
      h('thead', {}, h('tr', {}, head.map((t) => h('th', { scope: 'col' }, t)))),
      h('tbody', {}, c.rows.map((r) => h('tr', { 'data-index': r.index, 'data-flip': r.index === c.flip ? '' : null },
        h('th', { scope: 'row' }, String(r.index)),
        h('td', { class: 'kbi-token', 'data-alone': r.alone.token_id, 'data-crowd': r.crowd.token_id },
          r.alone.token_id === r.crowd.token_id ? show(r.alone.text) : `${show(r.alone.text)} → ${show(r.crowd.text)}`),
        h('td', {}, fmtLogprob(r.alone.logprob)), h('td', {}, fmtLogprob(r.crowd.logprob)),
        h('td', { 'data-delta': r.delta }, r.afterFlip ? `${fmtDelta(r.delta)} (other text)` : fmtDelta(r.delta)),
        h('td', {}, String(r.beside)))))));
  }

  exportData() {
    const c = this.comparison;
    return { source: this.source, prompt: PROMPT, params: PARAMS,
      comparison: c && { flip: c.flip, max_delta: c.maxDelta, differing: c.differing, compared: c.compared,
        rows: c.rows.map((r) => ({ index: r.index, alone: r.alone.token_id, crowd: r.crowd.token_id,
          alone_logprob: r.alone.logprob, crowd_logprob: r.crowd.logprob, beside: r.beside })) } };
  }
}

customElements.define('kv-batch-invariance', KvBatchInvariance);
