// <kv-catch-up>: chapter 14's catch-up rule. Every step has one token budget, and every
// request has a count of computed tokens chasing the tokens it has (its prompt, what it drew,
// and any drafts waiting to be checked). A step hands each request the gap, within the budget:
// a prompt's next chunk, one token for a decode, 1 + k for a verify, everything again for a
// request that was preempted. The widget draws the budget bar and, under it, one bar per
// request: computed before the step, the step's share, what is still missing. Built from the
// engine's `step` events (rows with kind, reason, start, num_tokens, num_drafts) and the
// request events (prompt lengths, tokens drawn). Two sources: a recording made with a budget
// of 32 tokens, prompt lookup and a pool of 11 blocks, so all four moments happen, and the
// live engine, where the learner's button sends two short prompts and a long one they cut
// into chunks.

import { KvWidget, formatInt } from '../widget-base.js';
import { h, svg } from './lib/svg.js';
import { injectStyle } from './lib/style.js';
import { namedRecordingEvents } from './lib/recording.js';
import { runBusy } from './lib/busy.js';
import { SourcePicker, Stepper, controlRow } from './lib/controls.js';

const RECORDING = 'catch-up';
const LIVE_STEPS_KEPT = 60;
const REASONS = {
  'prefill chunk': { color: 'var(--kv-prefill)', moment: 'chunk' },
  'new request': { color: 'var(--kv-cat-3)', moment: 'chunk' },
  decode: { color: 'var(--kv-decode)', moment: 'decode' },
  'verify drafts': { color: 'var(--kv-cat-4)', moment: 'verify' },
  'resumed after preemption': { color: 'var(--kv-cat-6)', moment: 'preemption' },
};
const OTHER = { color: 'var(--kv-cat-8)' };
const MOMENTS = [
  // a chunk that leaves part of its prompt for later steps (a last chunk looks like any prefill)
  { key: 'chunk', label: 'a prompt chunk', test: (p) => p.rows.some((r) => r.reason === 'prefill chunk' && r.end < r.total) },
  { key: 'decode', label: 'a decode', test: (p) => p.rows.some((r) => r.reason === 'decode') },
  { key: 'verify', label: 'a verify', test: (p) => p.rows.some((r) => r.reason === 'verify drafts') },
  { key: 'preemption', label: 'a preemption', test: (p) => p.preempted.length > 0 },
];
const LONG = Array(8).fill('The little fox ran along the river to find the shiny stone, and the old owl watched her.').join(' ');
const SHORT = ['The robot woke up', 'Tom looked out of the window'];
const CHUNK = 48;
const MIN_W = 360;
const MAX_W = 860;
const LABEL_W = 140;
const BAR_H = 16;

const STYLE = `
kv-catch-up .kcu-plan { border: 1px solid var(--kv-border); border-radius: var(--kv-radius, 6px); padding: .5rem .6rem; }
kv-catch-up .kcu-head { margin: 0 0 .3rem; font-size: .95rem; }
kv-catch-up .kcu-chart text { font-size: 11px; }
kv-catch-up .kcu-chart .kcu-rid { font-family: var(--kv-font-mono); }
kv-catch-up button[aria-pressed=true] { border-color: var(--kv-focus); font-weight: 600; }
`;

const reasonOf = (reason) => REASONS[reason] || OTHER;
const plural = (n, one, many = `${one}s`) => `${formatInt(n)} ${n === 1 ? one : many}`;

/** Steps as the widget draws them: each row with the tokens its request had when planned. */
class Steps {
  constructor(limit = Infinity) {
    this.limit = limit;
    this.list = [];
    this.prompts = new Map();
    this.drawn = new Map();
    this.computed = new Map();   // request id -> computed tokens after the last step it ran in
  }

  apply(e) {
    if (e.type === 'request.added') this.prompts.set(e.request_id, e.num_prompt_tokens);
    else if (e.type === 'request.token') this.drawn.set(e.request_id, Math.max(this.drawn.get(e.request_id) || 0, e.index + 1));
    else if (e.type === 'step') {
      this.list.push(this.plan(e));
      if (this.list.length > this.limit) this.list.shift();
      return true;
    }
    return false;
  }

