"""Everything the lab's commands write: the tidy tables (:mod:`.tables`), one table writer
(:mod:`.markdown`), each command's report with a section per axis (:mod:`.compare`,
:mod:`.cluster`) and every plot (:mod:`.plots`). Nothing below the command line imports it.
"""
