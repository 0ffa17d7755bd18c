"""The transfer model: flow-level max-min fair sharing of directed links (model.py, maxmin.py), a contention-free
analytic mode, and the modes' option set (modes.py, light enough for the schema and the CLI parser to import)."""
