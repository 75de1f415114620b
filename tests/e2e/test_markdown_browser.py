"""Assistant answers as Markdown, Copy buttons and XSS payloads, in real Chromium against the
real stack (the shared ``manage.py dev`` of ``page_stack``).

The demo model answers ``You said: <the message>``, so a message's lines after the first come
back as the answer's own Markdown. Personas: ``owner`` (writes the sessions), ``reviewer``
(staff), ``admin`` (the seeded superuser, for Django admin).
"""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import Page, expect

from tests.e2e.browser import NARROW, VIEWPORTS, WIDE, approval_card
from tests.e2e.page_stack import Contexts, PageStack
from tests.e2e.test_pages_browser import (
    assistant_texts,
    region,
    screenshot,
    start_session,
    wait_for_turn_end,
)

pytestmark = pytest.mark.e2e

CODE = 'def greet(name):\n    return f"hello {name}"'
MARKDOWN_MESSAGE = "\n".join([
    "/slow 0.25",
    "an answer with structure",
    "",
    "# Durable agents",
    "",
    "Some **bold** text, `inline code` and a [link to the docs](https://example.com/docs).",
    "",
    "- first point",
    "- second point",
    "",
    "1. step one",
    "2. step two",
    "",
    "| tool | effect | calls |",
    "|:-----|:------:|------:|",
    "| search | read | 12 |",
    "| slack | write | 3 |",
    "",
    "```python",
    CODE,
    "```",
    "",
    "> a quoted line",
    "",
    "The end.",
])


def grant_clipboard(page: Page) -> None:
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])


def clipboard(page: Page) -> str:
    text: str = page.evaluate("navigator.clipboard.readText()")
    return text


def check_markdown(answer: Any) -> None:
    """The structure MARKDOWN_MESSAGE renders to, inside ``answer`` (a message or the panel)."""
    expect(answer.get_by_role("heading", name="Durable agents", level=1)).to_be_visible()
    expect(answer.locator("strong")).to_have_text("bold")
    expect(answer.locator("p > code")).to_have_text("inline code")
    link = answer.get_by_role("link", name="link to the docs")
    expect(link).to_have_attribute("href", "https://example.com/docs")
    expect(link).to_have_attribute("target", "_blank")
    expect(link).to_have_attribute("rel", "noopener noreferrer")
    expect(answer.locator("ul > li")).to_have_text(["first point", "second point"])
    expect(answer.locator("ol > li")).to_have_text(["step one", "step two"])
    table = answer.get_by_role("table")
    expect(table.get_by_role("columnheader")).to_have_text(["tool", "effect", "calls"])
    expect(table.get_by_role("cell", name="12")).to_have_class("align-right")
    expect(table.get_by_role("columnheader", name="effect")).to_have_class("align-center")
    code = answer.locator(".code-block code")
    expect(code).to_have_text(CODE)
    # highlight.js coloured it: keywords and strings are spans of their own.
    expect(code.locator(".hljs-keyword").first).to_have_text("def")
    expect(code.locator(".hljs-string")).to_have_count(1)
    expect(answer.locator(".code-block .code-language")).to_have_text("python")
    expect(answer.locator("blockquote")).to_have_text("a quoted line")


@VIEWPORTS
def test_an_answer_renders_as_markdown_while_it_streams_and_after(
    contexts: Contexts, stack: PageStack, viewport: dict[str, int]
) -> None:
    page = contexts.logged_in("owner", viewport=viewport)
    session_id = start_session(page, MARKDOWN_MESSAGE)

    response = region(page, "Response")
    # Live: the heading is a heading before the answer is stored.
    expect(response.get_by_role("heading", name="Durable agents")).to_be_visible()
    assert assistant_texts(page).count() == 0
    expect(response.get_by_role("link", name="link to the docs")).to_have_attribute(
        "rel", "noopener noreferrer")
    screenshot(page, "markdown-live", screen_too=True)

    answer = page.locator(".message-assistant").last
    check_markdown(answer)
    expect(response).to_be_hidden()
    stored = wait_for_turn_end(stack, "owner", session_id)[-1]["text"]
    assert stored.startswith("You said: an answer with structure\n\n# Durable agents")
    # The user's message stays plain text: its "#" line is no heading.
    user = page.locator(".message-user").first
    expect(user.get_by_role("heading")).to_have_count(0)
    expect(user.locator(".message-text")).to_contain_text("# Durable agents")
    answer.scroll_into_view_if_needed()
    screenshot(page, "markdown-answer", screen_too=True)
    page.emulate_media(color_scheme="dark")
    answer.locator(".code-block").scroll_into_view_if_needed()
    screenshot(page, "markdown-answer-dark", screen_too=True)


LONG_CODE_LINE = "result = compute(" + ", ".join(f"argument_{n}" for n in range(40)) + ")"
TAIL_WORDS = " ".join(f"word{n}" for n in range(80))
#: A code block with one long line, then words that keep the answer streaming a while.
LONG_CODE_MESSAGE = "\n".join([
    "/slow 0.3", "a long line of code", "", "```python", LONG_CODE_LINE, "```", "", TAIL_WORDS,
])

