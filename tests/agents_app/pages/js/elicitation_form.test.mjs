// Tests of agents_app/static/agents_app/elicitation_form.mjs (run by tests/agents_app/pages/test_js_modules.py).
import assert from "node:assert/strict";
import { test } from "node:test";

import { contentFrom, elicitationCard, elicitationFields, fieldErrors } from "../../../../agents_app/static/agents_app/elicitation_form.mjs";

// The form server-everything's trigger-elicitation-request asks for, in part.
const schema = {
  type: "object",
  properties: {
    name: { title: "String", type: "string", description: "Your full, legal name" },
    check: { title: "Boolean", type: "boolean" },
    email: { type: "string", format: "email" },
    birthdate: { type: "string", format: "date" },
    meeting: { type: "string", format: "date-time" },
    integer: { title: "Integer", type: "integer", minimum: 1, maximum: 100, default: 42 },
    number: { type: "number", minimum: 0 },
    friend: { type: "string", enum: ["Monica", "Rachel"], default: "Monica" },
    hero: { type: "string", oneOf: [{ const: "hero-1", title: "Superman" }, { const: "hero-2", title: "Wonder Woman" }] },
    pet: { type: "string", enum: ["pet-1", "pet-2"], enumNames: ["Cats", "Dogs"] },
    instruments: { type: "array", minItems: 1, maxItems: 3, items: { type: "string", enum: ["Guitar", "Piano"] }, default: ["Guitar"] },
    fish: { type: "array", items: { anyOf: [{ const: "fish-1", title: "Tuna" }] } },
  },
  required: ["name", "friend"],
};

test("every property of the restricted schema becomes a field, in the server's order", () => {
  const fields = elicitationFields(schema);
  assert.deepEqual(
    fields.map((field) => [field.name, field.kind, field.input, field.required]),
    [
      ["name", "string", "text", true],
      ["check", "boolean", "checkbox", false],
      ["email", "string", "email", false],
      ["birthdate", "string", "date", false],
      ["meeting", "string", "datetime-local", false],
      ["integer", "integer", "number", false],
      ["number", "number", "number", false],
      ["friend", "choice", "text", true],
      ["hero", "choice", "text", false],
      ["pet", "choice", "text", false],
      ["instruments", "choices", "checkbox", false],
      ["fish", "choices", "checkbox", false],
    ],
  );
  const byName = Object.fromEntries(fields.map((field) => [field.name, field]));
  assert.equal(byName.name.title, "String");
  assert.equal(byName.email.title, "email");
  assert.equal(byName.name.description, "Your full, legal name");
  assert.deepEqual([byName.integer.minimum, byName.integer.maximum, byName.integer.default], [1, 100, 42]);
  assert.deepEqual(byName.hero.options, [
    { value: "hero-1", label: "Superman" },
    { value: "hero-2", label: "Wonder Woman" },
  ]);
  assert.deepEqual(byName.pet.options, [{ value: "pet-1", label: "Cats" }, { value: "pet-2", label: "Dogs" }]);
  assert.deepEqual(byName.instruments.options.map((option) => option.value), ["Guitar", "Piano"]);
  assert.deepEqual([byName.instruments.minItems, byName.instruments.maxItems], [1, 3]);
  assert.deepEqual(byName.fish.options.map((option) => option.label), ["Tuna"]);
  // The snapshot's field_order is the server's order (JSON readers may sort keys).
  assert.deepEqual(elicitationFields(schema, ["pet", "name", "nope"]).slice(0, 3).map((field) => field.name), ["pet", "name", "check"]);
  assert.equal(elicitationFields(null), null);
  assert.equal(elicitationFields({ type: "object" }), null);
});

test("the answer holds what was filled in, as the schema's types", () => {
  const fields = elicitationFields(schema);
  const content = contentFrom(fields, {
    name: "Ada",
    check: false,
    email: "",
    birthdate: "1815-12-10",
    meeting: "2026-12-04T15:30",
    integer: "7",
    number: "",
    friend: "Rachel",
    hero: "",
    pet: "pet-2",
    instruments: ["Piano"],
    fish: [],
  });
  assert.deepEqual(Object.keys(content), ["name", "check", "birthdate", "meeting", "integer", "friend", "pet", "instruments"]);
  assert.equal(content.check, false);
  assert.equal(content.integer, 7);
  assert.equal(content.meeting, new Date("2026-12-04T15:30").toISOString());
  assert.deepEqual(content.instruments, ["Piano"]);
  // Text that is not a number goes to the server as it is, which says what is wrong.
  assert.equal(contentFrom(fields, { integer: "seven" }).integer, "seven");
});

test("a pending elicitation becomes a card; URL mode has a link and no fields", () => {
  const form = elicitationCard({
    kind: "elicitation",
    elicitation_id: "turn-1.call_1.0123456789abcdef",
    call_id: "call_1",
    tool_name: "everything__trigger-elicitation-request",
    server: "everything",
    mode: "form",
    message: "Please provide inputs",
    requested_schema: schema,
    url: null,
    deadline: "2026-12-04T15:40:00+00:00",
  });
  assert.equal(form.id, "turn-1.call_1.0123456789abcdef");
  assert.equal(form.server, "everything");
  assert.equal(form.mode, "form");
  assert.equal(form.url, "");
  assert.equal(form.fields.length, 12);
  const link = elicitationCard({ elicitation_id: "e2", mode: "url", message: "Sign in", url: "https://example.com/a", requested_schema: null });
  assert.deepEqual([link.mode, link.url, link.fields, link.server], ["url", "https://example.com/a", [], "The MCP server"]);
  assert.equal(elicitationCard(null), null);
  assert.equal(elicitationCard({ elicitation_id: "e3", mode: "form", requested_schema: null }), null);
});

test("a 400 answer's messages go to their fields, the rest to the form", () => {
  const fields = elicitationFields(schema);
  const errors = fieldErrors(fields, {
    content: { name: ["This field is required."], non_field_errors: ["Not a field of this form: colour."], integer: "Enter a whole number." },
  });
  assert.deepEqual(errors.fields, { name: ["This field is required."], integer: ["Enter a whole number."] });
  assert.deepEqual(errors.form, ["Not a field of this form: colour."]);
  assert.deepEqual(fieldErrors(fields, { content: ["Expected a dictionary of items."] }), { fields: {}, form: ["Expected a dictionary of items."] });
  assert.deepEqual(fieldErrors(fields, { action: ["\"maybe\" is not a valid choice."] }).form, ["\"maybe\" is not a valid choice."]);
});
