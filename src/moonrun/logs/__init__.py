"""Jobs' log lines, as Run sends them: the seam (protocol.py), in memory (memory.py), on disk
(file.py). A store like `store/`: the wiring chooses one, the routes and pages use the seam."""
