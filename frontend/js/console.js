// The instructor console: drives the engine with the instructor WebSocket commands
// (docs/events.md) through the shared event client.
import { getClient } from './client.js';
import { formatSeconds } from './lib/format.js';

const $ = (id) => document.getElementById(id);
const MAX_LOG = 200;
const THROUGHPUT_WINDOW_S = 5;
// The projector shows the engine's pool without the learner-only parts (own load, sandbox).
const PROJECTOR_WIDGETS = [['kv-batch-timeline', {}], ['kv-pages', { 'pool-only': '' }]];
// A burst the room can follow: at full speed the engine finishes it in a fraction of a second.
const ROOM_BURST = { n: 6, max_tokens: 24, slow_motion_s: 0.25 };
const recentSteps = [];   // [ts, tokens sampled] of the last few seconds' steps
// The projector's figures. Steps taken by hand while paused are no rate and no burst: the
// figures stay those of the engine's last run, and say that it is paused.
const projector = { paused: false, rate: null, handSteps: 0, slowMotion: 0 };
const lastBurst = { peakRunning: 0, tokens: 0, startTs: null, lastTs: null };   // held after it ends

function log(text, kind = 'info') {
  const item = document.createElement('li');
  item.className = kind;
  item.textContent = `${new Date().toLocaleTimeString()}  ${text}`;
  $('log').prepend(item);
  while ($('log').children.length > MAX_LOG) $('log').lastChild.remove();
}

function numberOrNull(input) {
  return input.value === '' ? null : Number(input.value);
}

/** Attached to vLLM the caps are vLLM's own, set when it started (a cap of 0 is its
 *  stand-in: vLLM reports them only through /server_info, in its development mode). */
function attachedKnobs(k) {
  const cap = (v) => (v ? String(v) : 'not reported');
  return `vLLM's own: budget ${cap(k.max_num_batched_tokens)}, max seqs ${cap(k.max_num_seqs)} `
    + '(set by vLLM at start-up; not steerable from here)';
}

function showEngine(e) {
  $('s-paused').textContent = e.paused ? 'paused' : 'running';
  $('s-step').textContent = String(e.step);
  $('s-queues').textContent = `${e.num_running} / ${e.num_waiting}`;
  const k = e.knobs;
  $('s-knobs').textContent = e.vllm ? attachedKnobs(k)
    : `budget ${k.max_num_batched_tokens}, max seqs ${k.max_num_seqs}, `
      + `chunk ${k.prefill_chunk_size ?? 'none'}, chunked prefill ${k.enable_chunked_prefill ? 'on' : 'off'}`;
  $('s-viewers').textContent = String(e.num_viewers);
  $('s-slow').textContent = e.slow_motion_s ? `${e.slow_motion_s} s between steps` : 'off';
  showSlowMotion(e.slow_motion_s);
  if (e.paused !== projector.paused) projector.handSteps = 0;
  projector.paused = e.paused;
  projector.slowMotion = e.slow_motion_s;
  $('p-running').textContent = String(e.num_running);
  $('p-waiting').textContent = String(e.num_waiting);
  showProjectorFigures();
  $('s-recording').textContent = e.recording ? `${e.recording.name} (${e.recording.events} events)` : 'off';
  if (document.activeElement?.closest('#knobs') == null) {
    $('k-budget').value = k.max_num_batched_tokens;
    $('k-seqs').value = k.max_num_seqs;
    $('k-chunk').value = k.prefill_chunk_size ?? '';
    $('k-chunked').checked = k.enable_chunked_prefill;
  }
}

/** The slow-motion menu says what the server keeps (it survives pause and resume). */
function showSlowMotion(seconds) {
  const select = $('slow-interval');
  if (document.activeElement === select) return;
  const value = String(seconds || 0);
  if (![...select.options].some((o) => o.value === value)) select.append(new Option(`${value} s`, value));
  select.value = value;
}

