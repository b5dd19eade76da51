// A button whose action is under way is marked busy (aria-disabled), not disabled: a
// disabled button drops keyboard focus to <body>, and the learner who pressed Enter on it
// loses their place (and the widget's own shortcut keys with it). Its click handler must
// ignore clicks while busy; `isBusy(button)` says so.

export function setBusy(button, busy) {
  if (busy) button.setAttribute('aria-disabled', 'true');
  else button.removeAttribute('aria-disabled');
}

export function isBusy(button) {
  return button.getAttribute('aria-disabled') === 'true';
}

/** Runs the learner's live `work` with `button` busy and `errorEl` emptied; a failure is
 *  said in `errorEl`, in the widget's words. A click while busy, or with no live engine, does nothing. */
export async function runBusy(widget, button, errorEl, work) {
  if (isBusy(button) || !widget.isLive) return;
  setBusy(button, true);
  errorEl.textContent = '';
  try {
    await work();
  } catch (error) {
    errorEl.textContent = widget.describeError(error);
  } finally {
    setBusy(button, false);
  }
}
