// One request followed through the engine's events: when it was added, every step it took
// part in (prefill chunks, decode steps, with the step's measured time and cost), each token,
// and its finish. Timestamps are the server's clock (`ts`, seconds), so differences are real
// engine times, not the browser's.
//
//   const trace = new RequestTrace(rid);   // or RequestTrace(null, { owner }): follow the next request added (by owner)
//   trace.apply(event) → true when something changed
//   trace.added, trace.steps, trace.tokens, trace.finished, trace.ttftS, trace.itlS

export class RequestTrace {
  constructor(rid = null, { owner = null } = {}) {
    this.rid = rid;
    this.owner = owner;        // with rid null: follow the first request this client id owns (null: anyone's)
    this.added = null;         // the request.added event
    this.steps = [];           // [{ step, kind, tokens, start, ts, durationS, scheduleS, modelS, cost, batch, samples }]
    this.tokens = [];          // [{ index, ts, step, text }]
    this.finished = null;      // the request.finished event
  }

  apply(e) {
    if (e.type === 'request.added') {
      if (this.rid === null && !this.added && (!this.owner || e.owner === this.owner)) this.rid = e.request_id;
      if (e.request_id !== this.rid || this.added) return false;
      this.added = e;
      return true;
    }
    if (!this.rid) return false;
    if (e.type === 'step') {
      const mine = e.seqs.find((s) => s.request_id === this.rid);
      if (!mine) return false;
      this.steps.push({
        step: e.step, kind: mine.kind, tokens: mine.num_tokens, start: mine.start, samples: mine.samples, ts: e.ts,
        durationS: e.duration_s, scheduleS: e.schedule_s, modelS: e.model_s, cost: e.cost, batch: e.seqs.length,
        batchTokens: e.num_batched_tokens,
      });
      return true;
    }
    if (e.type === 'request.token' && e.request_id === this.rid) {
      this.tokens.push({ index: e.index, ts: e.ts, step: e.step, text: e.text });
      return true;
    }
    if (e.type === 'request.finished' && e.request_id === this.rid) {
      this.finished = e;
      return true;
    }
    return false;
  }

  get arrivalTs() { return this.added ? this.added.ts : null; }

  /** Seconds from arrival to the start of its first step: time spent waiting in the queue. */
  get queueS() {
    if (!this.added || !this.steps.length) return null;
    return Math.max(0, this.steps[0].ts - this.steps[0].durationS - this.added.ts);
  }

  get prefillSteps() { return this.steps.filter((s) => s.kind === 'prefill'); }
  get decodeSteps() { return this.steps.filter((s) => s.kind === 'decode'); }

  get ttftS() {
    if (this.finished && this.finished.ttft_s !== null) return this.finished.ttft_s;
    return this.tokens.length && this.added ? this.tokens[0].ts - this.added.ts : null;
  }

  get itlS() {
    if (this.finished) return this.finished.itl_s;
    return this.tokens.slice(1).map((t, i) => t.ts - this.tokens[i].ts);
  }

  toJSON() {
    return { request_id: this.rid, added: this.added, steps: this.steps, tokens: this.tokens, finished: this.finished,
      ttft_s: this.ttftS, itl_s: this.itlS, queue_s: this.queueS };
  }
}

/** The p-th percentile (0–1) of numbers, nearest rank; null for none. */
export function percentile(values, p) {
  if (!values.length) return null;
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil(p * sorted.length) - 1))];
}
