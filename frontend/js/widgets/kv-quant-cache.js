// <kv-quant-cache prompt="…">: what an 8-bit KV cache (vLLM's kv_cache_dtype) buys and costs,
// measured on the live model. For each format the learner ticks, the `kv_quant` command
// decodes the prompt greedily twice on the engine's own weights, with an unquantized cache
// and with the 8-bit one, and reports the blocks the engine's KV memory holds in each format
// and how far the next-token logits moved. The widget draws the two one above the other, a
// row per format: what it buys (blocks, ×), then what it costs (logit error, tokens still
// chosen alike); a table with bytes per block and the mean error; the error token by token.
// Without a live engine it shows the measurements stored in the chapter's recording.

import { KvWidget, formatInt, formatFloat, formatBytes, CATEGORICAL } from '../widget-base.js';
import { h, svg } from './lib/svg.js';
import { injectStyle } from './lib/style.js';
import { recordedOfType } from './lib/recording.js';
import { setBusy, isBusy } from './lib/busy.js';
import { modeBadge, showMode } from './lib/controls.js';

const FORMATS = [
  ['fp8_e4m3', 'fp8 (e4m3): 8-bit float, 4 exponent and 3 precision bits, one scale per layer', CATEGORICAL[0]],
  ['fp8_e5m2', 'fp8_e5m2: 8-bit float, 5 exponent and 2 precision bits: more range, less precision', CATEGORICAL[3]],
  ['int8_per_token_head', 'int8_per_token_head: 8-bit integers, one scale per token and head', CATEGORICAL[2]],
];
const AUTO_COLOR = 'var(--kv-cat-8)';
const DEFAULT_PROMPT = 'Once upon a time, a little fox found a shiny stone by the river.';
const DEFAULT_TOKENS = 16;
const W = 480;            // the chapter's widget column; the svg scales down below it
const ROW = 24;
const TITLE = 24;         // a panel's heading
const GAP = 14;           // between the two panels
const LABEL_W = 150;      // the format names
const BAR = 150;          // the longest bar, px (its figure follows it)
const STEP_W = 480;
const STEP_H = 180;
const STEP_PAD = { left: 40, right: 12, top: 26, bottom: 32 };

const STYLE = `
kv-quant-cache .kqc-controls { display: flex; flex-wrap: wrap; gap: .5rem 1.2rem; align-items: end; }
kv-quant-cache fieldset { border: 1px solid var(--kv-border); border-radius: var(--kv-radius, 6px); padding: .3rem .6rem; margin: 0; }
kv-quant-cache fieldset label { display: inline-flex; gap: .3rem; align-items: center; margin-right: .8rem; font-size: .9rem; }
kv-quant-cache .kqc-tokens { display: flex; flex-direction: column; font-size: .85rem; color: var(--kv-fg-soft); }
kv-quant-cache table { border-collapse: collapse; font-size: .8rem; font-variant-numeric: tabular-nums; width: 100%; }
kv-quant-cache th, kv-quant-cache td { padding: .2rem .25rem; border-bottom: 1px solid var(--kv-border); text-align: right; }
kv-quant-cache th:first-child, kv-quant-cache td:first-child { text-align: left; }
kv-quant-cache th { font-weight: 600; vertical-align: bottom; }
kv-quant-cache tbody th { font-weight: 400; font-family: var(--kv-font-mono); font-size: .78rem; }
kv-quant-cache td { white-space: nowrap; }
kv-quant-cache .kqc-swatch { display: inline-block; width: .8em; height: .8em; border-radius: 2px; margin-right: .35em; vertical-align: -.05em; }
kv-quant-cache svg:focus-visible { outline: 3px solid var(--kv-focus); outline-offset: 2px; }
kv-quant-cache .kqc-bar { transition: width .35s ease-out; }
@media (prefers-reduced-motion: reduce) { kv-quant-cache .kqc-bar { transition: none; } }
`;

/** One row of the comparison from a `kv_quant` reply (its 8-bit half). */
function rowOf(reply) {
  return {
    dtype: reply.kv_cache_dtype, fit: reply.quantized, gained: reply.blocks_gained,
    maxError: reply.max_abs_logit_error, meanError: reply.mean_abs_logit_error,
    agree: reply.greedy_agree, total: reply.greedy_total, stepErrors: reply.step_errors,
  };
}

