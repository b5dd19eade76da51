// A learner's prompt, run by the live engine as a *watched* request, and the events that
// come back for it: the prompt row (input, Run, mode badge, error line) that the
// inside-the-model widgets share, and the bookkeeping of which request they follow.
// Live: the request this widget submitted; before the first Run, the recorded request of
// the page's recording, drawn at once as an example. Replay: the first request in the
// recording that carries the event types the widget needs.
//
//   this.run = new WatchedRun(this, { watch: { internals: true, layers: [] }, wants: ['internals.mlp'],
//                                     onEvent: (e) => ..., onReset: () => ... });
//   this.body.append(this.run.controls, ...);

import { h } from './svg.js';
import { idLabel, tokenLabel, visibleText } from './tokens.js';
import { recordedPromptTokens, recordingEvents } from './recording.js';
import { modeBadge, showMode } from './controls.js';

const FAMILIES = ['request', 'internals', 'attention', 'sampling'];

export class WatchedRun {
  constructor(widget, { watch, wants, params = { temperature: 0, max_tokens: 4 }, submitFields, prompt, onEvent, onReset }) {
    this.widget = widget;
    this.watch = watch;
    this.wants = new Set(wants);
    this.params = params;
    this.submitFields = submitFields;   // () => more submit fields (they may replace params)
    this.onEventCb = onEvent;
    this.onResetCb = onReset;
    const uid = widget.getAttribute('aria-labelledby');
    this.input = h('input', { class: 'kvw-input', id: `${uid}-prompt`, type: 'text', size: 36 });
    this.input.value = widget.getAttribute('prompt') || prompt || 'The little cat sat on the mat';
    this.input.addEventListener('keydown', (e) => { if (e.key === 'Enter') this.start(); });
    this.button = h('button', { type: 'button', class: 'kvw-btn kvw-btn--primary', onclick: () => this.start() }, 'Run');
    this.badge = modeBadge();
    this.error = h('p', { class: 'kvw-error', role: 'alert' });
    this.exampleNote = h('p', { class: 'kvw-note kvw-example' });
    this.exampleNote.hidden = true;
    this.controls = h('div', {},
      h('div', { class: 'kvw-row' }, h('label', { for: this.input.id }, 'Prompt'), this.input, this.button, this.badge),
      this.exampleNote, this.error);
    this.reset();
    this.offs = [];
  }

  /** The widget's client (it changes when the widget falls back to its recording). */
  get client() { return this.widget.client; }

  /** Call from the widget's connectedCallback / disconnectedCallback. */
  attach() {
    if (this.offs.length) return;
    this.offs.push(this.client.on('*', (e) => this.onAny(e)));
    this.offs.push(this.client.onModeChange((mode) => this.modeChanged(mode)));
    this.modeChanged(this.client.mode);
  }

  detach() {
    for (const off of this.offs.splice(0)) off();
    if (this.replaySub) { this.replaySub(); this.replaySub = null; }
  }

  reset() {
    this.rid = null;
    this.buffer = [];
    this.labels = [];        // position -> visible token text
    this.tokenIds = [];
    this.numPrompt = 0;
    this.numCached = 0;
    this.finished = false;
    this.seen = new Map();   // replay: each request's events before one is followed
    this.exampleNote.hidden = true;
    delete this.widget.dataset.example;
    delete this.widget.dataset.finished;
    this.onResetCb?.();
  }

  modeChanged(mode) {
    this.button.disabled = mode === 'replay' || this.pending;
    this.button.title = mode === 'replay' ? 'Running a prompt needs the live engine' : '';
    showMode(this.badge, mode);
    if (mode === 'replay' && !this.replaySub) this.replaySub = this.client.subscribe(FAMILIES);
    if (mode !== 'replay' && this.replaySub) { this.replaySub(); this.replaySub = null; }
    if (mode === 'live' && !this.rid && !this.pending) this.showExample();
  }

