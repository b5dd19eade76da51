// The one event client every page and widget shares (protocol: docs/events.md).
//
//   import { getClient } from '/static/js/client.js';
//   const client = getClient();                       // singleton; connects on first use
//   const off = client.on('step', (event) => ...);    // event `type`, or '*' for all; returns unsubscribe
//   const unsubscribe = client.subscribe(['kv', 'step'], { request_id: 'r3' });  // ref-counted
//   const reply = await client.command('tokenize', { text: 'Hi' });  // resolves with the reply
//                                                      // or rejects with a CommandError (.code)
//   client.hello / .session / .engine / .memory        // latest state (null until known)
//   client.mode                                        // 'connecting' | 'live' | 'replay'
//   client.onModeChange((mode) => ...)                 // returns unsubscribe
//   client.replay.play() / pause() / step() / setSpeed(2) / seek(n)   // only in replay; paced by engine steps
//   client.stats                                       // counters: events, renders, rates
//
// Without a backend (the socket cannot connect, or the page comes from a static file
// server) it plays a committed recording, /static/recordings/<body data-recording>.jsonl,
// through a ReplaySocket: the same dispatch path, and commands that need the engine
// reject with code 'replay'. It keeps trying the live server in the background and
// switches back when one answers.

import { decodeBinaryFrame, expandTensors } from './lib/frames.js';
import { loadedRecordingUrl } from './lib/recordings.js';
import { ReplaySocket, familyOf } from './lib/replay-socket.js';

const COMMAND_TIMEOUT_MS = 20000;
const CONNECT_TIMEOUT_MS = 4000;
const BACKOFF_MS = [500, 1000, 2000, 4000, 8000, 15000, 30000];
// After a live connection drops, how many failed attempts before replaying instead.
const ATTEMPTS_BEFORE_REPLAY = 2;
const RATE_WINDOW_S = 5;
// While live, the recording is fetched quietly after this long, so the page can still
// replay it if the server goes away later.
const PREFETCH_AFTER_MS = 5000;
// Families the server sends to everyone; they are never subscribed to.
const ALWAYS_SENT = new Set(['hello', 'engine', 'error', 'ack']);

export class CommandError extends Error {
  constructor(code, message, reply = null) {
    super(message);
    this.name = 'CommandError';
    this.code = code;
    this.reply = reply;
  }
}

/** Events per second over the last few seconds, in one-second buckets. */
class RateMeter {
  constructor() { this.buckets = new Map(); }

  add(count = 1) {
    const second = Math.floor(performance.now() / 1000);
    this.buckets.set(second, (this.buckets.get(second) || 0) + count);
    if (this.buckets.size > RATE_WINDOW_S + 2) {
      for (const key of this.buckets.keys()) if (key < second - RATE_WINDOW_S - 1) this.buckets.delete(key);
    }
  }

  /** Average over the last RATE_WINDOW_S whole seconds. */
  perSecond() {
    const now = Math.floor(performance.now() / 1000);
    let total = 0;
    for (let s = now - RATE_WINDOW_S; s < now; s += 1) total += this.buckets.get(s) || 0;
    return total / RATE_WINDOW_S;
  }
}

/** The page's recording (`<body data-recording="name">`), or null when it has none. */
function defaultRecordingUrl() {
  const name = document.body ? document.body.dataset.recording : 'default';
  return name ? loadedRecordingUrl(name) : null;
}

/** A random id for this browser, kept in localStorage, so the server's per-learner limits
 *  follow a learner across tabs (a class behind one address is still many learners). */
function learnerId() {
  try {
    let id = localStorage.getItem('kvscope.learner');
    if (!id) {
      id = Array.from(crypto.getRandomValues(new Uint8Array(12)), (b) => b.toString(16).padStart(2, '0')).join('');
      localStorage.setItem('kvscope.learner', id);
    }
    return id;
  } catch {
    return null;   // storage off (private mode, file:): the connection is the learner
  }
}

function defaultSocketUrl() {
  const override = document.body && document.body.dataset.wsUrl;
  if (override) return override;
  const scheme = location.protocol === 'https:' ? 'wss' : 'ws';
  const learner = learnerId();
  return `${scheme}://${location.host}/ws${learner ? `?learner=${encodeURIComponent(learner)}` : ''}`;
}

