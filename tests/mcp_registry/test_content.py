"""``mcp_registry.content``: what a model reads of images, audio and binary resources.

Results come from ``@modelcontextprotocol/server-everything`` as a real subprocess where it
has them (its tiny PNG, a text/plain blob resource, a gzip blob resource); results it cannot
produce (two images, audio, other charsets) are built from its real image bytes.
"""

from __future__ import annotations

import base64
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from mcp.types import (
    AudioContent,
    BlobResourceContents,
    ContentBlock,
    EmbeddedResource,
    ImageContent,
    TextContent,
)

from mcp_registry.builtin_tools import builtin_tool_content, builtin_tool_execute
from mcp_registry.client import McpClientPool, McpServerSpec, McpToolOutput
from mcp_registry.content import (
    ENCODED_PREFIX,
    MediaLimits,
    ToolResultContent,
    decode_text_blob,
    format_size,
    is_textual_mime_type,
    mime_charset,
    render_blocks,
    replace_encoded_results,
    tool_result_text,
)

VISION = MediaLimits(accept_images=True)


async def _tiny_image(pool: McpClientPool, spec: McpServerSpec) -> McpToolOutput:
    return await pool.call_tool(spec, "get-tiny-image", {}, idempotency_key=None, timeout=None)


def _png_of(output: McpToolOutput) -> bytes:
    [image] = [block for block in output.content if isinstance(block, ImageContent)]
    return base64.b64decode(image.data)


def _resolver(spec: McpServerSpec) -> Callable[[str], Awaitable[McpServerSpec]]:
    async def resolve(name: str) -> McpServerSpec:
        assert name == spec.name
        return spec

    return resolve


@pytest.mark.parametrize(
    ("mime_type", "textual"),
    [
        ("text/plain", True),
        ("text/csv; charset=utf-8", True),
        ("application/json", True),
        ("application/ld+json", True),
        ("application/vnd.api+json", True),
        ("image/svg+xml", True),
        ("application/xml", True),
        ("application/javascript", True),
        ("application/x-yaml", True),
        ("APPLICATION/JSON", True),
        ("application/gzip", False),
        ("application/octet-stream", False),
        ("image/png", False),
        ("application/pdf", False),
        ("", False),
        (None, False),
    ],
)
def test_textual_mime_types(mime_type: str | None, textual: bool) -> None:
    assert is_textual_mime_type(mime_type) is textual


def test_text_blobs_decode_with_their_charset_and_binary_ones_do_not() -> None:
    def b64(raw: bytes) -> str:
        return base64.b64encode(raw).decode()

    assert decode_text_blob(b64("héllo".encode()), "text/plain") == "héllo"
    assert decode_text_blob(b64(b"\xef\xbb\xbfbom"), "text/plain") == "bom"
    assert decode_text_blob(b64("héllo".encode("latin-1")), "text/plain; charset=ISO-8859-1") \
        == "héllo"
    assert mime_charset('text/plain; charset="utf-16"') == "utf-16"
    assert mime_charset("text/plain; charset=no-such-charset") == "utf-8"
    # Latin-1 bytes under the default UTF-8, NUL bytes, and broken base64 are not text.
    assert decode_text_blob(b64("héllo".encode("latin-1")), "text/plain") is None
    assert decode_text_blob(b64(b"a\x00b"), "application/json") is None
    assert decode_text_blob("not base64!", "text/plain") is None


async def test_an_image_is_a_placeholder_unless_the_model_accepts_images(
    pool: McpClientPool, everything_spec: McpServerSpec
) -> None:
    output = await _tiny_image(pool, everything_spec)
    png = _png_of(output)
    assert png.startswith(b"\x89PNG")
    label = f"[image: image/png, {format_size(len(png))}]"
    assert output.text.splitlines() == [
        "Here's the image you requested:", label, "The image above is the MCP logo."
    ]
    assert output.for_model() == output.text
    blind = output.for_model_content(MediaLimits(accept_images=False))
    assert (blind.text, blind.images) == (output.text, ())

    seen = output.for_model_content(VISION)
    [image] = seen.images
    assert (image.mime_type, image.size) == ("image/png", len(png))
    assert base64.b64decode(image.data) == png
    assert f"[image 1: image/png, {format_size(len(png))}, attached]" in seen.text
    assert image.data not in seen.text
    assert seen.chat_content() == [
        {"type": "text", "text": seen.text},
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{image.data}"}},
    ]


