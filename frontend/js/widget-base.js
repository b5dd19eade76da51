// KvWidget: the base class of every kvscope widget (a custom element in the chapter text).
//
//   class KvPages extends KvWidget {
//     static events = ['kv', 'step'];          // families to subscribe to (hello/engine always arrive)
//     static replayEvents = ['request'];       // subscribed only while replaying (live, the widget
//                                              // follows its own requests)
//     static label = 'Page allocator';         // heading; a `label` attribute overrides it
//     static requires = ['kv', 'steps'];       // what the live view needs (hello.backend.capabilities);
//                                              // a server without one: the widget plays its
//                                              // chapter's recording at once, and says why
//     setup() { this.body.innerHTML = '<svg ...>'; }   // once, after the frame is built
//     onEvent(event) { ...update state...; this.requestRender(); }
//     render() { ...draw state into this.body... }     // at most once per animation frame
//     exportData() { return { blocks: this.blocks }; } // "Export data" (JSON)
//   }
//   customElements.define('kv-pages', KvPages);
//
// The frame it builds (light DOM, so the page CSS applies): a heading, a toolbar with
// "Export image" (the body's first <svg> as SVG, or its first <canvas> as PNG; otherwise
// an SVG snapshot of the widget's HTML) and "Export data", `this.body` for the drawing,
// a legend (`setLegend`) and a polite live region (`announce`).
// Also here: `this.client`, `this.filters` (set to re-subscribe with filters),
// `this.isLive`, `onModeChange(mode)`, `describeError(error)`, `addTool(element)`,
// `prefersReducedMotion()`, and the shared formatters and colours re-exported below.
// The first widget to paint sets performance mark 'kv:first-widget-paint'.

import { EventClient, getClient } from './client.js';
import { familyOf } from './lib/replay-socket.js';
import { recordingUrl } from './lib/recordings.js';

export { formatValue, formatInt, formatFloat, formatBytes, formatSeconds, formatSI, getPath, pausedText } from './lib/format.js';
export { CATEGORICAL, categoricalColor, cssVar, heatColor, heatTextColor } from './lib/colors.js';

const ALWAYS_DELIVERED = new Set(['hello', 'engine']);
let widgetCount = 0;

// How to start a kvscope server that has a capability it can lack.
const HOW_TO_SEE_LIVE = {
  speculation: 'This server does not speculate; start it with '
    + '`kvscope serve --speculative-config \'{"method": "ngram", "num_speculative_tokens": 3}\'` to see it live.',
  tensor_parallel: 'This server runs one rank; start it with `kvscope serve --tensor-parallel-size 2` to see it live.',
};

/** The capabilities of `needed` that the server of `hello` lacks ([] when it has them all;
 *  a hello without `backend` comes from a server older than the field, which had them all). */
export function missingCapabilities(hello, needed) {
  const have = hello && hello.backend ? new Set(hello.backend.capabilities) : null;
  return have ? needed.filter((c) => !have.has(c)) : [];
}

/** One sentence: why the live view cannot be shown, and how to see it live. */
export function fallbackReason(hello, missing) {
  const backend = hello.backend;
  if (backend.engine !== 'kvscope') {
    return `This needs kvscope's own engine; the attached ${backend.engine === 'vllm' ? 'vLLM ' : ''}server `
      + `does not expose it (${missing.join(', ')}).`;
  }
  const hint = missing.map((c) => HOW_TO_SEE_LIVE[c]).find(Boolean);
  return hint || `This server does not offer ${missing.join(', ')}.`;
}

/** True when the reader asked for no animation; widgets then jump straight to the end state. */
export function prefersReducedMotion() {
  return window.matchMedia('(prefers-reduced-motion: reduce)').matches;
}

/** Saves a Blob as a file through a temporary link. */
export function downloadBlob(blob, filename) {
  const url = URL.createObjectURL(blob);
  const link = document.createElement('a');
  link.href = url;
  link.download = filename;
  link.hidden = true;
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10000);
}

// Properties that carry an SVG's look; copied inline so an exported file needs no page CSS.
const SVG_STYLE_PROPERTIES = [
  'fill', 'fill-opacity', 'stroke', 'stroke-width', 'stroke-dasharray', 'stroke-opacity', 'opacity',
  'font-family', 'font-size', 'font-weight', 'text-anchor', 'dominant-baseline', 'visibility',
];

