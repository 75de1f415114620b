"""What a model reads of MCP content: text, images, and placeholders for everything else.

Django-free. A ``tools/call`` result (MCP specification, "Server features/Tools/Tool Result")
holds content blocks; a ``resources/read`` result ("Server features/Resources/Reading
Resources") holds resource contents. Each becomes model-readable text, one block per line:

==================================  ============================================================
block                               becomes
==================================  ============================================================
``text``                            the text, verbatim
``image``                           ``[image: image/png, 2.1 KiB]``; for a model that accepts
                                    images (``MediaLimits.accept_images``), within the bounds, a
                                    numbered label ``[image 1: image/png, 2.1 KiB, attached]``
                                    and the image itself (:class:`McpImage`); otherwise the
                                    label says why it was not attached
``audio``                           ``[audio: audio/wav, 12.0 KiB]``
embedded text resource              the text, verbatim
embedded blob resource              decoded text when its MIME type is textual
                                    (:func:`is_textual_mime_type`; charset from the MIME
                                    parameters, else UTF-8); an image when it is ``image/*``;
                                    else ``[binary resource <uri>: application/gzip, 1.2 KiB]``
``resource_link``                   ``[resource link] <name> <<uri>> (<mime>): <description>``
==================================  ============================================================

An image is attached only when the model accepts images, it is a PNG, JPEG, GIF or WebP (by
its bytes; a wrong declared type is corrected), it is at most ``image_max_bytes`` decoded and
the result's attached images stay within ``result_images_max_bytes``. Sizes are decoded bytes.

A tool result travels through the session's Dex state as one string (the seed's
``ToolExecutionResult(output: str)``). :class:`ToolResultContent` is that string: plain text
when nothing is attached, otherwise a JSON object that starts with :data:`ENCODED_PREFIX` and
holds the text and the attached images (base64). Readers that show a result to people use
:func:`tool_result_text`, which never returns base64.

One module, though past 600 lines: the table above is one contract, and its sections (MIME
types and sizes, images and their limits, the stored string, rendering, tool outputs) each
implement part of it through the same private pieces (the image attacher, the rendered lines,
the line of one block), which a split would have to make public to one another. Django-free;
imports only the ``mcp`` SDK's types.
"""

from __future__ import annotations

import base64
import binascii
import codecs
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from email.message import Message
from typing import Any

from mcp.types import (
    AudioContent,
    BlobResourceContents,
    CallToolResult,
    ContentBlock,
    EmbeddedResource,
    ImageContent,
    ResourceLink,
    TextContent,
    TextResourceContents,
)

KIB = 1024
MIB = 1024 * 1024
DEFAULT_IMAGE_MAX_BYTES = 1 * MIB
"""Largest image (decoded bytes) attached for the model; a larger one becomes a placeholder."""
DEFAULT_RESULT_IMAGES_MAX_BYTES = 1 * MIB
"""Most image bytes (decoded) one tool result attaches; images past it become placeholders.

Attached images live in the tool call's Dex record for the rest of the turn, and the embedded
engine hands a worker at most 4 MiB at once (large values are not moved to blobs yet), so a
turn's records must stay well inside that."""

ENCODED_PREFIX = '{"dexagents_tool_result": 1, '
"""How an encoded :class:`ToolResultContent` with attachments starts (``json.dumps`` form)."""

# Magic numbers of the formats every vision provider accepts (OpenAI, Anthropic, Gemini).
_IMAGE_SIGNATURES: tuple[tuple[str, bytes], ...] = (
    ("image/png", b"\x89PNG\r\n\x1a\n"),
    ("image/jpeg", b"\xff\xd8\xff"),
    ("image/gif", b"GIF87a"),
    ("image/gif", b"GIF89a"),
)
_TEXT_APPLICATION_SUBTYPES = frozenset(
    {
        "json", "jsonl", "ndjson", "x-ndjson", "x-jsonlines", "xml", "javascript",
        "x-javascript", "ecmascript", "x-ecmascript", "typescript", "x-typescript", "yaml",
        "x-yaml", "toml", "x-toml", "csv", "x-csv", "sql", "x-sql", "graphql", "x-sh",
        "x-shellscript", "x-python", "x-python-code", "x-httpd-php", "x-php", "x-perl",
        "x-ruby", "x-tex", "x-latex", "rtf", "x-www-form-urlencoded", "markdown",
        "x-markdown", "x-subrip", "x-diff", "x-patch",
    }
)
_TEXT_SUFFIXES = ("+json", "+xml", "+yaml", "+toml")


# --- MIME types and sizes ----------------------------------------------------------------------


