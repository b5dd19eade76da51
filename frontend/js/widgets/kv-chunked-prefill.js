// <kv-chunked-prefill>: a long prompt arrives while two requests decode. Per step, a bar of
// the tokens the engine computed — the prompt's chunk and the decodes — against the token
// budget; under it, the longest engine time a decoding request waited between two tokens.
// Two runs the project recorded on the real engine (with chunks of 16 under a budget of 24,
// and with chunking off), and, live, the same arrivals sent now as the learner's own requests
// under whatever knobs the engine has.

import { KvWidget, formatInt, formatSeconds } from '../widget-base.js';
import { h, svg } from './lib/svg.js';
import { injectStyle, modeText } from './lib/style.js';
import { namedRecordingEvents } from './lib/recording.js';
import { percentile } from './lib/request-trace.js';

const RECORDED = [
  ['chunked-prefill', 'Recorded: chunked, chunks of 16, budget 24'],
  ['chunked-prefill-off', 'Recorded: chunking off (budget 1,024)'],
];
const LONG_PROMPT = Array(8).fill('The little fox ran along the river to find the shiny stone.').join(' ');
const DECODERS = ['The robot woke up', 'Tom looked out'];
const BAR_W = 14;
const CHART_H = 90;

const STYLE = `
kv-chunked-prefill .kcp-panels { display: grid; grid-template-columns: repeat(auto-fit, minmax(20rem, 1fr)); gap: .6rem; }
kv-chunked-prefill .kcp-panel h4 { margin: 0 0 .3rem; font-size: .95rem; }
kv-chunked-prefill .kcp-gap { font-size: .88rem; margin: .3rem 0 0; }
kv-chunked-prefill svg:focus-visible { outline: 3px solid var(--kv-focus); outline-offset: 2px; }
`;

/** A run as the widget draws it, from its `step` events (and `request.*` to name the decoders). */
export function summarizeRun(events, { only = null } = {}) {
  const steps = [];
  for (const e of events) {
    if (e.type !== 'step') continue;
    const seqs = only ? e.seqs.filter((s) => only.has(s.request_id)) : e.seqs;
    if (only && !seqs.length) continue;
    steps.push({
      step: e.step, budget: e.token_budget, tokens: e.num_batched_tokens, durationS: e.duration_s,
      prefill: seqs.filter((s) => s.kind === 'prefill').reduce((a, s) => a + s.num_tokens, 0),
      decode: seqs.filter((s) => s.kind === 'decode').length,
      sampled: seqs.filter((s) => s.samples).map((s) => s.request_id),
    });
  }
  // A decoder's gap: engine time (sum of step durations) from one of its tokens to the next.
  const last = new Map();
  let worst = { seconds: 0, rid: null, step: null };
  const gaps = [];
  let elapsed = 0;
  for (const s of steps) {
    elapsed += s.durationS;
    for (const rid of s.sampled) {
      if (last.has(rid)) {
        const gap = elapsed - last.get(rid);
        gaps.push(gap);
        if (gap > worst.seconds) worst = { seconds: gap, rid, step: s.step };
      }
      last.set(rid, elapsed);
    }
  }
  return { steps, gaps, worst, overBudget: steps.filter((s) => s.tokens > s.budget).length };
}

class KvChunkedPrefill extends KvWidget {
  static events = ['step', 'request'];
  static label = 'Chunked prefill, step by step';

  setup() {
    injectStyle('kv-chunked-prefill', STYLE);
    this.runs = new Map();       // name -> { label, summary }
    this.live = null;            // { mine: Set, events: [] } while a live run goes on
    this.modeBadge = h('span', { class: 'kvw-mode' });
    this.runButton = h('button', { type: 'button', class: 'kvw-btn kvw-btn--primary', onclick: () => this.runLive() }, 'Run it on the live engine');
    this.errorEl = h('p', { class: 'kvw-error', role: 'alert' });
    this.panelsEl = h('div', { class: 'kcp-panels' });
    this.body.append(h('div', { class: 'kvw-row' }, this.runButton, this.modeBadge), this.errorEl, this.panelsEl);
    this.setLegend([
      { label: 'prompt chunk (prefill tokens in the step)', color: 'var(--kv-prefill)' },
      { label: 'decode tokens (one per decoding request)', color: 'var(--kv-decode)' },
      { label: 'token budget (dashed)', color: 'var(--kv-fg)', shape: 'line' },
    ]);
    this.updateMode(this.client.mode);
    for (const [name, label] of RECORDED) {
      namedRecordingEvents(name).then((events) => {
        if (events.length) this.runs.set(name, { label, summary: summarizeRun(events) });
        this.requestRender();
      });
    }
  }

  onModeChange(mode) { this.updateMode(mode); }

  updateMode(mode) {
    this.modeBadge.className = `kvw-mode kvw-mode--${mode}`;
    this.modeBadge.textContent = modeText(mode);
    this.runButton.disabled = mode !== 'live' || Boolean(this.live && !this.live.done);
  }

  async runLive() {
    this.errorEl.textContent = '';
    const live = { mine: new Set(), events: [], done: false, pending: 3 };
    this.live = live;
    this.updateMode(this.client.mode);
    // Our requests are known by their request.added events (owner = this page), which come
    // before the acks; a fast request may even finish before its ack arrives.
    const submit = (prompt, maxTokens) => this.client.command('submit', { prompt, params: { temperature: 0, max_tokens: maxTokens, ignore_eos: true } });
    try {
      const decoding = new Promise((resolve) => { live.onTokens = resolve; });
      await Promise.all(DECODERS.map((p) => submit(p, 32)));
      await decoding;   // the decoders are decoding before the long prompt arrives
      await submit(LONG_PROMPT, 4);
    } catch (error) {
      this.errorEl.textContent = this.describeError(error);
      live.done = true;
      this.updateMode(this.client.mode);
    }
  }

