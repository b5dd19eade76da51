// <kv-chunked-prefill>: a long prompt arrives while another request decodes. Per step, a bar of
// the tokens the engine computed — the prompt's chunk and the decodes — against the token
// budget; under it, the longest engine time the decoding request waited between two tokens.
// Two runs the project recorded on the real engine (chunks of 16 under a budget of 24, and
// chunking off), and, live, the learner's own pair: the same long prompt sent once cut into
// chunks of their choice (`prefill_chunk_tokens`, a cap on their request alone: nobody else's
// request changes) and once whole, each beside a decoding request of their own.

import { KvWidget, formatInt, formatSeconds } from '../widget-base.js';
import { h, svg } from './lib/svg.js';
import { injectStyle } from './lib/style.js';
import { namedRecordingEvents } from './lib/recording.js';
import { percentile } from './lib/request-trace.js';
import { setBusy, isBusy } from './lib/busy.js';
import { controlRow, modeBadge, showMode } from './lib/controls.js';

const RECORDED = [
  ['chunked-prefill', 'Recorded: chunked, chunks of 16, budget 24'],
  ['chunked-prefill-off', 'Recorded: chunking off (budget 1,024)'],
];
// about 350 tokens: one whole step of prefill is many decode steps' worth of work
const LONG_PROMPT = Array(14).fill('The little fox ran along the river to find the shiny stone, and the old owl watched her from the tall tree.').join(' ');
const DECODER = 'The robot woke up';
const CHUNKS = [16, 32, 64, 128];
const STEPS_BEFORE = 3;    // decode steps drawn before the long prompt's first step
const BAR_W = 14;
const CHART_H = 90;