async def test_images_past_the_bounds_are_placeholders(
    pool: McpClientPool, everything_spec: McpServerSpec
) -> None:
    output = await _tiny_image(pool, everything_spec)
    png = _png_of(output)
    size = format_size(len(png))
    tight = output.for_model_content(MediaLimits(accept_images=True, image_max_bytes=len(png) - 1))
    assert tight.images == ()
    limit = format_size(len(png) - 1)
    assert f"[image: image/png, {size}, not attached: larger than the {limit} limit]" in tight.text
    assert output.for_model_content(
        MediaLimits(accept_images=True, image_max_bytes=len(png))
    ).images

    # Three copies of the image in one result, room for two: the third is a placeholder.
    data = base64.b64encode(png).decode()
    blocks = [ImageContent(type="image", data=data, mime_type="image/png")] * 3
    two = render_blocks(blocks, MediaLimits(accept_images=True,
                                            result_images_max_bytes=2 * len(png) + 10))
    assert len(two.images) == 2
    assert two.text.splitlines()[:2] == [
        f"[image 1: image/png, {size}, attached]", f"[image 2: image/png, {size}, attached]"
    ]
    assert "not attached: this result's images would pass the" in two.text.splitlines()[2]


def test_image_bytes_decide_the_type_and_other_data_is_not_attached() -> None:
    gif = base64.b64encode(b"GIF89a" + b"\x00" * 20).decode()
    webp = base64.b64encode(b"RIFF\x10\x00\x00\x00WEBPVP8 " + b"\x00" * 8).decode()
    bmp = base64.b64encode(b"BM" + b"\x00" * 30).decode()
    blocks = [
        ImageContent(type="image", data=gif, mime_type="image/png"),  # mislabeled
        ImageContent(type="image", data=webp, mime_type="image/webp"),
        ImageContent(type="image", data=bmp, mime_type="image/bmp"),
        ImageContent(type="image", data="%%%", mime_type="image/png"),
    ]
    rendered = render_blocks(blocks, VISION)
    assert [image.mime_type for image in rendered.images] == ["image/gif", "image/webp"]
    lines = rendered.text.splitlines()
    assert lines[0] == "[image 1: image/gif, 26 bytes, attached]"
    assert lines[2] == (
        "[image: image/bmp, 32 bytes, not attached: not a PNG, JPEG, GIF or WebP image]"
    )
    assert lines[3].endswith("not attached: invalid base64]")


def test_audio_and_blobs_of_a_result() -> None:
    latin = base64.b64encode("Grüße".encode("latin-1")).decode()
    blocks: list[ContentBlock] = [
        AudioContent(type="audio", data=base64.b64encode(b"\x00" * 3000).decode(),
                     mime_type="audio/wav"),
        EmbeddedResource(type="resource", resource=BlobResourceContents(
            uri="file:///notes.txt", mime_type="text/plain; charset=latin-1", blob=latin)),
        EmbeddedResource(type="resource", resource=BlobResourceContents(
            uri="file:///bad.txt", mime_type="text/plain", blob=latin)),
        EmbeddedResource(type="resource", resource=BlobResourceContents(
            uri="file:///data.bin", blob=base64.b64encode(b"\x01\x02").decode())),
    ]
    assert render_blocks(blocks, VISION).text.splitlines() == [
        "[audio: audio/wav, 2.9 KiB]",
        "Grüße",
        "[binary resource file:///bad.txt: text/plain, 5 bytes, not valid utf-8 text]",
        "[binary resource file:///data.bin: 2 bytes]",
    ]


