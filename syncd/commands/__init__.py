"""The ``syncd`` subcommands, one module per concern; ``syncd/cli.py`` reads the command line
and calls them.

  * ``parser``: the grammar (every subcommand, option and help text; completion reads it).
  * ``settings``: the config file, ``SYNCD_*`` and the flags, resolved into what a command needs.
  * ``daemon``: running, stopping and asking the daemon (run, stop, status, sync, open, mcp).
  * ``memories``: one memory at a time (save, recall, list, get, edit, history, delete).
  * ``data``: the store as a whole (export, import, backup, restore).
  * ``hub``: the reference control plane (``syncd hub`` and its admin commands).
  * ``install``: this machine's set-up (an agent's config, joining a hub, the service, a licence).

Every command returns its exit code (``syncd.exits``) and prints its own messages; a failure
it does not handle (the daemon down, a refused request) is mapped in ``syncd/cli.py``.
"""
