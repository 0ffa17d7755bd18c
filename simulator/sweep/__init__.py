"""Studies over many runs: sweep files expanded into points (`spec`), run on an executor (`executors`: local
pool, serial, Dask) by `runner`, with results tables (`results`)."""
