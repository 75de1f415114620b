// Assistant text as Markdown: headings, lists, tables, links, code with syntax highlighting.
//
// markdown-it turns the text into HTML with raw HTML switched off (an answer's `<script>` is
// shown as text) and its own link check (no javascript:, vbscript:, file: or data: links);
// DOMPurify then keeps only the tags and attributes Markdown produces, so nothing a model
// writes (or a tool result it quotes) can run script in the page. Images are not rendered:
// an image loads by itself, and a prompt-injected answer could leak data through its URL;
// `![alt](url)` shows as a link named by its alt text instead. Links open in a new tab with rel="noopener
// noreferrer". Table alignment becomes a class, not a style attribute, because the page's
// Content-Security-Policy allows no inline styles. The vendored libraries and their versions
// are listed in static/vendor/README.md.

import DOMPurify from "../vendor/dompurify/purify.mjs";
import hljs from "../vendor/highlight.js/highlight.mjs";
import MarkdownIt from "../vendor/markdown-it/markdown-it.mjs";
import { copyButton } from "./copy_button.mjs";

/** Texts longer than this are shown as plain text: rendering them again on every streamed
 * piece would stall the page, and an answer that long is rarely prose. */
export const MARKDOWN_MAX_CHARS = 200_000;
/** Code blocks longer than this are not highlighted (highlight.js time grows with size). */
const HIGHLIGHT_MAX_CHARS = 50_000;

const ALIGN = /^text-align:\s*(left|right|center)$/;

function highlight(code, language) {
  if (code.length > HIGHLIGHT_MAX_CHARS) return "";
  const name = language ? language.toLowerCase() : "";
  try {
    if (name && hljs.getLanguage(name)) return hljs.highlight(code, { language: name, ignoreIllegals: true }).value;
  } catch {
    // An unusual block is shown plain rather than not at all.
  }
  return "";
}

const markdown = new MarkdownIt({ html: false, linkify: true, breaks: false, highlight });
// An image is parsed (so its "!" is not left behind) but rendered as a link named by its alt
// text, or by its address when it has none; markdown-it's link check refuses unsafe addresses
// for images as for links.
markdown.renderer.rules.image = (tokens, index, options, env, renderer) => {
  const token = tokens[index];
  const src = token.attrGet("src") ?? "";
  const alt = renderer.renderInlineAsText(token.children ?? [], options, env) || src;
  const escape = markdown.utils.escapeHtml;
  return `<a href="${escape(src)}">${escape(alt)}</a>`;
};
markdown.core.ruler.push("align_classes", (state) => {
  for (const token of state.tokens) {
    if (token.type !== "th_open" && token.type !== "td_open") continue;
    const match = ALIGN.exec(token.attrGet("style") ?? "");
    if (!token.attrs) continue;
    token.attrs = token.attrs.filter(([name]) => name !== "style");
    if (match) token.attrJoin("class", `align-${match[1]}`);
  }
});

/** The HTML markdown-it makes of `text` (not yet sanitized; see `renderMarkdown`). */
export function markdownHtml(text) {
  return markdown.render(text);
}

const SANITIZE = {
  ALLOWED_TAGS: [
    "a", "blockquote", "br", "code", "del", "em", "h1", "h2", "h3", "h4", "h5", "h6", "hr",
    "li", "ol", "p", "pre", "s", "span", "strong", "table", "tbody", "td", "th", "thead", "tr", "ul",
  ],
  ALLOWED_ATTR: ["href", "title", "class", "start"],
  ALLOW_DATA_ATTR: false,
  ALLOWED_URI_REGEXP: /^(?:https?|mailto):/i,
  RETURN_DOM_FRAGMENT: true,
};

let hooked = false;

function hookLinks() {
  if (hooked) return;
  hooked = true;
  DOMPurify.addHook("afterSanitizeAttributes", (node) => {
    if (node.tagName !== "A") return;
    if (node.hasAttribute("href")) {
      node.setAttribute("target", "_blank");
      node.setAttribute("rel", "noopener noreferrer");
    }
  });
}

/** Wrap each `<pre><code>` of `root` in a block with its language and a Copy button. */
function decorateCodeBlocks(root) {
  for (const code of root.querySelectorAll("pre > code")) {
    const pre = code.parentElement;
    const language = /(?:^|\s)language-(\S+)/.exec(code.className)?.[1] ?? "";
    code.classList.add("hljs");
    const bar = document.createElement("div");
    bar.className = "code-bar";
    const name = document.createElement("span");
    name.className = "code-language";
    name.textContent = language || "text";
    bar.append(name, copyButton("Copy code", () => code.textContent.replace(/\n$/, "")));
    const block = document.createElement("div");
    block.className = "code-block";
    pre.replaceWith(block);
    block.append(bar, pre);
  }
}

const shown = new WeakMap();

/**
 * Show `text` in `node` as sanitized Markdown (plain text past MARKDOWN_MAX_CHARS).
 *
 * Replaces the node's children; does nothing when `node` already shows this exact text.
 */
export function renderMarkdown(node, text) {
  if (shown.get(node) === text) return;
  shown.set(node, text);
  if (text.length > MARKDOWN_MAX_CHARS) {
    node.classList.remove("markdown");
    node.classList.add("markdown-plain");
    node.textContent = text;
    return;
  }
  hookLinks();
  const fragment = DOMPurify.sanitize(markdownHtml(text), SANITIZE);
  decorateCodeBlocks(fragment);
  node.classList.add("markdown");
  node.classList.remove("markdown-plain");
  node.replaceChildren(fragment);
}

const pending = new Map();
let frame = 0;

function flush() {
  frame = 0;
  const batch = [...pending];
  pending.clear();
  for (const [node, text] of batch) {
    if (node.isConnected) renderMarkdown(node, text);
  }
}

/**
 * Show `text` in `node` as Markdown at the next animation frame: a text that grows by many
 * small pieces (a streamed answer) is parsed once per frame, not once per piece.
 */
export function renderMarkdownSoon(node, text) {
  pending.set(node, text);
  if (!frame) frame = requestAnimationFrame(flush);
}