PAGE_OVERFLOW = "document.documentElement.scrollWidth - window.innerWidth"
#: Whether the <pre> or its <code> (highlight.js makes it the scroller) scrolls sideways.
SCROLLS_INSIDE = """pre => [pre, pre.querySelector("code")].some((node) =>
  ["auto", "scroll"].includes(getComputedStyle(node).overflowX)
  && node.scrollWidth > node.clientWidth)"""


def test_a_long_code_line_scrolls_in_its_block_while_streaming_and_after_at_phone_width(
    contexts: Contexts, stack: PageStack
) -> None:
    page = contexts.logged_in("owner", viewport=NARROW)
    session_id = start_session(page, LONG_CODE_MESSAGE)
    response = region(page, "Response")
    live_pre = response.locator(".code-block pre")
    expect(live_pre).to_contain_text("argument_39")
    # Still streaming: the words after the block have not all arrived.
    assert "word79" not in (response.text_content() or "")
    assert page.evaluate(PAGE_OVERFLOW) <= 0, "the live code block widens the page"
    assert live_pre.evaluate(SCROLLS_INSIDE), "the long line does not scroll in its block"
    screenshot(page, "markdown-long-code-live", screen_too=True)

    stored = page.locator(".message-assistant .code-block pre")
    expect(stored).to_contain_text("argument_39")
    wait_for_turn_end(stack, "owner", session_id)
    assert page.evaluate(PAGE_OVERFLOW) <= 0, "the stored code block widens the page"
    assert stored.evaluate(SCROLLS_INSIDE), "the long line does not scroll in its block"
    screenshot(page, "markdown-long-code-stored", screen_too=True)


def test_copy_buttons_put_code_messages_arguments_and_results_on_the_clipboard(
    contexts: Contexts, stack: PageStack
) -> None:
    page = contexts.logged_in("owner")
    grant_clipboard(page)
    start_session(page, MARKDOWN_MESSAGE.replace("/slow 0.25\n", ""))
    answer = page.locator(".message-assistant").last
    expect(answer.locator(".code-block")).to_be_visible()

    copy_code = answer.get_by_role("button", name="Copy code")
    copy_code.click()
    expect(copy_code).to_have_text("Copied")
    assert clipboard(page) == CODE

    answer.get_by_role("button", name="Copy message").click()
    assert clipboard(page) == "You said: " + MARKDOWN_MESSAGE.split("\n", 1)[1].strip()

    user = page.locator(".message-user").first
    user.get_by_role("button", name="Copy message").click()
    assert clipboard(page) == MARKDOWN_MESSAGE.replace("/slow 0.25\n", "")

    tool_session = start_session(page, '/tool search__web_search {"query": "copy me"}')
    tool = page.locator(".message-tool").last
    expect(tool).to_contain_text("copy me")
    calls = page.get_by_role("list", name="Tool calls")
    calls.get_by_role("button", name="Copy arguments").click()
    assert clipboard(page) == '{\n  "query": "copy me"\n}'
    tool.get_by_role("button", name="Copy result").click()
    messages = wait_for_turn_end(stack, "owner", tool_session)
    result = next(message["text"] for message in messages if message["role"] == "tool")
    assert "copy me" in result
    assert clipboard(page) == result
    screenshot(page, "chat-copy-tool", screen_too=True)


def test_copy_arguments_of_a_call_waiting_for_approval(
    contexts: Contexts, stack: PageStack
) -> None:
    owner = contexts.logged_in("owner")
    grant_clipboard(owner)
    session_id = start_session(
        owner, '/tool slack__post_message {"channel": "general", "text": "copy this call"}'
    )
    expected = '{\n  "channel": "general",\n  "text": "copy this call"\n}'
    waiting = region(owner, "Waiting for approval")
    waiting.get_by_role("button", name="Copy arguments").click()
    assert clipboard(owner) == expected

    for viewport in (WIDE, NARROW):
        reviewer = contexts.logged_in("reviewer", viewport=viewport)
        grant_clipboard(reviewer)
        reviewer.goto("/approvals/")
        card = approval_card(reviewer, session_id)
        card.get_by_role("button", name="Copy arguments").click()
        expect(card.get_by_role("button", name="Copy arguments")).to_have_text("Copied")
        assert clipboard(reviewer) == expected
        screenshot(reviewer, "approvals-copy", screen_too=True)


