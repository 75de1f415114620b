// Tests of agents_app/static/agents_app/markdown.mjs's Markdown step (run by
// tests/agents_app/pages/test_js_modules.py). Sanitizing, links and code blocks need a DOM: the browser
// tests (tests/e2e/test_markdown_browser.py) cover them in Chromium.
import assert from "node:assert/strict";
import { test } from "node:test";

import { markdownHtml } from "../../../../agents_app/static/agents_app/markdown.mjs";

test("headings, lists, inline code and fenced code become HTML", () => {
  const html = markdownHtml("# Title\n\n- one\n- `two`\n\n```python\nprint('hi')\n```\n");
  assert.match(html, /<h1>Title<\/h1>/);
  assert.match(html, /<li><code>two<\/code><\/li>/);
  assert.match(html, /<pre><code class="language-python"><span class="hljs-built_in">print<\/span>/);
});

test("raw HTML in the text stays text", () => {
  const html = markdownHtml('<img src=x onerror="alert(1)"> <script>alert(2)</script>');
  assert.doesNotMatch(html, /<img|<script/);
  assert.match(html, /&lt;img src=x onerror=&quot;alert\(1\)&quot;&gt;/);
});

test("javascript: links are not links and images are not images", () => {
  const html = markdownHtml("[x](javascript:alert(1)) ![y](https://example.com/t.png)");
  assert.doesNotMatch(html, /href="javascript/);
  assert.doesNotMatch(html, /<img/);
  assert.match(html, /<a href="https:\/\/example.com\/t.png">y<\/a>/);
});

test("an image is a link named by its alt text, with no stray '!'", () => {
  const html = markdownHtml("See ![a *chart*](https://example.com/c.png) and ![](https://example.com/n.png).");
  assert.equal(html, '<p>See <a href="https://example.com/c.png">a chart</a> and <a href="https://example.com/n.png">https://example.com/n.png</a>.</p>\n');
  assert.doesNotMatch(markdownHtml("![x](javascript:alert(1))"), /href=/);
});

test("table alignment is a class, not a style attribute (the CSP allows no inline styles)", () => {
  const html = markdownHtml("| a | b |\n|:--|--:|\n| 1 | 2 |\n");
  assert.doesNotMatch(html, /style=/);
  assert.match(html, /<th class="align-left">a<\/th>/);
  assert.match(html, /<td class="align-right">2<\/td>/);
});

// markdown-it's linkify leaves names without a scheme alone (fuzzyLink off); an upgrade that
// changed that would turn file names such as README.md (.md is a domain) into links.
test("addresses with a scheme become links, file names do not", () => {
  const html = markdownHtml("See https://example.com/a and README.md or docs.python.org");
  assert.match(html, /<a href="https:\/\/example.com\/a">https:\/\/example.com\/a<\/a>/);
  assert.doesNotMatch(html, /href="http:\/\/README.md"/);
  assert.equal((html.match(/<a /g) ?? []).length, 1);
});