  plan(e) {
    const rows = e.seqs.map((s) => {
      const end = s.start + s.num_tokens;
      const prompt = this.prompts.get(s.request_id);
      // a verify's tokens include its drafts; a sampling row reaches what it has; a chunk
      // lacks the rest of its prompt and what it drew before a preemption
      const total = s.samples ? end : Math.max(end, (prompt ?? end) + (this.drawn.get(s.request_id) || 0));
      this.computed.set(s.request_id, end);
      return { rid: s.request_id, reason: s.reason || s.kind, start: s.start, tokens: s.num_tokens, end, total,
        drafts: s.num_drafts || 0, cached: s.cached_tokens };
    });
    const preempted = e.preempted.map((rid) => ({ rid, lost: this.computed.get(rid) || 0 }));
    for (const p of preempted) this.computed.set(p.rid, 0);
    return { step: e.step, budget: e.token_budget, used: e.num_batched_tokens, rows, preempted, waiting: e.queues.waiting };
  }
}

class KvCatchUp extends KvWidget {
  static events = ['step', 'request'];
  static requires = ['requests', 'steps', 'step_rows'];
  static label = 'One budget, every request catching up';

  setup() {
    injectStyle('kv-catch-up', STYLE);
    this.recorded = new Steps();
    this.live = new Steps(LIVE_STEPS_KEPT);
    this.source = 'recorded';
    this.index = 0;
    this.following = false;
    const uid = this.getAttribute('aria-labelledby');
    this.picker = new SourcePicker({ id: `${uid}-source`, label: 'Steps from', onChange: (source) => this.show(source),
      recorded: 'Recorded: budget 32, prompt lookup, 11 blocks', live: 'Live engine' });
    this.stepper = new Stepper({ earlier: '◀ Earlier step', later: 'Later step ▶',
      index: () => this.index, count: () => this.steps.length, go: (i) => this.setIndex(i) });
    this.momentButtons = MOMENTS.map((m) => h('button', { type: 'button', class: 'kvw-btn', 'data-moment': m.key, 'aria-pressed': 'false',
      onclick: () => this.jump(m) }, m.label));
    this.runButton = h('button', { type: 'button', class: 'kvw-btn kvw-btn--primary', onclick: () => this.runLive() },
      'Send two short prompts and a long one in chunks');
    this.errorEl = h('p', { class: 'kvw-error', role: 'alert' });
    this.headEl = h('p', { class: 'kcu-head', 'data-head': '' });
    this.chart = svg('svg', { class: 'kvw-svg kcu-chart', role: 'img' });
    this.plan = this.stepper.panel({ class: 'kcu-plan', 'aria-roledescription': 'step',
      'aria-label': 'One step. Left and right arrows: earlier and later step; Home and End: first and last.' },
    this.headEl, h('div', { class: 'kvw-scroll' }, this.chart));
    // drawn at the plan's own width, so its text keeps its size: drawn again when that changes
    new ResizeObserver(() => { if (this.plan.clientWidth !== this.drawnWidth) this.requestRender(); }).observe(this.plan);
    this.body.append(
      controlRow('Your own run', this.runButton, this.picker.badge),
      this.errorEl,
      this.picker.row('Which steps', ...this.stepper.buttons),
      controlRow('Jump to the first step with', h('span', { class: 'kvw-note' }, 'First step with:'), ...this.momentButtons),
      this.plan);
    this.setLegend([
      ...Object.entries(REASONS).map(([reason, { color }]) => ({ label: reason, color })),
      { label: 'computed before this step', color: 'var(--kv-cat-8)' },
      { label: 'still missing (or budget left)', color: 'var(--kv-free)' },
    ]);
    this.onModeChange(this.client.mode);
    namedRecordingEvents(RECORDING).then((events) => {
      for (const e of events) this.recorded.apply(e);
      this.dataset.recordedSteps = String(this.recorded.list.length);
      if (this.source === 'recorded') this.jump(MOMENTS[2]);   // the lesson: a verify beside decodes and a chunk
    });
  }