function svgWithInlineStyles(svg) {
  const clone = svg.cloneNode(true);
  const originals = [svg, ...svg.querySelectorAll('*')];
  const copies = [clone, ...clone.querySelectorAll('*')];
  originals.forEach((original, i) => {
    const computed = getComputedStyle(original);
    const inline = SVG_STYLE_PROPERTIES.map((p) => `${p}:${computed.getPropertyValue(p)}`).join(';');
    copies[i].setAttribute('style', `${inline};${copies[i].getAttribute('style') || ''}`);
  });
  const box = svg.getBoundingClientRect();
  clone.setAttribute('xmlns', 'http://www.w3.org/2000/svg');
  if (!clone.getAttribute('width')) clone.setAttribute('width', String(Math.round(box.width)));
  if (!clone.getAttribute('height')) clone.setAttribute('height', String(Math.round(box.height)));
  // A background, so a dark-mode export stays readable on a white viewer.
  const background = document.createElementNS('http://www.w3.org/2000/svg', 'rect');
  background.setAttribute('width', '100%');
  background.setAttribute('height', '100%');
  background.setAttribute('fill', getComputedStyle(svg.closest('.kv-widget') || document.body).backgroundColor || '#fff');
  clone.prepend(background);
  return new XMLSerializer().serializeToString(clone);
}

function pageCss() {
  const parts = [];
  for (const sheet of document.styleSheets) {
    try {
      for (const rule of sheet.cssRules) parts.push(rule.cssText);
    } catch {
      // A cross-origin sheet cannot be read; kvscope serves none.
    }
  }
  return parts.join('\n');
}

/** An SVG picture of an HTML widget (foreignObject with the page's CSS). */
function htmlSnapshotSvg(widget) {
  const box = widget.getBoundingClientRect();
  const clone = widget.cloneNode(true);
  clone.querySelector('.kv-widget__toolbar')?.remove();
  const css = pageCss().replace(/]]>/g, ']]&gt;');
  const html = new XMLSerializer().serializeToString(clone);
  const width = Math.ceil(box.width);
  const height = Math.ceil(box.height);
  return `<svg xmlns="http://www.w3.org/2000/svg" width="${width}" height="${height}">`
    + `<style><![CDATA[${css}]]></style>`
    + `<foreignObject width="100%" height="100%"><div xmlns="http://www.w3.org/1999/xhtml">${html}</div></foreignObject></svg>`;
}

export class KvWidget extends HTMLElement {
  static events = [];
  static requires = [];
  static label = 'Widget';

  constructor() {
    super();
    this.client = getClient();
    this._filters = null;
    this._offs = [];
    this._renderQueued = false;
    this._built = false;
  }

  // -- hooks for subclasses --------------------------------------------------------------
  setup() {}
  render() {}
  onEvent() {}
  onModeChange() {}
  exportData() { return {}; }
  /** The element "Export image" saves: the body's first svg or canvas by default. */
  exportImageElement() { return this.body.querySelector('svg, canvas'); }

  // -- lifecycle -------------------------------------------------------------------------
  connectedCallback() {
    if (!this._built) {
      this._built = true;
      this._buildFrame();
      this.setup();
      this._firstRender();
    }
    this._listen();
  }

  disconnectedCallback() {
    for (const off of this._offs.splice(0)) off();
  }

  get label() { return this.getAttribute('label') || this.constructor.label; }
  get isLive() { return this.client.mode === 'live'; }
  get filters() { return this._filters; }

  /** Change the server-side filters ({request_id, layer, head}); re-subscribes. */
  set filters(value) {
    this._filters = value && Object.keys(value).length ? value : null;
    if (this.isConnected) {
      for (const off of this._offs.splice(0)) off();
      this._listen();
    }
  }

  _listen() {
    const families = this.constructor.events.filter((family) => !ALWAYS_DELIVERED.has(family));
    if (families.length) this._offs.push(this.client.subscribe(families, this._filters));
    const wanted = new Set([...families, ...ALWAYS_DELIVERED]);
    this._offs.push(this.client.on('*', (event) => {
      // Replies (they carry a ref) go to the command's promise, not to every widget.
      if (event.ref !== undefined && event.ref !== null) return;
      if (event.type === 'hello' && this._fallsBack(event)) return;
      if (wanted.has(familyOf(event.type))) this.onEvent(event);
    }));
    this._offs.push(this.client.onModeChange((mode) => {
      this.dataset.mode = mode;
      this._followReplay(mode);
      this.onModeChange(mode);
    }));
    this._offs.push(() => this._followReplay(null));
    this.dataset.mode = this.client.mode;
    this._followReplay(this.client.mode);
    if (!this._caughtUp) {
      // A widget loaded after the connection opened still starts from the model's facts.
      this._caughtUp = true;
      if (this.client.hello && this._fallsBack(this.client.hello)) return;
      if (this.client.hello) this.onEvent(this.client.hello);
      if (this.client.engine) this.onEvent(this.client.engine);
    }
  }

