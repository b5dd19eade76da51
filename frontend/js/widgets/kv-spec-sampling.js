// <kv-spec-sampling>: chapter 18's exact sampling rule, on a real verify pass. For a watched,
// sampled request the engine's `spec` event carries the target's p and the drafter's q at the
// check that decided the pass (`distribution`: the likeliest tokens and the rest summed). The
// widget draws p, q and the leftover max(p − q, 0) scaled to 1, and runs the rule itself in
// the page, many times, from that p and q: draw x from q, keep it with probability
// min(1, p(x)/q(x)), else draw from the leftover. The histogram of what comes out approaches
// p, and the distance between them (total variation) shrinks as draws add up. Two sources:
// the recording (prompt lookup, k = 3, a story told twice, sampled at temperature 0.8) and,
// on a server that speculates, the learner's own request.

import { KvWidget, formatInt } from '../widget-base.js';
import { h, svg } from './lib/svg.js';
import { injectStyle } from './lib/style.js';
import { namedRecordingEvents } from './lib/recording.js';
import { runBusy } from './lib/busy.js';
import { SourcePicker, Stepper, controlRow } from './lib/controls.js';
import { seededRandom } from './lib/sampling-math.js';

const RECORDING = 'spec-sampling';
const PROMPT = 'Once upon a time, a little fox found a shiny stone near the river. She was kind, and she loved telling '
  + 'jokes. One sunny morning, Omar and Oscar went to the river to play with her new paint box.\n\n'
  + 'Once upon a time, a little fox found a shiny stone near the river. She';
const BATCHES = [100, 1000, 10000];
const SEED = 12345;
const COLUMNS = [
  { key: 'p', head: 'target p', label: 'target p', color: 'var(--kv-cat-1)' },
  { key: 'q', head: 'draft q', label: 'draft q', color: 'var(--kv-cat-2)' },
  { key: 'left', head: 'leftover', label: 'leftover: max(p − q, 0), scaled to add up to 1', color: 'var(--kv-cat-5)' },
  { key: 'seen', head: 'produced', label: 'produced: what the rule gave in this page', color: 'var(--kv-cat-3)' },
];
const LABEL_W = 96;
const ROW_H = 20;
const TOP = 16;
const height0 = (pass) => TOP + (pass.tokens.length + 1) * ROW_H;   // the rows and the scale's line

const STYLE = `
kv-spec-sampling .kss-figure { border: 1px solid var(--kv-border); border-radius: var(--kv-radius, 6px); padding: .5rem .6rem; }
kv-spec-sampling .kss-head { margin: 0 0 .3rem; font-size: .95rem; }
kv-spec-sampling .kss-chart text { font-size: 11px; }
kv-spec-sampling .kss-chart .kss-token { font-family: var(--kv-font-mono); }
kv-spec-sampling .kss-history { font-size: .88rem; margin: .3rem 0; font-variant-numeric: tabular-nums; }
`;

const pct = (x) => (x >= 0.995 ? '100 %' : x > 0 && x < 0.005 ? '<1 %' : `${Math.round(100 * x)} %`);
const show = (text) => JSON.stringify(text).slice(1, -1);

function pick(weights, u) {
  const total = weights.reduce((a, b) => a + b, 0);
  let x = u * total;
  for (let i = 0; i < weights.length; i += 1) {
    x -= weights[i];
    if (x < 0) return i;
  }
  return weights.length - 1;
}

/** One pass's distributions, the listed tokens then "all others" as one more category (the
 *  rule is then exact when q puts nothing outside the listed tokens: prompt lookup always). */
function passOf(e) {
  const d = e.distribution;
  const p = [...d.p, d.p_rest];
  const q = [...d.q, d.q_rest];
  const over = p.map((pi, i) => Math.max(pi - q[i], 0));
  const overSum = over.reduce((a, b) => a + b, 0);
  const check = e.checks[d.check];
  return {
    step: e.step, rid: e.request_id, tokens: [...d.text.map(show), 'all others'], ids: [...d.ids, null], p, q,
    left: over.map((x) => (overSum > 0 ? x / overSum : 0)), draft: d.ids.indexOf(check.token_id),
    draftText: show(e.proposed_text[d.check]), accepted: check.accepted, u: check.u,
    acceptance: p.reduce((a, pi, i) => a + Math.min(pi, q[i]), 0),
  };
}

