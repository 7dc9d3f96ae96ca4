"""The measuring bench behind the ``prefixkv`` command (see README.md): workloads, traces,
replay, comparison, simulation, the cluster and the outputs. Nothing outside it imports it."""
