// What the engine's batches did, step by step, as widgets draw it: one row per request, one
// column per `step` event, each cell what that request did in that step. Built only from
// `request.added`, `step` and `request.finished` events, in the order they arrive.
//
//   const model = new BatchModel({ maxSteps: 80, maxRequests: 16 });
//   model.apply(event);                 // any event; returns true when the picture changed
//   model.steps                         // [{ step, tokens, budget, seqs, durationS }]
//   model.cell(rid, step)               // { kind: 'prefill' | 'decode' | 'waiting' | 'preempted', tokens, finished }
//   staticBatching(model.finishedRequests(), batchSize)  // the same requests, batched statically

export const CELL_KINDS = ['waiting', 'prefill', 'decode', 'preempted'];

export class BatchModel {
  constructor({ maxSteps = 80, maxRequests = 16 } = {}) {
    this.maxSteps = maxSteps;
    this.maxRequests = maxRequests;
    this.reset();
  }

  reset() {
    this.steps = [];                 // the last maxSteps step events, oldest first
    this.requests = new Map();       // rid -> { rid, prompt, arrivalStep, firstStep, lastStep, output, reason, cells: Map(step -> cell) }
    this.lastStep = 0;
    this.maxNumSeqs = 1;
  }

  apply(event) {
    if (event.type === 'request.added') return this._added(event);
    if (event.type === 'step') return this._step(event);
    if (event.type === 'request.finished') return this._finished(event);
    if (event.type === 'engine' && event.reason === 'reset') {
      this.reset();
      return true;
    }
    return false;
  }

  _added(e) {
    if (this.requests.has(e.request_id)) return false;
    this.requests.set(e.request_id, {
      rid: e.request_id, prompt: e.num_prompt_tokens, maxTokens: e.params.max_tokens, arrivalStep: this.lastStep + 1,
      firstStep: null, lastStep: null, output: 0, reason: null, cells: new Map(),
    });
    this._trimRequests();
    return true;
  }

  _step(e) {
    if (this.steps.length && e.step <= this.steps[this.steps.length - 1].step) this.reset();   // replay went back
    this.lastStep = e.step;
    this.maxNumSeqs = e.max_num_seqs;
    this.steps.push({ step: e.step, tokens: e.num_batched_tokens, budget: e.token_budget, seqs: e.seqs.length, durationS: e.duration_s });
    const ran = new Set();
    for (const s of e.seqs) {
      const r = this.requests.get(s.request_id);
      if (!r) continue;
      ran.add(s.request_id);
      r.firstStep ??= e.step;
      r.lastStep = e.step;
      if (s.samples) r.output += 1;
      r.cells.set(e.step, { kind: s.kind, tokens: s.num_tokens, samples: s.samples, finished: e.finished.includes(s.request_id) });
    }
    for (const rid of e.preempted) {
      const r = this.requests.get(rid);
      if (r && !ran.has(rid)) r.cells.set(e.step, { kind: 'preempted', tokens: 0, finished: false });
    }
    for (const r of this.requests.values()) {
      if (r.reason === null && !r.cells.has(e.step) && r.arrivalStep <= e.step) r.cells.set(e.step, { kind: 'waiting', tokens: 0, finished: false });
    }
    if (this.steps.length > this.maxSteps) this.steps.shift();
    return true;
  }

  _finished(e) {
    const r = this.requests.get(e.request_id);
    if (!r) return false;
    r.reason = e.reason;   // (it arrives before the step event of its last token, which counts that token)
    return true;
  }

  _trimRequests() {
    while (this.requests.size > this.maxRequests) {
      const oldest = [...this.requests.values()].find((r) => r.reason !== null) || this.requests.values().next().value;
      this.requests.delete(oldest.rid);
    }
  }

  /** Requests with at least one cell in the visible steps, in arrival order. */
  visibleRequests() {
    const first = this.steps.length ? this.steps[0].step : Infinity;
    return [...this.requests.values()].filter((r) => r.lastStep === null ? r.reason === null : r.lastStep >= first);
  }

  cell(rid, step) {
    const r = this.requests.get(rid);
    return (r && r.cells.get(step)) || null;
  }

  /** Finished requests that ran entirely within what this model saw. */
  finishedRequests() {
    return [...this.requests.values()].filter((r) => r.reason && r.reason !== 'abort' && r.firstStep !== null);
  }
}

/**
 * The same requests under static batching: when the engine is idle it takes every request
 * that has arrived (up to `batchSize`) as one batch, prefills it in one step, then decodes
 * until its longest member is done; the others' slots sit idle, and requests that arrive
 * meanwhile wait for the whole batch. Returns { steps, tokens, tokensPerStep, batches: [{ rids, start, steps }] }.
 */
export function staticBatching(requests, batchSize) {
  const queue = [...requests].sort((a, b) => a.arrivalStep - b.arrivalStep);
  const batches = [];
  let clock = queue.length ? queue[0].arrivalStep : 0;
  while (queue.length) {
    const start = Math.max(clock, queue[0].arrivalStep);
    let n = 0;
    while (n < queue.length && n < batchSize && queue[n].arrivalStep <= start) n += 1;
    const members = queue.splice(0, n);
    const steps = Math.max(...members.map((r) => Math.max(1, r.output)));   // the first token comes with the prefill step
    batches.push({ rids: members.map((r) => r.rid), start, steps });
    clock = start + steps;
  }
  const tokens = requests.reduce((sum, r) => sum + r.output, 0);
  const steps = batches.reduce((sum, b) => sum + b.steps, 0);
  return { steps, tokens, tokensPerStep: steps ? tokens / steps : 0, batches };
}

/** The same requests as the engine really ran them: the steps in which any of them computed. */
export function continuousBatching(requests) {
  if (!requests.length) return { steps: 0, tokens: 0, tokensPerStep: 0 };
  const busy = new Set(requests.flatMap((r) => [...r.cells].filter(([, c]) => c.kind === 'prefill' || c.kind === 'decode').map(([s]) => s)));
  const tokens = requests.reduce((sum, r) => sum + r.output, 0);
  return { steps: busy.size, tokens, tokensPerStep: busy.size ? tokens / busy.size : 0 };
}