/** The projector's big figures: queue lengths, output tokens a second over the last few
 * seconds, and the last burst's figures, which stay up after the burst has ended. A burst
 * lasts from its first step's start to its last step's end. */
function showProjectorStep(e) {
  $('p-step').textContent = String(e.step);
  $('p-running').textContent = String(e.queues.running);
  $('p-waiting').textContent = String(e.queues.waiting);
  if (projector.paused) {   // a step taken by hand
    projector.handSteps += 1;
    showProjectorFigures();
    return;
  }
  const sampled = e.seqs.filter((s) => s.samples).length;
  recentSteps.push([e.ts, sampled]);
  while (recentSteps.length && recentSteps[0][0] < e.ts - THROUGHPUT_WINDOW_S) recentSteps.shift();
  projector.rate = recentSteps.reduce((a, [, n]) => a + n, 0) / THROUGHPUT_WINDOW_S;
  if (lastBurst.lastTs === null || e.ts - lastBurst.lastTs > 1) Object.assign(lastBurst, { peakRunning: 0, tokens: 0, startTs: e.ts - e.duration_s });
  lastBurst.lastTs = e.ts;
  lastBurst.tokens += sampled;
  lastBurst.peakRunning = Math.max(lastBurst.peakRunning, e.seqs.length);
  showProjectorFigures();
}

function showProjectorFigures() {
  const { paused, rate, handSteps, slowMotion } = projector;
  const rateText = rate === null ? '–' : rate.toFixed(1);
  $('p-throughput').textContent = paused ? `paused (last running: ${rateText})` : rateText;
  $('p-throughput').dataset.rate = rate === null ? '' : String(rate);
  $('p-state').textContent = (paused ? `paused${handSteps ? `, ${handSteps} step${handSteps === 1 ? '' : 's'} by hand` : ''}` : 'running')
    + (slowMotion ? `, ${slowMotion} s/step` : '');
  if (lastBurst.lastTs === null) return;
  const seconds = lastBurst.lastTs - lastBurst.startTs;
  $('p-burst').textContent = `${lastBurst.peakRunning} at once · ${lastBurst.tokens} tokens in ${formatSeconds(seconds)}`
    + (paused ? ' (before the pause)' : '');
}

function toggleProjector() {
  const on = !document.body.classList.contains('projector');
  document.body.classList.toggle('projector', on);
  $('projector').hidden = !on;
  $('projector-toggle').setAttribute('aria-pressed', String(on));
  $('projector-toggle').textContent = on ? 'Back to the full console' : 'Show the projector view';
  if (on && !$('projector-widgets').children.length) {
    for (const [tag, attributes] of PROJECTOR_WIDGETS) {
      import(`./widgets/${tag}.js`).then(() => {
        const widget = document.createElement(tag);
        for (const [name, value] of Object.entries(attributes)) widget.setAttribute(name, value);
        $('projector-widgets').append(widget);
      }).catch((error) => log(`${tag}: ${error.message}`, 'error'));
    }
  }
}

function showStep(e) {
  const prefill = e.seqs.filter((s) => s.kind === 'prefill').length;
  $('s-last').textContent = `#${e.step}: ${e.seqs.length} sequences (${prefill} prefill), `
    + `${e.num_batched_tokens}/${e.token_budget} tokens, ${(e.duration_s * 1000).toFixed(1)} ms`;
  $('s-step').textContent = String(e.step);
  $('s-queues').textContent = `${e.queues.running} / ${e.queues.waiting}`;
}

function showViewers(reply) {
  const body = $('viewers-body');
  body.replaceChildren();
  for (const v of reply.viewers) {
    const row = document.createElement('tr');
    for (const cell of [v.client_id, v.role, v.peer, `${v.connected_s.toFixed(0)} s`, v.families.join(', ') || '–',
      v.active_requests, v.pending, v.dropped]) {
      const td = document.createElement('td');
      td.textContent = String(cell);
      row.append(td);
    }
    body.append(row);
  }
  $('viewers-caption').textContent = `${reply.viewers.length} connected`;
}

