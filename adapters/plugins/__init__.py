"""Plug-ins that put a prefixkv index inside the real engines, chosen by their own flags.

* :mod:`.vllm`: deprecated, moved to :mod:`prefixkv.adapters.vllm.scheduler`.
* :mod:`.sglang`: ``--radix-cache-backend prefixkv-radix`` or ``prefixkv-hash-chain``
  (SGLang 0.5.23), registered through SGLang's ``sglang.srt.plugins`` entry point.

Each submodule imports its engine; this package imports neither, so importing
``prefixkv.adapters`` never pulls an engine in.
"""
