// The one module every page loads: starts the shared event client, defines the page's
// own elements, and loads a widget's code only when that widget is on the page.

import { getClient } from './client.js';
import './kv-term.js';
import './kv-value.js';
import './kv-quiz.js';
import './lib/connection.js';

performance.mark('kv:page-start');
getClient();

// A widget's code is frontend/js/widgets/<tag>.js; the chapter template preloads the ones
// its page uses, so those links are the page's list of widgets.
const widgetTags = new Set([...document.querySelectorAll('link[rel="modulepreload"][href*="widgets/kv-"]')]
  .map((link) => new URL(link.href).pathname.split('/').pop().replace(/\.js$/, '')));

for (const tag of widgetTags) {
  if (!document.querySelector(tag)) continue;
  import(`./widgets/${tag}.js`).catch((error) => {
    console.warn(`kvscope: the ${tag} widget could not be loaded: ${error.message}`);
    for (const element of document.querySelectorAll(tag)) {
      element.textContent = 'This widget could not be loaded.';
      element.setAttribute('role', 'note');
    }
  });
}
