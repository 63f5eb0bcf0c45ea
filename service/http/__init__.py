"""The HTTP layer: a thin client of the served system (`service.system`): the FastAPI app, its routes, dependencies
and schemas, the micro-batching engine, the history store and the metrics. The only part of seqrec that imports
FastAPI or uvicorn."""