/** A format's name with line-break chances after its underscores (a narrow table wraps it). */
function breakable(name) {
  return name.split('_').flatMap((part, i, parts) => (i < parts.length - 1 ? [`${part}_`, h('wbr')] : [part]));
}

function colorOf(dtype) {
  const entry = FORMATS.find(([name]) => name === dtype || (dtype === 'fp8' && name === 'fp8_e4m3'));
  return entry ? entry[2] : AUTO_COLOR;
}

class KvQuantCache extends KvWidget {
  static events = [];
  static requires = ['kv_quant'];
  static label = 'A quantized KV cache: blocks gained, logits moved';

  setup() {
    injectStyle('kv-quant-cache', STYLE);
    this.replies = new Map();     // kv_cache_dtype -> the latest reply shown
    this.running = false;
    this.recorded = null;
    const uid = this.getAttribute('aria-labelledby');

    this.modeBadge = modeBadge();
    this.promptInput = h('textarea', { class: 'kvw-textarea', id: `${uid}-prompt`, rows: 2, spellcheck: 'false', maxlength: 2000 });
    this.promptInput.value = this.getAttribute('prompt') || DEFAULT_PROMPT;
    this.boxes = FORMATS.map(([name, label, color]) => {
      const box = h('input', { type: 'checkbox', value: name, checked: true, id: `${uid}-${name}` });
      return [box, h('label', { for: box.id }, box, h('span', { class: 'kqc-swatch', style: `background:${color}`, 'aria-hidden': 'true' }), name)];
    });
    this.tokensInput = h('input', { class: 'kvw-input', type: 'number', min: 2, max: 32, step: 1, value: DEFAULT_TOKENS, id: `${uid}-tokens` });
    this.runButton = h('button', { type: 'button', class: 'kvw-btn kvw-btn--primary', onclick: () => { if (!isBusy(this.runButton)) this.measure(); } }, 'Measure');
    this.errorEl = h('p', { class: 'kvw-error', role: 'alert' });
    this.budgetEl = h('p', { class: 'kvw-note kqc-budget' });
    this.chart = svg('svg', { class: 'kvw-svg kqc-chart', role: 'img', tabindex: '0', width: W, height: 100, viewBox: `0 0 ${W} 100` });
    this.stepChart = svg('svg', { class: 'kvw-svg kqc-steps', role: 'img', tabindex: '0', width: STEP_W, height: STEP_H, viewBox: `0 0 ${STEP_W} ${STEP_H}` });
    this.table = h('table', { class: 'kqc-table', 'aria-label': 'Each cache format: bytes, blocks the same memory holds, and the logit error' });
    this.body.append(
      h('div', { class: 'kvw-row' }, h('label', { for: this.promptInput.id }, 'Prompt to decode with each cache'), this.modeBadge),
      this.promptInput,
      h('div', { class: 'kqc-controls' },
        h('fieldset', {}, h('legend', { class: 'kvw-note' }, '8-bit formats to compare with the unquantized cache'), ...this.boxes.map(([, label]) => label)),
        h('label', { class: 'kqc-tokens', for: this.tokensInput.id }, 'Tokens to decode', this.tokensInput),
        this.runButton),
      this.errorEl, this.budgetEl,
      h('div', { class: 'kvw-scroll' }, this.chart),
      h('div', { class: 'kvw-scroll' }, this.table),
      h('p', { class: 'kvw-note' }, 'Below: the largest logit difference at each decoded token, while both runs still chose the same tokens. The first token comes from the prompt’s own keys and values, computed fresh, so its error is zero; from the second on, attention reads the cache back, rounded to 8 bits. A cross marks where a run first chose a different token; after it the two runs read different text and are no longer compared.'),
      h('div', { class: 'kvw-scroll' }, this.stepChart),
    );
    this.setLegend([
      { label: `auto: the model’s own dtype, nothing rounded`, color: AUTO_COLOR },
      ...FORMATS.map(([, label, color]) => ({ label, color })),
      { label: 'upper bars: blocks the same memory holds (longer: more room); lower bars: largest change in a logit (longer: more error)', color: 'transparent' },
    ]);
    this.updateMode(this.client.mode);
    if (this.client.mode === 'replay') this.showRecorded();   // a page that opened replaying
  }

  onModeChange(mode) {
    this.updateMode(mode);
    if (mode === 'replay') this.showRecorded();
  }