export class EventClient extends EventTarget {
  constructor({ socketUrl, recordingUrl, live = true } = {}) {
    super();
    this.socketUrl = socketUrl || defaultSocketUrl();
    this.recordingUrl = recordingUrl === undefined ? defaultRecordingUrl() : recordingUrl;
    this._recordingText = null;
    // An exported book (`data-live="off"`) or a file has no engine to connect to: replay at once.
    this.liveEnabled = live && location.protocol !== 'file:' && document.body?.dataset.live !== 'off';
    this.mode = 'connecting';
    this.hello = null;
    this.session = null;
    this.engine = null;
    this.memory = null;
    this.replayError = null;
    this.stats = {
      events: 0, byType: {}, renders: 0, connects: 0, lastEventAt: null,
      eventsPerSecond: () => this._eventRate.perSecond(),
      rendersPerSecond: () => this._renderRate.perSecond(),
    };
    this._eventRate = new RateMeter();
    this._renderRate = new RateMeter();
    this._handlers = new Map();          // type → Set(handler)
    this._subscriptions = new Set();     // { families, filters }
    this._sentFilters = new Map();       // family → JSON of filters the socket has
    this._pending = new Map();           // ref → { resolve, reject, timer, cmd }
    this._queue = [];                    // commands waiting for an open socket
    this._nextRef = 1;
    this._socket = null;                 // the live WebSocket, when open or opening
    this._replaySocket = null;
    this._attempt = 0;
    this._everLive = false;
    this._retryTimer = null;
    this._helloWaiters = [];
    this.replay = this._makeReplayControls();
  }

  // -- public API ------------------------------------------------------------------------

  start() {
    if (this._started) return this;
    this._started = true;
    if (this.liveEnabled) this._connectLive();
    else this._startReplay();
    return this;
  }

  /** Handler for an event type ('step', 'request.token', ...) or '*'. Returns unsubscribe. */
  on(type, handler) {
    if (!this._handlers.has(type)) this._handlers.set(type, new Set());
    this._handlers.get(type).add(handler);
    return () => this._handlers.get(type)?.delete(handler);
  }

  onModeChange(handler) {
    const listener = (event) => handler(event.detail.mode);
    this.addEventListener('modechange', listener);
    return () => this.removeEventListener('modechange', listener);
  }

  /** Resolves with the `hello` event (at once when known). */
  whenHello() {
    if (this.hello) return Promise.resolve(this.hello);
    return new Promise((resolve) => this._helloWaiters.push(resolve));
  }

  /**
   * Ask the server for event families (ref-counted across callers; filters of several
   * callers are merged). Returns a function that drops this caller's interest.
   */
  subscribe(families, filters = null) {
    const record = { families: [...new Set(families)], filters: filters && Object.keys(filters).length ? filters : null };
    this._subscriptions.add(record);
    this._syncSubscriptions();
    if (this.mode === 'replay') this._catchUpReplay();
    return () => {
      if (this._subscriptions.delete(record)) this._syncSubscriptions();
    };
  }

