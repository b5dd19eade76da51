// Direct client handlers for a widget (events outside its subscribed families, e.g. its
// own request's `request.*`, which the server sends to the owner unsubscribed), attached
// while the element is in the document.

export function clientHandlers(widget, map) {
  const offs = [];
  return {
    attach() {
      if (offs.length) return;
      for (const [type, fn] of Object.entries(map)) offs.push(widget.client.on(type, fn));
    },
    detach() {
      for (const off of offs.splice(0)) off();
    },
  };
}

/** Mix attach/detach of `this.handlers` into a widget class's connected callbacks. */
export function withHandlers(Base) {
  return class extends Base {
    connectedCallback() {
      super.connectedCallback();
      if (this.handlers) this.handlers.attach();
    }

    disconnectedCallback() {
      super.disconnectedCallback();
      if (this.handlers) this.handlers.detach();
    }
  };
}
