"""Raw-record readers (requirement D1): JSONL, Parquet, folders of text files, ``builtin:stdlib``.

Inputs are expanded into shards (one file, or one group of text files, per shard) so a
process pool or Ray can read them in parallel; a shard is a small frozen value that
pickles. Reading streams one line, record batch or file at a time, never a whole corpus.

A record that cannot become a ``Document`` is not dropped: it comes out as a
``Quarantined`` value naming file, line and reason, in the position it had in the file.
So every non-blank line (or row, or text file, or piece of a text file cut by the
source's ``split``) yields exactly one output, and "records in = kept + dropped +
quarantined" can be checked downstream. A file that cannot be read at all (a broken or
looping symlink, a folder link cycle, no permission, not a Parquet file) is one
quarantined record; a Parquet file without the source's text column (``text_field``)
quarantines each of its rows; a damaged compressed stream ends in one quarantined
record that says how many compressed bytes were not read. JSONL and Parquet records
carry their text, id and domain in the fields the source names.

One module per concern:
  shard.py        the values: ``Shard``, ``Quarantined``, ``ReaderError``, the quarantine table
  files.py        opening regular files, and why a path cannot be read
  find.py         inputs to shards: globs, folders of text files, ``datasets`` folders
  pieces.py       big files cut into pieces: byte ranges of JSONL, runs of Parquet row groups
  streams.py      bytes to lines: gzip and zstd decoded member by member, byte ranges
  fields.py       a record's fields checked and mapped into a ``Document``
  jsonl.py        JSONL lines (orjson where it reads the same, else ``json``)
  columnar.py     Parquet and Arrow rows, batch by batch
  text.py         text files, whole or split
  reader.py       ``read_shard``: a shard read by its format's reader
  fingerprint.py  what reading a shard would yield, as one hash
"""
