// Where a committed recording (frontend/recordings/<name>.jsonl) is read from: one rule for
// the client and the widgets. A served page fetches the file. An exported book loads its
// modules as data: URLs (server/pages/static_modules.py), so there is no folder to be relative
// to: each recording is a classic script that registers a data: URL of its events in
// window.kvscopeRecordings, which also works when the book is opened from file://.
const exported = import.meta.url.startsWith('data:');

/** The recording's URL when it is known now (served, or its script already ran), else null. */
export function loadedRecordingUrl(name) {
  if (!exported) return new URL(`../../recordings/${encodeURIComponent(name)}.jsonl`, import.meta.url).href;
  return (window.kvscopeRecordings || {})[name] || null;
}

/** The recording's URL, loading an exported recording's script first when needed. */
export async function recordingUrl(name) {
  const known = loadedRecordingUrl(name);
  if (known || !exported) return known;
  await loadClassicScript(exportedScriptUrl(name));
  return loadedRecordingUrl(name);
}

function exportedScriptUrl(name) {
  // The recordings' scripts sit beside the import map's: static/js/ and static/recordings/.
  const importMap = document.querySelector('script[src$="js/importmap.js"]');
  return new URL(`../recordings/${encodeURIComponent(name)}.js`, importMap.src).href;
}

function loadClassicScript(src) {
  return new Promise((resolve) => {
    const script = document.createElement('script');
    script.src = src;
    script.onload = script.onerror = () => resolve();
    document.head.append(script);
  });
}
