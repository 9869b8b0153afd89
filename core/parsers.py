"""DRF's request parsers, refusing a `Content-Type` whose charset Python does not know with 415
`unsupported_media_type` (DRF would decode with the default charset instead, silently accepting a body
in an encoding it cannot read). The other malformations are refused by DRF itself: a multipart body
without a boundary, a truncated multipart or JSON body, a body not in the declared charset are 400
`invalid_request` (`ParseError`), a type no parser takes is 415. `content_type_refusal` is the same rule
for a plain Django view that reads JSON (`POST /api/chat`).
"""

from __future__ import annotations

import codecs

from django.utils.http import parse_header_parameters
from rest_framework import parsers
from rest_framework.exceptions import UnsupportedMediaType


def charset_refusal(content_type: str | None) -> str | None:
    """Why a `Content-Type` header's charset is refused (an unknown codec), or None."""
    _, params = parse_header_parameters(content_type or "")
    charset = params.get("charset")
    if charset is None:
        return None
    try:
        codecs.lookup(charset)
    except (LookupError, ValueError):
        return f"Unsupported charset in Content-Type: {charset[:40]!r}."
    return None


def content_type_refusal(content_type: str | None, accepted: tuple[str, ...]) -> str | None:
    """Why a plain view refuses a request's `Content-Type` (415): a media type outside `accepted` (an
    absent header is accepted), or an unknown charset."""
    media_type, _ = parse_header_parameters(content_type or "")
    if media_type and media_type not in accepted:
        return f"Unsupported media type {media_type[:60]!r}: send {' or '.join(accepted)}."
    return charset_refusal(content_type)


class _KnownCharset:
    def parse(self, stream, media_type=None, parser_context=None):
        refusal = charset_refusal(media_type)
        if refusal:
            raise UnsupportedMediaType(media_type, detail=refusal)
        return super().parse(stream, media_type, parser_context)


class JSONParser(_KnownCharset, parsers.JSONParser):
    pass


class FormParser(_KnownCharset, parsers.FormParser):
    pass


class MultiPartParser(_KnownCharset, parsers.MultiPartParser):
    pass
