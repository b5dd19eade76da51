// ReplaySocket: a stand-in for WebSocket that plays a committed recording (JSONL, see
// docs/events.md "Recordings") and answers commands the way the server would, so the
// event client and every widget run the same code live and in replay.
//
//   const socket = new ReplaySocket('/static/recordings/demo.jsonl');
//   socket.onmessage = (e) => handle(JSON.parse(e.data));
//   socket.pause(); socket.step(); socket.speed = 2; socket.play(); socket.seek(12);
//
// Pacing is by engine steps, the rule the server's /ws/replay follows too
// (kvscope.instrumentation.recording): the recording is cut into step groups (everything up
// to a `step` event, that event, and what the engine published with it), and playing sends
// BASE_STEPS_PER_S × speed groups a second, whatever the recorded run's wall-clock gaps.
// `seek(n)` goes to the state after n groups, backwards too (by replaying from the start).
// At the end it stops and keeps what it drew (a learner may be reading it): `play()` then
// starts over.
//
// What it emulates: `hello`, a `session` with `replay: true`, subscriptions per family
// (with request_id/layer/head filters), a snapshot on subscribe (kv, memory, request),
// `ack` for subscribe/unsubscribe/snapshot/ping, and `error` code `replay` for commands
// that need a live engine (submit, tokenize, sandbox, ...).

const CONNECTING = 0;
const OPEN = 1;
const CLOSED = 3;

// Families every connection receives whether subscribed or not.
const ALWAYS_SENT = new Set(['hello', 'engine', 'error', 'ack', 'recording']);
// Commands a recording can answer without an engine.
const LOCAL_COMMANDS = new Set(['subscribe', 'unsubscribe', 'snapshot', 'ping', 'auth', 'replay']);
export const BASE_STEPS_PER_S = 4;
// What the engine publishes with a step, after the `step` event itself (docs/events.md).
const AFTER_STEP = new Set(['kv', 'attention', 'sampling', 'memory', 'spec']);

/** The family an event type belongs to: 'request.token' → 'request', 'session' → 'hello'. */
export function familyOf(type) {
  if (type === 'session') return 'hello';
  return String(type).split('.')[0];
}

function asList(value) {
  if (value === undefined || value === null) return null;
  return Array.isArray(value) ? value : [value];
}

/** Does `event` pass a subscription's filters ({request_id, layer, head})? */
export function passesFilters(event, filters) {
  if (!filters) return true;
  const ids = asList(filters.request_id);
  if (ids && 'request_id' in event && !ids.includes(event.request_id)) return false;
  const layers = asList(filters.layer);
  if (layers && Array.isArray(event.layers) && !event.layers.some((l) => layers.includes(l))) return false;
  const heads = asList(filters.head);
  if (heads && Array.isArray(event.heads) && !event.heads.some((h) => heads.includes(h))) return false;
  return true;
}

/** The index after the last event of each step group (see the header). */
export function stepGroupEnds(events) {
  const ends = [];
  let i = 0;
  while (i < events.length) {
    if (events[i].type === 'step') {
      i += 1;
      while (i < events.length && AFTER_STEP.has(events[i].type)) i += 1;
      ends.push(i);
    } else {
      i += 1;
    }
  }
  if (!ends.length || ends[ends.length - 1] < events.length) ends.push(events.length);
  return ends;
}

/** Parses a recording's text: { header, events }. Throws on a file that is not one. */
export function parseRecording(text) {
  const lines = text.split('\n').filter((line) => line.trim());
  if (!lines.length) throw new Error('the recording is empty');
  const header = JSON.parse(lines[0]);
  if (header.format !== 'kvscope-recording') throw new Error('not a kvscope recording (no header line)');
  return { header, events: lines.slice(1).map((line) => JSON.parse(line)) };
}

export class ReplaySocket extends EventTarget {
  static CONNECTING = CONNECTING;
  static OPEN = OPEN;
  static CLOSED = CLOSED;

  /** `text`: the recording's contents when already fetched (then `url` is only its name). */
  constructor(url, { speed = 1, autoplay = true, text = null } = {}) {
    super();
    this.url = String(url);
    this.readyState = CONNECTING;
    this.onopen = null;
    this.onmessage = null;
    this.onclose = null;
    this.onerror = null;
    this.header = null;
    this.playing = autoplay;
    this._speed = speed;
    this._events = [];
    this._ends = [];            // step groups: the index after each one's last event
    this._position = 0;         // index of the next event
    this._group = 0;            // step groups sent so far
    this._timer = null;
    this._subscriptions = new Map();   // family → filters
    this._state = { engine: null, memory: null, kv: null, requests: new Map() };
    this._load(text);
  }