/** How instructive a pass is: its draft neither surely kept nor surely thrown out, and p spread. */
const interest = (pass) => {
  const pd = pass.p[pass.draft];
  return Math.min(pd, 1 - pd) + 0.1 * (1 - Math.max(...pass.p));
};

class KvSpecSampling extends KvWidget {
  static events = ['spec'];
  static requires = ['requests', 'speculation'];
  static label = 'The exact sampling rule, on a real pass';

  setup() {
    injectStyle('kv-spec-sampling', STYLE);
    this.recorded = [];
    this.live = [];
    this.source = 'recorded';
    this.index = 0;
    this.mine = new Set();
    const uid = this.getAttribute('aria-labelledby');
    this.picker = new SourcePicker({ id: `${uid}-source`, label: 'Passes from', onChange: (source) => this.show(source),
      recorded: 'Recorded: prompt lookup, k = 3', live: 'Live: your request' });
    const drawMore = () => this.draw(1000);
    this.stepper = new Stepper({ earlier: '◀ Earlier pass', later: 'Later pass ▶', keys: { d: drawMore, D: drawMore },
      index: () => this.index, count: () => this.passes.length, go: (i) => this.select(i) });
    this.runButton = h('button', { type: 'button', class: 'kvw-btn kvw-btn--primary', onclick: () => this.runLive() },
      'Sample a story with speculation');
    this.errorEl = h('p', { class: 'kvw-error', role: 'alert' });
    this.drawButtons = BATCHES.map((n) => h('button', { type: 'button', class: 'kvw-btn', 'data-draws': n, onclick: () => this.draw(n) },
      `Run the rule ${formatInt(n)} times`));
    this.resetButton = h('button', { type: 'button', class: 'kvw-btn', onclick: () => this.resetDraws() }, 'Start over');
    this.headEl = h('p', { class: 'kss-head', 'data-head': '' });
    this.chart = svg('svg', { class: 'kvw-svg kss-chart', role: 'img' });
    this.figures = h('dl', { class: 'kvw-figures' });
    this.historyEl = h('p', { class: 'kss-history', 'data-history': '' });
    this.figure = this.stepper.panel({ class: 'kss-figure', 'aria-roledescription': 'verify pass',
      'aria-label': 'One verify pass. Left and right arrows: earlier and later pass; Home and End: first and last; D: run the rule 1,000 more times.' },
    this.headEl, h('div', { class: 'kvw-scroll' }, this.chart), this.figures, this.historyEl);
    this.body.append(
      controlRow('Your own run', this.runButton, this.picker.badge),
      this.errorEl,
      this.picker.row('Which pass', ...this.stepper.buttons),
      controlRow('Run the rule in this page', ...this.drawButtons, this.resetButton),
      this.figure);
    this.setLegend(COLUMNS.map((c) => ({ label: c.label, color: c.color })));
    this.onModeChange(this.client.mode);
    namedRecordingEvents(RECORDING).then((events) => {
      this.recorded = events.filter((e) => e.type === 'spec' && e.distribution).map(passOf);
      this.dataset.recordedPasses = String(this.recorded.length);
      if (this.source === 'recorded') this.select(this.bestIndex(this.recorded));
    });
  }

  get passes() { return this.source === 'live' ? this.live : this.recorded; }

  bestIndex(passes) {
    let best = 0;
    passes.forEach((pass, i) => { if (interest(pass) > interest(passes[best])) best = i; });
    return best;
  }

  onModeChange(mode) {
    this.runButton.disabled = mode !== 'live';
    this.picker.followMode(mode);
  }