  // -- a server that cannot show this widget live: its recording instead ------------------
  /** True (and the switch started) when a live `hello` lacks a capability this widget needs. */
  _fallsBack(hello) {
    if (this._fellBack || this.client.mode !== 'live') return false;
    const missing = missingCapabilities(hello, this.constructor.requires);
    if (!missing.length) return false;
    this._fellBack = true;
    this.dataset.fallback = missing.join(' ');
    this._playRecording(fallbackReason(hello, missing));
    return true;
  }

  /** Re-attach the widget to its own replay of the chapter's recording (the `recording`
   *  attribute, else the page's), paused at the end until the learner asks again. */
  async _playRecording(reason) {
    const name = this.getAttribute('recording') || document.body.dataset.recording;
    this._recordingClient = new EventClient({ recordingUrl: name ? await recordingUrl(name) : null, live: false });
    const said = `${reason} ${name ? 'Playing the recording.' : 'This page has no recording to play instead.'}`;
    // `a command` in the sentence is shown as code.
    this.fallbackText.replaceChildren(...said.split('`').map((part, i) => {
      if (i % 2 === 0) return part;
      const code = document.createElement('code');
      code.textContent = part;
      return code;
    }));
    this.fallbackEl.hidden = false;
    if (!name) return;
    // Handlers subclasses attached to the page's client follow the widget to its own one.
    this.disconnectedCallback();
    this.client = this._recordingClient;
    this._caughtUp = false;
    if (this.isConnected) this.connectedCallback();
    this.client.addEventListener('replaystate', () => this._showReplayState());
    this.client.start();
  }

  _showReplayState() {
    const state = this.client.replay.state;
    const ended = state.loaded && !state.playing && state.stepIndex >= state.stepCount;
    this.replayButton.textContent = ended ? 'Replay from the start' : (state.playing ? 'Pause' : 'Play');
    this.replayButton.hidden = !state.loaded;
    this.dataset.replayStep = String(state.stepIndex);
    this.dataset.replayEnded = String(ended);
  }

  /** Holds the `replayEvents` subscription exactly while the page replays. */
  _followReplay(mode) {
    const families = this.constructor.replayEvents || [];
    if (mode === 'replay' && families.length && !this._replaySub) this._replaySub = this.client.subscribe(families);
    if (mode !== 'replay' && this._replaySub) { this._replaySub(); this._replaySub = null; }
  }

  // -- the frame -------------------------------------------------------------------------
  _buildFrame() {
    widgetCount += 1;
    const id = `kv-widget-${widgetCount}`;
    this.classList.add('kv-widget');
    if (!this.hasAttribute('role')) this.setAttribute('role', 'region');
    this.setAttribute('aria-labelledby', `${id}-title`);

    const header = document.createElement('div');
    header.className = 'kv-widget__header';
    const title = document.createElement('h3');
    title.className = 'kv-widget__title';
    title.id = `${id}-title`;
    title.textContent = this.label;
    this.toolbar = document.createElement('div');
    this.toolbar.className = 'kv-widget__toolbar';
    this.toolbar.setAttribute('role', 'toolbar');
    this.toolbar.setAttribute('aria-label', `${this.label}: export`);
    const imageButton = this._button('Export image', () => this.exportImage().then(({ blob, filename }) => downloadBlob(blob, filename)));
    const dataButton = this._button('Export data', () => {
      const { blob, filename } = this.exportDataBlob();
      downloadBlob(blob, filename);
    });
    this.toolbar.append(imageButton, dataButton);
    header.append(title, this.toolbar);

    // The line that says why this widget plays a recording on a live page, with its control.
    this.fallbackEl = document.createElement('p');
    this.fallbackEl.className = 'kv-widget__fallback';
    this.fallbackEl.setAttribute('role', 'note');
    this.fallbackEl.hidden = true;
    this.fallbackText = document.createElement('span');
    this.replayButton = this._button('Play', () => {
      const replay = this.client.replay;
      if (replay.state.playing) replay.pause();
      else replay.play();
    });
    this.replayButton.hidden = true;
    this.fallbackEl.append(this.fallbackText, ' ', this.replayButton);

    this.body = document.createElement('div');
    this.body.className = 'kv-widget__body';
    this.legendEl = document.createElement('ul');
    this.legendEl.className = 'kv-legend';
    this.legendEl.setAttribute('aria-label', `${this.label}: legend`);
    this.legendEl.hidden = true;
    this.statusEl = document.createElement('p');
    this.statusEl.className = 'kv-widget__status';
    this.statusEl.setAttribute('role', 'status');
    this.statusEl.setAttribute('aria-live', 'polite');

    // Whatever the author put inside the element (rare) stays, above the drawing.
    const authored = [...this.childNodes];
    this.replaceChildren(header, this.fallbackEl, ...authored, this.body, this.legendEl, this.statusEl);
  }

