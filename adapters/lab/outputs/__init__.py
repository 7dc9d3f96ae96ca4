"""Everything the lab's commands write: tidy tables, report.md, results.json and plots.

* :mod:`.tables`: the writers of the tidy tables (CSV, JSON, JSON lines, Parquet,
  ``results.json``). Their one schema is below the commands: a run's labels, then
  a record's flat fields; one row per request (``sim.metrics.RequestRow`` through
  ``request_table``, whatever the run), one per run (its labels, then its summary).
* :mod:`.markdown`: one table writer over column specs (header, alignment, meaning)
  for the terminal and report.md, the column definitions, the number formats.
* :mod:`.compare` and :mod:`.cluster`: each command's report, a section per axis
  that moved (index, capacity, scheduler, request rate; policy, fleet size, faults).
* :mod:`.plots`: every plot, over one figure, palette and title rule.

Nothing below the command line imports this package; it reads the records the
comparison, the simulator and the cluster return.
"""