  onEvent(event) {
    if (this.client.mode !== 'live' || event.type !== 'spec' || !event.distribution || !this.mine.has(event.request_id)) return;
    this.live.push(passOf(event));
    this.dataset.livePasses = String(this.live.length);
  }

  runLive() {
    return runBusy(this, this.runButton, this.errorEl, async () => {
      this.live = [];
      const finished = new Promise((resolve) => {
        const off = this.client.on('request.finished', (e) => {
          if (this.mine.has(e.request_id)) { off(); resolve(); }
        });
      });
      const ack = await this.client.command('submit', {
        prompt: PROMPT, params: { temperature: 0.8, seed: Date.now() % 100000, max_tokens: 48, ignore_eos: true },
        watch: { layers: [], sampling: false } });   // watched: its spec events carry p and q
      this.mine.add(ack.request_id);
      await finished;
      this.show('live', true);
      this.announce(`Your request ${ack.request_id}: ${this.live.length} verify passes with their p and q.`);
    });
  }

  show(source, fresh = false) {
    if (source === this.source && !fresh) return;
    this.source = source;
    this.picker.value = source;
    this.select(this.bestIndex(this.passes));
  }

  /** Show pass i, its draws started afresh. */
  select(i) {
    const passes = this.passes;
    this.index = Math.max(0, Math.min(passes.length - 1, i));
    this.resetDraws();
    const pass = passes[this.index];
    if (pass) this.announce(`Step ${pass.step}: draft “${pass.draftText}” with p ${pct(pass.p[pass.draft])} and q ${pct(pass.q[pass.draft])}; the engine ${pass.accepted ? 'kept' : 'rejected'} it.`);
  }

  resetDraws() {
    const pass = this.passes[this.index];
    this.counts = pass ? pass.p.map(() => 0) : [];
    this.total = 0;
    this.kept = 0;
    this.history = [];
    this.random = seededRandom(SEED + this.index);   // the same draws each time the page is opened
    this.requestRender();
  }

  /** The rule, n times, from this pass's p and q. */
  draw(n) {
    const pass = this.passes[this.index];
    if (!pass) return;
    for (let k = 0; k < n; k += 1) {
      const x = pick(pass.q, this.random());
      let out = x;
      if (this.random() < Math.min(1, pass.p[x] / pass.q[x])) this.kept += 1;
      else out = pick(pass.left, this.random());
      this.counts[out] += 1;
    }
    this.total += n;
    this.history.push({ draws: this.total, distance: this.distance() });
    this.announce(`${formatInt(this.total)} draws: distance to p ${this.distance().toFixed(3)}.`);
    this.requestRender();
  }

  /** Total variation distance between what the rule produced and p. */
  distance() {
    const pass = this.passes[this.index];
    if (!pass || !this.total) return null;
    return 0.5 * pass.p.reduce((a, pi, i) => a + Math.abs(this.counts[i] / this.total - pi), 0);
  }

  render() {
    const pass = this.passes[this.index];
    this.stepper.update();
    for (const b of [...this.drawButtons, this.resetButton]) b.disabled = !pass;
    this.dataset.source = this.source;
    if (!pass) {
      this.headEl.textContent = this.source === 'live' ? 'No pass of yours yet: press the button above.' : 'Loading the recorded passes…';
      this.chart.replaceChildren();
      this.figures.replaceChildren();
      this.historyEl.textContent = '';
      return;
    }
    this.dataset.step = String(pass.step);
    this.dataset.draws = String(this.total);
    const distance = this.distance();
    this.dataset.distance = distance === null ? '' : distance.toFixed(4);
    this.headEl.textContent = `Step ${pass.step} (${this.source === 'live' ? 'live' : 'recorded'} pass ${this.index + 1} of ${this.passes.length}): `
      + `the drafter proposed “${pass.draftText}”, the target gave it p = ${pct(pass.p[pass.draft])} against q = ${pct(pass.q[pass.draft])}, `
      + `so it is kept with probability ${pct(Math.min(1, pass.p[pass.draft] / pass.q[pass.draft]))}; `
      + `the engine drew u = ${pass.u === null ? '—' : pass.u.toFixed(3)} and ${pass.accepted ? 'kept it' : 'rejected it, drawing from the leftover'}.`;
    this.drawChart(pass);
    const fig = (label, value, key) => h('div', {}, h('dt', {}, label), h('dd', { [`data-${key}`]: '' }, value));
    this.figures.replaceChildren(
      fig('draws in this page', formatInt(this.total), 'total'),
      fig('kept drafts', this.total ? pct(this.kept / this.total) : '—', 'kept'),
      fig('expected: Σ min(p, q)', pct(pass.acceptance), 'expected'),
      fig('distance to p', distance === null ? '—' : distance.toFixed(3), 'tv'));
    this.historyEl.textContent = this.history.length
      ? `Distance to p (half the sum of |produced − p|): ${this.history.map((s) => `${s.distance.toFixed(3)} after ${formatInt(s.draws)}`).join(', ')}.`
      : 'Press a button to run the rule in this page from this pass’s p and q.';
  }