  /** Live, before the learner's first Run: draw the recording's request (its events, read
   *  from the file, not replayed), so the widget shows something real on arrival. */
  async showExample() {
    if (this.exampleLoading) return;
    this.exampleLoading = true;
    const events = await recordingEvents(this.client);
    const first = events.find((e) => this.wants.has(e.type));
    if (!first || this.rid || this.pending || this.client.mode !== 'live') return;
    this.reset();
    const own = events.filter((e) => e.request_id === first.request_id && e.ref === undefined);
    for (const e of own) this.deliver(e);
    const added = own.find((e) => e.type === 'request.added');
    this.labelFromRecording();
    this.exampleNote.textContent = `A recorded example${added && added.prompt ? ` (“${added.prompt}”)` : ''}: press Run to compute your own prompt on the live engine.`;
    this.exampleNote.hidden = false;
    this.widget.announce(this.exampleNote.textContent);   // not the recorded request's own news
    this.widget.dataset.example = 'true';
  }

  async start() {
    const prompt = this.input.value.trim();
    if (!prompt || this.pending) return;
    this.error.textContent = '';
    if (this.rid && !this.finished) this.client.command('cancel', { request_id: this.rid }).catch(() => {});
    this.reset();
    this.pending = true;
    this.button.disabled = true;
    this.client.command('tokenize', { text: prompt }).then((t) => this.labelPrompt(t)).catch(() => {});
    try {
      const ack = await this.client.command('submit', { prompt, params: this.params, watch: this.watch, ...this.submitFields?.() });
      this.rid = ack.request_id;
      this.numPrompt = ack.num_prompt_tokens;
      this.widget.announce(`Request ${this.rid} submitted: ${ack.num_prompt_tokens} prompt tokens.`);
      for (const e of this.buffer.splice(0)) if (e.request_id === this.rid) this.deliver(e);
    } catch (error) {
      this.error.textContent = this.widget.describeError(error);
    } finally {
      this.pending = false;
      this.button.disabled = this.client.mode === 'replay';
      this.buffer = [];
    }
  }

  labelPrompt(tokens) {
    if (!tokens || !tokens.tokens) return;
    tokens.tokens.forEach((t, i) => { this.labels[i] = tokenLabel(t); });
    this.widget.requestRender();
  }

  labelAt(pos) {
    return this.labels[pos] ?? (this.tokenIds[pos] !== undefined ? idLabel(this.tokenIds[pos]) : `#${pos}`);
  }

  onAny(e) {
    if (!e.request_id || e.ref !== undefined) return;
    if (e.type === 'error') {
      if (e.request_id === this.rid) this.error.textContent = e.message;
      return;
    }
    if (this.rid) {
      if (e.request_id === this.rid) this.deliver(e);
      return;
    }
    if (this.pending) { this.buffer.push(e); return; }
    if (this.client.mode !== 'replay') return;
    if (!this.seen.has(e.request_id)) this.seen.set(e.request_id, []);
    this.seen.get(e.request_id).push(e);
    if (!this.wants.has(e.type)) return;
    this.rid = e.request_id;   // replay: follow the first request that has what we draw
    for (const earlier of this.seen.get(e.request_id)) this.deliver(earlier);
    this.seen.clear();
    this.labelFromRecording();
  }

  async labelFromRecording() {
    this.labelPrompt(await recordedPromptTokens(this.client, this.tokenIds.slice(0, this.numPrompt)));
  }

  deliver(e) {
    if (e.type === 'request.added') {
      this.numPrompt = e.num_prompt_tokens;
      e.prompt_token_ids.forEach((id, i) => { this.tokenIds[i] = id; });
      if (this.client.mode === 'replay' && e.prompt) this.input.value = e.prompt;   // the recorded prompt
    } else if (e.type === 'request.token') {
      const pos = this.numPrompt + e.index;
      this.tokenIds[pos] = e.token_id;
      this.labels[pos] = visibleText(e.text || '') || idLabel(e.token_id);
    } else if (e.type === 'request.finished') {
      this.finished = true;
      this.numCached = e.num_cached_tokens;
      this.widget.dataset.finished = 'true';
      this.widget.announce(`Request ${e.request_id} finished after ${e.num_output_tokens} tokens.`);
    } else if (e.type === 'internals.embeddings') {
      e.positions.forEach((p, i) => { this.tokenIds[p] = e.token_ids[i]; if (this.labels[p] === undefined) this.labels[p] = visibleText(e.texts[i]); });
    }
    this.onEventCb?.(e);
    this.widget.requestRender();
  }
}
