"""Every answer that crosses the wire, declared once, as TypedDicts (docs/architecture.md, "Wire").

The platform builds these (mypy checks every key and type of what it sends), the served
OpenAPI document is generated from them (`http/api.py`), and Run parses the platform's answers
into them at its edge (`wire/parse.py`: a foreign shape is `ForeignAnswer`, never a KeyError
deep in the agent). So the document, what is sent and what Run reads cannot differ.

TypedDicts rather than dataclasses: they are the dicts the platform serialises (orjson, no
conversion on the hot paths), and a key that may be absent (`NotRequired`) stays absent rather
than `null`. They come from `typing_extensions`, which pydantic needs on Python 3.11 to build
the document. Nothing here imports pydantic: Run loads this package and must start quickly.
"""