def _essence(mime_type: str | None) -> str:
    """``type/subtype`` of a MIME type, lower case, without parameters (``""`` when absent)."""
    return (mime_type or "").split(";", 1)[0].strip().lower()


def is_textual_mime_type(mime_type: str | None) -> bool:
    """Whether content of ``mime_type`` is text a model can read once decoded.

    True for ``text/*``, the ``application/`` types of structured text (JSON, XML, JavaScript,
    YAML, TOML, CSV, SQL, shell and other scripts, ...) and any ``+json``, ``+xml``, ``+yaml``
    or ``+toml`` suffix (RFC 6839), so ``image/svg+xml`` counts as text. Parameters are
    ignored; ``None`` or an empty type is not textual.
    """
    essence = _essence(mime_type)
    kind, _, subtype = essence.partition("/")
    if not subtype:
        return False
    if kind == "text":
        return True
    if subtype.endswith(_TEXT_SUFFIXES):
        return True
    return kind == "application" and subtype in _TEXT_APPLICATION_SUBTYPES


def mime_charset(mime_type: str | None) -> str:
    """The ``charset`` parameter of ``mime_type`` (RFC 2046 section 4.1.2), ``utf-8`` when it
    names none or one Python does not know."""
    if not mime_type:
        return "utf-8"
    header = Message()
    header["content-type"] = mime_type
    charset = header.get_content_charset()
    if not charset:
        return "utf-8"
    try:
        return codecs.lookup(charset).name
    except LookupError:
        return "utf-8"


def _b64decode(data: str) -> bytes | None:
    try:
        return base64.b64decode("".join(data.split()), validate=True)
    except (binascii.Error, ValueError):
        return None


