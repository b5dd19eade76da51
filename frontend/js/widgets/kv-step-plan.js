// <kv-step-plan>: vLLM V1's scheduling rule, drawn from the engine's own plan of each step
// (`step` events). One token budget per step; every scheduled request is a row that lets its
// computed count catch up with its tokens. The bar is the budget, each row's share of it
// labelled with why the row is there (`reason`); under it each request's progress (tokens
// computed before the step → after it, out of the tokens it has); then who was left waiting
// or preempted. The learner steps back and forward through the recent steps with the arrow
// keys. Two sources: a recording made on the engine with a budget of 32 tokens (three
// requests decode, a long prompt takes what they leave over several steps, a short one waits
// behind it), and the live engine, where the learner's own button sends two short requests
// and, once they decode, a long prompt cut into chunks (their own cap on their own request).

import { KvWidget, formatInt } from '../widget-base.js';
import { h, svg } from './lib/svg.js';
import { injectStyle } from './lib/style.js';
import { namedRecordingEvents } from './lib/recording.js';
import { setBusy, isBusy } from './lib/busy.js';
import { SourcePicker, Stepper, controlRow } from './lib/controls.js';

const RECORDING = 'step-plan';
const LIVE_STEPS_KEPT = 80;
// A row's reason, as the engine names it, with its colour. Running requests come first in a
// step (decode, prefill chunk, verify drafts), then those taken from the waiting queue.
const REASONS = {
  decode: { color: 'var(--kv-decode)', running: true, says: 'one new token of a running request' },
  'prefill chunk': { color: 'var(--kv-prefill)', running: true, says: 'the next piece of a running request’s prompt' },
  'verify drafts': { color: 'var(--kv-cat-5)', running: true, says: 'a token and its guessed drafts, checked' },
  'new request': { color: 'var(--kv-cat-3)', running: false, says: 'admitted from the waiting queue' },
  'resumed after preemption': { color: 'var(--kv-cat-6)', running: false, says: 'back from the waiting queue after preemption' },
};
const OTHER = { color: 'var(--kv-cat-8)', running: true, says: '' };
// The learner's run: two short requests decode, then a long prompt (about 350 tokens) arrives,
// cut into chunks of CHUNK by its own cap so it is spread over several steps even when the
// engine's budget would take it whole. Only the learner's requests are touched.
const DECODERS = ['The robot woke up', 'Tom looked out of the window'];
const LONG_PROMPT = Array(14).fill('The little fox ran along the river to find the shiny stone, and the old owl watched her from the tall tree.').join(' ');
const CHUNK = 64;
const MIN_BAR_W = 300;
const MAX_BAR_W = 860;
const BAR_H = 30;

const STYLE = `
kv-step-plan .ksp-plan { border: 1px solid var(--kv-border); border-radius: var(--kv-radius, 6px); padding: .5rem .6rem; }
kv-step-plan .ksp-head { display: flex; flex-wrap: wrap; gap: .3rem .8rem; align-items: baseline; margin: 0 0 .3rem; }
kv-step-plan .ksp-head strong { font-size: 1.05rem; font-variant-numeric: tabular-nums; }
kv-step-plan .ksp-lesson { margin: .2rem 0 .5rem; font-size: .95rem; }
kv-step-plan .ksp-bar text { font-size: 11px; }
kv-step-plan .ksp-bar .ksp-label { paint-order: stroke; stroke: var(--kv-bg); stroke-width: 3px; stroke-linejoin: round; }
kv-step-plan table { border-collapse: collapse; width: 100%; font-size: .88rem; font-variant-numeric: tabular-nums; }
kv-step-plan th, kv-step-plan td { text-align: left; padding: .2rem .4rem; border-bottom: 1px solid var(--kv-border); vertical-align: middle; }
kv-step-plan th { font-weight: 600; color: var(--kv-fg-soft); font-size: .8rem; }
kv-step-plan td.ksp-num { text-align: right; white-space: nowrap; }
kv-step-plan .ksp-reason { display: inline-flex; align-items: flex-start; gap: .35rem; }   /* "resumed after preemption" wraps: the progress column keeps its room */
kv-step-plan .ksp-swatch { width: .85rem; height: .85rem; border-radius: 2px; flex: none; margin-top: .2em; }
kv-step-plan .ksp-progress { min-width: 7rem; }
kv-step-plan .ksp-progress .kvw-bar { height: .7rem; }
kv-step-plan .ksp-progress .kvw-bar > span { transition: left .25s, width .25s; }
kv-step-plan .ksp-before { background: var(--kv-cat-8); }
kv-step-plan .ksp-strip { cursor: pointer; margin-bottom: .3rem; }
kv-step-plan .ksp-queue { display: flex; flex-wrap: wrap; gap: .3rem 1rem; margin: .5rem 0 0; font-size: .9rem; }
kv-step-plan .ksp-chip { display: inline-block; padding: 0 .35rem; margin-left: .2rem; border: 1px dashed var(--kv-border); border-radius: 3px; font-family: var(--kv-font-mono); font-size: .8rem; }
kv-step-plan .ksp-chip--waiting { width: .8rem; height: .8rem; vertical-align: middle; padding: 0; }
kv-step-plan .ksp-chip--preempted { border: 1px solid var(--kv-evicted); color: var(--kv-fg); }
@media (prefers-reduced-motion: reduce) { kv-step-plan .ksp-progress .kvw-bar > span { transition: none; } }
`;

