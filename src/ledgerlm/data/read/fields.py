"""A record's fields checked and mapped into a ``Document`` (JSONL and Parquet alike), or
the reason it cannot be one."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from ledgerlm.config import parse_time
from ledgerlm.data.read.shard import DEFAULT_FIELDS, Shard
from ledgerlm.data.records import Document


class _BadField(Exception):
    pass


def _text_of(record: dict[str, Any], field: str = "text") -> str:
    """The text, or raises with the reason it is unusable."""
    text = record.get(field)
    if text is None:
        raise _BadField("missing_text")
    if not isinstance(text, str):
        raise _BadField("text_not_string")
    if not text.strip():
        raise _BadField("empty_text")
    return text


def _name_field(value: Any) -> str | None:
    """id, source and domain group and join documents, so they must be non-empty strings."""
    if value is None:
        return None
    if isinstance(value, str) and value:
        return value
    raise _BadField("bad_field")


def _id_field(value: Any) -> str | None:
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return _name_field(value)


def _plain_field(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value or None
    raise _BadField("bad_field")


def _date_field(value: Any) -> str | None:
    """Parquet stores dates natively; their ISO form is what a JSONL record would carry."""
    if isinstance(value, dt.date):
        return value.isoformat()
    return _plain_field(value)


def _strict_date(value: Any) -> str | None:
    """A date that ``parse_time`` reads (ISO text as given; a Unix time as its ISO text
    in UTC), None for none (missing, null or empty), or raises ``bad_date``."""
    if value is None or value == "":
        return None
    try:
        micros = parse_time(value)
    except ValueError:
        raise _BadField("bad_date") from None
    if isinstance(value, int | float):
        return (
            dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(microseconds=micros)
        ).isoformat()
    return value.isoformat() if isinstance(value, dt.date) else value


def _meta(
    record: dict[str, Any], fields: tuple[str, ...] = (*DEFAULT_FIELDS, "date")
) -> str | None:
    """The record's other fields: all but the ones read (the mapped text, id, domain and
    date, and source, lang), so a ``text`` field not chosen as the text is kept."""
    read = {*fields, "source", "lang"}
    rest = {k: v for k, v in record.items() if k not in read}
    if not rest:
        return None
    return json.dumps(rest, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)


def _encodable(*values: str | None) -> bool:
    """JSON escapes can smuggle lone surrogates in, which no UTF-8 writer accepts later."""
    try:
        for value in values:
            if value is not None and not value.isascii():
                value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def to_document(record: dict[str, Any], shard: Shard, default_id: str) -> Document | str:
    """A document, or the reason (a string) the record cannot be one."""
    text_field, id_field, domain_field = shard.fields
    try:
        text = _text_of(record, text_field)
        doc = Document(
            id=_id_field(record.get(id_field)) or default_id,
            text=text,
            source=_name_field(record.get("source")) or shard.source,
            domain=_name_field(record.get(domain_field)) or shard.domain or "default",
            lang=_plain_field(record.get("lang")),
            date=(_strict_date if shard.dated else _date_field)(record.get(shard.date_field)),
            meta=_meta(record, (*shard.fields, shard.date_field)),
        )
    except _BadField as err:
        return str(err)
    if not _encodable(doc.id, doc.text, doc.source, doc.domain, doc.lang, doc.date, doc.meta):
        return "invalid_utf8"
    return doc
