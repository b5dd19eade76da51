// Load a widget can make on its own: the learner's own requests, within the learner limits
// the server states in `session.limits`, so a lesson that needs a busy engine works with no
// instructor and no other page.
//
//   const load = new LoadMaker(client, { keep: 3, paceS: 0.2, onChange: () => render() });
//   load.start();            // keep 3 requests in flight: each finished one is replaced
//   await load.burst(4);     // or: send 4 at once, once
//   load.stop();             // cancel what is still running
//   load.running             // Set of request ids in flight
//
// Requests are paced (`pace_s`): each steps at most once per interval, so they live long
// enough to be seen and stay under the per-minute submit limit.

const PROMPTS = [
  'Once upon a time, a little fox found a shiny stone by the river and carried it home to show her brothers.',
  'The old lighthouse keeper climbed the stairs every evening and',
  'Mia wanted to bake a cake for her grandmother, so she went to the market early in the morning to buy eggs, flour and sugar.',
  'In a small village by the sea, there lived a curious cat named',
  'Tom looked out of the window and saw that the snow had covered the whole garden, the fence and the little red car.',
  'The robot woke up in the empty garden and wondered why',
];
const RETRY_MS = 3000;

export class LoadMaker {
  constructor(client, { keep = 3, maxTokens = 48, paceS = 0.2, prompts = PROMPTS, onChange = () => {}, onFinished = () => {} } = {}) {
    this.client = client;
    this.keep = keep;
    this.maxTokens = maxTokens;
    this.paceS = paceS;
    this.prompts = prompts;
    this.onChange = onChange;
    this.onFinished = onFinished;   // (request id) once one of ours has finished
    this.running = new Set();
    this._finishedEarly = new Set();   // finished before its ack arrived (a short request can)
    this._submitting = 0;
    this.sent = 0;
    this.active = false;
    this.error = null;
    this._retry = null;
    this._off = client.on('request.finished', (event) => this._finished(event));
  }

  /** How many may run at once: what was asked, within the learner's limit. */
  get target() {
    const limits = this.client.session && this.client.session.limits;
    return Math.min(this.keep, limits ? limits.max_active_requests : this.keep);
  }

  start() {
    if (this.active) return;
    this.active = true;
    this.error = null;
    this._topUp();
    this.onChange();
  }

  stop() {
    this.active = false;
    clearTimeout(this._retry);
    for (const rid of this.running) this.client.command('cancel', { request_id: rid }).catch(() => {});
    this.onChange();
  }

  /** Send `n` requests at once (within the limit); resolves with their ids. */
  async burst(n, fields = {}) {
    const ids = [];
    for (let i = 0; i < n; i += 1) {
      const rid = await this._submit(fields);
      if (!rid) break;
      ids.push(rid);
    }
    return ids;
  }

  dispose() {
    this.stop();
    this._off();
  }

  async _topUp() {
    if (this._filling) return;   // one filler at a time, or two finishes would overshoot
    this._filling = true;
    try {
      while (this.active && this.running.size < this.target) {
        if (!(await this._submit())) {
          if (this.active) this._retry = setTimeout(() => this._topUp(), RETRY_MS);
          return;
        }
      }
    } finally {
      this._filling = false;
    }
  }

  async _submit(fields = {}) {
    const prompt = this.prompts[this.sent % this.prompts.length];
    this.sent += 1;
    this._submitting += 1;
    try {
      const ack = await this.client.command('submit', {
        prompt, pace_s: this.paceS,
        params: { temperature: 0.8, seed: this.sent, max_tokens: this.maxTokens, ignore_eos: true },
        ...fields,
      });
      this.error = null;
      if (this._finishedEarly.delete(ack.request_id)) this.onFinished(ack.request_id);
      else this.running.add(ack.request_id);
      this.onChange();
      return ack.request_id;
    } catch (error) {
      this.error = error;
      this.onChange();
      return null;
    } finally {
      this._submitting -= 1;
      if (!this._submitting) this._finishedEarly.clear();
    }
  }

  _finished(event) {
    if (!this.running.delete(event.request_id)) {
      if (this._submitting) this._finishedEarly.add(event.request_id);   // may be ours, ack still on its way
      return;
    }
    this.onFinished(event.request_id);
    this.onChange();
    if (this.active) this._topUp();
  }
}