  updateMode(mode) {
    showMode(this.modeBadge, mode);
    this.runButton.disabled = mode !== 'live';
    setBusy(this.runButton, this.running);
  }

  onEvent(event) {
    if (event.type === 'hello') this.requestRender();
  }

  /** Replay: the measurements the chapter's recording holds (one per format). */
  async showRecorded() {
    if (!this.recorded) this.recorded = await recordedOfType(this.client, 'kv_quant');
    if (this.client.mode !== 'replay') return;
    if (!this.recorded.length) {
      this.errorEl.textContent = 'Measuring needs the live engine; the page is replaying a recording that holds no measurements.';
      return;
    }
    this.replies = new Map(this.recorded.map((r) => [r.kv_cache_dtype, r]));
    this.promptInput.value = this.recorded[0].prompt || this.promptInput.value;
    this.dataset.shown = 'recorded';
    this.announce(`Replaying a recording: its measurements on the embedded model. ${this.summary()}`);
    this.requestRender();
  }

  async measure() {
    const prompt = this.promptInput.value.trim();
    const formats = this.boxes.filter(([box]) => box.checked).map(([box]) => box.value);
    this.errorEl.textContent = '';
    if (!prompt) { this.errorEl.textContent = 'Type a prompt first.'; return; }
    if (!formats.length) { this.errorEl.textContent = 'Tick at least one 8-bit format.'; return; }
    const tokens = Math.max(2, Math.min(32, Math.round(Number(this.tokensInput.value) || DEFAULT_TOKENS)));
    this.running = true;
    this.updateMode(this.client.mode);
    this.announce(`Measuring ${formats.join(', ')} on the live model…`);
    const replies = new Map();
    try {
      for (const dtype of formats) {
        replies.set(dtype, await this.client.command('kv_quant', { prompt, kv_cache_dtype: dtype, max_tokens: tokens }));
      }
      this.replies = replies;
      this.dataset.shown = 'live';
      this.dataset.runs = String(Number(this.dataset.runs || 0) + 1);
      this.announce(this.summary());
    } catch (error) {
      this.errorEl.textContent = this.describeError(error);
      this.announce('');
    } finally {
      this.running = false;
      this.updateMode(this.client.mode);
      this.requestRender();
    }
  }

  summary() {
    return [...this.replies.values()].map(rowOf).map((r) => `${r.dtype}: ${formatFloat(r.gained, 2)}× the blocks `
      + `(${formatInt(r.fit.num_blocks)}), largest logit difference ${formatFloat(r.maxError, 3)}, `
      + `${r.agree} of ${r.total} greedy tokens the same.`).join(' ');
  }

  render() {
    const replies = [...this.replies.values()];
    const first = replies[0];
    const hello = this.client.hello;
    this.dataset.formats = replies.map((r) => r.kv_cache_dtype).join(' ');
    if (first) {
      this.budgetEl.textContent = `The same memory for every format: this engine’s KV pool, ${formatBytes(first.budget_bytes)} `
        + `(${formatInt(first.auto.num_blocks)} blocks of ${first.block_size} tokens in ${first.model_dtype}). `
        + `Prompt: ${first.num_prompt_tokens} tokens, then ${first.greedy_total} decoded greedily.`;
    } else if (hello && hello.model) {
      this.budgetEl.textContent = `The model stores its cache in ${hello.model.dtype}: ${formatBytes(hello.model.kv_bytes_per_token)} `
        + `a token. Press Measure to see what 8 bits a number buys and costs.`;
    }
    this.renderChart(replies);
    this.renderTable(replies);
    this.renderSteps(replies);
  }