const plural = (n, one, many = `${one}s`) => `${formatInt(n)} ${n === 1 ? one : many}`;
const reasonOf = (row) => REASONS[row.reason] || OTHER;
/** A row's share of the budget in whole percent; a sliver is "<1 %", never "0 %". */
const share = (tokens, budget) => {
  const pct = (100 * tokens) / budget;
  return pct > 0 && pct < 0.5 ? '<1 %' : `${Math.round(pct)} %`;
};

/** The steps of an event stream as the widget draws them. Each row also gets the total
 *  tokens its request had when the step was planned (what its computed count catches up
 *  with): a row that samples reaches it; otherwise its prompt plus the tokens drawn before. */
class StepPlans {
  constructor(limit = Infinity) {
    this.limit = limit;
    this.steps = [];
    this.prompts = new Map();   // request id -> prompt tokens
    this.drawn = new Map();     // request id -> tokens drawn so far
  }

  apply(event) {
    if (event.type === 'request.added') this.prompts.set(event.request_id, event.num_prompt_tokens);
    else if (event.type === 'request.snapshot') {   // requests already in flight when the page connected
      for (const r of event.requests) {
        this.prompts.set(r.request_id, r.num_prompt_tokens);
        this.drawn.set(r.request_id, r.num_output_tokens);
      }
    }
    else if (event.type === 'request.token') this.drawn.set(event.request_id, Math.max(this.drawn.get(event.request_id) || 0, event.index + 1));
    else if (event.type === 'request.finished') { this.prompts.delete(event.request_id); this.drawn.delete(event.request_id); }
    else if (event.type === 'step') {
      this.steps.push(this.plan(event));
      if (this.steps.length > this.limit) this.steps.splice(0, this.steps.length - this.limit);
      return true;
    }
    return false;
  }

  plan(e) {
    const rows = e.seqs.map((s, i) => {
      const prompt = this.prompts.get(s.request_id);
      const end = s.start + s.num_tokens;
      const total = s.samples ? s.context_len : prompt === undefined ? null : Math.max(end, prompt + (this.drawn.get(s.request_id) || 0));
      return {
        order: i + 1, rid: s.request_id, reason: s.reason || s.kind, kind: s.kind, start: s.start, tokens: s.num_tokens,
        end, total, cached: s.cached_tokens, drafts: s.num_drafts || 0, samples: s.samples,
      };
    });
    return {
      step: e.step, budget: e.token_budget, used: e.num_batched_tokens, maxSeqs: e.max_num_seqs, rows,
      waiting: e.queues.waiting, running: e.queues.running, preempted: e.preempted, finished: e.finished,
    };
  }
}

