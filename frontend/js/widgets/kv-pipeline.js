// <kv-pipeline prompt="…">: one real request walks the serving pipeline — tokenize → queue and
// schedule → prefill → decode steps → sample → detokenize → stream — each stage lit when its
// event arrives, with the time measured for it. Engine times come from the server's own
// events; the tokenizer's and the stream's are measured in this browser and say so.

import { KvWidget, formatInt, formatSeconds, pausedText } from '../widget-base.js';
import { h } from './lib/svg.js';
import { injectStyle } from './lib/style.js';
import { RequestTrace } from './lib/request-trace.js';
import { runBusy } from './lib/busy.js';
import { modeBadge, showMode } from './lib/controls.js';

const PACE_S = 0.2;
const MAX_TOKENS = 12;
const STAGES = [
  ['tokenize', 'Tokenize', 'text → token ids'],
  ['schedule', 'Queue & schedule', 'wait for a place in a step'],
  ['prefill', 'Prefill', 'the whole prompt in one pass'],
  ['decode', 'Decode steps', 'one token per step'],
  ['sample', 'Sample', 'pick the next token'],
  ['detokenize', 'Detokenize', 'token ids → text'],
  ['stream', 'Stream', 'text to your browser'],
];

const STYLE = `
kv-pipeline .kpl-flow { display: flex; flex-wrap: wrap; gap: .4rem; list-style: none; padding: 0; margin: .5rem 0; counter-reset: stage; }
kv-pipeline .kpl-stage { flex: 1 1 8.5rem; border: 2px solid var(--kv-border); border-radius: var(--kv-radius, 6px); padding: .35rem .5rem; background: var(--kv-surface); }
kv-pipeline .kpl-stage[data-state=active] { border-color: var(--kv-prefill); border-style: dashed; }
kv-pipeline .kpl-stage[data-state=done] { border-color: var(--kv-decode); background: var(--kv-bg-soft); }
kv-pipeline .kpl-stage[data-state=done] .kpl-name::before { content: "✓ "; }
kv-pipeline .kpl-stage[data-state=active] .kpl-name::before { content: "▶ "; }
kv-pipeline .kpl-name { font-weight: 600; font-size: .92rem; }
kv-pipeline .kpl-what { font-size: .78rem; color: var(--kv-fg-soft); }
kv-pipeline .kpl-time { font-family: var(--kv-font-mono); font-size: .82rem; margin-top: .2rem; }
kv-pipeline .kpl-text { font-family: var(--kv-font-mono); font-size: .9rem; min-height: 1.4em; white-space: pre-wrap; }
@media (prefers-reduced-motion: no-preference) { kv-pipeline .kpl-stage { transition: border-color .2s, background .2s; } }
`;

class KvPipeline extends KvWidget {
  static events = ['step', 'request'];
  static requires = ['requests', 'tokenize', 'steps'];
  static label = 'The journey of one request';

  setup() {
    injectStyle('kv-pipeline', STYLE);
    this.trace = new RequestTrace(null);
    this.tokenize = null;          // { ids, seconds } measured here
    this.streamed = null;          // { first, last } seconds after submit, in this browser
    this.modeBadge = modeBadge();
    this.promptInput = h('input', { class: 'kvw-input', type: 'text', size: 30, value: this.getAttribute('prompt') || 'Once upon a time', 'aria-label': 'Prompt' });
    this.runButton = h('button', { type: 'button', class: 'kvw-btn kvw-btn--primary', onclick: () => this.run() }, 'Send it through');
    this.errorEl = h('p', { class: 'kvw-error', role: 'alert' });
    this.stageEls = new Map(STAGES.map(([key, name, what]) => [key, h('li', { class: 'kpl-stage', 'data-stage': key, 'data-state': 'pending' },
      h('div', { class: 'kpl-name' }, name), h('div', { class: 'kpl-what' }, what), h('div', { class: 'kpl-time' }, '—'))]));
    this.textEl = h('p', { class: 'kpl-text', 'aria-live': 'polite', 'aria-label': 'Text streamed so far' });
    this.body.append(
      h('div', { class: 'kvw-row' }, this.promptInput, this.runButton, this.modeBadge),
      h('p', { class: 'kvw-note' }, `Your request is stepped at most once every ${PACE_S} s, so each stage stays lit long enough to see; nobody else is slowed.`),
      this.errorEl,
      h('ol', { class: 'kpl-flow', 'aria-label': 'Pipeline stages' }, ...this.stageEls.values()),
      this.textEl,
    );
    this.setLegend([
      { label: 'pending', color: 'var(--kv-border)', shape: 'line' },
      { label: '▶ in progress (dashed)', color: 'var(--kv-prefill)', shape: 'line' },
      { label: '✓ done', color: 'var(--kv-decode)', shape: 'line' },
    ]);
    this.updateMode(this.client.mode);
  }