  renderChart(replies) {
    const rows = replies.length ? [{ dtype: `auto (${replies[0].model_dtype})`, fit: replies[0].auto, gained: 1, maxError: 0, agree: replies[0].greedy_total, total: replies[0].greedy_total, auto: true }, ...replies.map(rowOf)] : [];
    const panel = ROW * Math.max(1, rows.length);
    const height = 2 * (TITLE + panel) + GAP;
    this.chart.setAttribute('height', String(height));
    this.chart.setAttribute('viewBox', `0 0 ${W} ${height}`);
    const maxBlocks = Math.max(1, ...rows.map((r) => r.fit.num_blocks));
    const maxError = Math.max(1e-9, ...rows.map((r) => r.maxError));
    const costTop = TITLE + panel + GAP;
    const nodes = [
      svg('text', { x: 0, y: 14, 'font-size': 13, 'font-weight': 600 }, 'Buys: blocks the same memory holds'),
      svg('text', { x: 0, y: costTop + 14, 'font-size': 13, 'font-weight': 600 }, 'Costs: largest change in a next-token logit'),
      svg('line', { x1: 0, x2: W, y1: costTop - GAP / 2, y2: costTop - GAP / 2, stroke: 'var(--kv-border)' }),
    ];
    rows.forEach((r, i) => {
      const color = r.auto ? AUTO_COLOR : colorOf(r.dtype);
      const blocksW = Math.max(2, (r.fit.num_blocks / maxBlocks) * BAR);
      const errorW = r.maxError > 0 ? Math.max(2, (r.maxError / maxError) * BAR) : 0;
      const yBuy = TITLE + i * ROW;
      const yCost = costTop + TITLE + i * ROW;
      nodes.push(
        svg('text', { x: 0, y: yBuy + 15, 'font-size': 12 }, r.dtype),
        svg('rect', { class: 'kqc-bar', x: LABEL_W, y: yBuy + 3, width: blocksW, height: 16, fill: color, 'data-bar': 'blocks', 'data-dtype': r.dtype },
          svg('title', {}, `${r.dtype}: ${formatInt(r.fit.num_blocks)} blocks of ${formatBytes(r.fit.bytes_per_block)}`)),
        svg('text', { x: LABEL_W + blocksW + 5, y: yBuy + 15, 'font-size': 12 }, `${formatInt(r.fit.num_blocks)} (×${formatFloat(r.gained, 2)})`),
        svg('text', { x: 0, y: yCost + 15, 'font-size': 12 }, r.dtype),
        svg('rect', { class: 'kqc-bar', x: LABEL_W, y: yCost + 3, width: errorW, height: 16, fill: color, 'data-bar': 'error', 'data-dtype': r.dtype }),
        svg('text', { x: LABEL_W + errorW + 5, y: yCost + 15, 'font-size': 12 }, r.auto ? '0: the reference'
          : `${formatFloat(r.maxError, 3)} · ${r.agree} of ${r.total} tokens alike`),
      );
    });
    if (!rows.length) {
      for (const top of [TITLE, costTop + TITLE]) nodes.push(svg('text', { x: W / 2, y: top + 20, 'text-anchor': 'middle', 'font-size': 12, class: 'kvw-soft' }, this.isLive ? 'Press Measure: one row per format.' : 'Loading the recorded measurements…'));
    }
    this.chart.replaceChildren(...nodes);
    this.chart.setAttribute('aria-label', rows.length
      ? `What each cache format buys and costs. ${rows.map((r) => `${r.dtype}: ${formatInt(r.fit.num_blocks)} blocks, ${formatFloat(r.gained, 2)} times; largest logit difference ${formatFloat(r.maxError, 3)}, ${r.agree} of ${r.total} tokens alike`).join('; ')}`
      : 'No measurement yet.');
  }

  renderTable(replies) {
    const head = h('tr', {}, ...[['format', 'kv_cache_dtype'], ['bytes a block', 'K and V of one block of tokens, all layers, scales included'],
      ['blocks', 'blocks the engine’s KV memory holds in this format'], ['gain', 'blocks ÷ the unquantized blocks'],
      ['max Δlogit', 'largest change in a next-token logit'], ['mean Δlogit', 'mean over the decoded tokens of the largest change'],
      ['same', 'greedy tokens chosen as the unquantized cache chose them, before the first difference']]
      .map(([c, title]) => h('th', { scope: 'col', title }, c)));
    const cell = (field, text) => h('td', { 'data-field': field }, text);
    const rows = [];
    if (replies.length) {
      const r0 = replies[0];
      rows.push(h('tr', { 'data-dtype': 'auto' },
        h('th', { scope: 'row' }, `auto (${r0.model_dtype})`),
        cell('bytes_per_block', formatInt(r0.auto.bytes_per_block)),
        cell('num_blocks', formatInt(r0.auto.num_blocks)), cell('blocks_gained', '×1'), cell('max_abs_logit_error', '0'),
        cell('mean_abs_logit_error', '0'), cell('greedy', `${r0.greedy_total}/${r0.greedy_total}`)));
    }
    for (const r of replies.map(rowOf)) {
      rows.push(h('tr', { 'data-dtype': r.dtype },
        h('th', { scope: 'row' }, ...breakable(r.dtype)),
        cell('bytes_per_block', formatInt(r.fit.bytes_per_block)),
        cell('num_blocks', formatInt(r.fit.num_blocks)), cell('blocks_gained', `×${formatFloat(r.gained, 2)}`),
        cell('max_abs_logit_error', formatFloat(r.maxError, 3)), cell('mean_abs_logit_error', formatFloat(r.meanError, 3)),
        cell('greedy', `${r.agree}/${r.total}`)));
    }
    this.table.replaceChildren(h('thead', {}, head), h('tbody', {}, ...rows));
  }

