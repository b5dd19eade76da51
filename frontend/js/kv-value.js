// <kv-value key="model.num_layers" format="int|bytes|float|text">: a number from the live
// model's `hello` event, so chapters never hard-code what depends on the model. Shows "—"
// until the engine (or a recording) has said hello; updates on every new hello.

import { getClient } from './client.js';
import { formatInt, formatValue, getPath } from './lib/format.js';

// Figures a chapter derives from `hello` instead of restating them.
const DERIVED = {
  'derived.min_decode_step_s': (hello) => hello.model.weight_bytes / hello.device.peak_bandwidth_bytes_per_s,
  'derived.ridge_flops_per_byte': (hello) => hello.device.peak_flops / hello.device.peak_bandwidth_bytes_per_s,
  // Chapter 21's quantization arithmetic: one byte per weight, and half a byte.
  'derived.weight_bytes_int8': (hello) => hello.model.num_params,
  'derived.weight_bytes_int4': (hello) => hello.model.num_params / 2,
};

function lookup(hello, key) {
  if (!hello) return undefined;
  return DERIVED[key] ? DERIVED[key](hello) : getPath(hello, key);
}

class KvValue extends HTMLElement {
  connectedCallback() {
    const client = getClient();
    this._off = client.on('hello', (hello) => this.update(hello));
    this.update(client.hello);
  }

  disconnectedCallback() {
    if (this._off) this._off();
  }

  update(hello) {
    const key = this.getAttribute('key') || '';
    const format = this.getAttribute('format') || 'int';
    const value = lookup(hello, key);
    const known = value !== undefined && value !== null;
    // `unit` joins the number ("19.8 GB/s" reads as one figure, not "19.8 G" + "B/s").
    this.textContent = known ? formatValue(value, format) + (this.getAttribute('unit') || '') : '—';
    this.dataset.state = known ? 'known' : 'unknown';
    this.dataset.value = known ? String(value) : '';
    const exact = known && format === 'bytes' ? ` (${formatInt(value)} bytes)` : '';
    this.title = known ? `${key}${exact}, reported by the running engine` : `${key}: not known yet (no engine connected)`;
  }
}

if (!customElements.get('kv-value')) customElements.define('kv-value', KvValue);
