// <kv-request-timeline prompt="…">: one real request on a time axis — its wait in the queue,
// its prefill step(s), then one decode step per token — with the measured time to first token
// and inter-token latencies, and, per step, the FLOPs and bytes the engine reports for it, so
// compute-bound prefill and bandwidth-bound decode can be told apart by their numbers. It runs
// at full speed unless the learner ticks "slow it down"; then the figures say the latency is
// the pace they chose, next to the engine's own step time.

import { KvWidget, formatInt, formatSeconds, formatSI, formatBytes, formatFloat, pausedText } from '../widget-base.js';
import { h, svg } from './lib/svg.js';
import { injectStyle } from './lib/style.js';
import { RequestTrace, percentile } from './lib/request-trace.js';
import { runBusy } from './lib/busy.js';
import { modeBadge, showMode } from './lib/controls.js';

const WIDTH = 720;
const LEFT = 70;
const MAX_ROWS = 8;   // the first steps and the last two, with a row saying how many are left out
const PACE_S = 0.15;

const STYLE = `
kv-request-timeline table { border-collapse: collapse; font-size: .76rem; font-variant-numeric: tabular-nums; width: 100%; }
kv-request-timeline th, kv-request-timeline td { padding: .15rem .2rem; border-bottom: 1px solid var(--kv-border); text-align: right; }
kv-request-timeline th { vertical-align: bottom; font-weight: 600; }
kv-request-timeline td { white-space: nowrap; }
kv-request-timeline td:last-child { white-space: normal; min-width: 4.5rem; }
kv-request-timeline tr.krt-skipped td { text-align: center; color: var(--kv-fg-soft); font-style: italic; white-space: normal; }
kv-request-timeline .krt-slowed { border-left: 4px solid var(--kv-replay); padding: .2rem .5rem; background: var(--kv-bg-soft); font-size: .88rem; margin: .3rem 0; }
kv-request-timeline th:first-child, kv-request-timeline td:first-child { text-align: left; }
kv-request-timeline td .kvw-soft { color: var(--kv-fg-soft); font-size: .75rem; }
kv-request-timeline .krt-axis:focus-visible { outline: 3px solid var(--kv-focus); outline-offset: 2px; }
`;

class KvRequestTimeline extends KvWidget {
  static events = ['step', 'request'];
  static requires = ['requests', 'steps', 'step_rows'];
  static label = 'One request, prefill then decode';

  setup() {
    injectStyle('kv-request-timeline', STYLE);
    this.trace = new RequestTrace(null);
    this.modeBadge = modeBadge();
    this.promptInput = h('input', { class: 'kvw-input', type: 'text', value: this.getAttribute('prompt') || 'The cat sat on the', 'aria-label': 'Prompt', size: 30 });
    this.slowBox = h('input', { type: 'checkbox', id: `${this.getAttribute('aria-labelledby')}-slow` });
    this.runButton = h('button', { type: 'button', class: 'kvw-btn kvw-btn--primary', onclick: () => this.run() }, 'Run');
    this.errorEl = h('p', { class: 'kvw-error', role: 'alert' });
    this.figuresEl = h('dl', { class: 'kvw-figures', 'aria-label': 'Measured latencies' });
    this.slowedEl = h('p', { class: 'krt-slowed', hidden: '' });
    this.axis = svg('svg', { class: 'kvw-svg krt-axis', role: 'img', tabindex: '0', viewBox: `0 0 ${WIDTH} 90`, width: WIDTH, height: 90 });
    this.table = h('table', { 'aria-label': 'Each step of the request: tokens, time, FLOPs and bytes' });
    this.body.append(
      h('div', { class: 'kvw-row' }, this.promptInput, this.runButton,
        h('label', { for: this.slowBox.id }, this.slowBox, ` slow it down (one step per ${PACE_S} s)`), this.modeBadge),
      this.errorEl, this.figuresEl, this.slowedEl, h('div', { class: 'kvw-scroll' }, this.axis), h('div', { class: 'kvw-scroll' }, this.table),
      h('p', { class: 'kvw-note' }, 'FLOPs and bytes are the whole step’s (every request batched with this one). FLOPs per byte above a few hundred means the step is limited by arithmetic (compute-bound); a few per byte, as in decode, means it waits on memory (bandwidth-bound).'),
    );
    this.setLegend([
      { label: 'waiting in the queue', color: 'var(--kv-free)' },
      { label: 'prefill step', color: 'var(--kv-prefill)' },
      { label: 'decode step', color: 'var(--kv-decode)' },
      { label: 'token streamed (tick)', color: 'var(--kv-fg)', shape: 'line' },
    ]);
    this.updateMode(this.client.mode);
  }