  onModeChange(mode) {
    this.updateMode(mode);
    if (mode === 'replay') this.restart(null);
  }

  updateMode(mode) {
    showMode(this.modeBadge, mode);
    this.runButton.disabled = mode !== 'live';
  }

  restart(owner) {
    this.trace = new RequestTrace(null, { owner });
    this.tokenize = null;
    this.streamed = null;
    this.requestRender();
  }

  run() {
    const prompt = this.promptInput.value;
    return runBusy(this, this.runButton, this.errorEl, async () => {
      this.restart(this.client.session.client_id);
      let t0 = performance.now();
      const tokens = await this.client.command('tokenize', { text: prompt });
      this.tokenize = { ids: tokens.ids.length, seconds: (performance.now() - t0) / 1000 };
      this.requestRender();
      t0 = performance.now();
      this.submittedAt = t0;
      await this.client.command('submit', { prompt, params: { temperature: 0.7, seed: 1, max_tokens: MAX_TOKENS }, pace_s: PACE_S });
    });
  }

  onEvent(event) {
    if (event.type === 'engine' && event.reason === 'reset' && !this.isLive) this.restart(null);   // the replay went back
    if (event.type === 'engine') this.requestRender();   // paused or resumed: say so
    if (!this.trace.apply(event)) return;
    if (event.type === 'request.token' && this.submittedAt) {
      const at = (performance.now() - this.submittedAt) / 1000;
      this.streamed = { first: this.streamed ? this.streamed.first : at, last: at };
    }
    this.dataset.state = this.trace.finished ? 'finished' : 'running';
    this.requestRender();
  }

  /** [state, measured text] per stage, from what has arrived so far. */
  stages() {
    const t = this.trace;
    const started = Boolean(t.added);
    const prefill = t.prefillSteps;
    const decode = t.decodeSteps;
    const done = Boolean(t.finished);
    const sum = (steps, key) => steps.reduce((a, s) => a + s[key], 0);
    const state = (isDone, isActive) => (isDone ? 'done' : isActive ? 'active' : 'pending');
    const prefillDone = prefill.some((s) => s.samples);
    const tok = this.tokenize;
    return {
      tokenize: [state(Boolean(tok) || started, false), tok ? `${formatInt(tok.ids)} tokens, ${formatSeconds(tok.seconds)} round trip`
        : started ? `${formatInt(t.added.num_prompt_tokens)} tokens (in the engine)` : '—'],
      schedule: [state(t.steps.length > 0, started), t.queueS === null ? '—' : `waited ${formatSeconds(t.queueS)}; scheduling ${formatSeconds(sum(t.steps, 'scheduleS'))} over ${t.steps.length} steps`],
      prefill: [state(prefillDone, prefill.length > 0), prefill.length ? `${formatInt(sum(prefill, 'tokens'))} tokens in ${prefill.length} step${prefill.length > 1 ? 's' : ''}, model ${formatSeconds(sum(prefill, 'modelS'))}` : '—'],
      decode: [state(done, prefillDone), decode.length ? `${decode.length} steps, model ${formatSeconds(sum(decode, 'modelS'))}` : '—'],
      sample: [state(done, t.tokens.length > 0), t.tokens.length ? `${t.tokens.length} token${t.tokens.length === 1 ? '' : 's'} drawn, inside each step’s model time` : '—'],
      detokenize: [state(done, t.tokens.length > 0), t.tokens.length ? `${t.tokens.length} piece${t.tokens.length === 1 ? '' : 's'} of text, on the engine thread` : '—'],
      stream: [state(done, t.tokens.length > 0), this.streamed ? `first text ${formatSeconds(this.streamed.first)} after Send, last ${formatSeconds(this.streamed.last)} (this browser’s clock)`
        : t.tokens.length ? `${t.tokens.length} tokens streamed` : '—'],
    };
  }

  render() {
    const stages = this.stages();
    for (const [key, el] of this.stageEls) {
      const [state, text] = stages[key];
      el.dataset.state = state;
      if (state === 'active') el.setAttribute('aria-current', 'step');
      else el.removeAttribute('aria-current');
      el.querySelector('.kpl-time').textContent = text;
    }
    this.textEl.textContent = this.trace.tokens.map((k) => k.text).join('');
    const t = this.trace;
    if (!t.rid && !this.tokenize) this.announce(this.isLive ? 'Press “Send it through” to follow a real request.' : 'Waiting for the recording’s first request…');
    else if (t.finished) this.announce(`${t.rid} finished (${t.finished.reason}) after ${formatSeconds(t.finished.e2e_s)} in the engine.`);
    else if (this.isLive && this.client.engine?.paused) this.announce(`${pausedText(this.client.engine)}: your request moves on when they resume.`);
    else this.announce('');
  }

  exportData() {
    return { trace: this.trace.toJSON(), tokenize: this.tokenize, streamed: this.streamed, stages: this.stages() };
  }
}

customElements.define('kv-pipeline', KvPipeline);
