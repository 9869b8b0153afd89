"""The agent runtime: executor, pipeline, model clients, tools and the knowledge retrieval index."""