  /** Send a command; resolves with its reply (ack, tokens, sandbox, ...), rejects on `error`. */
  command(type, fields = {}) {
    const ref = `k${this._nextRef++}`;
    const message = { type, ref, ...fields };
    if (this.mode === 'replay' && this.replayError) {
      return Promise.reject(new CommandError('replay', `"${type}" needs a live engine, and none is connected`));
    }
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this._pending.delete(ref);
        this._queue = this._queue.filter((queued) => queued.ref !== ref);
        reject(new CommandError('timeout', `no answer to "${type}" within ${COMMAND_TIMEOUT_MS / 1000} s`));
      }, COMMAND_TIMEOUT_MS);
      this._pending.set(ref, { resolve, reject, timer, cmd: type });
      const socket = this._openSocket();
      if (socket) socket.send(JSON.stringify(message));
      else this._queue.push(message);
    });
  }

  get isLive() { return this.mode === 'live'; }

  /** Called by widgets once per drawn frame, so the update rate can be measured. */
  countRender() {
    this.stats.renders += 1;
    this._renderRate.add();
  }

  // -- connection ------------------------------------------------------------------------

  _openSocket() {
    const socket = this.mode === 'replay' ? this._replaySocket : this._socket;
    return socket && socket.readyState === 1 ? socket : null;
  }

  _setMode(mode) {
    if (this.mode === mode) return;
    this.mode = mode;
    this.dispatchEvent(new CustomEvent('modechange', { detail: { mode } }));
  }

  _connectLive() {
    clearTimeout(this._retryTimer);
    let socket;
    try {
      socket = new WebSocket(this.socketUrl);
    } catch {
      this._liveFailed();
      return;
    }
    socket.binaryType = 'arraybuffer';   // binary frames: events with arrays (lib/frames.js)
    this._socket = socket;
    let opened = false;
    const connectTimer = setTimeout(() => { if (!opened) socket.close(); }, CONNECT_TIMEOUT_MS);
    socket.onopen = () => {
      opened = true;
      clearTimeout(connectTimer);
      this._attempt = 0;
      this._everLive = true;
      this.replayError = null;
      this.stats.connects += 1;
      this._stopReplay();
      this._setMode('live');
      this._onSocketOpen(socket);
      this._prefetchRecording();
    };
    socket.onmessage = (event) => this._receive(event.data);
    socket.onclose = () => {
      clearTimeout(connectTimer);
      if (this._socket !== socket) return;
      this._socket = null;
      if (opened) this._rejectPending('disconnected', 'the connection to the engine was lost');
      this._liveFailed();
    };
    socket.onerror = () => {};   // always followed by close, handled there
  }

  _liveFailed() {
    this._attempt += 1;
    const replaying = this.mode === 'replay';
    if (!replaying && (!this._everLive || this._attempt >= ATTEMPTS_BEFORE_REPLAY)) this._startReplay();
    else if (!replaying) this._setMode('connecting');
    const delay = BACKOFF_MS[Math.min(this._attempt - 1, BACKOFF_MS.length - 1)];
    this._retryTimer = setTimeout(() => this._connectLive(), delay);
  }

  _prefetchRecording() {
    if (this._prefetchStarted || !this.recordingUrl) return;
    this._prefetchStarted = true;
    setTimeout(() => {
      fetch(this.recordingUrl, { priority: 'low' })
        .then((response) => (response.ok ? response.text() : null))
        .then((text) => { if (text) this._recordingText = text; })
        .catch(() => {});   // the page keeps working live; replay would just fetch again
    }, PREFETCH_AFTER_MS);
  }

  _startReplay() {
    this._sentFilters.clear();
    this._setMode('replay');
    if (!this.recordingUrl) {
      this.replayError = 'this page has no recording';
      this._rejectPending('replay', 'no live engine, and no recording to replay');
      this._emitReplayState();
      return;
    }
    const socket = new ReplaySocket(this.recordingUrl, { text: this._recordingText });
    this._replaySocket = socket;
    socket.onopen = () => {
      this.replayError = null;
      this._onSocketOpen(socket);
      this._emitReplayState();
    };
    socket.onmessage = (event) => this._receive(event.data);
    socket.addEventListener('progress', () => this._emitReplayState());
    socket.onclose = (event) => {
      if (this._replaySocket !== socket) return;
      if (socket.loadError) {
        this.replayError = socket.loadError.message;
        this._rejectPending('replay', 'no live engine, and the recording could not be loaded');
        this._emitReplayState();
      }
    };
  }

  /** A widget that joins a replay late gets the episode so far (once per burst of joins). */
  _catchUpReplay() {
    if (this._catchUpTimer) return;
    this._catchUpTimer = setTimeout(() => {
      this._catchUpTimer = null;
      if (this._replaySocket) this._replaySocket.catchUp();
    }, 0);
  }

  _stopReplay() {
    const socket = this._replaySocket;
    if (!socket) return;
    this._replaySocket = null;
    this._sentFilters.clear();
    this._rejectPending('disconnected', 'switched from the recording to the live engine');
    socket.close();
    this._emitReplayState();
  }

  _onSocketOpen(socket) {
    this._sentFilters.clear();
    this._syncSubscriptions();
    const queued = this._queue;
    this._queue = [];
    for (const message of queued) if (this._pending.has(message.ref)) socket.send(JSON.stringify(message));
  }

  _rejectPending(code, message) {
    for (const [ref, pending] of this._pending) {
      clearTimeout(pending.timer);
      pending.reject(new CommandError(code, message));
      this._pending.delete(ref);
    }
    this._queue = [];
  }

  // -- subscriptions ---------------------------------------------------------------------

  /** The filters a family needs so every caller gets its events (null: no filter). */
  _mergedFilters(family) {
    const records = [...this._subscriptions].filter((record) => record.families.includes(family));
    if (!records.length) return undefined;
    if (records.some((record) => !record.filters)) return null;
    const merged = {};
    for (const key of ['request_id', 'layer', 'head']) {
      if (records.some((record) => record.filters[key] === undefined)) continue;
      const values = new Set(records.flatMap((record) => [].concat(record.filters[key])));
      merged[key] = [...values];
    }
    return Object.keys(merged).length ? merged : null;
  }

  _syncSubscriptions() {
    const socket = this._openSocket();
    if (!socket) return;
    const wanted = new Set([...this._subscriptions].flatMap((record) => record.families)
      .filter((family) => !ALWAYS_SENT.has(family)));
    const groups = new Map();   // filters JSON → families
    for (const family of wanted) {
      const key = JSON.stringify(this._mergedFilters(family));
      if (this._sentFilters.get(family) === key) continue;
      this._sentFilters.set(family, key);
      if (!groups.has(key)) groups.set(key, []);
      groups.get(key).push(family);
    }
    const dropped = [...this._sentFilters.keys()].filter((family) => !wanted.has(family));
    for (const family of dropped) this._sentFilters.delete(family);
    const quiet = (promise) => promise.catch((error) => console.warn(`kvscope: ${error.message}`));
    for (const [key, families] of groups) {
      const filters = JSON.parse(key);
      quiet(this.command('subscribe', filters ? { families, filters } : { families }));
    }
    if (dropped.length) quiet(this.command('unsubscribe', { families: dropped }));
  }

  // -- dispatch --------------------------------------------------------------------------

  _receive(data) {
    if (data instanceof ArrayBuffer) {   // one event with arrays, decoded once for every widget
      this._handleEvent(decodeBinaryFrame(data));
      return;
    }
    let parsed;
    try {
      parsed = JSON.parse(data);
    } catch {
      return;   // not ours to interpret
    }
    // The server may batch several events into one frame as a JSON array. A recorded event
    // with arrays carries them in base64 (`payload`): expanded here, as a binary frame is.
    if (Array.isArray(parsed)) for (const event of parsed) this._handleEvent(expandTensors(event));
    else this._handleEvent(expandTensors(parsed));
  }

  _handleEvent(event) {
    if (!event || typeof event.type !== 'string') return;
    this.stats.events += 1;
    this.stats.byType[event.type] = (this.stats.byType[event.type] || 0) + 1;
    this.stats.lastEventAt = performance.now();
    this._eventRate.add();
    this._remember(event);
    this._settle(event);
    this._dispatch(event.type, event);
    this._dispatch('*', event);
  }

  _remember(event) {
    switch (event.type) {
      case 'hello':
        this.hello = event;
        for (const resolve of this._helloWaiters.splice(0)) resolve(event);
        break;
      case 'session':
        this.session = event;
        break;
      case 'engine':
        this.engine = event;
        break;
      case 'memory':
        this.memory = event;
        break;
      default:
        break;
    }
  }

  /** A reply settles the command that carries the same ref. */
  _settle(event) {
    if (event.ref === undefined || event.ref === null) return;
    const pending = this._pending.get(event.ref);
    if (!pending) return;
    this._pending.delete(event.ref);
    clearTimeout(pending.timer);
    if (event.type === 'error') pending.reject(new CommandError(event.code, event.message, event));
    else pending.resolve(event);
  }

  _dispatch(type, event) {
    const handlers = this._handlers.get(type);
    if (!handlers) return;
    for (const handler of [...handlers]) {
      try {
        handler(event);
      } catch (error) {
        // One broken widget must not starve the others; the error still reaches the console.
        if (typeof reportError === 'function') reportError(error);
        else setTimeout(() => { throw error; });
      }
    }
  }

  // -- replay controls -------------------------------------------------------------------

  _emitReplayState() {
    this.dispatchEvent(new CustomEvent('replaystate', { detail: this.replay.state }));
  }

  _makeReplayControls() {
    const client = this;
    const socket = () => client._replaySocket;
    const act = (fn) => () => {
      const replaySocket = socket();
      if (replaySocket && replaySocket.readyState === 1) fn(replaySocket);
      client._emitReplayState();
    };
    return {
      play: act((s) => s.play()),
      pause: act((s) => s.pause()),
      step: act((s) => s.step()),
      setSpeed(speed) { act((s) => { s.speed = speed; })(); },
      seek(stepIndex) { act((s) => s.seek(stepIndex))(); },
      get state() {
        const s = socket();
        return {
          active: client.mode === 'replay',
          loaded: Boolean(s && s.readyState === 1),
          playing: Boolean(s && s.playing),
          speed: s ? s.speed : 1,
          stepsPerSecond: s ? s.stepsPerSecond : 0,
          stepIndex: s ? s.stepIndex : 0,
          stepCount: s ? s.stepCount : 0,
          position: s ? s.position : 0,
          length: s ? s.length : 0,
          recording: s && s.header ? s.header.name : null,
          description: s && s.header ? s.header.description : null,
          error: client.replayError,
        };
      },
    };
  }
}

/** Whether an event belongs to one of `families` (e.g. 'request.token' → 'request'). */
export function inFamilies(event, families) {
  return families.includes(familyOf(event.type));
}

let singleton = null;

/** The page's one client, started on first use. */
export function getClient() {
  if (!singleton) {
    singleton = new EventClient();
    singleton.start();
    // Handy for tests and for poking at the stream from the devtools console.
    window.kvscope = Object.assign(window.kvscope || {}, { client: singleton });
  }
  return singleton;
}