# A standard mix of XSS payloads (OWASP's filter evasion cheat sheet and Markdown-specific
# tricks). Each one that ran would set window.__xss or open a dialog.
XSS_PAYLOADS = [
    "<script>window.__xss = 1; alert(1)</script>",
    '<img src=x onerror="window.__xss = 2; alert(2)">',
    '<svg onload="window.__xss = 3; alert(3)"></svg>',
    '<svg><script>window.__xss = 31</script></svg>',
    '<iframe src="javascript:window.top.__xss = 4; alert(4)"></iframe>',
    '<iframe srcdoc="<script>parent.__xss = 5; alert(5)</script>"></iframe>',
    '<a href="javascript:window.__xss = 6; alert(6)">html link</a>',
    '<body onload="window.__xss = 7; alert(7)">',
    '<details open ontoggle="window.__xss = 8; alert(8)"><summary>x</summary></details>',
    '<math><mtext><table><mglyph><style><img src=x onerror="window.__xss = 9">',
    "[js link](javascript:window.__xss=10;alert(10))",
    "[mixed case](JaVaScRiPt:alert(11))",
    "[entity](&#106;avascript:alert(12))",
    "[tab](java\tscript:alert(13))",
    "[data link](data:text/html;base64,PHNjcmlwdD5hbGVydCgxNCk8L3NjcmlwdD4=)",
    '![img](x" onerror="window.__xss = 15; alert(15))',
    "![img2](javascript:alert(16))",
    "[vb](vbscript:msgbox(17))",
    '<object data="javascript:alert(18)"></object>',
    '<embed src="javascript:alert(19)">',
    '<input autofocus onfocus="window.__xss = 20; alert(20)">',
    "<style>*{background:url('javascript:alert(21)')}</style>",
    '[title](https://example.com "x\\" onmouseover=\\"window.__xss=22")',
    "<<script>script>window.__xss = 23<</script>/script>",
    "`<img src=x onerror=\"window.__xss = 24\">`",
    '<a href="data:text/html,<script>alert(25)</script>">data html</a>',
    '<svg><a xlink:href="javascript:alert(26)"><text x="20" y="20">svg link</text></a></svg>',
    "[ref link][r]\n\n[r]: javascript:alert(27)",
    "<https://example.com/ok> <javascript:alert(28)>",
    '<form action="javascript:alert(29)"><button>go</button></form>',
    '<meta http-equiv="refresh" content="0;url=javascript:alert(30)">',
]

CHECK_DOM = """(root) => {
  const bad = [];
  for (const node of root.querySelectorAll('*')) {
    const tag = node.tagName.toLowerCase();
    if (['script', 'img', 'svg', 'iframe', 'object', 'embed', 'style', 'form', 'input',
         'meta', 'math', 'body', 'details', 'link', 'base'].includes(tag)) bad.push(tag);
    for (const attribute of node.attributes) {
      const name = attribute.name;
      if (name.startsWith('on') || name === 'style' || name === 'srcdoc') {
        bad.push(`${tag}[${attribute.name}]`);
      }
    }
    if (tag === 'a' && !/^(https?:|mailto:)/.test(node.getAttribute('href') ?? 'https:')) {
      bad.push(`a[href=${node.getAttribute('href')}]`);
    }
  }
  return bad;
}"""


def test_xss_payloads_in_an_answer_run_nothing(
    contexts: Contexts, stack: PageStack
) -> None:
    page = contexts.logged_in("owner")
    dialogs: list[str] = []

    def on_dialog(dialog: Any) -> None:
        dialogs.append(dialog.message)
        dialog.dismiss()

    page.on("dialog", on_dialog)
    message = "/slow 0.1\npayloads follow\n\n" + "\n\n".join(XSS_PAYLOADS)
    session_id = start_session(page, message)
    response = region(page, "Response")
    expect(response).to_contain_text("payloads follow")
    # While it streams: whatever the growing text holds is sanitized too.
    assert page.evaluate(CHECK_DOM, response.element_handle()) == []

    answer = page.locator(".message-assistant").last
    expect(answer).to_contain_text("svg link")
    wait_for_turn_end(stack, "owner", session_id)
    # Hover and focus what could carry a handler, then look for any trace of a payload.
    for link in answer.get_by_role("link").all():
        link.hover()
    assert page.evaluate(CHECK_DOM, answer.element_handle()) == []
    assert page.evaluate(CHECK_DOM, page.locator("#messages").element_handle()) == []
    assert page.evaluate("window.__xss") is None
    assert dialogs == []
    # The payloads are shown as text, not dropped.
    expect(answer).to_contain_text("<script>window.__xss = 1; alert(1)</script>")
    expect(answer).to_contain_text('<img src=x onerror="window.__xss = 2; alert(2)">')
    links = answer.get_by_role("link")
    hrefs = [link.get_attribute("href") for link in links.all()]
    assert hrefs and all(href and href.startswith("https://") for href in hrefs), hrefs
    # Reloaded from the snapshot (not the live stream): the same.
    page.reload()
    expect(page.locator(".message-assistant").last).to_contain_text("svg link")
    assert page.evaluate(CHECK_DOM, page.locator("#messages").element_handle()) == []
    assert page.evaluate("window.__xss") is None
    assert dialogs == []
