make docs         # builds the site into site/ with mkdocs build --strict (a broken link fails)
make docs-serve   # serves it on http://127.0.0.1:8000, rebuilt on every change
