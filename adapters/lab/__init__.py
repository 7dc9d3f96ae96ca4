"""The measuring bench: workloads, traces, replay, comparison, simulation, outputs and
the CLI.

``cli/`` (one module per ``prefixkv`` subcommand), ``compare/`` (backends head to
head), ``replay`` (the K-live schedule), ``sim/`` (one replica at arrival time),
``cluster/`` (many simulated replicas behind :mod:`prefixkv.adapters.router`),
``traces/``, ``workloads`` and ``outputs/`` (every table, report and plot). It imports
the engine-facing layers below it (indexes, storage, the manager, the engine classes, the
router); nothing outside ``lab`` imports it, so an engine or a router that embeds
prefixkv never loads it.
"""