/** The step's plan in words: running requests first, then the waiting queue, the budget. */
function describePlan(p) {
  const running = p.rows.filter((r) => reasonOf(r).running);
  const admitted = p.rows.filter((r) => !reasonOf(r).running);
  const sum = (rows) => rows.reduce((a, r) => a + r.tokens, 0);
  const left = p.budget - p.used;
  const parts = [];
  if (!p.rows.length) parts.push('Nothing could run in this step.');
  if (running.length) {
    const byReason = new Map();
    for (const r of running) byReason.set(r.reason, [...(byReason.get(r.reason) || []), r]);
    const kinds = [...byReason].map(([reason, rows]) => `${plural(rows.length, reason === 'prefill chunk' ? 'prompt chunk' : reason)} (${plural(sum(rows), 'token')})`);
    parts.push(`First the running requests: ${kinds.join(' and ')}.`);
  }
  if (admitted.length) {
    parts.push(`${running.length ? 'Then, with the budget they left' : 'From the waiting queue'}: `
      + `${admitted.map((r) => `${r.rid} ${r.reason === 'new request' ? 'starts' : 'resumes'} with ${plural(r.tokens, 'token')}`
        + (r.total !== null && r.end < r.total ? ` of ${formatInt(r.total)}` : '')).join(', ')}.`);
  }
  const cut = p.rows.find((r) => r.kind === 'prefill' && !r.samples);
  if (cut) {
    parts.push(left === 0 ? `The budget ran out inside ${cut.rid}’s prompt: the rest waits for the next steps.`
      : `${cut.rid}’s chunk stopped at ${plural(cut.tokens, 'token')} with budget to spare: a chunk cap cut it, not the budget.`);
  }
  parts.push(`${formatInt(p.used)} of ${formatInt(p.budget)} tokens used.`);
  if (p.waiting) parts.push(`${plural(p.waiting, 'request')} left waiting${left === 0 ? ' (no budget left)' : ''}.`);
  if (p.preempted.length) parts.push(`Preempted: ${p.preempted.join(', ')} (blocks freed; recomputed later).`);
  return parts.join(' ');
}

class KvStepPlan extends KvWidget {
  static events = ['step', 'request'];
  static requires = ['requests', 'steps', 'step_rows'];
  static label = 'The scheduler’s plan, step by step';

  setup() {
    injectStyle('kv-step-plan', STYLE);
    this.recorded = new StepPlans();
    this.live = new StepPlans(LIVE_STEPS_KEPT);
    this.source = 'recorded';
    this.pinned = null;       // the step number shown; null: the newest (live, until the learner steps back)
    this.run = null;          // the learner's run: { mine: Set, longRid, done }
    const uid = this.getAttribute('aria-labelledby');
    this.picker = new SourcePicker({ id: `${uid}-source`, label: 'Steps from', onChange: (source) => this.show(source),
      recorded: 'Recorded: budget 32 tokens', live: 'Live engine' });
    this.stepper = new Stepper({ earlier: '◀ Earlier step', later: 'Later step ▶',
      index: () => this.index, count: () => this.steps.length, go: (i) => this.setIndex(i) });
    this.runButton = h('button', { type: 'button', class: 'kvw-btn kvw-btn--primary', onclick: () => this.runLive() },
      'Send a long prompt while two of mine decode');
    this.liveNote = h('span', { class: 'kvw-note' });
    this.errorEl = h('p', { class: 'kvw-error', role: 'alert' });
    this.headEl = h('p', { class: 'ksp-head' });
    this.lessonEl = h('p', { class: 'ksp-lesson', 'data-lesson': '' });
    this.bar = svg('svg', { class: 'kvw-svg ksp-bar', role: 'img' });
    this.strip = svg('svg', { class: 'kvw-svg ksp-strip', role: 'img' });
    this.strip.addEventListener('click', (e) => {
      const column = e.target.closest('[data-index]');
      if (column) this.setIndex(Number(column.dataset.index));
    });
    this.tbody = h('tbody', {});
    this.queueEl = h('div', { class: 'ksp-queue' });
    this.plan = this.stepper.panel({ class: 'ksp-plan', 'aria-roledescription': 'step plan',
      'aria-label': 'One step’s plan. Left and right arrows: earlier and later step; Home and End: first and newest.' },
    h('div', { class: 'kvw-scroll' }, this.strip), this.headEl, this.lessonEl, h('div', { class: 'kvw-scroll' }, this.bar),
    h('div', { class: 'kvw-scroll' }, h('table', {},
      h('caption', { class: 'kvw-sr' }, 'The rows of this step, in the order the scheduler planned them'),
      h('thead', {}, h('tr', {}, ...['#', 'request', 'why it runs', 'tokens', 'computed: before → after, of its tokens'].map((t) => h('th', { scope: 'col' }, t)))),
      this.tbody)),
    this.queueEl);
    // the bar is drawn at the plan's width: draw again when that width changes
    this.resizer = new ResizeObserver(() => {
      if (this.plan.clientWidth !== this.drawnWidth) this.requestRender();
    });
    this.resizer.observe(this.plan);
    this.body.append(
      controlRow('Your own run', this.runButton, this.picker.badge),
      this.liveNote, this.errorEl,
      this.picker.row('Which steps', ...this.stepper.buttons),
      this.plan);
    this.setLegend([
      ...Object.entries(REASONS).map(([reason, { color, says }]) => ({ label: `${reason}: ${says}`, color })),
      { label: 'computed before this step (progress bars)', color: 'var(--kv-cat-8)' },
      { label: 'budget left unused', color: 'var(--kv-free)' },
    ]);
    this.updateMode(this.client.mode);
    namedRecordingEvents(RECORDING).then((events) => {
      for (const e of events) this.recorded.apply(e);
      if (this.source === 'recorded') this.pinned = this.firstMixed(this.recorded.steps);
      this.dataset.recordedSteps = String(this.recorded.steps.length);
      this.requestRender();
    });
  }

