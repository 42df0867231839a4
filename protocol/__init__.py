"""Wire types and pure codecs shared by syncd and its tests.

Rules: this package imports only msgspec and the standard library, does no I/O, and holds
plain data (msgspec Structs) plus pure functions. Import the submodules directly
(``protocol.rows``, ``protocol.timestamp``, ...); nothing is re-exported here.
"""