def base64_size(data: str) -> int:
    """The decoded size in bytes of base64 ``data`` (whitespace ignored), without decoding."""
    compact = len(data) - sum(data.count(space) for space in " \n\r\t")
    padding = len(data.rstrip()) - len(data.rstrip().rstrip("="))
    return max(0, compact * 3 // 4 - padding)


def decode_text_blob(blob: str, mime_type: str | None) -> str | None:
    """The text of a base64 ``blob`` of a textual ``mime_type``.

    Decoded with the MIME type's charset (:func:`mime_charset`; a UTF-8 byte order mark is
    dropped). ``None`` when the blob is not valid base64, not valid in that charset, or holds
    NUL characters (binary data under a text type).
    """
    raw = _b64decode(blob)
    if raw is None:
        return None
    charset = mime_charset(mime_type)
    try:
        text = raw.decode("utf-8-sig" if charset == "utf-8" else charset)
    except (UnicodeDecodeError, LookupError):
        return None
    return None if "\x00" in text else text


def format_size(size: int) -> str:
    """``size`` bytes for people: ``512 bytes``, ``2.1 KiB``, ``3.0 MiB``."""
    if size < KIB:
        return f"{size} bytes"
    if size < MIB:
        return f"{size / KIB:.1f} KiB"
    return f"{size / MIB:.1f} MiB"


def sniff_image_type(raw: bytes) -> str | None:
    """``image/png``, ``image/jpeg``, ``image/gif`` or ``image/webp`` from the first bytes of
    ``raw``, or ``None`` for any other data."""
    for mime_type, signature in _IMAGE_SIGNATURES:
        if raw.startswith(signature):
            return mime_type
    if raw[:4] == b"RIFF" and raw[8:12] == b"WEBP":
        return "image/webp"
    return None


# --- Images and limits -------------------------------------------------------------------------


@dataclass(frozen=True)
class MediaLimits:
    """Whether a result's images are attached for the model, and how large they may be.

    Attributes:
        accept_images: The model accepts images (LiteLLM's model information, or the agent's
            ``supports_images``); when false every image is a placeholder.
        image_max_bytes: Largest image attached, in decoded bytes.
        result_images_max_bytes: Most image bytes (decoded) one result attaches, in order.
    """

    accept_images: bool = False
    image_max_bytes: int = DEFAULT_IMAGE_MAX_BYTES
    result_images_max_bytes: int = DEFAULT_RESULT_IMAGES_MAX_BYTES


@dataclass(frozen=True)
class McpImage:
    """An image attached to a tool result for the model.

    Attributes:
        mime_type: ``image/png``, ``image/jpeg``, ``image/gif`` or ``image/webp``, as its bytes
            say.
        data: The image, base64 (standard alphabet, padded, no whitespace).
        size: Its size in decoded bytes.
    """

    mime_type: str
    data: str
    size: int

    def data_url(self) -> str:
        """``data:<mime type>;base64,<data>`` (RFC 2397), as image content parts carry it."""
        return f"data:{self.mime_type};base64,{self.data}"


def _image_label(
    number: int | None, uri: str | None, mime_type: str, size: int, note: str | None
) -> str:
    name = "image" if number is None else f"image {number}"
    if uri:
        name += f" {uri}"
    label = f"[{name}: {mime_type or 'unknown type'}, {format_size(size)}"
    if note:
        label += f", {note}"
    return label + "]"


class _Attacher:
    """Decides, image by image in result order, which are attached (see ``MediaLimits``)."""

    def __init__(self, limits: MediaLimits | None) -> None:
        self.limits = limits or MediaLimits()
        self.images: list[McpImage] = []
        self.used = 0

    def line(self, data: str, mime_type: str | None, uri: str | None = None) -> str:
        declared = _essence(mime_type) or "image"
        size = base64_size(data)
        limits = self.limits
        if not limits.accept_images:
            return _image_label(None, uri, declared, size, None)
        if size > limits.image_max_bytes:
            limit = format_size(limits.image_max_bytes)
            return _image_label(
                None, uri, declared, size, f"not attached: larger than the {limit} limit"
            )
        if self.used + size > limits.result_images_max_bytes:
            limit = format_size(limits.result_images_max_bytes)
            note = f"not attached: this result's images would pass the {limit} limit"
            return _image_label(None, uri, declared, size, note)
        raw = _b64decode(data)
        if raw is None:
            return _image_label(None, uri, declared, size, "not attached: invalid base64")
        sniffed = sniff_image_type(raw)
        if sniffed is None:
            note = "not attached: not a PNG, JPEG, GIF or WebP image"
            return _image_label(None, uri, declared, len(raw), note)
        image = McpImage(
            mime_type=sniffed, data=base64.b64encode(raw).decode("ascii"), size=len(raw)
        )
        self.images.append(image)
        self.used += image.size
        return _image_label(len(self.images), uri, sniffed, image.size, "attached")


def _blob_line(blob: BlobResourceContents, attacher: _Attacher) -> tuple[str, bool]:
    """``(line, is_media)`` for an embedded or read blob resource."""
    uri = str(blob.uri)
    essence = _essence(blob.mime_type)
    if is_textual_mime_type(blob.mime_type):
        text = decode_text_blob(blob.blob, blob.mime_type)
        if text is not None:
            return text, False
        charset = mime_charset(blob.mime_type)
        size = format_size(base64_size(blob.blob))
        return f"[binary resource {uri}: {essence}, {size}, not valid {charset} text]", True
    if essence.startswith("image/"):
        return attacher.line(blob.blob, blob.mime_type, uri), True
    kind = f"{essence}, " if essence else ""
    return f"[binary resource {uri}: {kind}{format_size(base64_size(blob.blob))}]", True


def _resource_link_text(name: str, uri: str, mime_type: str | None, description: str | None) -> str:
    line = f"[resource link] {name} <{uri}>"
    if mime_type:
        line += f" ({mime_type})"
    if description:
        line += f": {description}"
    return line


def _block_line(block: ContentBlock, attacher: _Attacher) -> tuple[str, bool]:
    """``(line, is_media)`` for one content block; media lines stand for bytes not shown."""
    if isinstance(block, TextContent):
        return block.text, False
    if isinstance(block, EmbeddedResource):
        if isinstance(block.resource, TextResourceContents):
            return block.resource.text, False
        return _blob_line(block.resource, attacher)
    if isinstance(block, ResourceLink):
        return _resource_link_text(
            block.name, str(block.uri), block.mime_type, block.description
        ), False
    if isinstance(block, ImageContent):
        return attacher.line(block.data, block.mime_type), True
    if isinstance(block, AudioContent):
        essence = _essence(block.mime_type) or "unknown type"
        return f"[audio: {essence}, {format_size(base64_size(block.data))}]", True
    return f"[{block.type} content]", True


# --- Rendering ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ToolResultContent:
    """A tool result as the model gets it: text, plus the images attached to it.

    Attributes:
        text: Model-readable text; every image has a label line in it (attached images are
            numbered in the order of ``images``). Never holds base64 image data.
        images: The attached images, in result order.
    """

    text: str
    images: tuple[McpImage, ...] = ()

    def encode(self) -> str:
        """The string a tool call record stores (``ToolExecutionResult.output``).

        ``text`` itself when nothing is attached (and it does not happen to start with
        :data:`ENCODED_PREFIX`); otherwise ``{"dexagents_tool_result": 1, "text": ...,
        "images": [{"mime_type", "data", "size"}]}`` as one line of JSON.
        """
        if not self.images and not self.text.startswith(ENCODED_PREFIX):
            return self.text
        return json.dumps(
            {
                "dexagents_tool_result": 1,
                "text": self.text,
                "images": [
                    {"mime_type": image.mime_type, "data": image.data, "size": image.size}
                    for image in self.images
                ],
            },
            ensure_ascii=False,
        )

    @classmethod
    def decode(cls, output: str) -> ToolResultContent:
        """The content :meth:`encode` stored as ``output``; any other string is plain text."""
        if not output.startswith(ENCODED_PREFIX):
            return cls(output)
        try:
            value = json.loads(output)
        except ValueError:
            return cls(output)
        decoded = _from_json(value)
        return cls(output) if decoded is None else decoded

    def chat_content(self, text: str | None = None) -> str | list[dict[str, Any]]:
        """Chat Completions ``content`` for a tool message: the text (``text`` when given, e.g.
        cut to the agent's limit) alone, or a list of one ``text`` part followed by one
        ``image_url`` part per image (``{"url": "data:image/png;base64,..."}``), which
        LiteLLM translates per provider."""
        shown = self.text if text is None else text
        if not self.images:
            return shown
        return [
            {"type": "text", "text": shown},
            *({"type": "image_url", "image_url": {"url": image.data_url()}}
              for image in self.images),
        ]


def _from_json(value: Any) -> ToolResultContent | None:
    if not isinstance(value, dict) or value.get("dexagents_tool_result") != 1:
        return None
    text, images = value.get("text"), value.get("images")
    if not isinstance(text, str) or not isinstance(images, list):
        return None
    decoded: list[McpImage] = []
    for image in images:
        if not isinstance(image, dict):
            return None
        mime_type, data, size = image.get("mime_type"), image.get("data"), image.get("size")
        if not (isinstance(mime_type, str) and isinstance(data, str) and isinstance(size, int)):
            return None
        decoded.append(McpImage(mime_type=mime_type, data=data, size=size))
    return ToolResultContent(text, tuple(decoded))


def tool_result_text(output: str) -> str:
    """What people see of a stored tool result (snapshots, pages, notes): its text, never the
    base64 of its images."""
    return ToolResultContent.decode(output).text


def replace_encoded_results(text: str) -> str:
    """``text`` with every encoded tool result in it (a line of :meth:`ToolResultContent.encode`
    output, e.g. quoted in the note of a failed turn) replaced by its text."""
    if ENCODED_PREFIX not in text:
        return text
    decoder = json.JSONDecoder()
    pieces: list[str] = []
    position = 0
    while (start := text.find(ENCODED_PREFIX, position)) >= 0:
        try:
            value, end = decoder.raw_decode(text, start)
        except ValueError:
            value, end = None, start + len(ENCODED_PREFIX)
        decoded = _from_json(value)
        pieces.append(text[position:start])
        pieces.append(text[start:end] if decoded is None else decoded.text)
        position = end
    pieces.append(text[position:])
    return "".join(pieces)


@dataclass(frozen=True)
class _Rendered:
    lines: tuple[str, ...]
    media_lines: tuple[str, ...]
    images: tuple[McpImage, ...]


def _render(blocks: Sequence[ContentBlock], limits: MediaLimits | None) -> _Rendered:
    attacher = _Attacher(limits)
    lines: list[str] = []
    media: list[str] = []
    for block in blocks:
        line, is_media = _block_line(block, attacher)
        lines.append(line)
        if is_media:
            media.append(line)
    return _Rendered(tuple(lines), tuple(media), tuple(attacher.images))


def render_block(block: ContentBlock) -> str:
    """Render one MCP content block as a line (or lines) of model-readable text, for a model
    that is shown no images (the table in the module docstring)."""
    return _block_line(block, _Attacher(None))[0]


def render_content(result: CallToolResult) -> str:
    """Render a result's content blocks with :func:`render_block`, one block per line."""
    return "\n".join(render_block(block) for block in result.content)


def render_blocks(
    blocks: Sequence[ContentBlock], limits: MediaLimits | None = None
) -> ToolResultContent:
    """Render content blocks for a model under ``limits`` (``None``: no images attached), one
    block per line, attaching the images that ``limits`` allow."""
    rendered = _render(blocks, limits)
    return ToolResultContent("\n".join(rendered.lines), rendered.images)


def render_resource_contents(
    contents: Sequence[TextResourceContents | BlobResourceContents],
    limits: MediaLimits | None = None,
) -> ToolResultContent:
    """A ``resources/read`` result for the model: each content's text, separated by blank
    lines; a blob as an embedded blob resource is (decoded text, an attached image, or a
    placeholder). ``(empty resource)`` when there is no content."""
    attacher = _Attacher(limits)
    parts = [
        item.text if isinstance(item, TextResourceContents) else _blob_line(item, attacher)[0]
        for item in contents
    ]
    return ToolResultContent("\n\n".join(parts) or "(empty resource)", tuple(attacher.images))


# --- Tool outputs ------------------------------------------------------------------------------


@dataclass(frozen=True)
class McpResourceLink:
    """A ``resource_link`` content block of a tool result (MCP specification, "Tools/Resource
    Links"): a resource the model may read with the ``mcp_read_resource`` built-in tool."""

    uri: str
    name: str
    description: str | None = None
    mime_type: str | None = None


def resource_links(result: CallToolResult) -> tuple[McpResourceLink, ...]:
    """The ``resource_link`` blocks of ``result``, in order."""
    return tuple(
        McpResourceLink(
            uri=str(block.uri),
            name=block.name,
            description=block.description,
            mime_type=block.mime_type,
        )
        for block in result.content
        if isinstance(block, ResourceLink)
    )


@dataclass(frozen=True)
class McpToolOutput:
    """A successful ``tools/call`` result.

    Attributes:
        text: Model-readable text of the content blocks (see :func:`render_content`), as for a
            model shown no images.
        structured_content: The result's ``structuredContent`` (any JSON value) or ``None``.
        resource_links: The result's ``resource_link`` blocks, in order.
        content: The result's content blocks; :meth:`for_model_content` renders them again
            for a model that accepts images. Empty: ``text`` is used as it is.
    """

    text: str
    structured_content: Any = None
    resource_links: tuple[McpResourceLink, ...] = ()
    content: tuple[ContentBlock, ...] = field(default=(), repr=False)

    def for_model(self) -> str:
        """The result as one string for the model's tool message, in ONE form, with no image
        attached (:meth:`for_model_content` with no limits)."""
        return self.for_model_content().text

    def for_model_content(self, limits: MediaLimits | None = None) -> ToolResultContent:
        """The result for the model's tool message, in ONE form, with the images ``limits``
        allow.

        MCP asks servers to mirror ``structuredContent`` in a text block ("Tools/Structured
        Content"), so sending both would make the model read the result twice. The rendered
        content is sent when there is no structured content or when the structured content
        adds nothing to it (:func:`structured_adds_information`); otherwise the structured
        content alone is sent as JSON, followed by the result's resource links and the labels
        of its images, audio and binary resources, one per line (none of them is part of the
        JSON). Images travel in either form. An empty result reads ``(no content)``.
        """
        if self.content:
            rendered = _render(self.content, limits)
        else:
            rendered = _Rendered((self.text,) if self.text else (), (), ())
        if self.structured_content is None or not structured_adds_information(
            self.text, self.structured_content
        ):
            return ToolResultContent("\n".join(rendered.lines) or "(no content)", rendered.images)
        structured = json.dumps(self.structured_content, ensure_ascii=False, sort_keys=True)
        links = [
            _resource_link_text(link.name, link.uri, link.mime_type, link.description)
            for link in self.resource_links
        ]
        return ToolResultContent(
            "\n".join([structured, *links, *rendered.media_lines]), rendered.images
        )


def _scalars(value: Any) -> Iterator[Any]:
    if isinstance(value, dict):
        for item in value.values():
            yield from _scalars(item)
    elif isinstance(value, list):
        for item in value:
            yield from _scalars(item)
    else:
        yield value


def structured_adds_information(text: str, structured: Any) -> bool:
    """Whether ``structured`` (a ``structuredContent`` JSON value) says more than ``text``.

    It adds nothing when ``text`` parses as the same JSON value, or when every string of it
    (at any depth) occurs in ``text`` and every number and boolean occurs there as JSON
    (``3.5``, ``true``); object keys and ``null`` are layout, not information. So
    ``{"content": "<file text>"}`` next to the file text adds nothing, while
    ``{"temperature": 21}`` next to "It is mild" does.
    """
    if not text:
        return True
    try:
        if json.loads(text) == structured:
            return False
    except ValueError:
        pass
    lowered = text.lower()
    for scalar in _scalars(structured):
        if scalar is None or scalar == "":
            continue
        if isinstance(scalar, str):
            if scalar not in text:
                return True
        elif json.dumps(scalar).lower() not in lowered:
            return True
    return False
