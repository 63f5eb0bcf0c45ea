"""Jobs that glue the stages together: retriever training, ranker training, the pipeline."""
