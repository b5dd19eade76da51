// The one module every page loads: starts the shared event client, defines the page's
// own elements, and loads a widget's code only when that widget is on the page.

import { getClient } from './client.js';
import './kv-term.js';
import './kv-value.js';
import './kv-quiz.js';
import './lib/connection.js';

const WIDGET_TAGS = ['kv-tokenizer', 'kv-attention', 'kv-cache-view', 'kv-pages', 'kv-memory'];

performance.mark('kv:page-start');
getClient();

for (const tag of WIDGET_TAGS) {
  if (!document.querySelector(tag)) continue;
  import(`./widgets/${tag}.js`).catch((error) => {
    console.warn(`kvscope: the ${tag} widget could not be loaded: ${error.message}`);
    for (const element of document.querySelectorAll(tag)) {
      element.textContent = 'This widget could not be loaded.';
      element.setAttribute('role', 'note');
    }
  });
}
