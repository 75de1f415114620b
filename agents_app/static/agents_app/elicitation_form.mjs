// A question an MCP server asks during a tool call (the snapshot's pending_elicitations), as
// the chat page shows it: the server's message, then one labelled input per property of its
// restricted JSON Schema (MCP "Client features/Elicitation"): text, email, URL, date and
// date-time inputs for strings, number inputs, a checkbox for a boolean, a select for a single
// choice and a group of checkboxes for a multiple choice; required fields are marked. In URL
// mode, the message and the URL as a link (never opened for the user) with Done / Decline /
// Cancel. The pure parts (elicitationCard, elicitationFields, contentFrom, fieldErrors) are
// tested in tests/agents_app/pages/js/elicitation_form.test.mjs; the server checks every answer again.

import { el } from "./dom.mjs";

const FORMAT_INPUTS = { email: "email", uri: "url", date: "date", "date-time": "datetime-local" };

/**
 * The card of a pending elicitation: `{id, callId, server, toolName, message, mode, url,
 * deadline, fields}`, or null for a missing or unusable one. `fields` is elicitationFields of
 * its schema (form mode), else [].
 */
export function elicitationCard(pending) {
  if (!pending || !pending.elicitation_id) return null;
  const mode = pending.mode === "url" ? "url" : "form";
  const fields = mode === "form" ? elicitationFields(pending.requested_schema, pending.field_order) : [];
  if (fields === null) return null;
  return {
    id: String(pending.elicitation_id),
    callId: String(pending.call_id ?? ""),
    server: pending.server || "The MCP server",
    toolName: pending.tool_name ?? "",
    message: pending.message ?? "",
    mode,
    url: mode === "url" ? String(pending.url ?? "") : "",
    deadline: pending.deadline ?? null,
    fields,
  };
}

function options(list) {
  if (!Array.isArray(list)) return [];
  return list
    .filter((item) => item && typeof item.const === "string")
    .map((item) => ({ value: item.const, label: typeof item.title === "string" && item.title ? item.title : item.const }));
}

function enumOptions(spec) {
  const values = Array.isArray(spec?.enum) ? spec.enum.filter((value) => typeof value === "string") : [];
  const names = Array.isArray(spec?.enumNames) && spec.enumNames.length === values.length ? spec.enumNames : null;
  return values.map((value, index) => ({ value, label: names ? String(names[index]) : value }));
}

/**
 * The fields of a form's schema, in the server's order (`order`, the snapshot's field_order:
 * JavaScript puts integer-like keys of an object first): `{name, kind, title, description,
 * required, options: [{value, label}], format, input (the <input> type), minimum, maximum,
 * minLength, maxLength, minItems, maxItems, default}`; `kind` is string, number, integer,
 * boolean, choice or choices. Null when the schema is not an object of properties.
 */
export function elicitationFields(schema, order = []) {
  if (!schema || typeof schema !== "object" || typeof schema.properties !== "object" || schema.properties === null) return null;
  const required = new Set(Array.isArray(schema.required) ? schema.required : []);
  const names = (Array.isArray(order) ? order : []).filter((name) => Object.hasOwn(schema.properties, name));
  for (const name of Object.keys(schema.properties)) if (!names.includes(name)) names.push(name);
  return names.map((name) => [name, schema.properties[name]]).map(([name, spec]) => {
    const base = {
      name,
      title: typeof spec?.title === "string" && spec.title ? spec.title : name,
      description: typeof spec?.description === "string" ? spec.description : "",
      required: required.has(name),
      default: spec?.default,
      options: [],
      format: "",
      input: "text",
      minimum: null,
      maximum: null,
      minLength: null,
      maxLength: null,
      minItems: null,
      maxItems: null,
    };
    if (spec?.type === "string" && (Array.isArray(spec.enum) || Array.isArray(spec.oneOf))) {
      return { ...base, kind: "choice", options: Array.isArray(spec.oneOf) ? options(spec.oneOf) : enumOptions(spec) };
    }
    if (spec?.type === "string") {
      const format = typeof spec.format === "string" ? spec.format : "";
      return { ...base, kind: "string", format, input: FORMAT_INPUTS[format] ?? "text", minLength: spec.minLength ?? null, maxLength: spec.maxLength ?? null };
    }
    if (spec?.type === "number" || spec?.type === "integer") {
      return { ...base, kind: spec.type, input: "number", minimum: spec.minimum ?? null, maximum: spec.maximum ?? null };
    }
    if (spec?.type === "boolean") return { ...base, kind: "boolean", input: "checkbox" };
    if (spec?.type === "array") {
      const items = spec.items ?? {};
      return {
        ...base,
        kind: "choices",
        input: "checkbox",
        options: Array.isArray(items.anyOf) ? options(items.anyOf) : enumOptions(items),
        minItems: spec.minItems ?? null,
        maxItems: spec.maxItems ?? null,
      };
    }
    return { ...base, kind: "string" };
  });
}