function connect(token) {
  const scheme = location.protocol === 'https:' ? 'wss' : 'ws';
  document.body.dataset.wsUrl = `${scheme}://${location.host}/ws?token=${encodeURIComponent(token)}`;
  const client = getClient();
  const run = (cmd, fields = {}) => client.command(cmd, fields)
    .then((reply) => { log(`${cmd}: ok ${summary(reply)}`); return reply; })
    .catch((error) => { log(`${cmd}: ${error.code}: ${error.message}`, 'error'); return null; });

  client.on('session', (s) => {
    $('role').textContent = s.role === 'instructor'
      ? `Connected as instructor (${s.client_id}).`
      : 'Connected, but as a learner: the token was not accepted.';
  });
  client.on('engine', showEngine);
  client.on('step', showStep);
  client.on('step', showProjectorStep);
  $('projector-toggle').onclick = toggleProjector;
  client.subscribe(['step']);
  client.onModeChange((mode) => { if (mode !== 'live') $('role').textContent = `Not live (${mode}).`; });

  const paused = () => client.engine?.paused;
  $('pause').onclick = () => run('pause');
  $('resume').onclick = () => run('resume');
  $('step').onclick = () => run('step');
  $('reset').onclick = () => {
    if (confirm('Reset aborts every request in flight and empties the KV cache. Go on?')) run('reset');
  };
  $('knobs').onsubmit = (event) => {
    event.preventDefault();
    run('set_knobs', {
      max_num_batched_tokens: Number($('k-budget').value), max_num_seqs: Number($('k-seqs').value),
      prefill_chunk_size: numberOrNull($('k-chunk')), enable_chunked_prefill: $('k-chunked').checked,
    });
  };
  $('slow').onsubmit = (event) => {
    event.preventDefault();
    run('slow_motion', { interval_s: Number($('slow-interval').value) });
  };
  // A burst for the room: slow motion first (when the engine runs at full speed), so the
  // projector's timeline grows while people watch; the menu above shows it and sets it back.
  $('room-burst').onclick = async () => {
    if (!client.engine?.slow_motion_s) await run('slow_motion', { interval_s: ROOM_BURST.slow_motion_s });
    run('inject', { n: ROOM_BURST.n, max_tokens: ROOM_BURST.max_tokens });
  };
  $('inject').onsubmit = (event) => {
    event.preventDefault();
    const fields = { n: Number($('i-n').value), max_tokens: Number($('i-tokens').value) };
    if ($('i-prompt').value) fields.prompt_tokens = Number($('i-prompt').value);
    run('inject', fields);
  };
  $('record').onsubmit = (event) => {
    event.preventDefault();
    run('record_start', $('r-name').value ? { name: $('r-name').value } : {});
  };
  $('r-stop').onclick = () => run('record_stop');
  $('viewers').onclick = () => run('viewers').then((reply) => reply && showViewers(reply));

  document.addEventListener('keydown', (event) => {
    if (event.target.closest('input, textarea, select') || event.ctrlKey || event.metaKey || event.altKey) return;
    if (event.key === 'p') run(paused() ? 'resume' : 'pause');
    else if (event.key === 's') run('step');
    else if (event.key === 'v') $('viewers').click();
  });
}

function summary(reply) {
  const { type, ts, ref, cmd, ...rest } = reply;
  const text = JSON.stringify(rest);
  return text === '{}' ? '' : text.length > 160 ? `${text.slice(0, 160)}…` : text;
}

const token = new URLSearchParams(location.search).get('token') || sessionStorage.getItem('kvscope-token');
$('token-form').onsubmit = (event) => {
  event.preventDefault();
  sessionStorage.setItem('kvscope-token', $('token').value);
  location.search = `?token=${encodeURIComponent($('token').value)}`;
};
if (token) {
  $('token').value = token;
  connect(token);
} else {
  $('role').textContent = 'Enter the instructor token to connect.';
}
