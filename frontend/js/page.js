// The one module every page loads: starts the shared event client, defines the page's
// own elements, and loads a widget's code only when that widget is on the page.

import { getClient } from './client.js';
import './kv-term.js';
import './kv-value.js';
import './kv-quiz.js';
import './lib/connection.js';

// Every <kv-*> element on the page not defined above is a widget, in widgets/<tag>.js (the
// server renders only tags whose file exists there).
const WIDGET_TAGS = [...new Set([...document.querySelectorAll('*')].map((el) => el.localName)
  .filter((tag) => tag.startsWith('kv-') && !customElements.get(tag)))];

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