const STYLE = `
kv-chunked-prefill .kcp-panels { display: grid; grid-template-columns: repeat(auto-fit, minmax(20rem, 1fr)); gap: .6rem; }
kv-chunked-prefill .kcp-panel h4 { margin: 0 0 .3rem; font-size: .95rem; }
kv-chunked-prefill .kcp-gap { font-size: .88rem; margin: .3rem 0 0; }
kv-chunked-prefill .kcp-gap strong { font-variant-numeric: tabular-nums; }
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
  static requires = ['requests', 'steps', 'step_rows'];
  static label = 'Chunked prefill, step by step';

  setup() {
    injectStyle('kv-chunked-prefill', STYLE);
    this.runs = new Map();       // name -> { label, summary }
    this.live = null;            // the run under way: { name, chunk, mine: Set, events: [], longRid }
    this.runNumber = 0;
    this.modeBadge = modeBadge();
    const uid = this.getAttribute('aria-labelledby') || 'kcp';
    this.chunkSelect = h('select', { class: 'kvw-select', id: `${uid}-chunk` },
      ...CHUNKS.map((n) => h('option', { value: String(n), ...(n === 32 ? { selected: '' } : {}) }, `${n} tokens`)));
    this.chunkedButton = h('button', { type: 'button', class: 'kvw-btn kvw-btn--primary', onclick: () => this.runLive(true) }, 'Run my prompt chunked');
    this.wholeButton = h('button', { type: 'button', class: 'kvw-btn', onclick: () => this.runLive(false) }, 'Run it unchunked');
    this.liveNote = h('span', { class: 'kvw-note' });
    this.errorEl = h('p', { class: 'kvw-error', role: 'alert' });
    this.panelsEl = h('div', { class: 'kcp-panels' });
    this.body.append(
      controlRow('Your own run', h('label', { for: this.chunkSelect.id }, 'Chunks of'), this.chunkSelect, this.chunkedButton, this.wholeButton, this.modeBadge),
      this.liveNote, this.errorEl, this.panelsEl);
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
    showMode(this.modeBadge, mode);
    const running = Boolean(this.live && !this.live.done);
    const knobs = this.client.engine && this.client.engine.knobs;
    const chunkingOff = Boolean(knobs && !knobs.enable_chunked_prefill);
    for (const button of [this.chunkedButton, this.wholeButton]) {
      button.disabled = mode !== 'live';
      setBusy(button, running);   // busy, not disabled: focus stays on the button pressed
    }
    if (chunkingOff) this.chunkedButton.disabled = true;
    this.liveNote.textContent = mode !== 'live' ? 'With the live engine you can run the same long prompt (about 350 tokens) yourself, chunked and unchunked.'
      : chunkingOff ? 'The engine runs with chunked prefill off (kvscope serve --no-enable-chunked-prefill): prompts are never cut, so only the unchunked run is possible.'
        : 'Each run sends a short request of yours that decodes, then the long prompt (about 350 tokens). “Chunked” caps your prompt at the chosen chunk per step — only your request: the engine’s settings and everyone else’s requests stay as they are.';
  }

  async runLive(chunked) {
    if (isBusy(this.chunkedButton)) return;
    this.errorEl.textContent = '';
    const chunk = chunked ? Number(this.chunkSelect.value) : null;
    const name = chunked ? 'live-chunked' : 'live-unchunked';
    const live = { name, chunk, mine: new Set(), events: [], longRid: null, decoderRid: null, done: false };
    this.live = live;
    this.updateMode(this.client.mode);
    this.runNumber += 1;
    // A different first word each run: the prefix cache must not hand the second run the first one's blocks.
    const prompt = `Story ${this.runNumber}${Date.now() % 1000}. ${LONG_PROMPT}`;
    const submit = (fields) => this.client.command('submit', fields);
    try {
      // Our requests are known by their request.added events (owner = this page), which come before the acks.
      const decoding = new Promise((resolve) => { live.onDecode = resolve; });
      live.decoderRid = (await submit({ prompt: DECODER, params: { temperature: 0, max_tokens: 128, ignore_eos: true } })).request_id;
      await decoding;   // the short request decodes before the long prompt arrives
      const ack = await submit({ prompt, params: { temperature: 0, max_tokens: 4, ignore_eos: true }, ...(chunk ? { prefill_chunk_tokens: chunk } : {}) });
      live.longRid = ack.request_id;
      live.promptTokens = ack.num_prompt_tokens;
      this.update(live);
    } catch (error) {
      this.errorEl.textContent = this.describeError(error);
      this.finish(live);
    }
  }

  onEvent(event) {
    const live = this.live;
    if (!live || live.done) return;
    if (event.type === 'request.added' && event.owner === (this.client.session && this.client.session.client_id)) {
      live.mine.add(event.request_id);
    } else if (event.type === 'step' && event.seqs.some((s) => live.mine.has(s.request_id))) {
      live.events.push(event);
      if (live.onDecode && event.seqs.some((s) => live.mine.has(s.request_id) && s.kind === 'decode')) { live.onDecode(); live.onDecode = null; }
      this.update(live);
    } else if (event.type === 'request.finished' && event.request_id === live.longRid) {
      this.finish(live);   // the long prompt is done: the decoder has shown what it had to
    }
  }

  /** The steps worth drawing: a few decode steps, then from the long prompt's first step on. */
  update(live) {
    const first = live.longRid === null ? -1 : live.events.findIndex((e) => e.seqs.some((s) => s.request_id === live.longRid));
    const from = first < 0 ? Math.max(0, live.events.length - STEPS_BEFORE) : Math.max(0, first - STEPS_BEFORE);
    this.runs.set(live.name, { label: this.liveLabel(live), chunk: live.chunk, summary: summarizeRun(live.events.slice(from), { only: live.mine }) });
    this.requestRender();
  }

  finish(live) {
    if (live.done) return;
    live.done = true;
    if (live.decoderRid) this.client.command('cancel', { request_id: live.decoderRid }).catch(() => {});
    this.dataset.live = 'done';
    this.dataset.lastRun = live.name;
    this.updateMode(this.client.mode);
  }

  liveLabel(live) {
    const tokens = live.promptTokens ? `${formatInt(live.promptTokens)} prompt tokens` : 'your long prompt';
    return live.chunk ? `Live, yours: ${tokens} in chunks of ${live.chunk}` : `Live, yours: ${tokens} unchunked (one step)`;
  }

  render() {
    // the learner's own runs first: they are what they just asked for
    const runs = [...this.runs.entries()].sort(([a], [b]) => Number(b.startsWith('live')) - Number(a.startsWith('live')));
    // Each pair on one scale: the recorded pair, and the learner's own pair.
    const tops = new Map();
    for (const [name, r] of runs) {
      const group = name.startsWith('live') ? 'live' : 'recorded';
      const top = Math.max(1, ...r.summary.steps.map((s) => Math.min(s.budget, Math.max(s.tokens, 24))));
      tops.set(group, Math.max(tops.get(group) || 1, top));
    }
    this.panelsEl.replaceChildren(...runs.map(([name, run]) => this.panel(name, run, tops.get(name.startsWith('live') ? 'live' : 'recorded'))));
    if (!runs.length) this.panelsEl.replaceChildren(h('p', { class: 'kvw-note' }, 'Loading the recorded runs…'));
  }

  panel(name, { label, summary, chunk }, top) {
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
    if (chunk) {   // the learner's own cap, which every chunk of their prompt stays under
      nodes.push(svg('line', { x1: 34, x2: width, y1: y(chunk), y2: y(chunk), stroke: 'var(--kv-prefill)', 'stroke-dasharray': '2 2' }),
        svg('text', { x: 0, y: y(chunk) + 4, 'font-size': 10 }, String(chunk)));
    }
    nodes.push(svg('text', { x: 0, y: 10 + CHART_H + 12, 'font-size': 10, class: 'kvw-soft' }, 'steps →'));
    const chart = svg('svg', {
      class: 'kvw-svg', role: 'img', tabindex: '0', width, height: CHART_H + 26, viewBox: `0 0 ${width} ${CHART_H + 26}`,
      'aria-label': `${label}: ${steps.length} steps, the most tokens in a step ${Math.max(0, ...steps.map((s) => s.tokens))} of a budget of ${budget}; longest wait between two tokens of a decoding request ${formatSeconds(summary.worst.seconds)}.`,
    }, ...nodes);
    return h('section', { class: 'kvw-panel kcp-panel', 'data-run': name },
      h('h4', {}, label), h('div', { class: 'kvw-scroll' }, chart),
      h('p', { class: 'kcp-gap', 'data-worst-gap': summary.worst.seconds },
        'Longest wait between two tokens of a decoding request: ', h('strong', {}, formatSeconds(summary.worst.seconds)),
        ` of engine time${summary.worst.step ? ` (up to step ${summary.worst.step})` : ''}; median gap ${formatSeconds(percentile(summary.gaps, 0.5) || 0)}.`));
  }

  exportData() {
    return Object.fromEntries([...this.runs].map(([name, run]) => [name, { label: run.label, ...run.summary }]));
  }
}

customElements.define('kv-chunked-prefill', KvChunkedPrefill);