  get steps() { return (this.source === 'live' ? this.live : this.recorded).steps; }

  /** Where the shown step is in `steps` (the newest when none is pinned, or it fell off). */
  get index() {
    const steps = this.steps;
    if (this.pinned === null) return steps.length - 1;
    return Math.max(0, steps.findIndex((p) => p.step === this.pinned));
  }

  /** The number of the first step mixing a decode with prompt work (of request `prompt`
   *  when given): the lesson's step. Null when there is none. */
  firstMixed(steps, prompt = null) {
    const p = steps.find((q) => q.rows.some((r) => r.reason === 'decode')
      && q.rows.some((r) => r.kind === 'prefill' && (prompt === null || r.rid === prompt)));
    return p ? p.step : null;
  }

  onModeChange(mode) { this.updateMode(mode); }

  updateMode(mode) {
    const live = mode === 'live';
    this.picker.followMode(mode);
    this.runButton.disabled = !live;
    setBusy(this.runButton, Boolean(this.run && !this.run.done));
    this.liveNote.textContent = !live ? 'With the live engine you can make such a step yourself.'
      : `Sends two short requests of yours; once they decode, a long prompt of about 350 tokens that you cap at ${CHUNK} tokens a step, so it is spread over several steps beside their decodes. Only your requests are touched.`;
  }

  onEvent(event) {
    if (this.client.mode !== 'live') return;   // a replaying page: the widget draws its own recording
    if (this.live.apply(event)) {
      this.dataset.liveSteps = String(this.live.steps.length);
      if (this.source === 'live') this.requestRender();
    }
    this.trackRun(event);
  }

  // -- the learner's run ------------------------------------------------------------------
  async runLive() {
    if (isBusy(this.runButton) || !this.isLive) return;
    this.errorEl.textContent = '';
    const run = { mine: new Set(), finished: new Set(), longRid: null, decoderRids: [], done: false, decoding: null };
    this.run = run;
    this.updateMode(this.client.mode);
    this.show('live');
    const submit = (fields) => this.client.command('submit', fields);
    try {
      const decoding = new Promise((resolve) => { run.decoding = resolve; });
      // sent together so they start together; long enough to outlast the prompt (cancelled once it is done)
      const acks = await Promise.all(DECODERS.map((prompt) => submit({ prompt, params: { temperature: 0, max_tokens: 160, ignore_eos: true } })));
      for (const ack of acks) {
        run.decoderRids.push(ack.request_id);
        run.mine.add(ack.request_id);
      }
      await decoding;
      // A fresh first word each run: the prefix cache must not hand this run the last one's blocks.
      const ack = await submit({ prompt: `Story ${Date.now() % 100000}. ${LONG_PROMPT}`, params: { temperature: 0, max_tokens: 4, ignore_eos: true }, prefill_chunk_tokens: CHUNK });
      run.longRid = ack.request_id;
      run.mine.add(ack.request_id);
      this.announce(`Your long prompt ${ack.request_id}: ${plural(ack.num_prompt_tokens, 'token')}, at most ${CHUNK} a step.`);
      if (run.finished.has(run.longRid)) this.showRun(run);   // it finished before its ack arrived
    } catch (error) {
      this.errorEl.textContent = this.describeError(error);
      this.finishRun(run);
    }
  }

