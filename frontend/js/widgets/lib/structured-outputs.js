// The constraints a learner can put on a sampling request (vLLM's `structured_outputs`,
// sent on the WebSocket `submit`), and a check of the finished text against each, done
// here in the page so the learner sees that the engine's output really is in the language.

const PERSON = {
  type: 'object',
  properties: { name: { type: 'string', maxLength: 12 }, age: { type: 'integer', minimum: 0, maximum: 120 } },
  required: ['name', 'age'], additionalProperties: false,
};

function checkPerson(text) {
  let value;
  try { value = JSON.parse(text); } catch { return { ok: false, says: 'not JSON (yet)' }; }
  const keys = value && typeof value === 'object' && !Array.isArray(value) ? Object.keys(value).sort() : [];
  const ok = keys.join() === 'age,name' && typeof value.name === 'string' && value.name.length <= 12
    && Number.isInteger(value.age) && value.age >= 0 && value.age <= 120;
  return ok ? { ok, says: `valid JSON for the schema: name ${JSON.stringify(value.name)}, age ${value.age}` }
    : { ok, says: 'JSON, but not of the schema' };
}

export const CONSTRAINTS = {
  none: { label: 'none: any token may follow' },
  json: {
    label: 'a JSON schema: {"name": string, "age": integer}',
    fields: { json: PERSON, disable_any_whitespace: true },
    check: checkPerson,
  },
  choice: {
    label: 'a choice: "yes" or "no"',
    fields: { choice: ['yes', 'no'] },
    check: (text) => (['yes', 'no'].includes(text) ? { ok: true, says: `one of the choices: “${text}”` }
      : { ok: false, says: 'not one of the choices (yet)' }),
  },
};

/** Submit fields for a constrained run: enough tokens for the grammar to finish (it stops the request). */
export function constrainedSubmit(kind) {
  const c = CONSTRAINTS[kind];
  return c.fields ? { params: { temperature: 0, max_tokens: 48 }, structured_outputs: c.fields } : {};
}
