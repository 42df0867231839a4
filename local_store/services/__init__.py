"""The store's services by concern, each an attribute of ``Store`` and each on the shell alone.

A service reads through the shell's ``_fetch`` and writes through ``_write`` or
``_write_embedded`` (one transaction per call, embedding before it); it never opens a
connection of its own or writes off the writer thread. ``local_store/store.py`` composes them.
"""