  renderSteps(replies) {
    const rows = replies.map(rowOf);
    const steps = Math.max(2, ...rows.map((r) => r.total));
    const maxY = Math.max(1e-9, ...rows.flatMap((r) => r.stepErrors));
    const x = (i) => STEP_PAD.left + (i / (steps - 1)) * (STEP_W - STEP_PAD.left - STEP_PAD.right);
    const y = (v) => STEP_H - STEP_PAD.bottom - (v / maxY) * (STEP_H - STEP_PAD.top - STEP_PAD.bottom);
    const nodes = [
      svg('line', { x1: STEP_PAD.left, x2: STEP_W - STEP_PAD.right, y1: y(0), y2: y(0), stroke: 'var(--kv-fg-soft)' }),
      svg('line', { x1: STEP_PAD.left, x2: STEP_PAD.left, y1: STEP_PAD.top, y2: y(0), stroke: 'var(--kv-fg-soft)' }),
      svg('text', { x: (STEP_W + STEP_PAD.left) / 2, y: STEP_H - 6, 'font-size': 11, 'text-anchor': 'middle' }, 'decoded token (1 = from the prompt’s pass) →'),
      svg('text', { x: 0, y: 12, 'font-size': 11 }, '↑ largest |Δlogit| at that token'),
    ];
    if (rows.length) {
      nodes.push(svg('text', { x: STEP_PAD.left - 4, y: STEP_PAD.top + 4, 'font-size': 10, 'text-anchor': 'end', class: 'kvw-soft' }, formatFloat(maxY, 2)),
        svg('text', { x: STEP_PAD.left - 4, y: y(0), 'font-size': 10, 'text-anchor': 'end', class: 'kvw-soft' }, '0'));
      for (const i of [0, steps - 1]) nodes.push(svg('text', { x: x(i), y: y(0) + 13, 'font-size': 10, 'text-anchor': 'middle', class: 'kvw-soft' }, String(i + 1)));
    }
    for (const r of rows) {
      const color = colorOf(r.dtype);
      const points = r.stepErrors.map((e, i) => `${x(i)},${y(e)}`).join(' ');
      nodes.push(svg('polyline', { points, fill: 'none', stroke: color, 'stroke-width': 2, 'data-dtype': r.dtype }));
      r.stepErrors.forEach((e, i) => nodes.push(svg('circle', { cx: x(i), cy: y(e), r: 2.5, fill: color })));
      if (r.agree < r.total) {   // the step where the runs chose different tokens
        const i = r.stepErrors.length - 1;
        const cx = x(i);
        const cy = y(r.stepErrors[i]);
        nodes.push(svg('path', { d: `M${cx - 5},${cy - 5}L${cx + 5},${cy + 5}M${cx - 5},${cy + 5}L${cx + 5},${cy - 5}`, stroke: color, 'stroke-width': 2.5, 'data-parted': r.dtype },
          svg('title', {}, `${r.dtype}: a different token at step ${i + 1}`)));
      }
    }
    this.stepChart.replaceChildren(...nodes);
    this.stepChart.setAttribute('aria-label', rows.length
      ? `Largest logit difference per decoded token. ${rows.map((r) => `${r.dtype}: ${r.stepErrors.map((e) => formatFloat(e, 3)).join(', ')}${r.agree < r.total ? `; a different token at step ${r.agree + 1}` : ''}`).join('. ')}`
      : 'No measurement yet.');
  }

  exportData() {
    return { prompt: this.promptInput.value, shown: this.dataset.shown || null, measurements: [...this.replies.values()] };
  }
}

customElements.define('kv-quant-cache', KvQuantCache);