  drawChart(pass) {
    const width = Math.max(420, Math.min(760, this.figure.clientWidth - 26 || 760));
    const colW = (width - LABEL_W) / COLUMNS.length;
    const seen = this.total ? this.counts.map((c) => c / this.total) : null;
    const values = { p: pass.p, q: pass.q, left: pass.left, seen };
    const top = TOP;
    // one scale for p, the leftover and what was produced, so they compare by eye; q (often
    // all on one token) is cut at the end of its column, its label still exact
    const scale = Math.max(...pass.p, ...pass.left, ...(seen || [0]));
    const nodes = COLUMNS.map((c, j) => svg('text', { x: LABEL_W + j * colW + 2, y: 11, class: 'kvw-soft' }, c.head));
    nodes.push(svg('text', { x: width - 2, y: height0(pass) - 2, 'text-anchor': 'end', class: 'kvw-soft' }, `bar scale: full column = ${pct(scale)}`));
    pass.tokens.forEach((token, i) => {
      const y = top + i * ROW_H;
      const isDraft = i === pass.draft;
      nodes.push(svg('text', { x: LABEL_W - 6, y: y + 14, 'text-anchor': 'end', class: 'kss-token', 'font-weight': isDraft ? 700 : 400 },
        `${isDraft ? '▸ ' : ''}${token.length > 12 ? `${token.slice(0, 11)}…` : token}`));
      COLUMNS.forEach((c, j) => {
        const v = values[c.key] ? values[c.key][i] : 0;
        const x = LABEL_W + j * colW;
        nodes.push(svg('rect', { x, y: y + 3, width: colW - 8, height: ROW_H - 6, fill: 'var(--kv-bg-soft)' }));
        const w = (colW - 8) * Math.min(1, v / scale);
        nodes.push(svg('rect', { x, y: y + 3, width: Math.max(0, w), height: ROW_H - 6, fill: c.color, 'data-col': c.key, 'data-row': i, 'data-value': v.toFixed(4) },
          svg('title', {}, `${token}: ${c.label} ${pct(v)}`)));
        if (v >= 0.005) nodes.push(svg('text', { x: x + 3 + Math.min(colW - 40, w), y: y + 14 }, pct(v)));
      });
    });
    const height = height0(pass) + 4;
    this.chart.setAttribute('viewBox', `0 0 ${width} ${height}`);
    this.chart.setAttribute('width', String(width));
    this.chart.setAttribute('height', String(height));
    this.chart.setAttribute('aria-label', `Step ${pass.step}: ${pass.tokens.map((t, i) => `${t} p ${pct(pass.p[i])} q ${pct(pass.q[i])}`
      + (seen ? ` produced ${pct(seen[i])}` : '')).join('; ')}.`);
    this.chart.replaceChildren(...nodes);
  }

  exportData() {
    const pass = this.passes[this.index];
    return { source: this.source, pass, draws: this.total, counts: this.counts, history: this.history };
  }
}

customElements.define('kv-spec-sampling', KvSpecSampling);