  get speed() { return this._speed; }

  set speed(value) {
    const speed = Number(value);
    if (!(speed > 0)) return;
    this._speed = speed;
    if (this.playing) this._schedule();
  }

  /** Engine steps a second while playing. */
  get stepsPerSecond() { return BASE_STEPS_PER_S * this._speed; }

  /** Index of the next event and the total, for a progress display. */
  get position() { return this._position; }
  get length() { return this._events.length; }

  /** Step groups sent so far, and how many the recording has (the scrubber's range). */
  get stepIndex() { return this._group; }
  get stepCount() { return this._ends.length; }

  play() {
    if (this.readyState !== OPEN) { this.playing = true; return; }
    if (this._position >= this._events.length) this._restart();
    this.playing = true;
    this._schedule();
  }

  pause() {
    this.playing = false;
    clearTimeout(this._timer);
  }

  /** Paused, advance by one engine step: its group of events. */
  step() {
    this.pause();
    if (this._position >= this._events.length) this._restart();
    this._emitGroup();
  }

  /** Paused, go to the state after `n` step groups: forwards by sending them, backwards by
   * starting over (widgets reset) and sending the first n at once. */
  seek(n) {
    this.pause();
    const target = Math.max(0, Math.min(this._ends.length, Math.round(n)));
    if (target < this._group) this._restart();
    while (this._group < target) this._emitGroup();
  }

  /** Send what has been replayed so far again, from the start (widgets reset first): a
   * widget that subscribed after the replay began then sees the whole episode so far. */
  catchUp() {
    if (this._group === 0 || this.readyState !== OPEN) return;
    const target = this._group;
    this._restart();
    while (this._group < target) this._emitGroup();
  }

  send(data) {
    if (this.readyState !== OPEN) throw new DOMException('the replay is not open', 'InvalidStateError');
    let command;
    try {
      command = JSON.parse(data);
    } catch {
      this._reply({ type: 'error', ref: null, code: 'invalid_json', message: 'the message is not JSON' });
      return;
    }
    const ref = command.ref ?? null;
    const cmd = command.type;
    if (!LOCAL_COMMANDS.has(cmd)) {
      this._reply({
        type: 'error', ref, cmd, code: 'replay',
        message: `"${cmd}" needs a live engine; this page is replaying a recording`,
      });
      return;
    }
    if (cmd === 'subscribe') {
      const families = command.families || [];
      for (const family of families) this._subscriptions.set(family, command.filters || null);
      this._reply({ type: 'ack', ref, cmd });
      this._sendSnapshots(families);
    } else if (cmd === 'unsubscribe') {
      for (const family of command.families || []) this._subscriptions.delete(family);
      this._reply({ type: 'ack', ref, cmd });
    } else if (cmd === 'snapshot') {
      this._reply({ type: 'ack', ref, cmd });
      this._sendSnapshots(command.families || [...this._subscriptions.keys()]);
    } else if (cmd === 'replay') {
      if (command.speed) this.speed = command.speed;
      if (command.action === 'pause') this.pause();
      else if (command.action === 'play') this.play();
      else if (command.action === 'step') this.step();
      this._reply({ type: 'ack', ref, cmd });
    } else {
      this._reply({ type: 'ack', ref, cmd, role: 'learner' });
    }
  }

  close(code = 1000, reason = '') {
    if (this.readyState === CLOSED) return;
    clearTimeout(this._timer);
    this.readyState = CLOSED;
    this._fire('close', Object.assign(new Event('close'), { code, reason, wasClean: code === 1000 }));
  }

  // -- loading and the clock -------------------------------------------------------------

  async _load(preloaded) {
    await null;   // let the caller attach onopen/onmessage first, as with a WebSocket
    try {
      let text = preloaded;
      if (!text) {
        const response = await fetch(this.url);
        if (!response.ok) throw new Error(`${response.status} ${response.statusText}`);
        text = await response.text();
      }
      const { header, events } = parseRecording(text);
      this.header = header;
      this._events = events;
      this._ends = stepGroupEnds(events);
    } catch (error) {
      this.loadError = error;
      this._fire('error', new Event('error'));
      this.close(1006, `could not load the recording: ${error.message}`);
      return;
    }
    if (this.readyState === CLOSED) return;
    this.readyState = OPEN;
    this._fire('open', new Event('open'));
    this._openStream();
  }