  onEvent(event) {
    const live = this.live;
    if (!live || live.done) return;
    if (event.type === 'request.added' && event.owner === (this.client.session && this.client.session.client_id)) {
      live.mine.add(event.request_id);
    } else if (event.type === 'step' && event.seqs.some((s) => live.mine.has(s.request_id))) {
      live.events.push(event);
      const decoding = event.seqs.some((s) => live.mine.has(s.request_id) && s.kind === 'decode');
      if (decoding && live.onTokens) { live.onTokens(); live.onTokens = null; }
      this.runs.set('live', { label: this.liveLabel(event), summary: summarizeRun(live.events, { only: live.mine }) });
      this.requestRender();
    } else if (event.type === 'request.finished' && live.mine.has(event.request_id)) {
      live.pending -= 1;
      if (live.pending === 0) {
        live.done = true;
        this.dataset.live = 'done';
        this.updateMode(this.client.mode);
      }
    }
  }

  liveLabel(step) {
    const knobs = this.client.engine && this.client.engine.knobs;
    const chunk = knobs ? (knobs.enable_chunked_prefill ? `chunked${knobs.prefill_chunk_size ? `, chunks of ${knobs.prefill_chunk_size}` : ''}` : 'chunking off') : '';
    return `Live now: ${chunk}, budget ${formatInt(step.token_budget)}`;
  }

  render() {
    const runs = [...this.runs.entries()];
    const top = Math.max(1, ...runs.flatMap(([, r]) => r.summary.steps.map((s) => Math.min(s.budget, Math.max(s.tokens, 24)))));
    this.panelsEl.replaceChildren(...runs.map(([name, run]) => this.panel(name, run, top)));
    if (!runs.length) this.panelsEl.replaceChildren(h('p', { class: 'kvw-note' }, 'Loading the recorded runs…'));
  }

  panel(name, { label, summary }, top) {
    const steps = summary.steps;
    const width = Math.max(steps.length, 12) * BAR_W + 40;
    const y = (tokens) => 10 + CHART_H - (Math.min(tokens, top * 1.15) / (top * 1.15)) * CHART_H;
    const nodes = [];
    steps.forEach((s, i) => {
      const x = 36 + i * BAR_W;
      const decodeTop = s.decode ? Math.min(y(s.decode), 10 + CHART_H - 3) : 10 + CHART_H;   // a decode stays visible
      nodes.push(svg('rect', { x, y: decodeTop, width: BAR_W - 2, height: 10 + CHART_H - decodeTop, fill: 'var(--kv-decode)' }));
      const prefillTop = Math.min(y(s.decode + s.prefill), decodeTop);
      nodes.push(svg('rect', { x, y: prefillTop, width: BAR_W - 2, height: decodeTop - prefillTop, fill: 'var(--kv-prefill)', 'data-step': s.step, 'data-tokens': s.tokens, 'data-budget': s.budget },
        svg('title', {}, `step ${s.step}: ${s.tokens} tokens (${s.prefill} prompt, ${s.decode} decode) of a budget of ${s.budget}; ${formatSeconds(s.durationS)}`)));
      if (s.tokens > top * 1.15) nodes.push(svg('text', { x: x + BAR_W / 2, y: 8, 'font-size': 9, 'text-anchor': 'middle' }, String(s.tokens)));
    });
    const budget = steps.length ? steps[0].budget : 0;
    if (budget && budget <= top * 1.15) {
      nodes.push(svg('line', { x1: 34, x2: width, y1: y(budget), y2: y(budget), stroke: 'var(--kv-fg)', 'stroke-dasharray': '4 3' }),
        svg('text', { x: 0, y: y(budget) + 4, 'font-size': 10 }, `${budget}`));
    } else if (budget) {
      nodes.push(svg('text', { x: 0, y: 14, 'font-size': 10 }, `budget ${formatInt(budget)} ↑`));
    }
    nodes.push(svg('text', { x: 0, y: 10 + CHART_H + 12, 'font-size': 10, class: 'kvw-soft' }, 'steps →'));
    const chart = svg('svg', {
      class: 'kvw-svg', role: 'img', tabindex: '0', width, height: CHART_H + 26, viewBox: `0 0 ${width} ${CHART_H + 26}`,
      'aria-label': `${label}: ${steps.length} steps, the most tokens in a step ${Math.max(0, ...steps.map((s) => s.tokens))} of a budget of ${budget}; longest wait between two tokens of a decoding request ${formatSeconds(summary.worst.seconds)}.`,
    }, ...nodes);
    return h('section', { class: 'kvw-panel kcp-panel', 'data-run': name },
      h('h4', {}, label), h('div', { class: 'kvw-scroll' }, chart),
      h('p', { class: 'kcp-gap', 'data-worst-gap': summary.worst.seconds },
        `Longest wait between two tokens of a decoding request: ${formatSeconds(summary.worst.seconds)} of engine time`
        + `${summary.worst.step ? ` (up to step ${summary.worst.step})` : ''}; median gap ${formatSeconds(percentile(summary.gaps, 0.5) || 0)}.`));
  }

  exportData() {
    return Object.fromEntries([...this.runs].map(([name, run]) => [name, { label: run.label, ...run.summary }]));
  }
}

customElements.define('kv-chunked-prefill', KvChunkedPrefill);
