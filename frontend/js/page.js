// The one module every page loads: starts the shared event client, defines the page's
// own elements, and loads a widget's code only when that widget is on the page.

import { getClient } from './client.js';
import './kv-term.js';
import './kv-value.js';
import './kv-quiz.js';
import './lib/connection.js';

performance.mark('kv:page-start');
getClient();

// A widget's code is frontend/js/widgets/<tag>.js. The renderer marks every widget it
// places with class kv-widget (an exported page has no preload links to go by).
const widgetTags = new Set([...document.querySelectorAll('.kv-widget')]
  .map((element) => element.localName).filter((tag) => tag.startsWith('kv-')));

for (const tag of widgetTags) {
  import(`./widgets/${tag}.js`).catch((error) => {
    console.warn(`kvscope: the ${tag} widget could not be loaded: ${error.message}`);
    for (const element of document.querySelectorAll(tag)) {
      element.textContent = 'This widget could not be loaded.';
      element.setAttribute('role', 'note');
    }
  });
}