  /** The server's connect sequence: hello, session, engine; then the stream. */
  _openStream() {
    const helloIndex = this._events.findIndex((event) => event.type === 'hello');
    if (helloIndex >= 0) {
      this._emitAt(helloIndex);
      this._position = helloIndex + 1;
    }
    this._reply({
      type: 'session', client_id: 'replay', role: 'learner', replay: true,
      recording: this.header ? this.header.name : null,
      subscriptions: Object.fromEntries(this._subscriptions), limits: {},
    });
    if (this.playing) this.play();
  }

  _restart() {
    const helloIndex = this._events.findIndex((event) => event.type === 'hello');
    this._position = helloIndex + 1;
    this._group = 0;
    this._state.requests.clear();
    // Widgets drop what they drew for the previous pass, as after an engine reset.
    this._reply({ type: 'engine', reason: 'reset', paused: false, replay_restart: true });
  }

  /** Send the next step group. */
  _emitGroup() {
    const end = this._ends.find((e) => e > this._position) ?? this._events.length;
    while (this._position < end && this.readyState === OPEN) {
      this._emitAt(this._position);
      this._position += 1;
    }
    this._group = this._ends.filter((e) => e <= this._position).length;
    this.dispatchEvent(new Event('progress'));   // for a scrubber
  }

  /** Playing: one step group now, the next one 1 / stepsPerSecond later; at the end, stop. */
  _schedule() {
    clearTimeout(this._timer);
    if (!this.playing || this.readyState !== OPEN) return;
    if (this._position >= this._events.length) {
      this.playing = false;
      this.dispatchEvent(new Event('progress'));
      return;
    }
    this._emitGroup();
    this._timer = setTimeout(() => this._schedule(), 1000 / this.stepsPerSecond);
  }

  // -- emitting --------------------------------------------------------------------------

  _emitAt(index) {
    const event = this._events[index];
    this._track(event);
    const family = familyOf(event.type);
    if (!ALWAYS_SENT.has(family)) {
      if (!this._subscriptions.has(family)) return;
      if (!passesFilters(event, this._subscriptions.get(family))) return;
    }
    // Replies recorded for another client carry its refs; they must not match ours.
    const { ref, ...rest } = event;
    this._deliver(ref === undefined ? event : rest);
  }

  _reply(fields) {
    const last = this._events[Math.max(0, this._position - 1)];
    this._deliver({ ts: last && typeof last.ts === 'number' ? last.ts : 0, ...fields });
  }

  _deliver(event) {
    if (this.readyState !== OPEN) return;
    this._fire('message', new MessageEvent('message', { data: JSON.stringify(event) }));
  }

  _fire(type, event) {
    const handler = this[`on${type}`];
    if (typeof handler === 'function') handler.call(this, event);
    this.dispatchEvent(event);
  }

  // -- state kept so a late subscriber gets a snapshot, as from the server ----------------

  _track(event) {
    const state = this._state;
    switch (event.type) {
      case 'engine':
        state.engine = event;
        break;
      case 'memory':
        state.memory = event;
        break;
      case 'kv':
        if (event.kind === 'snapshot') {
          state.kv = structuredClone(event);
        } else if (state.kv) {
          for (const block of event.blocks || []) state.kv.blocks[block.id] = block;
          Object.assign(state.kv.tables, event.tables || {});
          for (const id of event.removed_tables || []) delete state.kv.tables[id];
          for (const key of ['step', 'num_free', 'num_cached', 'prefix_hits', 'evictions', 'ts']) {
            if (key in event) state.kv[key] = event[key];
          }
        }
        break;
      case 'request.added':
        state.requests.set(event.request_id, {
          request_id: event.request_id, source: event.source, owner: event.owner, status: 'waiting',
          num_prompt_tokens: event.num_prompt_tokens, num_output_tokens: 0, num_computed_tokens: 0,
          held: Boolean(event.held), watched: Boolean(event.watched),
        });
        break;
      case 'request.token': {
        const request = state.requests.get(event.request_id);
        if (request) request.num_output_tokens = event.index + 1;
        break;
      }
      case 'request.finished':
        state.requests.delete(event.request_id);
        break;
      case 'step':
        for (const seq of event.seqs || []) {
          const request = state.requests.get(seq.request_id);
          if (request) {
            request.status = 'running';
            request.num_computed_tokens = seq.start + seq.num_tokens;
          }
        }
        break;
      default:
        break;
    }
  }

  _sendSnapshots(families) {
    const state = this._state;
    for (const family of families) {
      if (family === 'kv' && state.kv) this._deliver({ ...structuredClone(state.kv), kind: 'snapshot' });
      else if (family === 'memory' && state.memory) this._deliver(state.memory);
      else if (family === 'request') {
        this._reply({ type: 'request.snapshot', requests: [...state.requests.values()] });
      }
    }
  }
}