/** `<input type="datetime-local">` wants "YYYY-MM-DDTHH:MM" in local time. */
function localDateTime(value) {
  const date = new Date(value);
  if (Number.isNaN(date.getTime())) return "";
  const pad = (number) => String(number).padStart(2, "0");
  return `${date.getFullYear()}-${pad(date.getMonth() + 1)}-${pad(date.getDate())}T${pad(date.getHours())}:${pad(date.getMinutes())}`;
}

/**
 * The answer's `content` from what the inputs hold (`raw`: name -> text, boolean or list of
 * chosen values): empty texts and numbers are left out (the server says when one is required),
 * numbers become numbers, a local date-time becomes ISO 8601 UTC, booleans and lists stay.
 */
export function contentFrom(fields, raw) {
  const content = {};
  for (const field of fields) {
    const value = raw[field.name];
    if (field.kind === "boolean") {
      content[field.name] = Boolean(value);
    } else if (field.kind === "choices") {
      if (Array.isArray(value) && (value.length || field.required)) content[field.name] = [...value];
    } else if (typeof value === "string" && value !== "") {
      if (field.kind === "number" || field.kind === "integer") {
        const number = Number(value);
        content[field.name] = Number.isNaN(number) ? value : number;
      } else if (field.format === "date-time") {
        const date = new Date(value);
        content[field.name] = Number.isNaN(date.getTime()) ? value : date.toISOString();
      } else {
        content[field.name] = value;
      }
    }
  }
  return content;
}

/**
 * The messages of a 400 answer, per field: `{fields: {name: [messages]}, form: [messages]}`
 * (`form` for messages about the answer as a whole, and for fields the form does not show).
 */
export function fieldErrors(fields, body) {
  const content = body?.content;
  const result = { fields: {}, form: [] };
  if (Array.isArray(content)) {
    result.form.push(...content.map(String));
    return result;
  }
  if (!content || typeof content !== "object") {
    for (const messages of Object.values(body ?? {})) if (Array.isArray(messages)) result.form.push(...messages.map(String));
    return result;
  }
  const names = new Set(fields.map((field) => field.name));
  for (const [name, messages] of Object.entries(content)) {
    const list = Array.isArray(messages) ? messages.map(String) : [String(messages)];
    if (names.has(name)) result.fields[name] = list;
    else result.form.push(...list);
  }
  return result;
}

// ---------------------------------------------------------------- DOM

function fieldId(prefix, field) {
  return `${prefix}-${field.name.replace(/[^A-Za-z0-9_-]/g, "_")}`;
}

function requiredMark(field) {
  return field.required ? el("span", { class: "field-required" }, " (required)") : null;
}

function rangeHint(field) {
  const parts = [];
  if (field.kind === "integer") parts.push("A whole number");
  if (field.minimum !== null && field.maximum !== null) parts.push(`from ${field.minimum} to ${field.maximum}`);
  else if (field.minimum !== null) parts.push(`at least ${field.minimum}`);
  else if (field.maximum !== null) parts.push(`at most ${field.maximum}`);
  if (field.kind === "choices" && (field.minItems !== null || field.maxItems !== null)) {
    if (field.minItems !== null && field.maxItems !== null) parts.push(`Choose ${field.minItems} to ${field.maxItems}`);
    else if (field.minItems !== null) parts.push(`Choose at least ${field.minItems}`);
    else parts.push(`Choose at most ${field.maxItems}`);
  }
  if (field.format === "date-time") parts.push("in your time zone");
  const text = parts.join(" ");
  return text ? text.charAt(0).toUpperCase() + text.slice(1) + "." : "";
}

/** One field's element: a labelled input (a fieldset for a multiple choice), its help text
 * and an error line the answer's messages fill. */
