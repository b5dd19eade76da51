// <kv-connection>: the header badge that says whether the page shows the live engine or
// a recording, and, while replaying, the replay controls (play/pause, step, steps per second,
// a scrubber with a step counter that goes back and forth); while
// the instructor has paused the engine, a banner that says so, and another while the
// instructor's slow motion spaces the engine's steps (it stays on across pause and resume).

import { getClient } from '../client.js';
import { pausedText, slowMotionText } from './format.js';
import { BASE_STEPS_PER_S } from './replay-socket.js';

const STEP_RATES = [1, 2, 4, 8, 16];   // engine steps a second while playing
const REPLAY_TEXT = 'Replaying a recording — no live engine';

/** The header while attached to vLLM (`serve --attach`): who answers (vLLM, its version,
 *  its model, its address) and whether it does now (engine.vllm.connected, updated by every
 *  `engine` event; while it is away the server retries every engine.vllm.retry_s). Attached
 *  to several servers (engine.vllm.servers), it names them, and the ones not answering. */
export function attachedText(hello, vllm) {
  const model = (vllm?.model || hello.model?.name || '').split('/').filter(Boolean).pop() || 'its model';
  const url = vllm?.url || hello.backend.attached_url;
  const servers = vllm?.servers || [];
  const where = servers.length > 1 ? `${servers.length} servers (${servers.map((x) => x.url).join(', ')})` : url;
  const head = `Attached: vLLM ${vllm?.version || hello.backend.version} serving ${model} at ${where}`;
  if (!vllm) return { text: `${head} — connecting…`, state: 'connecting' };
  if (vllm.connected) return { text: `${head} — connected`, state: 'connected' };
  const down = servers.filter((x) => !x.connected);
  if (servers.length > 1 && down.length < servers.length) {   // the others keep working
    return { text: `${head} — ${down.map((x) => x.url).join(', ')} not answering, reconnecting; the others connected`, state: 'disconnected' };
  }
  const every = vllm.retry_s ? ` every ${vllm.retry_s} s` : '';
  return { text: `${head} — disconnected, reconnecting${every}…`, state: 'disconnected' };
}

class KvConnection extends HTMLElement {
  connectedCallback() {
    if (this._built) return;
    this._built = true;
    this.client = getClient();
    this.badge = this.querySelector('.kv-badge') || document.createElement('span');
    this.badge.className = 'kv-badge';
    this.badge.setAttribute('role', 'status');
    this.controls = this._buildControls();
    // Every learner page says when the instructor has stopped the engine, and at which step.
    this.pausedBanner = document.createElement('span');
    this.pausedBanner.className = 'kv-paused-banner';
    this.pausedBanner.setAttribute('role', 'status');
    this.pausedBanner.hidden = true;
    this.slowBanner = document.createElement('span');
    this.slowBanner.className = 'kv-slow-banner';
    this.slowBanner.setAttribute('role', 'status');
    this.slowBanner.hidden = true;
    this.replaceChildren(this.badge, this.pausedBanner, this.slowBanner, this.controls);
    this.client.onModeChange(() => this.update());
    this.client.addEventListener('replaystate', () => this.update());
    this.client.on('hello', () => this.update());
    this.client.on('engine', () => this.update());
    this.update();
  }

