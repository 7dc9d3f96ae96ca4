"""Plug-ins that put a prefixkv index inside the real engines, chosen by their own flags.

* :mod:`.vllm`: ``--scheduler-cls prefixkv.adapters.plugins.vllm.PrefixKVScheduler``
  with ``--additional-config '{"prefixkv": {"index": "radix"}}'`` (vLLM 0.33).
* :mod:`.sglang`: deprecated, moved to :mod:`prefixkv.adapters.sglang.plugin`.

Each submodule imports its engine; this package imports neither, so importing
``prefixkv.adapters`` never pulls an engine in.
"""