  _button(text, onClick) {
    const button = document.createElement('button');
    button.type = 'button';
    button.className = 'kv-button';
    button.textContent = text;
    button.addEventListener('click', () => {
      Promise.resolve()
        .then(onClick)
        .catch((error) => this.announce(`Could not export: ${error.message}`));
    });
    return button;
  }

  /** Adds a control (button, select, ...) to the toolbar, before the export buttons. */
  addTool(element) {
    this.toolbar.prepend(element);
    return element;
  }

  _firstRender() {
    this._renderNow();
    requestAnimationFrame(() => requestAnimationFrame(() => {
      // Two frames: the first runs before the paint, the second after it.
      if (!performance.getEntriesByName('kv:first-widget-paint').length) performance.mark('kv:first-widget-paint');
      performance.mark(`kv:paint:${this.localName}`);
      this.dataset.painted = 'true';
    }));
  }

  /** Schedule render(); many events in one frame cost one render. */
  requestRender() {
    if (this._renderQueued) return;
    this._renderQueued = true;
    requestAnimationFrame(() => {
      this._renderQueued = false;
      this._renderNow();
    });
  }

  _renderNow() {
    this.render();
    this.client.countRender();
  }

  // -- status, legend, errors ------------------------------------------------------------
  /** Says something to screen readers (and shows it under the widget). */
  announce(text) {
    this.statusEl.textContent = text;
  }

  /** items: [{ label, color, shape?: 'square' | 'circle' | 'line' | 'hatch' }] */
  setLegend(items) {
    this.legendEl.replaceChildren(...items.map((item) => {
      const entry = document.createElement('li');
      const swatch = document.createElement('span');
      swatch.className = `kv-legend__swatch kv-legend__swatch--${item.shape || 'square'}`;
      swatch.style.setProperty('--swatch', item.color);
      swatch.setAttribute('aria-hidden', 'true');
      entry.append(swatch, document.createTextNode(item.label));
      return entry;
    }));
    this.legendEl.hidden = items.length === 0;
  }

  /** A sentence for a failed command, with the replay case spelled out. */
  describeError(error) {
    if (error && error.code === 'replay') return 'This needs the live engine; the page is replaying a recording.';
    if (error && error.code === 'disconnected') return 'The connection to the engine was lost; try again in a moment.';
    return error && error.message ? error.message : String(error);
  }

  // -- export ----------------------------------------------------------------------------
  _filename(extension) {
    const stamp = new Date().toISOString().replace(/[:.]/g, '-').slice(0, 19);
    return `${this.localName}-${stamp}.${extension}`;
  }

  /** { blob, filename } of the current view: SVG, or PNG for a canvas. */
  async exportImage() {
    const target = this.exportImageElement();
    if (target instanceof HTMLCanvasElement) {
      const blob = await new Promise((resolve, reject) => target.toBlob((b) => (b ? resolve(b) : reject(new Error('the canvas is empty'))), 'image/png'));
      return { blob, filename: this._filename('png') };
    }
    const text = target instanceof SVGSVGElement ? svgWithInlineStyles(target) : htmlSnapshotSvg(this);
    return { blob: new Blob([text], { type: 'image/svg+xml' }), filename: this._filename('svg') };
  }

  /** { blob, filename } of exportData() with what it came from. */
  exportDataBlob() {
    const hello = this.client.hello;
    const payload = {
      widget: this.localName,
      exported_at: new Date().toISOString(),
      mode: this.client.mode,
      model: hello && hello.model ? hello.model.name : null,
      data: this.exportData(),
    };
    return { blob: new Blob([JSON.stringify(payload, null, 2)], { type: 'application/json' }), filename: this._filename('json') };
  }
}