  onModeChange(mode) {
    this.updateMode(mode);
    if (mode === 'replay') this.follow(null);
  }

  updateMode(mode) {
    showMode(this.modeBadge, mode);
    this.runButton.disabled = mode !== 'live';
  }

  follow(rid, owner = null, paceS = 0) {
    this.trace = new RequestTrace(rid, { owner });
    this.paceS = paceS;   // the pace this page asked for its request (0: full speed)
    this.dataset.steps = '0';
    this.dataset.state = 'waiting';   // not the last run's 'finished' while this one starts
    this.requestRender();
  }

  run() {
    return runBusy(this, this.runButton, this.errorEl, async () => {
      // Its events may arrive before the ack: follow this page's next request from the start.
      const paceS = this.slowBox.checked ? PACE_S : 0;
      this.follow(null, this.client.session.client_id, paceS);
      await this.client.command('submit', {
        prompt: this.promptInput.value, params: { temperature: 0, max_tokens: 16, ignore_eos: true }, pace_s: paceS,
      });
    });
  }

  onEvent(event) {
    if (event.type === 'engine' && event.reason === 'reset' && !this.isLive) this.follow(null);   // the replay went back
    if (event.type === 'request.added' && event.request_id === this.trace.rid && !this.isLive) this.paceS = 0;
    if (event.type === 'engine') this.requestRender();   // paused or resumed: say so
    if (this.trace.apply(event)) {
      this.dataset.steps = String(this.trace.steps.length);
      this.dataset.state = this.trace.finished ? 'finished' : 'running';
      this.requestRender();
    }
  }

  render() {
    const t = this.trace;
    const ttft = t.ttftS;
    const itl = t.itlS;
    const decodeStep = t.decodeSteps.length ? percentile(t.decodeSteps.map((s) => s.durationS), 0.5) : null;
    const fig = (label, value, key) => h('div', {}, h('dt', {}, label), h('dd', { 'data-figure': key }, value));
    this.figuresEl.replaceChildren(
      fig('Request', t.rid || '—', 'rid'),
      fig('Prompt tokens', t.added ? formatInt(t.added.num_prompt_tokens) : '—', 'prompt'),
      fig('Waited in queue', t.queueS === null ? '—' : formatSeconds(t.queueS), 'queue'),
      fig('Time to first token', ttft === null ? '—' : formatSeconds(ttft), 'ttft'),
      fig('Inter-token p50', itl.length ? formatSeconds(percentile(itl, 0.5)) : '—', 'itl_p50'),
      fig('Engine decode step p50', decodeStep === null ? '—' : formatSeconds(decodeStep), 'step_p50'),
      fig('Tokens', formatInt(t.tokens.length), 'tokens'),
    );
    // Slowed on purpose (this page's pace, or the instructor's slow motion for the room): say
    // so beside the figure it inflates, by how much, and what the engine's own step took.
    const room = this.isLive && this.client.engine ? this.client.engine.slow_motion_s || 0 : 0;
    const slowed = Boolean(this.paceS || room) && t.rid !== null;
    this.slowedEl.hidden = !slowed;
    this.dataset.slowed = String(slowed);
    if (slowed) {
      const own = `the engine's own decode step took ${decodeStep === null ? '…' : formatSeconds(decodeStep)} (median)`;
      this.slowedEl.textContent = this.paceS
        ? `Slowed down on purpose: your request took at most one step every ${formatSeconds(this.paceS)}, so its inter-token latency here is that pace, not the engine's; ${own}. Untick “slow it down” and run again to see the real inter-token latency.`
        : `Slowed down by the instructor's slow motion: at least ${formatSeconds(room)} between any two engine steps, so inter-token latency here is that, not the engine's; ${own}.`;
    }
    this.renderAxis();
    this.renderTable();
    if (!t.rid) this.announce(this.isLive ? 'Press Run to send the prompt and see its timeline.' : 'Waiting for the recording’s first request…');
    else if (t.finished) this.announce(`${t.rid} finished: first token after ${formatSeconds(ttft)}, then a token every ${formatSeconds(percentile(itl, 0.5) || 0)} (median).`);
    else this.announce('');
  }

