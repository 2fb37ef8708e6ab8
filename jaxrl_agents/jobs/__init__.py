"""The composition root: typed config groups, builders and the train / eval / export jobs."""
