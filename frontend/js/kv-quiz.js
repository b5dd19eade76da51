// <kv-quiz>: the end-of-chapter quiz. The server renders each question as a fieldset of
// native radio buttons (keyboard: Tab to the group, arrows to choose, Enter or the button
// to check). Checking shows every choice's `why`, marked right or wrong in words and
// colour, and keeps a score of first answers.

class KvQuiz extends HTMLElement {
  connectedCallback() {
    if (this._wired) return;
    this._wired = true;
    this._firstTries = new Map();   // question id → was the first answer right
    this.addEventListener('click', (event) => {
      const button = event.target.closest('.kv-quiz__check');
      if (button) this.check(button.closest('.kv-quiz__question'));
    });
    this.addEventListener('keydown', (event) => {
      if (event.key === 'Enter' && event.target.matches('input[type="radio"]')) {
        event.preventDefault();
        this.check(event.target.closest('.kv-quiz__question'));
      }
    });
  }

  check(question) {
    const feedback = question.querySelector('.kv-quiz__feedback');
    const chosen = question.querySelector('input[type="radio"]:checked');
    if (!chosen) {
      feedback.textContent = 'Choose an answer first.';
      return;
    }
    let right = false;
    for (const choice of question.querySelectorAll('.kv-quiz__choice')) {
      const correct = choice.dataset.correct === 'true';
      const picked = choice.contains(chosen);
      if (picked) right = correct;
      choice.dataset.verdict = correct ? 'correct' : 'wrong';
      choice.toggleAttribute('data-chosen', picked);
      const why = choice.querySelector('.kv-quiz__why');
      let verdict = why.querySelector('.kv-quiz__verdict');
      if (!verdict) {
        verdict = document.createElement('span');
        verdict.className = 'kv-quiz__verdict';
        why.prepend(verdict, ' ');
      }
      verdict.textContent = `${correct ? '✓ Right' : '✗ Wrong'}${picked ? ' (your answer)' : ''}:`;
      why.hidden = false;
      const input = choice.querySelector('input');
      input.setAttribute('aria-describedby', why.id);
    }
    feedback.textContent = right
      ? 'Correct. The notes under each choice say why.'
      : 'Not quite. The right answer is marked ✓; the notes say why each choice is right or wrong.';
    if (!this._firstTries.has(question.id)) this._firstTries.set(question.id, right);
    this._updateScore();
  }

  _updateScore() {
    const total = this.querySelectorAll('.kv-quiz__question').length;
    const answered = this._firstTries.size;
    const right = [...this._firstTries.values()].filter(Boolean).length;
    const score = this.querySelector('.kv-quiz__score');
    if (score) {
      score.textContent = answered === total
        ? `You got ${right} of ${total} right on the first try.`
        : `${answered} of ${total} answered, ${right} right on the first try.`;
    }
  }
}

if (!customElements.get('kv-quiz')) customElements.define('kv-quiz', KvQuiz);