  trackRun(event) {
    const run = this.run;
    if (!run || run.done) return;
    const mine = this.client.session && event.owner === this.client.session.client_id;
    if (event.type === 'request.added' && mine) run.mine.add(event.request_id);
    else if (event.type === 'step' && run.decoding && event.seqs.some((s) => run.mine.has(s.request_id) && s.reason === 'decode')) {
      run.decoding();
      run.decoding = null;
    } else if (event.type === 'request.finished') {
      run.finished.add(event.request_id);
      if (event.request_id === run.longRid) this.showRun(run);
    }
  }

  /** The long prompt is done: stop the decoders and show the first step where a chunk of
   *  it shares the step with decodes. */
  showRun(run) {
    this.finishRun(run);
    const step = this.firstMixed(this.live.steps, run.longRid);
    if (step !== null && this.source === 'live') this.setIndex(this.live.steps.findIndex((p) => p.step === step));
    this.dataset.lastRun = run.longRid;
  }

  finishRun(run) {
    if (run.done) return;
    run.done = true;
    for (const rid of run.decoderRids) this.client.command('cancel', { request_id: rid }).catch(() => {});
    this.updateMode(this.client.mode);
  }

  // -- moving through steps -----------------------------------------------------------------
  show(source) {
    if (source === this.source) return;
    this.source = source;
    this.picker.value = source;
    this.pinned = source === 'live' ? null : this.firstMixed(this.recorded.steps);
    this.requestRender();
  }

  setIndex(i) {
    const last = this.steps.length - 1;
    if (last < 0) return;
    const p = this.steps[Math.max(0, Math.min(last, i))];
    this.pinned = this.source === 'live' && p === this.steps[last] ? null : p.step;
    this.announce(`Step ${p.step}: ${describePlan(p)}`);
    this.requestRender();
  }

  // -- drawing ------------------------------------------------------------------------------
  render() {
    const steps = this.steps;
    const index = this.index;
    const p = steps[index];
    this.stepper.update();
    this.dataset.source = this.source;
    if (!p) {
      this.headEl.replaceChildren(this.source === 'live' ? 'No live step yet: press the button above, or wait for the class’s requests.' : 'Loading the recorded steps…');
      this.lessonEl.textContent = '';
      this.bar.replaceChildren();
      this.strip.replaceChildren();
      this.tbody.replaceChildren();
      this.queueEl.replaceChildren();
      delete this.dataset.step;
      return;
    }
    this.dataset.step = String(p.step);
    this.headEl.replaceChildren(h('strong', { 'data-step': p.step }, `Step ${formatInt(p.step)}`),
      h('span', {}, `${plural(p.rows.length, 'row')} · `, h('span', { 'data-used': p.used }, formatInt(p.used)), ' of ',
        h('span', { 'data-budget': p.budget }, formatInt(p.budget)), ' budget tokens'),
      h('span', { class: 'kvw-note' }, `${this.source === 'live' ? 'live' : 'recorded'} step ${index + 1} of ${steps.length}${this.pinned === null ? ' (following the newest)' : ''}`));
    this.lessonEl.textContent = describePlan(p);
    this.drawStrip(steps, index);
    this.drawBar(p);
    this.tbody.replaceChildren(...p.rows.map((r) => this.row(r, p)));
    this.drawQueues(p);
  }