  renderAxis() {
    const t = this.trace;
    const nodes = [];
    if (!t.added || !t.steps.length) {
      this.axis.replaceChildren(svg('text', { x: 0, y: 20, class: 'kvw-soft', 'font-size': 12 }, !t.rid ? ''
        : this.client.engine?.paused && this.isLive ? `${pausedText(this.client.engine)}: its first step runs when they resume.` : 'Waiting for its first step…'));
      return;
    }
    const t0 = t.added.ts;
    const end = Math.max(t.steps[t.steps.length - 1].ts, ...t.tokens.map((k) => k.ts)) - t0 || 1e-3;
    const x = (ts) => LEFT + ((ts - t0) / end) * (WIDTH - LEFT - 10);
    const first = t.steps[0];
    nodes.push(svg('text', { x: 0, y: 24, 'font-size': 11 }, 'steps'), svg('text', { x: 0, y: 52, 'font-size': 11 }, 'tokens'));
    nodes.push(svg('rect', { x: LEFT, y: 12, width: Math.max(0, x(first.ts - first.durationS) - LEFT), height: 18, fill: 'var(--kv-free)' }));
    for (const s of t.steps) {
      const x0 = x(s.ts - s.durationS);
      nodes.push(svg('rect', { x: x0, y: 12, width: Math.max(1.5, x(s.ts) - x0), height: 18, fill: s.kind === 'prefill' ? 'var(--kv-prefill)' : 'var(--kv-decode)', 'data-step': s.step },
        svg('title', {}, `step ${s.step}: ${s.kind}, ${s.tokens} tokens, ${formatSeconds(s.durationS)}`)));
    }
    for (const k of t.tokens) nodes.push(svg('line', { x1: x(k.ts), x2: x(k.ts), y1: 40, y2: 58, stroke: 'var(--kv-fg)', 'stroke-width': 1.5 }));
    if (t.tokens.length) {
      const xf = x(t.tokens[0].ts);
      nodes.push(svg('line', { x1: LEFT, x2: xf, y1: 70, y2: 70, stroke: 'var(--kv-fg-soft)', 'marker-end': '' }),
        svg('text', { x: LEFT, y: 84, 'font-size': 11 }, `time to first token ${formatSeconds(t.ttftS)}`));
    }
    nodes.push(svg('text', { x: WIDTH - 10, y: 84, 'font-size': 11, 'text-anchor': 'end', class: 'kvw-soft' }, `${formatSeconds(end)} after arrival`));
    this.axis.replaceChildren(...nodes);
    this.axis.setAttribute('aria-label', `Timeline of ${t.rid}: waited ${formatSeconds(t.queueS || 0)}, ${t.prefillSteps.length} prefill step(s), ${t.decodeSteps.length} decode steps; first token after ${t.ttftS === null ? 'not yet' : formatSeconds(t.ttftS)}.`);
  }

  renderTable() {
    // Seven narrow columns: the widget may sit in a 30rem side column, and the last two are
    // the comparison the chapter asks for, so they must not scroll out of sight.
    const head = h('tr', {}, ...['step', 'tokens', 'time', 'FLOPs', 'bytes moved', 'FLOPs per byte', 'on an H100'].map((c) => h('th', { scope: 'col' }, c)));
    const steps = this.trace.steps;
    const row = (s) => h('tr', { 'data-kind': s.kind, 'data-step': s.step },
      h('td', { title: `engine step ${s.step}: ${s.batch} sequences, ${s.batchTokens} tokens in all` }, String(s.step), h('br'), h('span', { class: 'kvw-soft' }, s.kind)),
      h('td', {}, formatInt(s.tokens)), h('td', {}, formatSeconds(s.durationS)),
      h('td', { 'data-flops': s.cost.flops }, formatSI(s.cost.flops)), h('td', { 'data-bytes': s.cost.bytes }, formatBytes(s.cost.bytes)),
      h('td', { 'data-intensity': s.cost.arithmetic_intensity }, formatFloat(s.cost.arithmetic_intensity, 1)),
      h('td', {}, `${s.cost.h100.bound}-bound`));
    let rows = steps.map(row);
    if (steps.length > MAX_ROWS) {
      const skipped = steps.slice(MAX_ROWS - 2, -2);
      const kinds = [...new Set(skipped.map((s) => s.kind))].join(' and ');
      rows = [...rows.slice(0, MAX_ROWS - 2),
        h('tr', { class: 'krt-skipped', 'data-skipped': skipped.length },
          h('td', { colspan: 7 }, `⋮ ${skipped.length} more ${kinds} steps of this request not shown (engine steps ${skipped[0].step}–${skipped[skipped.length - 1].step}; the timeline above draws them all)`)),
        ...rows.slice(-2)];
    }
    this.table.replaceChildren(h('thead', {}, head), h('tbody', {}, ...rows));
  }

  exportData() {
    return this.trace.toJSON();
  }
}

customElements.define('kv-request-timeline', KvRequestTimeline);
