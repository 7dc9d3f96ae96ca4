"""The measuring bench: workloads, traces, replay, comparison, report, plots and the CLI.

It imports the engine-facing layers above it (indexes, storage, the manager and the
facades); nothing outside ``lab`` imports it, so an engine that embeds prefixkv never
loads it.
"""
