// Events of the recording the page replays, read directly. Replies recorded for another
// client (`tokens`, `sandbox`) are not part of the replayed stream a widget receives, so
// widgets that show them in replay read them here.

import { recordingUrl } from '../../lib/recordings.js';

const cache = new Map();

/** All events of the client's recording (cached per URL); [] when it cannot be read. */
export function recordingEvents(client) {
  const url = client.recordingUrl;
  if (!url) return Promise.resolve([]);
  if (!cache.has(url)) {
    cache.set(url, fetch(url)
      .then((r) => (r.ok ? r.text() : ''))
      .then((text) => text.split('\n').filter((l) => l.trim()).slice(1).map((l) => {
        try { return JSON.parse(l); } catch { return null; }
      }).filter(Boolean))
      .catch(() => []));
  }
  return cache.get(url);
}

/** The recording's events of the given types. */
export async function recordedOfType(client, ...types) {
  const events = await recordingEvents(client);
  return events.filter((e) => types.includes(e.type));
}

/** The recording's `tokens` reply for a prompt whose ids begin `ids` (the longest such;
 *  null when the recording tokenized none): a replay labels prompt tokens with their text. */
export async function recordedPromptTokens(client, ids) {
  const recorded = await recordedOfType(client, 'tokens');
  const matches = recorded.filter((t) => t.ids.length && t.ids.length <= ids.length && t.ids.every((id, i) => id === ids[i]));
  return matches.reduce((best, t) => (!best || t.ids.length > best.ids.length ? t : best), null);
}

/** All events of a committed recording by name; [] when it cannot be read. */
export async function namedRecordingEvents(name) {
  return recordingEvents({ recordingUrl: await recordingUrl(name) });
}
