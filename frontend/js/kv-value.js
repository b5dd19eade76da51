// <kv-value key="model.num_layers" format="int|bytes|float|text">: a number from the live
// model's `hello` event, so chapters never hard-code what depends on the model. Shows "—"
// until the engine (or a recording) has said hello; updates on every new hello. Attached to
// vLLM, a value vLLM does not report reads "not reported by vLLM", never its stand-in.

import { getClient } from './client.js';
import { formatInt, formatValue, getPath } from './lib/format.js';

// Figures a chapter derives from `hello` instead of restating them: what each is made of,
// and how.
const DERIVED = {
  'derived.min_decode_step_s': [['model.weight_bytes', 'device.peak_bandwidth_bytes_per_s'], (w, bw) => w / bw],
  'derived.ridge_flops_per_byte': [['device.peak_flops', 'device.peak_bandwidth_bytes_per_s'], (f, bw) => f / bw],
  // Chapter 21's quantization arithmetic: one byte per weight, and half a byte.
  'derived.weight_bytes_int8': [['model.num_params'], (n) => n],
  'derived.weight_bytes_int4': [['model.num_params'], (n) => n / 2],
};

/** The hello keys a value is read from. */
function sources(key) {
  return DERIVED[key] ? DERIVED[key][0] : [key];
}

/** True when the engine that answers does not report this value: attached to vLLM, hello
 *  keeps its shape with stand-ins and lists them in backend.unreported. */
export function unreported(hello, key) {
  const missing = hello?.backend?.unreported;
  return Boolean(missing && sources(key).some((k) => missing.includes(k)));
}

function lookup(hello, key) {
  if (!hello) return undefined;
  if (!DERIVED[key]) return getPath(hello, key);
  const [keys, fn] = DERIVED[key];
  return fn(...keys.map((k) => getPath(hello, k)));
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
    if (unreported(hello, key)) {
      // a stand-in is not a fact: say whose figure is missing instead of printing it
      this.textContent = '(not reported by vLLM)';
      this.dataset.state = 'unreported';
      this.dataset.value = '';
      this.title = `${key}: the attached vLLM server does not report it`
        + (key.startsWith('engine.max_num') ? ' (it does with VLLM_SERVER_DEV_MODE=1, through /server_info)' : '');
      return;
    }
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