  _buildControls() {
    const group = document.createElement('div');
    group.className = 'kv-replay-controls';
    group.setAttribute('role', 'group');
    group.setAttribute('aria-label', 'Replay controls');
    group.hidden = true;

    this.playButton = document.createElement('button');
    this.playButton.type = 'button';
    this.playButton.className = 'kv-button';
    this.playButton.addEventListener('click', () => {
      if (this.client.replay.state.playing) this.client.replay.pause();
      else this.client.replay.play();
    });

    const stepButton = document.createElement('button');
    stepButton.type = 'button';
    stepButton.className = 'kv-button';
    stepButton.textContent = 'Step';
    stepButton.title = 'Pause and advance the recording by one engine step';
    stepButton.setAttribute('aria-label', 'Step: pause and advance by one engine step');
    stepButton.addEventListener('click', () => this.client.replay.step());

    const label = document.createElement('label');
    const speedId = 'kv-replay-speed';
    label.htmlFor = speedId;
    label.textContent = 'Steps/s';
    this.speedSelect = document.createElement('select');
    this.speedSelect.id = speedId;
    this.speedSelect.className = 'kv-select';
    for (const rate of STEP_RATES) {
      const option = document.createElement('option');
      option.value = String(rate / BASE_STEPS_PER_S);
      option.textContent = String(rate);
      this.speedSelect.append(option);
    }
    this.speedSelect.addEventListener('change', () => this.client.replay.setSpeed(Number(this.speedSelect.value)));

    this.scrubber = document.createElement('input');
    this.scrubber.type = 'range';
    this.scrubber.className = 'kv-replay-scrubber';
    this.scrubber.min = '0';
    this.scrubber.step = '1';
    this.scrubber.setAttribute('aria-label', 'Replay position, in engine steps');
    this.scrubber.addEventListener('input', () => this.client.replay.seek(Number(this.scrubber.value)));
    this.counter = document.createElement('span');
    this.counter.className = 'kv-replay-counter';

    group.append(this.playButton, stepButton, label, this.speedSelect, this.scrubber, this.counter);
    return group;
  }

  update() {
    const { mode, hello } = this.client;
    const replay = this.client.replay.state;
    this.badge.dataset.mode = mode;
    this.dataset.mode = mode;
    let text;
    let state = mode;
    if (mode === 'live' && hello?.backend?.engine === 'vllm') {
      ({ text, state } = attachedText(hello, this.client.engine?.vllm));
    } else if (mode === 'live') {
      const model = hello && hello.model ? hello.model.name : 'the engine';
      const device = hello && hello.device ? hello.device.type : '';
      text = `Live engine: ${model}${device ? ` on ${device}` : ''}`;
    } else if (mode === 'replay') {
      text = replay.error ? 'No live engine, and no recording to replay' : REPLAY_TEXT;
    } else {
      text = 'Connecting to the engine…';
    }
    if (this.badge.textContent !== text) this.badge.textContent = text;
    this.badge.dataset.state = state;
    if (mode === 'replay' && replay.recording) this.badge.title = `Recording: ${replay.recording}${replay.description ? ` — ${replay.description}` : ''}`;
    else this.badge.removeAttribute('title');

    const paused = mode === 'live' && Boolean(this.client.engine && this.client.engine.paused);
    this.pausedBanner.hidden = !paused;
    if (paused) this.pausedBanner.textContent = pausedText(this.client.engine);
    const slow = mode === 'live' && this.client.engine ? this.client.engine.slow_motion_s : 0;
    this.slowBanner.hidden = !slow;
    if (slow) this.slowBanner.textContent = slowMotionText(slow);
    this.dataset.slowMotion = String(slow || 0);
    this.controls.hidden = !(mode === 'replay' && replay.loaded);
    const ended = replay.loaded && !replay.playing && replay.stepIndex >= replay.stepCount;
    this.playButton.textContent = replay.playing ? 'Pause' : (ended ? 'Replay from the start' : 'Play');
    this.playButton.setAttribute('aria-label', replay.playing ? 'Pause the replay' : (ended ? 'Replay the recording from the start' : 'Play the replay'));
    this.dataset.replayEnded = String(ended);
    this.speedSelect.value = String(replay.speed);
    this.scrubber.max = String(replay.stepCount);
    if (document.activeElement !== this.scrubber || replay.playing) this.scrubber.value = String(replay.stepIndex);
    const counter = `step ${replay.stepIndex} / ${replay.stepCount}`;
    this.scrubber.setAttribute('aria-valuetext', counter);
    if (this.counter.textContent !== counter) this.counter.textContent = counter;
    this.dataset.replayStep = String(replay.stepIndex);
  }
}

if (!customElements.get('kv-connection')) customElements.define('kv-connection', KvConnection);