function fieldNode(field, prefix, disabled) {
  const id = fieldId(prefix, field);
  const description = field.description && !/[.!?:]$/.test(field.description.trim()) ? `${field.description.trim()}.` : field.description;
  const help = [description, rangeHint(field)].filter(Boolean).join(" ");
  const helpId = help ? `${id}-help` : null;
  const errorId = `${id}-error`;
  const describedBy = [helpId, errorId].filter(Boolean).join(" ");
  const helpNode = help ? el("p", { id: helpId, class: "hint" }, help) : null;
  const errorNode = el("p", { id: errorId, class: "field-error small", hidden: true });
  const common = { id, name: field.name, "aria-describedby": describedBy, disabled };
  if (field.kind === "choices") {
    const chosen = new Set(Array.isArray(field.default) ? field.default : []);
    return el(
      "fieldset",
      { class: "field elicitation-field elicitation-choices", dataset: { name: field.name, kind: field.kind }, "aria-describedby": describedBy },
      el("legend", {}, field.title, requiredMark(field)),
      field.options.map((option, index) =>
        el(
          "label",
          { class: "elicitation-option" },
          el("input", { type: "checkbox", id: `${id}-${index}`, name: field.name, value: option.value, checked: chosen.has(option.value), disabled }),
          ` ${option.label}`,
        ),
      ),
      helpNode,
      errorNode,
    );
  }
  if (field.kind === "boolean") {
    return el(
      "div",
      { class: "field elicitation-field elicitation-boolean", dataset: { name: field.name, kind: field.kind } },
      el("label", { for: id }, el("input", { ...common, type: "checkbox", checked: field.default === true }), ` ${field.title}`, requiredMark(field)),
      helpNode,
      errorNode,
    );
  }
  let input;
  if (field.kind === "choice") {
    const blank = field.default === undefined || !field.required ? [el("option", { value: "" }, "Choose…")] : [];
    input = el(
      "select",
      { ...common, required: field.required, "aria-required": field.required ? "true" : null },
      blank,
      field.options.map((option) => el("option", { value: option.value, selected: option.value === field.default }, option.label)),
    );
  } else {
    let value = field.default === undefined || field.default === null ? "" : String(field.default);
    if (field.format === "date-time" && value) value = localDateTime(value);
    input = el("input", {
      ...common,
      type: field.input,
      value,
      required: field.required,
      "aria-required": field.required ? "true" : null,
      step: field.kind === "integer" ? "1" : field.kind === "number" ? "any" : null,
      min: field.minimum,
      max: field.maximum,
      minlength: field.minLength,
      maxlength: field.maxLength,
      autocomplete: "off",
    });
  }
  return el(
    "div",
    { class: "field elicitation-field", dataset: { name: field.name, kind: field.kind } },
    el("label", { for: id }, field.title, requiredMark(field)),
    input,
    helpNode,
    errorNode,
  );
}

/** The elements of a form's fields; `disabled` for a reader who may not answer. */
export function fieldNodes(fields, prefix, { disabled = false } = {}) {
  return fields.map((field) => fieldNode(field, prefix, disabled));
}

/** What the inputs under `root` hold, per field (see contentFrom). */
export function rawValues(fields, root) {
  const raw = {};
  for (const field of fields) {
    const inputs = [...root.querySelectorAll("input, select")].filter((input) => input.name === field.name);
    if (field.kind === "choices") raw[field.name] = inputs.filter((input) => input.checked).map((input) => input.value);
    else if (field.kind === "boolean") raw[field.name] = Boolean(inputs[0]?.checked);
    else raw[field.name] = inputs[0]?.value ?? "";
  }
  return raw;
}

/** Show `errors` (fieldErrors) next to their fields under `root`; returns the first invalid
 * input, for focus. */
export function showFieldErrors(fields, root, errors) {
  let first = null;
  for (const field of fields) {
    const box = root.querySelector(`[data-name="${CSS.escape(field.name)}"]`);
    if (!box) continue;
    const messages = errors.fields[field.name] ?? [];
    const line = box.querySelector(".field-error");
    line.textContent = messages.join(" ");
    line.hidden = messages.length === 0;
    for (const input of box.querySelectorAll("input, select")) {
      if (messages.length) input.setAttribute("aria-invalid", "true");
      else input.removeAttribute("aria-invalid");
    }
    if (messages.length && !first) first = box.querySelector("input, select");
  }
  return first;
}
