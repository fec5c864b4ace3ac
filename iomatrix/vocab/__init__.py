"""The run's vocabulary, just above core: the axes of a configuration, each declared once
(``axes``), and the words a run is described in: mode, accelerator, trial and run status
(``words``)."""