async def test_embedded_and_read_blobs_from_a_real_server(
    pool: McpClientPool, everything_spec: McpServerSpec
) -> None:
    reference = await pool.call_tool(
        everything_spec, "get-resource-reference", {"resourceType": "Blob", "resourceId": 2},
        idempotency_key=None, timeout=None,
    )
    # A text/plain blob: decoded, not "[binary resource ...]".
    assert "Resource 2: This is a base64 blob created at" in reference.for_model()
    assert "binary" not in reference.for_model()

    gzip_text = base64.b64encode(b"hello world").decode()
    gzipped = await pool.call_tool(
        everything_spec, "gzip-file-as-resource",
        {"name": "hello.gz", "data": f"data:text/plain;base64,{gzip_text}",
         "outputType": "resource"},
        idempotency_key=None, timeout=None,
    )
    line = gzipped.for_model_content(VISION).text
    assert line.startswith("[binary resource demo://resource/session/hello.gz: application/gzip, ")
    assert line.endswith(" bytes]")
    blob = next(block for block in gzipped.content if isinstance(block, EmbeddedResource))
    assert blob.resource.blob not in line  # type: ignore[union-attr]

    common: dict[str, Any] = {
        "pool": pool, "server_names": [everything_spec.name],
        "resolve_server": _resolver(everything_spec),
    }
    read = await builtin_tool_execute(
        name="mcp_read_resource",
        arguments={"server": everything_spec.name, "uri": "demo://resource/dynamic/blob/3"},
        **common,
    )
    assert read.startswith("Resource 3: This is a base64 blob created at")
    read_gzip = await builtin_tool_content(
        name="mcp_read_resource",
        arguments={"server": everything_spec.name, "uri": "demo://resource/session/hello.gz"},
        media=VISION, **common,
    )
    assert read_gzip.text == line
    assert read_gzip.images == ()


def test_structured_content_keeps_one_form_and_the_images() -> None:
    png = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\x00" * 100).decode()
    output = McpToolOutput(
        text="It is mild.\n[image: image/png, 108 bytes]",
        structured_content={"temperature": 21},
        content=(TextContent(type="text", text="It is mild."),
                 ImageContent(type="image", data=png, mime_type="image/png")),
    )
    rendered = output.for_model_content(VISION)
    assert rendered.text.splitlines() == [
        '{"temperature": 21}', "[image 1: image/png, 108 bytes, attached]"
    ]
    assert len(rendered.images) == 1
    assert output.for_model() == '{"temperature": 21}\n[image: image/png, 108 bytes]'


def test_the_stored_string_carries_images_and_people_read_only_the_text() -> None:
    png = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\x00" * 100).decode()
    content = render_blocks(
        [TextContent(type="text", text="a chart"),
         ImageContent(type="image", data=png, mime_type="image/png")], VISION)
    stored = content.encode()
    assert stored.startswith(ENCODED_PREFIX)
    assert ToolResultContent.decode(stored) == content
    assert tool_result_text(stored) == content.text
    assert png not in tool_result_text(stored)
    # Without images the string is the text itself; a text that looks encoded is escaped.
    assert ToolResultContent("plain").encode() == "plain"
    tricky = ToolResultContent(ENCODED_PREFIX + "x")
    assert ToolResultContent.decode(tricky.encode()) == tricky
    assert ToolResultContent.decode(ENCODED_PREFIX + "not json").text == ENCODED_PREFIX + "not json"
    # Quoted in a longer text (a failed turn's note), each encoded result becomes its text.
    note = f"- a {{}} -> succeeded: {stored}\n- b {{}} -> succeeded: plain"
    assert replace_encoded_results(note) == f"- a {{}} -> succeeded: {content.text}\n" \
        "- b {} -> succeeded: plain"
