// <kv-term>: a glossary term in the chapter text (rendered by the server with its tooltip
// inside). CSS shows the tooltip on hover and focus; this element keeps it on screen,
// lets Escape dismiss it (WCAG 1.4.13) and lets touch readers tap it open.

const MARGIN = 8;

class KvTerm extends HTMLElement {
  connectedCallback() {
    if (this._wired) return;
    this._wired = true;
    this.addEventListener('focus', () => this._show());
    this.addEventListener('mouseenter', () => this._show());
    this.addEventListener('blur', () => this._reset());
    this.addEventListener('mouseleave', () => this._reset());
    this.addEventListener('keydown', (event) => {
      if (event.key === 'Escape') {
        this.dataset.dismissed = '';
        delete this.dataset.open;
      }
    });
    this.addEventListener('click', () => {
      // Touch screens have no hover: a tap toggles the tooltip.
      if ('open' in this.dataset) delete this.dataset.open;
      else this.dataset.open = '';
      this._place();
    });
  }

  get tip() {
    return this.querySelector(':scope > .kv-term__tip');
  }

  _show() {
    delete this.dataset.dismissed;
    this._place();
  }

  _reset() {
    delete this.dataset.dismissed;
    delete this.dataset.open;
  }

  /** Flip the tooltip left or above when it would run off the viewport. */
  _place() {
    const tip = this.tip;
    if (!tip) return;
    delete this.dataset.align;
    delete this.dataset.place;
    const box = tip.getBoundingClientRect();
    if (!box.width) return;   // not shown
    if (box.right > document.documentElement.clientWidth - MARGIN) this.dataset.align = 'right';
    const term = this.getBoundingClientRect();
    if (box.bottom > window.innerHeight - MARGIN && term.top - box.height > MARGIN * 8) this.dataset.place = 'above';
  }
}

if (!customElements.get('kv-term')) customElements.define('kv-term', KvTerm);