  /** The budget as a bar, each row's tokens a segment in plan order; when the rows use a
   *  small part of a large budget, a second bar shows that part stretched. */
  drawBar(p) {
    const nodes = [];
    const width = this.barWidth();
    const bar = (name, y, scale, label, showUnused) => {
      if (showUnused) nodes.push(svg('rect', { x: 0, y, width, height: BAR_H, fill: 'var(--kv-free)', stroke: 'var(--kv-border)' }));
      const segments = svg('g', { 'data-bar': name });
      nodes.push(segments);
      let x = 0;
      for (const r of p.rows) {
        const w = Math.max(2, r.tokens * scale);
        segments.append(svg('rect', { x, y, width: w, height: BAR_H, fill: reasonOf(r).color, stroke: 'var(--kv-bg)', 'stroke-width': 1, 'data-rid': r.rid, 'data-reason': r.reason, 'data-tokens': r.tokens },
          svg('title', {}, `#${r.order} ${r.rid}: ${r.reason}, ${plural(r.tokens, 'token')}`)));
        if (w >= 13) segments.append(svg('text', { x: x + w / 2, y: y + BAR_H / 2 + 4, 'text-anchor': 'middle', class: 'ksp-label' }, String(r.order)));
        x += w;
      }
      nodes.push(svg('text', { x: 0, y: y - 4, class: 'kvw-soft' }, label));
    };
    const zoom = p.used > 0 && p.used < 0.4 * p.budget;
    const scale = width / p.budget;
    bar('budget', 14, scale, `token budget ${formatInt(p.budget)}: ${formatInt(p.used)} used, ${formatInt(p.budget - p.used)} left`, true);
    let labelsTop = 14 + BAR_H;
    let labelScale = scale;
    if (zoom) {   // the used part stretched to the full width, so each row's share can be read
      labelScale = width / p.used;
      bar('zoom', labelsTop + 18, labelScale, `the ${formatInt(p.used)} used tokens, stretched ×${formatInt(Math.round(labelScale / scale))}`, false);
      labelsTop += 18 + BAR_H;
    }
    // Under the bar, each run of rows with the same reason is named, with its token count.
    const groups = [];
    let x = 0;
    for (const r of p.rows) {
      const w = Math.max(2, r.tokens * labelScale);
      const g = groups[groups.length - 1];
      if (g && g.reason === r.reason) { g.w += w; g.n += 1; g.tokens += r.tokens; } else groups.push({ reason: r.reason, x, w, n: 1, tokens: r.tokens });
      x += w;
    }
    const lineEnds = [];
    for (const g of groups) {
      const text = `${g.n > 1 ? `${g.n} × ` : ''}${g.reason} · ${plural(g.tokens, 'token')}`;
      const textW = 12 + text.length * 6.2;
      // under the middle of a wide group, from the start of a narrow one; lines stack when names would touch
      const start = Math.max(0, Math.min(width - textW, g.w >= textW ? g.x + (g.w - textW) / 2 : g.x));
      let line = lineEnds.findIndex((end) => end + 8 <= start);
      if (line < 0) { line = lineEnds.length; lineEnds.push(0); }
      lineEnds[line] = start + textW;
      const y = labelsTop + 14 + line * 14;
      nodes.push(svg('line', { x1: g.x + g.w / 2, x2: g.x + g.w / 2, y1: labelsTop, y2: y - 9, stroke: reasonOf(g).color, 'stroke-width': 2 }),
        svg('rect', { x: start, y: y - 9, width: 9, height: 9, fill: reasonOf(g).color }),
        svg('text', { x: start + 12, y, 'data-group': g.reason }, text));
    }
    const height = labelsTop + 14 + lineEnds.length * 14 + 4;
    this.bar.setAttribute('viewBox', `0 0 ${width} ${height}`);
    this.bar.setAttribute('width', String(width));
    this.bar.setAttribute('height', String(height));
    this.bar.setAttribute('aria-label', `Step ${p.step}: ${p.rows.map((r) => `${r.rid} ${r.reason} ${r.tokens}`).join(', ')}; ${p.used} of a budget of ${p.budget} tokens.`);
    this.bar.replaceChildren(...nodes);
  }

  /** Every step kept, a column each: its rows stacked in plan order, coloured by reason, the
   *  shown one outlined. An overview of which steps mixed decodes with prompt work; a click
   *  shows that step. */
  drawStrip(steps, index) {
    const width = this.barWidth();
    const colW = Math.max(3, Math.min(14, (width - 4) / steps.length));
    const tallest = Math.max(1, ...steps.map((p) => p.used));
    const top = 4;
    const height = 36;
    const nodes = [];
    steps.forEach((p, i) => {
      const x = 2 + i * colW;
      const column = svg('g', { 'data-index': i, 'data-step': p.step });
      column.append(svg('rect', { x, y: top, width: colW, height, fill: 'transparent' }, svg('title', {}, `step ${p.step}: ${p.rows.map((r) => r.reason).join(', ')}`)));
      let y = top + height;
      for (const r of p.rows) {
        const rowH = (height * r.tokens) / tallest;
        y -= rowH;
        column.append(svg('rect', { x: x + 0.5, y, width: Math.max(1, colW - 1), height: Math.max(1.5, rowH), fill: reasonOf(r).color, 'pointer-events': 'none' }));
      }
      nodes.push(column);
    });
    nodes.push(svg('rect', { x: 2 + index * colW - 1, y: top - 2, width: colW + 2, height: height + 4, fill: 'none', stroke: 'var(--kv-focus)', 'stroke-width': 2 }));
    const label = `steps ${steps[0].step}–${steps[steps.length - 1].step}, tokens per step (tallest ${formatInt(tallest)}); click one to show it`;
    nodes.push(svg('text', { x: 2, y: top + height + 14, class: 'kvw-soft', 'font-size': 11 }, label));
    this.strip.setAttribute('viewBox', `0 0 ${width} ${top + height + 18}`);
    this.strip.setAttribute('width', String(width));
    this.strip.setAttribute('height', String(top + height + 18));
    this.strip.setAttribute('aria-label', `${steps.length} steps, step ${steps[index].step} shown. ${label}.`);
    this.strip.replaceChildren(...nodes);
  }

