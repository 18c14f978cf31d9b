"""Jobs' artifacts, as Run uploads them in chunks: the seam (protocol.py) and the files under
the data directory (file.py). A store like `store/`: the wiring chooses it, the routes and
pages use the seam."""