  get steps() { return (this.source === 'live' ? this.live : this.recorded).list; }

  onModeChange(mode) {
    this.runButton.disabled = mode !== 'live';
    this.picker.followMode(mode);
  }

  onEvent(event) {
    if (this.client.mode !== 'live') return;
    if (this.live.apply(event)) {
      this.dataset.liveSteps = String(this.live.list.length);
      if (this.source === 'live' && this.following) this.index = this.live.list.length - 1;
      if (this.source === 'live') this.requestRender();
    }
  }

  runLive() {
    return runBusy(this, this.runButton, this.errorEl, async () => {
      this.show('live');
      this.following = true;
      // submitted held and released by one `pace` command (interval 0: full speed), so all three
      // start in the same step and the shorts decode beside the long prompt's middle chunks
      const params = { temperature: 0, ignore_eos: true };
      const sent = await Promise.allSettled([
        ...SHORT.map((prompt) => this.client.command('submit', { prompt, hold: true, params: { ...params, max_tokens: 12 } })),
        this.client.command('submit', { prompt: `Story ${Date.now() % 100000}. ${LONG}`, hold: true, params: { ...params, max_tokens: 2 }, prefill_chunk_tokens: CHUNK })]);
      const ids = sent.filter((r) => r.status === 'fulfilled').map((r) => r.value.request_id);
      if (ids.length) await this.client.command('pace', { request_ids: ids, interval_s: 0 });
      const refused = sent.find((r) => r.status === 'rejected');
      if (refused) throw refused.reason;
      this.dataset.lastRun = ids.join(' ');
      this.announce(`Sent ${ids.join(', ')}; the long prompt at most ${CHUNK} tokens a step.`);
    });
  }

  show(source) {
    this.source = source;
    this.picker.value = source;
    this.following = source === 'live';
    this.index = source === 'live' ? this.live.list.length - 1 : 0;
    if (source === 'recorded') this.jump(MOMENTS[2]);
    this.requestRender();
  }

  jump(moment) {
    const i = this.steps.findIndex(moment.test);
    if (i < 0) {
      this.announce(`No step with ${moment.label} among these steps.`);
      return;
    }
    this.setIndex(i);
  }

  setIndex(i) {
    const steps = this.steps;
    if (!steps.length) return;
    this.index = Math.max(0, Math.min(steps.length - 1, i));
    this.following = this.source === 'live' && this.index === steps.length - 1;
    this.announce(this.describe(steps[this.index]));
    this.requestRender();
  }

  describe(p) {
    const parts = p.rows.map((r) => `${r.rid} ${r.reason} ${formatInt(r.start)} → ${formatInt(r.end)} of ${formatInt(r.total)}`);
    const lost = p.preempted.map((x) => `${x.rid} preempted, its ${plural(x.lost, 'computed token')} dropped`);
    return `Step ${p.step}, ${formatInt(p.used)} of ${formatInt(p.budget)} budget tokens: ${[...parts, ...lost].join('; ') || 'nothing ran'}.`;
  }

  render() {
    const steps = this.steps;
    const p = steps[this.index];
    this.stepper.update();
    this.dataset.source = this.source;
    for (const b of this.momentButtons) b.setAttribute('aria-pressed', String(Boolean(p && MOMENTS.find((m) => m.key === b.dataset.moment).test(p))));
    if (!p) {
      this.headEl.textContent = this.source === 'live' ? 'No live step yet: press the button above.' : 'Loading the recorded steps…';
      this.chart.replaceChildren();
      delete this.dataset.step;
      return;
    }
    this.dataset.step = String(p.step);
    const kinds = [...new Set(p.rows.map((r) => r.reason))];
    this.headEl.textContent = `Step ${p.step} (${this.source} step ${this.index + 1} of ${steps.length}): `
      + `${formatInt(p.used)} of the ${formatInt(p.budget)}-token budget spent on ${kinds.join(', ') || 'nothing'}`
      + `${p.preempted.length ? `; ${p.preempted.map((x) => x.rid).join(', ')} preempted` : ''}`
      + `${p.waiting ? `; ${plural(p.waiting, 'request')} waiting` : ''}.`;
    this.drawChart(p);
  }