  /** The bar as wide as the plan's box (so its labels are drawn at their own size), within limits. */
  barWidth() {
    this.drawnWidth = this.plan.clientWidth;
    const inner = this.plan.clientWidth - 26;
    return Math.round(Math.max(MIN_BAR_W, Math.min(MAX_BAR_W, inner > 0 ? inner : MAX_BAR_W)));
  }

  row(r, p) {
    const { color } = reasonOf(r);
    const total = r.total;
    const pct = (n) => `${total ? (100 * n) / total : 0}%`;
    const progress = total === null ? h('span', { class: 'kvw-note' }, `${formatInt(r.start)} → ${formatInt(r.end)}`)
      : h('div', {},
        h('div', { class: 'kvw-bar', 'aria-hidden': 'true' },
          h('span', { class: 'ksp-before', style: `width:${pct(r.start)}` }),
          h('span', { style: `left:${pct(r.start)};width:${pct(r.tokens)};background:${color}` })),
        h('span', {}, `${formatInt(r.start)} → ${formatInt(r.end)} of ${formatInt(total)}`,
          r.end < total ? ` · lacks ${formatInt(total - r.end)}` : ' · caught up',
          r.cached && !reasonOf(r).running ? ` · ${formatInt(r.cached)} from the prefix cache` : '',
          r.drafts ? ` · ${plural(r.drafts, 'draft')}` : ''));
    return h('tr', { 'data-rid': r.rid, 'data-reason': r.reason, 'data-tokens': r.tokens, 'data-start': r.start, 'data-total': total ?? '' },
      h('td', { class: 'ksp-num' }, String(r.order)),
      h('td', {}, h('code', {}, r.rid)),
      h('td', {}, h('span', { class: 'ksp-reason' }, h('span', { class: 'ksp-swatch', style: `background:${color}`, 'aria-hidden': 'true' }), r.reason)),
      h('td', { class: 'ksp-num' }, `${formatInt(r.tokens)}`, h('span', { class: 'kvw-note' }, ` (${share(r.tokens, p.budget)})`)),
      h('td', { class: 'ksp-progress' }, progress));
  }

  drawQueues(p) {
    const chips = (ids, cls) => ids.map((id) => h('span', { class: `ksp-chip ${cls}` }, id));
    this.queueEl.replaceChildren(
      h('span', { 'data-waiting': p.waiting }, 'Left waiting after this step: ', h('strong', {}, formatInt(p.waiting)),
        ...Array.from({ length: Math.min(p.waiting, 12) }, () => h('span', { class: 'ksp-chip ksp-chip--waiting', 'aria-hidden': 'true' }))),
      h('span', { 'data-running': p.running }, 'Running: ', h('strong', {}, formatInt(p.running)), ` (at most ${formatInt(p.maxSeqs)})`),
      h('span', { 'data-preempted': p.preempted.length }, 'Preempted: ', p.preempted.length ? chips(p.preempted, 'ksp-chip--preempted') : h('strong', {}, 'none')),
      p.finished.length ? h('span', {}, 'Finished: ', chips(p.finished, '')) : '');
  }

  exportData() {
    return { source: this.source, shown_step: this.steps[this.index]?.step ?? null, steps: this.steps, recorded_steps: this.recorded.steps.length, live_steps: this.live.steps.length };
  }
}

customElements.define('kv-step-plan', KvStepPlan);
