"""Every HTTP body and parameter of the gateway as a pydantic model, one module per area.

Request bodies refuse unknown keys and are strict (:class:`.common.RequestBody`); views are built
from our records (:class:`.common.View`); :mod:`.operation` holds an operation as data. These
modules import no web framework, so a route module of any owner can use them.
"""
