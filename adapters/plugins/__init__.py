"""Plug-ins that put a prefixkv index inside the real engines, chosen by their own flags.

* :mod:`.vllm`: deprecated, moved to :mod:`prefixkv.adapters.vllm.scheduler`.
* :mod:`.sglang`: deprecated, moved to :mod:`prefixkv.adapters.sglang.plugin`.

Each submodule imports its engine; this package imports neither, so importing
``prefixkv.adapters`` never pulls an engine in.
"""