  drawChart(p) {
    this.drawnWidth = this.plan.clientWidth;
    const W = Math.round(Math.max(MIN_W, Math.min(MAX_W, this.plan.clientWidth - 26 || MAX_W)));
    const barW = W - LABEL_W - 8;
    const nodes = [svg('text', { x: 0, y: 12, class: 'kvw-soft' }, `token budget: ${formatInt(p.used)} of ${formatInt(p.budget)} used`)];
    const budget = svg('g', { 'data-bar': 'budget' });
    budget.append(svg('rect', { x: LABEL_W, y: 18, width: barW, height: BAR_H + 4, fill: 'var(--kv-free)', stroke: 'var(--kv-border)' }));
    let x = LABEL_W;
    for (const r of p.rows) {
      const w = (barW * r.tokens) / p.budget;
      budget.append(svg('rect', { x, y: 18, width: Math.max(1.5, w), height: BAR_H + 4, fill: reasonOf(r.reason).color, stroke: 'var(--kv-bg)', 'data-rid': r.rid, 'data-tokens': r.tokens },
        svg('title', {}, `${r.rid}: ${r.reason}, ${plural(r.tokens, 'token')}`)));
      if (w > 26) budget.append(svg('text', { x: x + w / 2, y: 32, 'text-anchor': 'middle', class: 'kcu-rid' }, r.rid));
      x += w;
    }
    budget.append(svg('text', { x: LABEL_W - 6, y: 32, 'text-anchor': 'end' }, 'this step'));
    nodes.push(budget);
    let y = 54;
    nodes.push(svg('text', { x: 0, y: y - 4, class: 'kvw-soft' }, 'each request: computed tokens out of the tokens it has'));
    const line = (label, parts, text, attrs) => {
      const g = svg('g', attrs);
      g.append(svg('text', { x: LABEL_W - 6, y: y + 12, 'text-anchor': 'end' }, label));
      g.append(svg('rect', { x: LABEL_W, y, width: barW, height: BAR_H, fill: 'var(--kv-free)', stroke: 'var(--kv-border)' }));
      for (const [from, to, fill] of parts) g.append(svg('rect', { x: LABEL_W + barW * from, y, width: Math.max(to > from ? 1.5 : 0, barW * (to - from)), height: BAR_H, fill }));
      g.append(svg('text', { x: LABEL_W + 4, y: y + BAR_H + 12, class: 'kvw-soft' }, text));
      nodes.push(g);
      y += BAR_H + 22;
    };
    for (const r of p.rows) {
      const t = r.total || 1;
      const gap = r.total - r.end;
      line(`${r.rid} · ${r.reason}`, [[0, r.start / t, 'var(--kv-cat-8)'], [r.start / t, r.end / t, reasonOf(r.reason).color]],
        `${formatInt(r.start)} → ${formatInt(r.end)} of ${formatInt(r.total)}${r.drafts ? ` (1 + ${plural(r.drafts, 'draft')} checked)` : ''}`
          + (gap > 0 ? ` · ${formatInt(gap)} still missing` : ' · caught up'),
        { 'data-rid': r.rid, 'data-reason': r.reason, 'data-start': r.start, 'data-end': r.end, 'data-total': r.total, 'data-drafts': r.drafts });
    }
    for (const x2 of p.preempted) {
      line(`${x2.rid} · preempted`, [], `its ${plural(x2.lost, 'computed token')} dropped: back to 0`,
        { 'data-rid': x2.rid, 'data-reason': 'preempted', 'data-start': 0, 'data-end': 0, 'data-lost': x2.lost });
    }
    this.chart.setAttribute('viewBox', `0 0 ${W} ${y}`);
    this.chart.setAttribute('height', String(y));
    this.chart.setAttribute('width', String(W));
    this.chart.setAttribute('aria-label', this.describe(p));
    this.chart.replaceChildren(...nodes);
  }

  exportData() {
    return { source: this.source, shown_step: this.steps[this.index]?.step ?? null, steps: this.steps };
  }
}

customElements.define('kv-catch-up', KvCatchUp);
